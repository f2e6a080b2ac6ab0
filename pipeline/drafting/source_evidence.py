"""How each draft source's drafts fared in the rollout so far (`spec.method:
history+group+model`): the trees' and the draft model's own estimates of their drafts'
accepted tokens against the tokens vLLM accepted. `ModelSource` scales each source's
estimates by it, so that a confident, wrong source (a one-layer draft of a real model's
text, trees on text that wanders) loses to the other and drafts less. Pure logic; the
evidence restarts with every rollout."""

from __future__ import annotations

from typing import Hashable

from pipeline.drafting.choice import MODEL, TREE, SourceDraft

CALIBRATION_PRIOR = 8.0  # tokens: how much evidence the sources' own estimates start with


class SourceEvidence:
    """Per source (TREE, MODEL): expected and accepted tokens of the rollout's drafts."""

    def __init__(self):
        self._evidence = {TREE: [0.0, 0.0], MODEL: [0.0, 0.0]}
        self._out: dict[Hashable, tuple[str, float]] = {}  # request -> its draft's source, E

    def ratio(self, source: str) -> float:
        """Accepted over expected tokens of this rollout's drafts from `source`, from
        CALIBRATION_PRIOR tokens that met their estimate; at most 1."""
        expected, accepted = self._evidence[source]
        return min(1.0, (accepted + CALIBRATION_PRIOR) / (expected + CALIBRATION_PRIOR))

    def calibrated(self, draft: SourceDraft | None, source: str) -> SourceDraft | None:
        """The draft with its first token's acceptance estimate scaled by `ratio(source)`
        (a draft's expected accepted tokens scale by the same factor; never up): what the
        priced rule weighs."""
        ratio = self.ratio(source)
        if draft is None or not draft.accept or ratio >= 1.0:
            return draft
        return SourceDraft(draft.tokens, (draft.accept[0] * ratio,) + draft.accept[1:])

    def sent(self, req_id: Hashable, source: str, expected: float) -> None:
        """The request's draft out this pass came from `source`, expected to have
        `expected` tokens accepted."""
        self._out[req_id] = (source, expected)

    def observe(self, req_id: Hashable, accepted: int) -> str | None:
        """The request's last draft had `accepted` tokens accepted: its source (None when
        no draft of it was out)."""
        out = self._out.pop(req_id, None)
        if out is None:
            return None
        source, expected = out
        evidence = self._evidence[source]
        evidence[0] += expected
        evidence[1] += accepted
        return source

    def forget(self, req_id: Hashable) -> None:
        self._out.pop(req_id, None)

    def reset(self) -> None:
        """A new rollout: the evidence restarts."""
        self.__init__()


__all__ = ["CALIBRATION_PRIOR", "SourceEvidence"]
