"""The rollout contract: what the loop, the scheduler runtime and the benches need from a
rollout engine, as a typing Protocol, and the data that crosses it. `RolloutEngine`
(`pipeline.rollout.engine`, the one vLLM adapter) implements it; nothing here imports vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Protocol, Sequence

from pipeline.rollout.meter import PassCounts
from pipeline.rollout.request_id import RequestId


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


@dataclass
class RolloutStats:
    """What one rollout measured on one engine: a `generate`, a `generate_first`, or a
    stream from `open_stream` to `close_stream`."""

    passes: PassCounts = field(default_factory=PassCounts)  # target forward passes (meter)
    generated: int = 0  # tokens generated, over every request
    requests: int = 0  # engine requests: responses, or a stream's chunks
    dropped_tokens: int = 0  # generate_first: finished responses' tokens of dropped groups
    speculating: bool = False  # the engine verifies drafts (spec.method is not none)

    def spec_metrics(self) -> dict[str, float]:
        """Speculation in this rollout, the same accounting for every method (see
        `pipeline.rollout.meter`); {} without speculation. rhymectl's drafter adds its own
        counters (`DraftingState.stats`)."""
        if not self.speculating:
            return {}
        c, generated, requests = self.passes, self.generated, self.requests
        return {"spec_tau": c.tau(generated, requests),
                "spec_accept_rate": c.accept_rate(generated, requests),
                "spec_drafter_s": c.draft_seconds, "spec_passes": c.passes,
                **c.path_metrics()}  # spec_critical_passes, spec_tail_passes


@dataclass
class RolloutResult:
    """groups[p]: prompt p's `n` completions, in sample order (None only from
    `generate_first`, for a group it dropped); stats: what the rollout measured."""

    groups: list[list[Completion] | None]
    stats: RolloutStats


class DraftingState(Protocol):
    """rhymectl's drafter as the loop drives it across steps (implemented by
    `pipeline.rollout.speculation.Drafting`); the engine feeds it during generation."""

    def use_run(self, run_dir: Path) -> None:
        """Read history from the run directory's index and history store (once, at setup)."""

    def prepare(self, prompts: Sequence[Sequence[int]], records: Sequence = ()) -> None:
        """The next rollout's prompts (token ids, as it will encode them): their trees are
        built in the background while the trainer runs."""

    def remember(self, records: Sequence) -> None:
        """One step's rollout records (every rank's) join the history."""

    def stats(self) -> dict[str, float]:
        """The drafter's `spec_*` counters since the last call."""

    model: object | None  # the draft model beside the trees (`model` methods), else None

    def train_model(self, rollouts: Sequence[tuple]) -> dict:
        """Between steps: the draft model learns one step's (prompt ids, response ids[,
        the policy's `pipeline.train.teacher.Teacher` or None]); its metrics."""

    def warm_model(self, rollouts: Sequence[tuple], updates: int) -> dict:
        """Before a fresh run's first step: the draft model's warm-up on the starting
        policy's responses to prompts the run does not train on; its metrics."""


class RolloutBackend(Protocol):
    """generate / stream / update_weights / sleep.

    Token ids in and out; `generate` returns one list of `n` completions per prompt and
    what the rollout measured. The stream (`open_stream` ... `close_stream`) takes
    requests one by one, for a runtime that places them over ranks. Generation needs the
    engine awake. `sleep` gives its memory to the trainer and discards its weights;
    `update_weights` loads the policy of `version` and wakes it (also valid when awake).

    Requests are named by `RequestId` and seeded by it (`RequestId.seed`, from the
    sampling's step seed and group size), whichever call generates them.
    """

    drafting: DraftingState | None  # rhymectl's drafter; None for every other method

    def generate(self, prompts: Sequence[list[int]],
                 sampling: Sampling) -> RolloutResult: ...

    def generate_first(self, prompts: Sequence[list[int]], sampling: Sampling, keep: int,
                       pinned: Sequence[bool] = ()) -> RolloutResult: ...

    def open_stream(self, prompts: Sequence[list[int]], n: int) -> None: ...

    def submit(self, request: RequestId, prompt_ids: Sequence[int], sampling: Sampling, *,
               prompt_len: int | None = None) -> None: ...

    def step(self) -> list[tuple[RequestId, Completion]]: ...

    def busy(self) -> bool: ...

    def running(self) -> int: ...

    def close_stream(self) -> RolloutStats: ...

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]], version: int) -> None: ...

    def sleep(self) -> None: ...


__all__ = ["Completion", "DraftingState", "RequestId", "RolloutBackend", "RolloutResult",
           "RolloutStats", "Sampling"]
