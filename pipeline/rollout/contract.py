"""The rollout contract: what the loop, the scheduler runtime and the benches need from a
rollout engine, as a typing Protocol, and the data that crosses it. `RolloutEngine`
(`pipeline.rollout.engine`, the one vLLM adapter) implements it; nothing here imports vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Protocol, Sequence


@dataclass
class Completion:
    """One response. `logprobs[i]` is vLLM's logprob of `token_ids[i]` (raw target model);
    empty when the request did not ask for them (`Sampling.logprobs`)."""

    request_id: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    gen_seconds: float
    finish_s: float = 0.0  # seconds from the start of its `generate` call to its last token


@dataclass(frozen=True)
class Sampling:
    n: int
    temperature: float
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 128
    seed: int | None = None
    # ask vLLM for each sampled token's logprob: only the sampler check uses them (the
    # trainer recomputes its own), and they cost vLLM per-token work (`rollout.
    # logprob_check_every` says when the loop asks)
    logprobs: bool = True

    @classmethod
    def from_rollout(cls, rollout: Any, *, n: int, seed: int | None,
                     logprobs: bool) -> "Sampling":
        """The sampling a run's `rollout` config section sets (temperature, top_p, top_k,
        max_tokens), for `n` samples per prompt."""
        return cls(n=n, temperature=rollout.temperature, top_p=rollout.top_p,
                   top_k=rollout.top_k, max_tokens=rollout.max_tokens, seed=seed,
                   logprobs=logprobs)


class RolloutBackend(Protocol):
    """generate / stream / update_weights / sleep / metrics.

    Token ids in and out; `generate` returns one list of `n` completions per prompt. The
    stream (`open_stream` ... `close_stream`) takes requests one by one, for a runtime that
    places them over ranks. Generation needs the engine awake. `sleep` gives its memory to
    the trainer and discards its weights; `update_weights` loads the policy of `version`
    and wakes it (also valid when awake).
    """

    drafting: Any  # the speculative drafter (`speculation.Drafting`), None without one

    def generate(self, prompts: Sequence[list[int]], sampling: Sampling) -> list[list[Completion]]: ...

    def generate_first(self, prompts: Sequence[list[int]], sampling: Sampling, keep: int,
                       pinned: Sequence[bool] = ()) -> list[list[Completion] | None]: ...

    def open_stream(self, prompts: Sequence[list[int]], n: int) -> None: ...

    def submit(self, key: str, prompt_ids: Sequence[int], sampling: Sampling, *,
               prompt_len: int | None = None) -> None: ...

    def step(self) -> list[tuple[str, Completion]]: ...

    def busy(self) -> bool: ...

    def running(self) -> int: ...

    def close_stream(self) -> None: ...

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]], version: int) -> None: ...

    def sleep(self) -> None: ...

    def spec_metrics(self) -> dict[str, float]: ...


__all__ = ["Completion", "RolloutBackend", "Sampling"]
