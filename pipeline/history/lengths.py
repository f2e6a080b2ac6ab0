"""Length evidence: what is known about the response lengths of each prompt.

Per prompt, the lengths (generated tokens) of its responses in earlier epochs, by epoch,
and the lengths of its requests that finished in the step at hand (its GRPO siblings, as
they end). Two readers predict from it:

- the draft budget's remaining-length estimate (`pipeline.drafting.remaining`: every
  length the prompt has, and the pool of every prompt's history);
- the placement's length predictor (`pipeline.sched.predictor`: the per-epoch lengths of
  the prompt's newest epochs, `pipeline.history.epochs`).

Prompts are keyed by `prompt_hash` of their token ids, as the history store, its index and
the drafter key them: it is the one key both readers have, since the proposer inside vLLM
sees token ids only and the placement predicts after the step's prompts were encoded. (A
bench's length trace keys them by its group ids.) Pure logic. Units: tokens.
"""

from __future__ import annotations

from typing import Iterator, Mapping, Sequence

LengthHistory = Mapping[str, Mapping[int, Sequence[int]]]  # prompt key -> epoch -> lengths


class LengthEvidence:
    """History lengths by epoch and this step's finished siblings, per prompt key.

    `version(key)` changes whenever `lengths(key)` may have changed and `history_version`
    whenever any prompt's history may have, so readers can cache what they derive.
    """

    def __init__(self, history: LengthHistory | None = None):
        self._history: dict[str, dict[int, list[int]]] = {}
        self._finished: dict[str, list[int]] = {}
        self._versions: dict[str, int] = {}
        self.history_version = 0
        for key, per_epoch in (history or {}).items():
            self.set_history(key, per_epoch)

    # -- writing ----------------------------------------------------------------------
    def set_history(self, key: str, per_epoch: Mapping[int, Sequence[int]]) -> None:
        """Make `per_epoch` (epoch -> lengths) the prompt's history."""
        self._history[key] = {int(e): [int(x) for x in ls] for e, ls in per_epoch.items()}
        self._changed(key)
        self.history_version += 1

    def add(self, key: str, epoch: int, length: int) -> None:
        """One more response of the prompt in `epoch` (a step that ended)."""
        self._history.setdefault(key, {}).setdefault(int(epoch), []).append(int(length))
        self._changed(key)
        self.history_version += 1

    def finished(self, key: str, length: int) -> None:
        """A request of the prompt finished in the step at hand with `length` tokens."""
        self._finished.setdefault(key, []).append(int(length))
        self._changed(key)

    def end_group(self, key: str) -> None:
        """The prompt's group ended: its finished siblings are no longer this step's."""
        if self._finished.pop(key, None) is not None:
            self._changed(key)

    # -- reading ----------------------------------------------------------------------
    def prompts(self) -> list[str]:
        """Keys of the prompts with history."""
        return list(self._history)

    def by_epoch(self, key: str) -> dict[int, list[int]]:
        """The prompt's history: epoch -> lengths ({} without history)."""
        return self._history.get(key, {})

    def lengths(self, key: str) -> list[int]:
        """Every length known for the prompt: its history's, then its finished siblings'."""
        out = [x for ls in self._history.get(key, {}).values() for x in ls]
        return out + self._finished.get(key, [])

    def history_lengths(self) -> Iterator[int]:
        """Every prompt's history lengths (the pool behind prompts without evidence)."""
        return (x for per_epoch in self._history.values() for ls in per_epoch.values()
                for x in ls)

    def version(self, key: str) -> int:
        return self._versions.get(key, 0)

    def _changed(self, key: str) -> None:
        self._versions[key] = self._versions.get(key, 0) + 1


__all__ = ["LengthEvidence", "LengthHistory"]
