"""The placement policies by name, and `sched.policy` resolved for a run.

`POLICIES` is what `sched.policy` (besides `auto`), `bench sched --policies` and the
scripts choose from; `pipeline.config.schema.SchedConfig.policy` lists the names training
may run (every policy but those that need the true lengths; a unit test keeps the two
equal). A run resolves its policy once, at setup, into a `RolloutPlacement`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config.schema import SchedConfig
from pipeline.errors import UsageError
from pipeline.sched.placement import HistoPipePolicy, OraclePolicy, StaticPolicy
from pipeline.sched.seer import SeerPolicy
from pipeline.sched.settings import PlacementParams, PlacementSettings
from pipeline.sched.tier2 import Tier2Policy
from pipeline.sched.types import GroupWork, Placement

POLICIES: dict[str, type[Placement]] = {
    p.name: p for p in (StaticPolicy, HistoPipePolicy, Tier2Policy, SeerPolicy, OraclePolicy)}
AUTO = "auto"  # sched.policy: seer over several rollout workers


def policy_names() -> list[str]:
    return list(POLICIES)


def training_policy_names() -> list[str]:
    """The policies a training run can place with: those that need no true lengths."""
    return [name for name, p in POLICIES.items() if not p.needs_lengths]


def policy_class(name: str) -> type[Placement]:
    """The policy called `name` (UsageError listing the valid names otherwise)."""
    try:
        return POLICIES[name]
    except KeyError:
        raise UsageError(f"unknown placement policy {name!r}; choose from "
                         f"{', '.join(POLICIES)}") from None


def make_policy(name: str, params: PlacementParams = PlacementParams()) -> Placement:
    """The policy called `name`, for one step placed with `params`."""
    return policy_class(name)(params)


def resolve_policy_name(name: str, workers: int) -> str:
    """sched.policy for `workers` rollout workers: `auto` is seer when there is more than
    one; one worker runs the whole batch, under any policy, as the static split does."""
    if workers < 2:
        return StaticPolicy.name
    return SeerPolicy.name if name == AUTO else name


@dataclass(frozen=True)
class RolloutPlacement:
    """A run's placement: `sched.policy` resolved for its rollout workers (TP groups), with
    the settings every step's parameters are built from (`PlacementSettings.step_params`)."""

    policy: type[Placement]
    settings: PlacementSettings

    @classmethod
    def from_config(cls, sched: SchedConfig, workers: int) -> RolloutPlacement:
        """UsageError for a name the registry lacks or training cannot run."""
        if sched.policy != AUTO:
            wanted = policy_class(sched.policy)
            if wanted.needs_lengths:
                raise UsageError(f"sched.policy {sched.policy} needs every response's length in "
                                 f"advance, which training does not have (it is a reference for "
                                 f"`rhymectl bench sched`); choose from "
                                 f"{', '.join([AUTO, *training_policy_names()])}")
        policy = POLICIES[resolve_policy_name(sched.policy, workers)]
        return cls(policy, PlacementSettings.from_config(sched))

    @property
    def name(self) -> str:
        return self.policy.name

    @property
    def coordinated(self) -> bool:
        """Whether a coordinator hands the work out (`pipeline.loop.scheduled`); else each
        worker runs its own share of the policy's plan (`share`)."""
        return not self.policy.runs_locally

    def for_step(self, params: PlacementParams) -> Placement:
        return self.policy(params)

    def share(self, groups: int, n: int, worker: int, workers: int) -> list[int]:
        """For a policy that runs locally: the groups `worker` of `workers` runs in a step
        of `groups` groups of `n` requests, as batch positions in plan order. ValueError
        when the plan would split a group over workers (a batch the workers do not divide)."""
        if self.coordinated:
            raise ValueError(f"the {self.name} policy hands work out through a coordinator; "
                             f"it has no per-worker share")
        work = [GroupWork(str(g), n, 0.0, known=False) for g in range(groups)]
        plan = self.policy(PlacementParams()).assign(work, workers)[worker]
        mine = list(dict.fromkeys(r.group for r in plan))
        if len(plan) != n * len(mine):
            raise ValueError(f"the {self.name} plan splits a group over the workers: a batch "
                             f"of {groups} groups does not divide over {workers} workers")
        return mine


__all__ = ["AUTO", "POLICIES", "RolloutPlacement", "make_policy", "policy_class", "policy_names",
           "resolve_policy_name", "training_policy_names"]
