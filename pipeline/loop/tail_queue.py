"""Which prompts a step launches under tail batching (`sched.tail_batching`), and which
come back later.

Without tail batching a step trains on `PromptSource.batch(step)`. With it, the prompts
form one stream (epoch after epoch, each epoch shuffled as `PromptSource` shuffles it) and
a step training on G groups launches L = ceil(G (1 + overprovision)) of them (rounded up
to a multiple of the rollout workers, so each worker launches its share): first the
prompts deferred by earlier steps, oldest first, then fresh ones from the stream. The
rollout keeps, per worker, the first groups to complete and any prompt already deferred
`max_waits` times (pinned: the step waits for it), up to G in all; the others are stopped
and dropped, never trained on, and go to the back of the deferred queue, to be generated
afresh by a later step's policy. So every trained token comes from the policy of its step.

A launched prompt keeps the epoch it was drawn in (its history rows say that epoch), and
is a fresh `Prompt` object, so a prompt deferred from the end of one epoch and drawn again
in the next is two groups, not one. The queue's state is not stored: `replay` rebuilds it
from which (prompt, epoch) pairs the history says each step trained on.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

from pipeline.loop.batches import PromptSource
from pipeline.tasks.prompts import Prompt


@dataclass(frozen=True)
class Launched:
    prompt: Prompt  # a copy made for this launch (its own group)
    epoch: int  # the epoch it was drawn in
    waits: int  # steps it has been deferred

    @property
    def key(self) -> tuple[str, int]:
        return (self.prompt.id, self.epoch)


class TailQueue:
    def __init__(self, source: PromptSource, overprovision: float, max_waits: int, workers: int = 1):
        self.source, self.max_waits = source, max_waits
        per_worker = source.batch_size // workers
        self.keep = source.batch_size
        self.launch_size = math.ceil(per_worker * (1 + overprovision)) * workers
        self.position = 0  # next stream position
        self.deferred: deque[tuple[int, int, int]] = deque()  # (prompt index, epoch, waits)
        self._pending: list[tuple[int, int, int]] = []  # the last launch, until `settle`
        self._orders: dict[int, list[int]] = {}

    @property
    def epoch(self) -> int:
        """The epoch the stream is in (a step's `epoch` metric)."""
        return self.position // len(self.source.prompts)

    def _draw(self) -> tuple[int, int]:
        n = len(self.source.prompts)
        epoch, i = divmod(self.position, n)
        if epoch not in self._orders:
            self._orders = {epoch: self.source.order(epoch)}
        self.position += 1
        return self._orders[epoch][i], epoch

    def launch(self) -> list[Launched]:
        """The next step's launch: deferred prompts first, then fresh ones. Call `settle`
        with what it trained before the next `launch`."""
        picked = []
        while self.deferred and len(picked) < self.launch_size:
            picked.append(self.deferred.popleft())
        while len(picked) < self.launch_size:
            picked.append((*self._draw(), 0))
        self._pending = picked
        return [Launched(replace(self.source.prompts[i]), epoch, waits) for i, epoch, waits in picked]

    def pinned(self, launched: Sequence[Launched]) -> list[bool]:
        return [item.waits >= self.max_waits for item in launched]

    def settle(self, trained: Iterable[tuple[str, int]]) -> int:
        """The (prompt id, epoch) pairs the step trained on; the rest of its launch is
        deferred. Returns how many were deferred."""
        trained = set(trained)
        deferred = 0
        for i, epoch, waits in self._pending:
            if (self.source.prompts[i].id, epoch) not in trained:
                self.deferred.append((i, epoch, waits + 1))
                deferred += 1
        self._pending = []
        return deferred

    def replay(self, steps: Iterable[Iterable[tuple[str, int]]]) -> None:
        """Rebuild the state after the given steps from what each trained (a resume)."""
        for trained in steps:
            self.launch()
            self.settle(trained)


__all__ = ["Launched", "TailQueue"]
