"""The vocabulary shared by placement policies and whoever runs them (simulator or trainer).

One rollout step is a list of `GroupWork` (a prompt, its group size n, its predicted
response length). A `Placement` policy turns it into either a static plan (`assign`: an
ordered list of requests per worker) or a `Dispatcher`, which hands `Chunk`s to workers as
they free capacity. The runtime shows the dispatcher the workers through a `Cluster`: how
many requests each one runs, which one is least loaded, and `assign` to start a chunk.

Requests are addressed by position, `Request(group, sample)`; sample 0 of a group is the
one Seer launches first as the group's probe.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import Enum
from typing import ClassVar, NamedTuple, Protocol, Sequence

from pipeline.errors import UsageError
from pipeline.sched.load import LoadEstimate
from pipeline.sched.settings import PlacementParams


@dataclass(frozen=True)
class GroupWork:
    """One prompt's GRPO group in this step.

    predicted: tokens per response, from the length predictor; known: whether that came
    from this prompt's own history (False: the data set fallback); lengths: the true
    response lengths, known only to the simulator and the oracle policy.
    """

    prompt_id: str
    n: int
    predicted: float
    known: bool = True
    lengths: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.n < 1:
            raise ValueError(f"group {self.prompt_id!r}: n must be >= 1, got {self.n}")
        if not math.isfinite(self.predicted) or self.predicted < 0:
            raise ValueError(f"group {self.prompt_id!r}: predicted length must be a finite "
                             f"number >= 0, got {self.predicted}")
        if self.lengths is not None and len(self.lengths) != self.n:
            raise ValueError(f"group {self.prompt_id!r}: {len(self.lengths)} lengths for n={self.n}")


class Request(NamedTuple):
    """Response `sample` of `groups[group]`."""

    group: int
    sample: int


class RequestState(Enum):
    """Where a request of the step is, as a dispatcher tracks it.

    WAITING: not started (in the global queue); RUNNING: a chunk of it is on a worker;
    CONTINUING: a chunk stopped at its budget and the request awaits its next placement
    (same worker or a migration); FINISHED: its response is complete.
    """

    WAITING = "waiting"
    RUNNING = "running"
    CONTINUING = "continuing"
    FINISHED = "finished"


class Chunk(NamedTuple):
    """Run `request` for up to `budget` more tokens (None: until it finishes)."""

    request: Request
    budget: int | None = None


class Cluster(Protocol):
    """The workers as a dispatcher sees them; the runtime keeps it current."""

    workers: int
    capacity: int  # concurrent requests per worker (KV-cache capacity)

    def load(self, worker: int) -> int:
        """Requests running on `worker` now."""

    def least_loaded(self) -> int | None:
        """A worker with a free slot and the fewest running requests (lowest index on
        ties); None when every worker is full."""

    def assign(self, worker: int, chunk: Chunk) -> None:
        """Start `chunk` on `worker` now; it must have a free slot."""


class Dispatcher(ABC):
    """Hands out one step's work. The runtime calls `dispatch` at the start and after every
    `chunk_done`, with the workers whose slots were freed."""

    migrations: int = 0
    # Hints for a simulator that skips chunk boundaries where nothing can happen
    # (`pipeline.sched.events`). quiet_gap: a continuation stays where it runs unless its
    # worker runs at least this many more requests than the least-loaded one (None: any
    # boundary may matter).
    quiet_gap: int | None = None

    def movable_after(self, request: Request) -> float:
        """A boundary can move `request` only once it has generated more than this many
        tokens (math.inf: never; -1: at every boundary)."""
        return -1.0

    def stuck(self) -> bool:
        """Continuations wait for a free slot: then any worker's boundary may matter."""
        return False

    def stays(self, cluster: Cluster, worker: int, stopping: Sequence[tuple[Request, int]],
              finished: int) -> Sequence[Request]:
        """Of the requests `stopping` at a chunk boundary on `worker` now ((request,
        generated), in the order `chunk_done` would get them; `finished` others end there
        at the same moment), those `dispatch` would put back on `worker` before it places
        anything else. A simulator may leave them running instead (none by default)."""
        return ()

    @abstractmethod
    def dispatch(self, cluster: Cluster, freed: Sequence[int]) -> None:
        """Fill free slots by calling `cluster.assign`."""

    @abstractmethod
    def chunk_done(self, chunk: Chunk, worker: int, generated: int, finished: bool) -> None:
        """`chunk` stopped on `worker`: the request now has `generated` tokens; when not
        `finished` it reached its budget and must be placed again by the next dispatch."""

    @abstractmethod
    def pending(self) -> int:
        """Requests (or continuations) not yet handed out."""


class Placement(ABC):
    """A placement policy: small, stateless between steps except through `step`.

    Built per step with that step's `PlacementParams`; the registry
    (`pipeline.sched.registry`) finds it by `name`.
    """

    name: ClassVar[str]
    # its plan needs no prediction and no coordinator: each rollout worker runs its own
    # share of `assign` (static); the others run on a coordinator's `dispatcher`
    runs_locally: ClassVar[bool] = False
    # it places by the true lengths (GroupWork.lengths): a reference for the bench, never
    # something training can run
    needs_lengths: ClassVar[bool] = False

    def __init__(self, params: PlacementParams = PlacementParams()):
        self.params = params

    @abstractmethod
    def assign(self, groups: Sequence[GroupWork], workers: int, step: int = 0) -> list[list[Request]]:
        """A static plan: for each worker, the requests it runs, in order (shape [W][*]).
        Every request appears exactly once."""

    @abstractmethod
    def dispatcher(self, groups: Sequence[GroupWork], workers: int, step: int = 0) -> Dispatcher:
        """The online form of the policy, for a runtime with a `Cluster`."""


def requests_of(groups: Sequence[GroupWork]) -> list[Request]:
    """Every request of the step, group-major (the batch order veRL splits by position)."""
    return [Request(g, s) for g, group in enumerate(groups) for s in range(group.n)]


def check_workers(groups: Sequence[GroupWork], workers: int) -> None:
    """UsageError unless 1 <= workers <= the step's requests."""
    total = sum(g.n for g in groups)
    if total == 0:
        raise UsageError("the step has no requests to place")
    if workers < 1:
        raise UsageError(f"workers must be >= 1, got {workers}")
    if workers > total:
        raise UsageError(f"{workers} workers for {total} requests: give at most {total} "
                         f"workers or more requests")


def lpt(units: Sequence[list[Request]], lengths: Sequence[float], workers: int,
        params: PlacementParams) -> list[list[int]]:
    """Longest-processing-time-first dealing on predicted worker time.

    units: [U] lists of requests placed together; lengths: [U] predicted tokens per request
    of each unit. Returns [W] lists of unit indices: each unit, longest first, goes to the
    worker with the least predicted time so far (`LoadEstimate`, lowest index on ties).
    """
    estimate = LoadEstimate(workers, params.cost, params.capacity, params.length_floor)
    out: list[list[int]] = [[] for _ in range(workers)]
    for u in sorted(range(len(units)), key=lambda u: (-lengths[u], -len(units[u]), u)):
        w = estimate.best()
        out[w].append(u)
        estimate.add(w, lengths[u], len(units[u]))
    return out


def longest_first(plan: list[list[int]], units: Sequence[list[Request]],
                  lengths: Sequence[float]) -> list[list[Request]]:
    """Each worker's units as requests, longest predicted first."""
    return [[r for u in sorted(us, key=lambda u: (-lengths[u], u)) for r in units[u]] for us in plan]


def place_continuation(cluster: Cluster, own: int, gap: int) -> int | None:
    """Where a request that reached a chunk boundary on `own` runs its next chunk.

    It stays (its KV cache is there) unless the least-loaded worker runs at least `gap`
    fewer requests, which pays for re-prefilling prompt and partial output there. None
    when no worker has a free slot (the caller keeps it for a later dispatch).
    """
    target = cluster.least_loaded()
    if target is None:
        return None
    own_free = cluster.load(own) < cluster.capacity
    if target != own and (not own_free or cluster.load(own) - cluster.load(target) >= gap):
        return target
    return own if own_free else target
