"""The speculative methods `spec.method` may name: one registry that the config, the
engine, the drafter, the bench and the CLI all read.

- `none`: no speculation.
- `ngram`, `suffix`: vLLM's own proposers (prompt n-grams; vLLM's suffix cache).
- `history`, `group`, `history+group`: rhymectl's drafter behind vLLM's custom proposer,
  drafting from the prompt's earlier epochs, its live siblings, or both.
- `history+group+model`: the same trees and, beside them, a small draft model of the
  policy trained online on the rollouts; each pass chooses per request between the
  trees' draft, the model's and nothing (`pipeline.drafting.model_source`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Method:
    name: str
    vllm_method: str | None = None  # vLLM's own proposer that serves it (speculative_config)
    history: bool = False  # drafts from the prompt's responses in earlier epochs
    siblings: bool = False  # drafts from the live responses of the prompt's group
    model: bool = False  # a draft model of the policy, trained online, beside the trees

    @property
    def drafter(self) -> bool:
        """Served by rhymectl's drafter (`pipeline.drafting`) rather than by vLLM."""
        return self.history or self.siblings


REGISTRY: dict[str, Method] = {m.name: m for m in (
    Method("none"),
    Method("ngram", vllm_method="ngram"),
    Method("suffix", vllm_method="suffix"),
    Method("history", history=True),
    Method("group", siblings=True),
    Method("history+group", history=True, siblings=True),
    Method("history+group+model", history=True, siblings=True, model=True),
)}

METHODS: tuple[str, ...] = tuple(REGISTRY)
DRAFTER_METHODS: tuple[str, ...] = tuple(n for n, m in REGISTRY.items() if m.drafter)


def method(name: str) -> Method:
    """The registered method; KeyError naming the valid ones otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown speculative method {name!r}; expected one of "
                       f"{', '.join(METHODS)}") from None


__all__ = ["DRAFTER_METHODS", "METHODS", "Method", "REGISTRY", "method"]
