"""What a draft budget is: the rule that decides how many draft tokens each request gets in
the next forward pass (`spec.budget`; the rules are registered in `pipeline.drafting.build`).

The proposer drives every rule the same way, once per pass, in two stages:

1. `ask(req_ids, available, rows, remaining)` -> tokens to ask the drafter for, per
   candidate (0: do not draft it). available[j]: tokens candidate j may draft (room left in
   its sequence, at most the engine's cap); rows: sequences in the pass, each of which
   schedules one token besides its draft; remaining: the drafter's remaining-length estimate,
   `remaining(req_ids) -> [(mean, std)]` in tokens, for rules that need it.
2. `grant(drafts)` -> tokens kept of each draft (a prefix), given the drafter's drafts for
   the candidates of the last `ask` (empty where nothing was asked or found; not called
   when `ask` asked for nothing). A rule that sizes drafts before seeing them keeps them
   whole.

Then, per request, `observe(req_id, proposed, accepted)` when a kept draft was verified
(`accepted` of its `proposed` tokens), and `forget(req_id)` when the request stopped; per
pass, `observe_pass(tokens, seconds)` for each decode pass the engine measured.
`calibration()` reports what a rule learned about acceptance (None when it learns nothing);
`state()` / `load_state()` carry what it learned through a checkpoint.
A rule that keeps no evidence inherits the no-ops below.

`fixed_caps`: the rule asks every request for the same number of tokens whatever happened
since its last draft, so the drafter may work out each request's next draft ahead
(`GroupDrafter.after_pass(presume=...)`); drafts are the same either way.

A new rule is one module with a subclass of `Budget` (its `from_spec` reads the `spec`
section) and one entry in `pipeline.drafting.build.BUDGETS` under the name `spec.budget`
gives it (also allowed by the schema's Literal).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING, Callable, Hashable, Protocol, Sequence

if TYPE_CHECKING:
    from pipeline.config.schema import SpecConfig
    from pipeline.drafting.suffix_tree import Draft

# (mean, std) predicted remaining output tokens of each request, in order
Remaining = Callable[[Sequence[Hashable]], Sequence[tuple[float, float]]]


class Budget(Protocol):
    """A draft-length rule (see the module docstring for when each method is called)."""

    fixed_caps: bool = False

    @classmethod
    @abstractmethod
    def from_spec(cls, spec: SpecConfig) -> Budget:
        """The rule as the validated `spec` config section sets it up."""

    @abstractmethod
    def ask(self, req_ids: Sequence[Hashable], available: Sequence[int], rows: int,
            remaining: Remaining) -> list[int]:
        """Stage 1: draft tokens to ask the drafter for, per candidate (0: none)."""

    def grant(self, drafts: Sequence[Draft]) -> list[int]:
        """Stage 2: tokens kept of each draft of the last `ask`'s candidates (a prefix)."""
        return [len(d.token_ids) for d in drafts]

    def observe(self, req_id: Hashable, proposed: int, accepted: int) -> None:
        """The request's last kept draft of `proposed` tokens had `accepted` accepted."""

    def forget(self, req_id: Hashable) -> None:
        """The request stopped: its evidence goes."""

    def observe_pass(self, tokens: int, seconds: float) -> None:
        """A decode pass of `tokens` scheduled tokens took `seconds` (the engine's meter)."""

    def calibration(self) -> dict | None:
        """What the rule learned about acceptance, for reports; None when nothing."""
        return None

    def state(self) -> dict | None:
        """Everything the rule learned that decides later drafts (JSON-friendly), saved
        with a checkpoint so that `--resume` drafts as the uninterrupted run; None when
        it learns nothing. Called between steps, when no request is running."""
        return None

    def load_state(self, state: dict) -> None:
        """Continue from `state()` of a rule of the same kind and settings."""


__all__ = ["Budget", "Remaining"]
