"""The requests' own trees: a small suffix tree per running request of its prompt and output
alone, as vLLM's suffix method keeps one (`GroupDrafter` owns the requests; this module
decides when their own trees are fed and asked).

With siblings off it is a request's only live tree and is always used. With siblings on
it sits beside the prompt's tree, where the request's text is one sequence among its
siblings' and history's: a phrase the request keeps repeating is cut at `min_path_prob`
there, and counted alone in its own tree. `DrafterConfig.own_tree` says where it is asked:
"thin" (default) only in thin passes, the step's tail, where few requests run and a GPU
pass costs about the same whatever it verifies, so a full batch pays nothing for it;
"always"; "never". Measured in docs/speculation.md ("Trees").

The trees are built and fed after a pass, off the critical path, wherever the next pass
may ask them: once a pass is within twice the thin size, the first thin pass finds them
built. A tree holds the request's tokens up to its previous pass when it drafts (the newest
pass is held back, as for the prompt's tree); the drafts do not depend on when it was built.
"""

from __future__ import annotations

from typing import Iterator

from pipeline.drafting.inputs import DrafterConfig
from pipeline.drafting.live import LiveRequest, LiveSet
from pipeline.drafting.pass_caps import within
from pipeline.drafting.suffix_tree import SuffixTree


class OwnTrees:
    """When the running requests' own trees are fed and asked."""

    def __init__(self, config: DrafterConfig, live: LiveSet):
        self.config = config
        self._live = live
        self.last_pass = (False, 0)  # the last drafting pass: (own trees asked, largest cap)

    def asked(self, thin: bool, caps: list[int]) -> bool:
        """Whether a pass with these caps (thin: it is thin) asks the own trees; the pass
        is remembered for the work after it."""
        cfg = self.config
        asked = not cfg.use_siblings or cfg.own_tree == "always" \
            or (cfg.own_tree == "thin" and thin)
        self.last_pass = (asked, max(caps, default=0))
        return asked

    def _ahead(self) -> bool:
        """After a pass, with siblings: whether the running requests' own trees are built
        now (where they are in use, and within twice the thin size)."""
        cfg = self.config
        asked, cap = self.last_pass
        return asked or (cfg.own_tree == "thin"
                         and within(len(self._live.running), cap, 2 * cfg.thin_pass_tokens))

    def feed(self, req: LiveRequest, to_end: bool = False, create: bool = True) -> None:
        """The request's own tree (made on its first draft, or ahead of it) gets its
        tokens up to its previous pass (to its end with to_end, after a pass)."""
        if req.own is None:
            if not create:
                return
            req.own = SuffixTree(self.config.max_depth)
        stop = req.end if to_end else req.pending
        if req.own_pos < stop:
            req.own.extend(0, req.since(req.own_pos, stop))
            req.own_pos = stop
            req.trim()

    def after_pass_steps(self) -> Iterator[None]:
        """After a pass (a background job's steps): the running requests' own trees get
        the pass's tokens, and are built where the next passes may ask them."""
        if not self._live.own:
            return
        ahead = self.config.use_siblings and self._ahead()
        for req in self._live.running.values():
            self.feed(req, to_end=True, create=ahead)
            if ahead:
                yield
        yield


__all__ = ["OwnTrees"]
