"""The placement knobs, and one step's placement parameters built from them.

`PlacementSettings` is what a user sets (the `sched` config section, the `bench sched`
options); its defaults are the config schema's (`pipeline.config.schema.SchedConfig`), the
one place they are written. Every step turns the settings into `PlacementParams`, what a
policy places that step with: the migrate gap resolved for the step's requests per worker,
the pass-cost model, the workers' capacity and the length floor of the load model
(`pipeline.sched.load.LoadEstimate`). Training and both benches build them the same way
(`PlacementSettings.step_params`), so the benches measure the policy that training runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.config.schema import RolloutConfig, SchedConfig
from pipeline.costs import SCHED_COST, CostModel

if TYPE_CHECKING:
    from pipeline.sched.predictor import LengthPredictor

_SCHED = SchedConfig()


def auto_migrate_gap(requests_per_worker: int) -> int:
    """`sched.migrate_gap: null`: a continuation moves only if that frees about an eighth of
    a worker's batch: round(requests_per_worker / 8), at least 2 (a move from L to L - 1
    requests only swaps the load, and re-prefilling is not free) and at most 8. Measured in
    docs/scheduling.md: with 8-16 requests a worker a gap of 8 could hardly ever move a
    straggler; with about 100, small gaps moved thousands of requests and made the step
    7-11 % longer."""
    return max(2, min(8, round(requests_per_worker / 8)))


@dataclass(frozen=True)
class PlacementSettings:
    """The placement knobs (`sched.*`, documented there).

    chunk_tokens: tokens a request runs before the next placement decision (seer,
    histopipe); migrate_gap: a continuation moves to the least-loaded worker only when that
    one runs at least this many fewer requests (None: `auto_migrate_gap`);
    tier2_workers_frac, tier2_max_seqs: tier2's reserved share of the workers and sequences
    per reserved worker (`pipeline.sched.tier2`).
    """

    chunk_tokens: int = _SCHED.chunk_tokens
    migrate_gap: int | None = _SCHED.migrate_gap
    tier2_workers_frac: float = _SCHED.tier2_workers_frac
    tier2_max_seqs: int = _SCHED.tier2_max_seqs

    @classmethod
    def from_config(cls, sched: SchedConfig) -> PlacementSettings:
        return cls(chunk_tokens=sched.chunk_tokens, migrate_gap=sched.migrate_gap,
                   tier2_workers_frac=sched.tier2_workers_frac,
                   tier2_max_seqs=sched.tier2_max_seqs)

    def step_params(self, predictor: LengthPredictor, requests_per_worker: int, *, capacity: int,
                    cost: CostModel = SCHED_COST) -> PlacementParams:
        """The parameters of a step whose workers each hold about `requests_per_worker`
        requests, `capacity` at a time: `length_floor` is the length the longest of them
        probably reaches anyway (`LengthPredictor.typical_max`)."""
        return PlacementParams(chunk_tokens=self.chunk_tokens, cost=cost, capacity=capacity,
                               length_floor=predictor.typical_max(requests_per_worker),
                               migrate_gap=self.migrate_gap or auto_migrate_gap(requests_per_worker),
                               tier2_workers_frac=self.tier2_workers_frac,
                               tier2_max_seqs=self.tier2_max_seqs)


_DEFAULT = PlacementSettings()


@dataclass(frozen=True)
class PlacementParams:
    """What a policy places one step with (each reads the fields it needs).

    The settings, with migrate_gap resolved; cost, capacity (concurrent requests per
    worker) and length_floor (the length a worker's longest response will probably reach
    anyway) are what the policies balance predicted worker time with
    (`pipeline.sched.load.LoadEstimate`). The defaults are the default settings' on the
    bench's default step (`sched.sim_requests_per_worker` requests per worker, the
    default `rollout.max_num_seqs`, the built-in cost model, no history).
    """

    chunk_tokens: int = _DEFAULT.chunk_tokens
    migrate_gap: int = _DEFAULT.migrate_gap or auto_migrate_gap(_SCHED.sim_requests_per_worker)
    cost: CostModel = SCHED_COST
    capacity: int = RolloutConfig().max_num_seqs
    length_floor: float = 0.0
    tier2_workers_frac: float = _DEFAULT.tier2_workers_frac
    tier2_max_seqs: int = _DEFAULT.tier2_max_seqs

    def __post_init__(self):
        if not 0 <= self.tier2_workers_frac < 1:
            raise ValueError(f"tier2_workers_frac must be in [0, 1), got {self.tier2_workers_frac}")
        if self.tier2_max_seqs < 1:
            raise ValueError(f"tier2_max_seqs must be >= 1, got {self.tier2_max_seqs}")
        if self.chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be >= 1, got {self.chunk_tokens}")
        if self.migrate_gap < 1:
            raise ValueError(f"migrate_gap must be >= 1, got {self.migrate_gap}")
        if self.capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {self.capacity}")


__all__ = ["PlacementParams", "PlacementSettings", "auto_migrate_gap"]
