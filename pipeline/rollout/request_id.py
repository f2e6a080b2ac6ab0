"""Request ids and request seeds: the one place they are built and parsed.

A request of a rollout is one response (or, under a coordinated placement, one chunk of a
response) of one group: `RequestId(group, sample, chunk)`. Its text is what vLLM is given
as the request id,

    "g:s"      response s of group g (a whole response: `generate_first`)
    "g:s:c"    its c-th chunk (`pipeline.loop.sched_runtime`; c counts from 0)

and vLLM 0.32's input processor makes its internal id `{that text}-{8 hex characters}`
(unless VLLM_DISABLE_REQUEST_ID_RANDOMIZATION is set); the model runner, the proposer hook
and the scheduler output see the internal one, finished outputs carry the caller's.
`caller_id` undoes the suffix.

The seed of a request is a function of the step's seed and its id alone, so a step samples
the same way however its requests are batched or placed, and a resumed run draws what an
uninterrupted one drew: response s of group g is seeded `seed + g * n + s`; chunk c of it
adds `CHUNK_SEED_STRIDE * c` (its first chunk draws what the whole response would). Runs
compare rows with earlier runs bit for bit: never change these numbers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CHUNK_SEED_STRIDE = 1_000_003  # seed distance between a response's chunks
_TEXT = re.compile(r"[0-9]+:[0-9]+(:[0-9]+)?")
_VLLM_SUFFIX = re.compile(r"-[0-9a-f]{8}\Z")


@dataclass(frozen=True)
class RequestId:
    """group: the prompt's position in the rollout; sample: the response's index in its
    group (0 .. n-1); chunk: which chunk of that response, None for a whole response."""

    group: int
    sample: int
    chunk: int | None = None

    def __str__(self) -> str:
        head = f"{self.group}:{self.sample}"
        return head if self.chunk is None else f"{head}:{self.chunk}"

    @classmethod
    def parse(cls, text: str) -> "RequestId":
        """The id whose text is `text` (a caller's id: `caller_id` first for vLLM's
        internal one). Raises ValueError for any other text."""
        if not _TEXT.fullmatch(text):
            raise ValueError(f"not a rollout request id: {text!r} (expected 'g:s' or 'g:s:c')")
        return cls(*(int(p) for p in text.split(":")))

    def seed(self, step_seed: int | None, n: int) -> int | None:
        """This request's sampling seed from the step's (`Sampling.seed`; None: unseeded)
        and the group size `n` (see the module docstring)."""
        if step_seed is None:
            return None
        return step_seed + self.group * n + self.sample + CHUNK_SEED_STRIDE * (self.chunk or 0)


def caller_id(vllm_id: str) -> str:
    """The id the caller gave vLLM for the request vLLM calls `vllm_id` (its internal id
    without the `-{8 hex characters}` vLLM appended; unchanged when it has none)."""
    return _VLLM_SUFFIX.sub("", vllm_id)


__all__ = ["CHUNK_SEED_STRIDE", "RequestId", "caller_id"]
