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

Pass time is the wall time from one pass's start to the next one's (or to `stop`), so it
includes scheduling, sampling and drafting: what a pass really costs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pipeline import costs


@dataclass
class PassCounts:
    passes: int = 0
    scheduled_tokens: int = 0
    seq_passes: int = 0  # (request, pass) pairs
    prefill_seq_passes: int = 0  # pairs that were a request's first (prefill) pass
    draft_tokens: int = 0  # draft tokens scheduled for verification
    draft_seconds: float = 0.0  # inside propose_draft_token_ids
    seconds: float = 0.0  # first pass start .. stop
    samples: list = field(default_factory=list)  # (scheduled tokens, seconds, had prefill)

    def tau(self, generated: int, requests: int) -> float:
        return costs.tau(generated - requests, self.seq_passes - self.prefill_seq_passes)

    def accept_rate(self, generated: int, requests: int) -> float:
        return costs.accept_rate(generated - requests, self.seq_passes - self.prefill_seq_passes,
                                 self.draft_tokens)


class PassMeter:
    """Counts target forward passes of one engine between `start()` and `stop()`."""

    def __init__(self, runner):
        self._runner = runner
        self._counts: PassCounts | None = None
        self._last: tuple[float, int, bool] | None = None  # start, tokens, prefill of the last pass
        self._first: float | None = None
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
        self._counts, self._last, self._first = PassCounts(), None, None

    def stop(self) -> PassCounts:
        counts, now = self._counts, time.perf_counter()
        if counts is None:
            raise RuntimeError("PassMeter.stop() without start()")
        self._close_pass(now)
        counts.seconds = now - self._first if self._first is not None else 0.0
        self._counts = None
        return counts

    def _on_pass(self, so) -> None:
        c = self._counts
        total = int(getattr(so, "total_num_scheduled_tokens", 0) or 0)
        if c is None or total <= 0:
            return
        now = time.perf_counter()
        self._close_pass(now)
        if self._first is None:
            self._first = now
        scheduled = getattr(so, "num_scheduled_tokens", {}) or {}
        new = getattr(so, "scheduled_new_reqs", ()) or ()
        c.passes += 1
        c.scheduled_tokens += total
        c.seq_passes += len(scheduled)
        c.prefill_seq_passes += len(new)
        c.draft_tokens += sum(len(v) for v in (getattr(so, "scheduled_spec_decode_tokens", {})
                                                or {}).values())
        self._last = (now, total, bool(new))

    def _close_pass(self, now: float) -> None:
        if self._last is not None and self._counts is not None:
            start, tokens, prefill = self._last
            self._counts.samples.append((tokens, now - start, prefill))
            if self.listener is not None:
                self.listener(tokens, now - start, prefill)
        self._last = None


__all__ = ["PassCounts", "PassMeter"]
