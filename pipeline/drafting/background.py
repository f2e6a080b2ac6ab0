"""Drafter work moved off the rollout's critical path: one thread running jobs in order.

vLLM asks the proposer for drafts between two target passes, with the GPU idle; what the
next drafts do not need yet can run while the GPU computes the next pass: live tokens
entering the trees, ended groups leaving them, the next step's trees being built. A job
is a generator: the worker runs it step by step and releases the GIL between steps
(arctic-inference's tree calls hold it), so a thread that needs the GIL — vLLM's host
loop, the trainer — waits for at most one step, not for the job. `wait()` returns when
every job submitted so far has finished: callers wait before touching what jobs touch,
so the result is the same as running the jobs inline, whatever the timing. With
`enabled=False` jobs run inline at `submit` (the reference the bench compares against).
An exception in a job is raised again by the next `wait()`.

Reproducibility tests slow the thread down on purpose: `RHYMECTL_TEST_DRAFTER_DELAY_S`
(seconds, off by default) makes the worker sleep a random time up to that before each step
of a job, so that waits cut optional work at other points than in an undisturbed run.
Drafts must not change (docs/speculation.md, "Reproducible speculation").

A job may yield `OPTIONAL`: what follows only saves later work (a cache being filled),
so `wait()` does not wait for it — it stops the job at its next step instead. Inline,
the optional part runs in full.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import deque
from typing import Callable, Iterator

Job = Callable[[], Iterator[None] | None]
OPTIONAL = object()  # yielded by a job: the rest of it may be cut short by `wait()`
DELAY_ENV = "RHYMECTL_TEST_DRAFTER_DELAY_S"  # a test hook: random sleeps in the thread


def delay_hook_s() -> float:
    """The most seconds the worker sleeps before a job's step (0: the hook is off)."""
    try:
        return max(0.0, float(os.environ.get(DELAY_ENV, "0") or 0))
    except ValueError:
        return 0.0


class Background:
    """A FIFO of jobs run by one daemon thread (started on the first submit)."""

    def __init__(self, enabled: bool = True, name: str = "rhymectl-drafter"):
        self.enabled = enabled
        self.name = name
        self.busy_s = 0.0  # seconds jobs have run, inline or in the thread (wall time)
        self.busy_cpu_s = 0.0  # the CPU time of that (their thread's)
        self._jobs: deque[Job] = deque()
        self._cond = threading.Condition()
        self._pending = 0  # submitted, not finished
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._cut = False  # a waiter asks the running job to stop at its optional part
        self._pid = os.getpid()
        self._delay_s = delay_hook_s()
        self._rng = random.Random()  # the hook's timing noise; never seeds a draft

    def _after_fork(self) -> None:
        """A forked child has no worker thread: queued jobs run inline from now on."""
        if self._pid != os.getpid():
            self._pid, self._thread, self.enabled = os.getpid(), None, False
            self._cond = threading.Condition()
            jobs, self._jobs, self._pending = list(self._jobs), deque(), 0
            for job in jobs:
                self._run(job)

    def submit(self, job: Job) -> None:
        self._after_fork()
        if not self.enabled:
            self._run(job)
            return
        with self._cond:
            self._jobs.append(job)
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def idle(self) -> bool:
        return self._pending == 0

    def close(self) -> None:
        """Finish the jobs submitted so far and end the thread (later jobs run inline)."""
        self.wait()
        with self._cond:
            self._closed = True
            self.enabled = False
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def wait(self) -> float:
        """Block until every submitted job has finished; returns the seconds waited."""
        self._after_fork()
        if self._pending == 0 and self._error is None:
            return 0.0
        t0 = time.perf_counter()
        with self._cond:
            self._cut = True
            while self._pending:
                self._cond.wait()
            self._cut = False
            error, self._error = self._error, None
        if error is not None:
            raise error
        return time.perf_counter() - t0

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closed:
                    self._cond.wait()
                if not self._jobs:
                    return
                job = self._jobs.popleft()
            try:
                self._run(job, yielding=True)
            except BaseException as exc:  # noqa: BLE001 — handed to the waiter
                with self._cond:
                    self._error = self._error or exc
            with self._cond:
                self._pending -= 1
                self._cond.notify_all()

    def _run(self, job: Job, yielding: bool = False) -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            steps = job()
            if steps is not None:
                optional = False
                for step in steps:
                    optional = optional or step is OPTIONAL
                    if yielding:
                        if optional and self._cut:
                            steps.close()
                            break
                        time.sleep(self._rng.uniform(0, self._delay_s) if self._delay_s
                                   else 0)  # let a waiting thread take the GIL
        finally:
            self.busy_s += time.perf_counter() - t0
            self.busy_cpu_s += time.thread_time() - c0


__all__ = ["Background", "DELAY_ENV", "Job", "OPTIONAL", "delay_hook_s"]
