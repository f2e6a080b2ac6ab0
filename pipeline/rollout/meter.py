"""Per-pass accounting of the target model (part of the vLLM adapter), the same for every
speculative method: forward passes, scheduled tokens, draft tokens and drafting time.

`PassMeter(runner)` wraps two methods of the in-process model runner instance:
`execute_model(scheduler_output)` (one target forward pass; the scheduler output says how
many tokens each request got, which requests are new and which draft tokens are being
verified) and `propose_draft_token_ids(...)` (whatever drafter the method uses: n-gram,
vLLM's suffix cache or rhymectl's proposer). vLLM types are read by attribute only.

From the counts, for `n` requests that generated `g` tokens in all:

    decode seq-passes = scheduled (request, pass) pairs - prefill pairs
    tau               = (g - n) / decode seq-passes   (tokens per pass and sequence, bonus
                                                        token included; the prefill pass of
                                                        each request emits its first token)
    accept_rate       = (g - n - decode seq-passes) / draft tokens verified

A prefill pair is any pass of a request before it decodes: each part of a prompt that
chunked prefill splits over several passes (the last part emits the first token), and
each part but the last of a preempted request's recomputation (prompt and output so far,
after which it emits a token again, as a decode pass does). Which one a row is, vLLM's
scheduler decides by the rule its `_update_after_schedule` applies: a row whose computed
tokens, with this pass's, stay below its prompt plus the output it already holds
(`num_computed_tokens`, `num_output_tokens` of `scheduled_cached_reqs`) emits nothing. A
new request's prompt length comes with it (`scheduled_new_reqs`), and is kept.

Pass time is the wall time from one pass's start to the next one's (or to `stop`), so it
includes scheduling, sampling and drafting: what a pass really costs.

For the critical path (`pipeline.critical_path`) each pass also keeps how many requests it
scheduled and the output tokens they held before it (`scheduled_cached_reqs.
num_output_tokens`), and each request its first and last pass, at a cost per request, not
per request and pass (this runs in every training step):

- first pass: the pass that emits its first token (the last part of its prompt);
- last pass: vLLM reports a finished request in the next pass's `finished_req_ids`; it
  finished in the pass before, or two before where it was not scheduled there (async
  scheduling, vLLM's default without speculation on a GPU, schedules the next pass before
  the last one's output is known: a request that stops may run one more pass, and is
  then counted to that pass). Requests not reported by the end ran until the last pass;
- passes: last - first + 1. Exact when no request skipped a pass (the sum over requests
  then equals the scheduled (request, pass) pairs); after a preemption or a token-budget
  deferral it is the span, an upper bound (`PassCounts.spans_exact` says which);
- passes that emit nothing (prompt parts before the last) are not in the pass's requests
  (`pass_running`), so the critical path counts each request's passes as a whole-prompt
  prefill would have, and the passes themselves still count.

`PassCounts.pass_log` turns these into a `PassLog` after the rollout, joining vLLM's
internal request ids to the callers' ids (`pipeline.rollout.request_id.caller_id`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Mapping

from pipeline import costs
from pipeline.critical_path import PassLog, critical_path
from pipeline.rollout.request_id import caller_id


@dataclass
class PassCounts:
    passes: int = 0
    scheduled_tokens: int = 0
    seq_passes: int = 0  # (request, pass) pairs
    prefill_seq_passes: int = 0  # pairs of a request's prefill (every part; see above)
    silent_seq_passes: int = 0  # of them, pairs that emitted nothing (parts before the last)
    draft_tokens: int = 0  # draft tokens scheduled for verification
    draft_seconds: float = 0.0  # inside propose_draft_token_ids
    seconds: float = 0.0  # first pass start .. stop
    samples: list = field(default_factory=list)  # (scheduled tokens, seconds, had prefill)
    # per pass, in order: requests scheduled that emit tokens, how many of them emit
    # their first token, the output tokens of the scheduled requests before the pass
    pass_running: list = field(default_factory=list)
    pass_new: list = field(default_factory=list)
    pass_outputs_before: list = field(default_factory=list)
    # per request (vLLM's internal id), in order of arrival: its first and last pass
    request_first: dict = field(default_factory=dict)
    request_finish: dict = field(default_factory=dict)

    @property
    def spans_exact(self) -> bool:
        """Whether every request ran in every pass from its first to its last (see the
        module docstring): then its span is its pass count."""
        spans = sum(self.request_finish[r] - p + 1 for r, p in self.request_first.items())
        return spans == self.seq_passes - self.silent_seq_passes

    def tau(self, generated: int, requests: int) -> float:
        return costs.tau(generated - requests, self.seq_passes - self.prefill_seq_passes)

    def accept_rate(self, generated: int, requests: int) -> float:
        return costs.accept_rate(generated - requests, self.seq_passes - self.prefill_seq_passes,
                                 self.draft_tokens)

    def pass_log(self, lengths: Mapping[str, int] | None = None) -> PassLog:
        """The passes and requests of this rollout (`pipeline.critical_path.PassLog`).

        lengths: generated tokens per request id as the caller gave it to vLLM (the
        `Completion.request_id`s); requests not in it have tokens_out None."""
        lengths = lengths or {}
        first, finish = self.request_first, self.request_finish
        return PassLog(tokens=[t for t, _, _ in self.samples], running=list(self.pass_running),
                       new=list(self.pass_new), outputs_before=list(self.pass_outputs_before),
                       finish=[finish[r] for r in first],
                       passes=[finish[r] - p + 1 for r, p in first.items()],
                       tokens_out=[lengths.get(caller_id(r)) for r in first])

    def path_metrics(self) -> dict[str, int]:
        """The critical path's pass counts (training's per-step metrics)."""
        path = critical_path(self.pass_log())
        return {"spec_critical_passes": path.critical_passes, "spec_tail_passes": path.tail_passes}


class PassMeter:
    """Counts target forward passes of one engine between `start()` and `stop()`."""

    def __init__(self, runner):
        self._runner = runner
        self._counts: PassCounts | None = None
        self._last: tuple[float, int, bool] | None = None  # start, tokens, prefill of the last pass
        self._first: float | None = None
        self._previous: dict = {}  # the last pass's scheduled requests (id -> tokens)
        self._prompt_lens: dict = {}  # request -> prompt tokens, from its first scheduling
        # called with (scheduled tokens, seconds, had prefill) as each pass closes
        self.listener = None
        execute, propose = runner.execute_model, runner.propose_draft_token_ids

        def execute_model(scheduler_output, *args, **kwargs):
            self._on_pass(scheduler_output)
            return execute(scheduler_output, *args, **kwargs)

        def propose_draft_token_ids(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return propose(*args, **kwargs)
            finally:
                if self._counts is not None:
                    self._counts.draft_seconds += time.perf_counter() - t0

        runner.execute_model = execute_model
        runner.propose_draft_token_ids = propose_draft_token_ids

    def start(self) -> None:
        self._counts, self._last, self._first, self._previous = PassCounts(), None, None, {}
        self._prompt_lens = {}

    def stop(self) -> PassCounts:
        counts, now = self._counts, time.perf_counter()
        if counts is None:
            raise RuntimeError("PassMeter.stop() without start()")
        self._close_pass(now)
        counts.seconds = now - self._first if self._first is not None else 0.0
        last = counts.passes - 1
        for rid in counts.request_first:
            counts.request_finish.setdefault(rid, last)  # not reported: ran to the end
        self._counts, self._previous, self._prompt_lens = None, {}, {}
        return counts

    def _on_pass(self, so) -> None:
        c = self._counts
        if c is None:
            return
        self._finished(c, getattr(so, "finished_req_ids", None) or ())
        total = int(getattr(so, "total_num_scheduled_tokens", 0) or 0)
        if total <= 0:
            return
        now = time.perf_counter()
        self._close_pass(now)
        if self._first is None:
            self._first = now
        scheduled = getattr(so, "num_scheduled_tokens", {}) or {}
        silent, first = self._prefill_rows(so, scheduled)
        c.passes += 1
        c.scheduled_tokens += total
        c.seq_passes += len(scheduled)
        c.prefill_seq_passes += len(silent) + len(first)
        c.silent_seq_passes += len(silent)
        c.pass_running.append(len(scheduled) - len(silent))
        c.pass_new.append(len(first))
        cached = getattr(so, "scheduled_cached_reqs", None)
        c.pass_outputs_before.append(sum(getattr(cached, "num_output_tokens", ()) or ()))
        for rid in first:
            c.request_first.setdefault(rid, c.passes - 1)
        self._previous = scheduled
        c.draft_tokens += sum(len(v) for v in (getattr(so, "scheduled_spec_decode_tokens", {})
                                                or {}).values())
        self._last = (now, total, bool(silent or first))

    def _prefill_rows(self, so, scheduled: Mapping[str, int]) -> tuple[list, list]:
        """This pass's rows that emit nothing (prompt or recomputation parts before the
        last) and those that emit a request's first token (see the module docstring).

        A row whose prompt length is unknown (fields missing, a request older than
        `start`) counts as its request's first pass when new, else as a decode pass."""
        silent, first = [], []
        for r in getattr(so, "scheduled_new_reqs", ()) or ():
            prompt = getattr(r, "prompt_token_ids", None)
            if prompt is not None:
                self._prompt_lens[r.req_id] = len(prompt)
            done = getattr(r, "num_computed_tokens", 0) + scheduled.get(r.req_id, 0)
            (silent if prompt is not None and done < len(prompt) else first).append(r.req_id)
        cached = getattr(so, "scheduled_cached_reqs", None)
        ids = getattr(cached, "req_ids", None) or ()
        computed = getattr(cached, "num_computed_tokens", None) or ()
        outputs = getattr(cached, "num_output_tokens", None) or ()
        for rid, done, out in zip(ids, computed, outputs):
            prompt = self._prompt_lens.get(rid)
            if prompt is None:
                continue
            if done + scheduled.get(rid, 0) < prompt + out:  # vLLM's `is_prefill_chunk`
                silent.append(rid)
            elif out == 0:
                first.append(rid)
        return silent, first

    def _finished(self, c: PassCounts, finished) -> None:
        """Requests reported finished before the coming pass: their last pass is the
        previous one, or the one before where they were not scheduled in the previous one
        (async scheduling; see the module docstring). Earlier rollouts' are not ours."""
        last = c.passes - 1
        for rid in finished:
            first = c.request_first.get(rid)
            if first is not None and rid not in c.request_finish:
                c.request_finish[rid] = last if rid in self._previous else max(first, last - 1)

    def _close_pass(self, now: float) -> None:
        if self._last is not None and self._counts is not None:
            start, tokens, prefill = self._last
            self._counts.samples.append((tokens, now - start, prefill))
            if self.listener is not None:
                self.listener(tokens, now - start, prefill)
        self._last = None


__all__ = ["PassCounts", "PassMeter"]
