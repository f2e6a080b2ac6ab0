"""Child processes that stop when rhymectl is stopped.

rhymectl runs torchrun (`train --nproc`, `bench sched` on real ranks), training runs
(`bench e2e`) and bench workers as child processes. A signal sent to rhymectl's process
alone (`kill PID`, a process manager stopping a service, `Popen.terminate()`) used to end
rhymectl and leave the child running: torchrun and its ranks trained on in the
background, holding the run directory's lock, so the next `--resume` was refused.

`run` forwards SIGTERM and SIGHUP to the child. Ctrl-C reaches the child from the
terminal already, so on SIGINT it gives the child `grace_s` to stop, then sends SIGTERM
(at once on a second Ctrl-C). A child still running `grace_s` after it was signalled is
killed (torchrun itself gives its ranks 30 s). `run` returns only after the child has
ended, and then raises `Stopped`, which the command line reports as one line and exit
code 128 + the signal's number (143 for SIGTERM). SIGKILL cannot be forwarded: a parent
killed that way still leaves its child running.
"""

from __future__ import annotations

import signal
import subprocess
import threading
from typing import Callable, Sequence

FORWARDED = (signal.SIGTERM, signal.SIGHUP)
GRACE_S = 60.0  # longer than torchrun's own 30 s for its ranks


class Stopped(Exception):
    """This process was asked to stop while a child ran; the child has ended."""

    def __init__(self, signum: int):
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name}; the processes it "
                         f"started have stopped too")


def run(cmd: Sequence[str], *, on_line: Callable[[str], None] | None = None,
        grace_s: float = GRACE_S, **popen) -> int:
    """Run `cmd` to its end and return its exit code (`subprocess.call`'s keyword
    arguments). With `on_line`, its stdout is read as text, line by line. Raises `Stopped`
    if this process got SIGTERM, SIGHUP or SIGINT meanwhile."""
    received: list[int] = []
    proc: subprocess.Popen | None = None
    killer: threading.Timer | None = None

    def forward(signum, _frame):
        nonlocal killer
        received.append(signum)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signum)
            if killer is None:  # a child that ignores the signal is killed after grace_s
                killer = threading.Timer(grace_s, _kill, (proc,))
                killer.daemon = True
                killer.start()

    main = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, forward) for s in FORWARDED} if main else {}
    try:
        if on_line is not None:
            popen.update(stdout=subprocess.PIPE, text=True)
        proc = subprocess.Popen(list(cmd), **popen)
        if received:  # signalled while the child was being started
            forward(received.pop(), None)
        try:
            if on_line is not None:
                for line in proc.stdout:
                    on_line(line)
            code = proc.wait()
        except KeyboardInterrupt:
            received.append(signal.SIGINT)
            _stop(proc, grace_s)
            code = proc.returncode
        finally:
            if proc.stdout is not None:
                proc.stdout.close()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if killer is not None:
            killer.cancel()
    if received:
        raise Stopped(received[0])
    return code


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()


def _stop(proc: subprocess.Popen, grace_s: float) -> None:
    """After Ctrl-C: wait for the child, then SIGTERM, then SIGKILL; each further Ctrl-C
    moves on to the next."""
    for escalate in (None, signal.SIGTERM, signal.SIGKILL):
        if escalate is not None and proc.poll() is None:
            proc.send_signal(escalate)
        try:
            proc.wait(timeout=grace_s)
            return
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            continue
    proc.wait()


__all__ = ["FORWARDED", "GRACE_S", "Stopped", "run"]
