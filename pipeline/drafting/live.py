"""Live-request bookkeeping for `GroupDrafter`: the requests running in one engine, the
GRPO group each belongs to, and the tokens each has generated that a tree has yet to get.

A running request's tokens feed up to three suffix trees (`pipeline.drafting.drafter` owns
them): its prompt's tree (with siblings on, its output, the newest pass held back while it
runs), the global tree (with siblings on, its output) and its own tree (prompt and
output, the newest pass held back: always with siblings off, with siblings as the drafter's
`own_tree` rule has it). Appending a token to a C++ tree costs
microseconds, and in a full batch the budget grants few drafts, so tokens are only
recorded here — one list per request, extended once per pass — and a tree receives them
when a request that reads it drafts: each tree's share is a slice from that tree's
position to the end. Requests whose tokens the global tree lacks are queued in the order
they first had tokens waiting, which is the order they reach that tree.

A group is the requests of one prompt in the current step, running or finished: a
finished sibling still predicts the stragglers. It ends when all of its requests have
finished (and at least as many as announced with `expect`); its members are then handed
back so the drafter can drop their sequences from the trees.

Positions count tokens from the start of the prompt. A request keeps positions `base` to
`end - 1`: everything some tree has not received yet, and at least the drafting context;
older tokens are dropped in chunks as the trees catch up.
"""

from __future__ import annotations

from enum import Enum
from typing import Hashable, Sequence

import numpy as np

TRIM_SLACK = 256  # tokens a request may keep beyond what it needs before they are cut


class LiveState(Enum):
    """RUNNING: in the engine, generating (in `LiveSet.running`); FINISHED: stopped, kept
    while its group still runs (its tokens still draft for the stragglers). A request
    leaves the table when its group ends or a restart of the same id replaces it."""

    RUNNING = "running"
    FINISHED = "finished"


class LiveRequest:
    """A running request (or a finished one whose group still runs).

    local_seq / local_pos: its sequence id in the prompt tree and the first position that
    tree has not received (None: it feeds no prompt-tree sequence); global_seq /
    global_pos: the same for the global tree; own / own_pos: its own tree (created on its
    first draft) and position; pending: where the newest appended tokens start (the own
    tree, and the prompt tree while the request runs, get tokens up to there only);
    sent: (tokens, cap, score) of its last draft; presumed: the draft it would get next pass if
    all of `sent` and the predicted next token are accepted (the drafter's cache).
    """

    __slots__ = ("req_id", "key", "state", "tokens", "base", "keep", "local_seq",
                 "local_pos", "global_seq", "global_pos", "own", "own_pos", "pending",
                 "sent", "presumed")

    def __init__(self, req_id: Hashable, key: str, tokens: list[int], keep: int):
        self.req_id = req_id
        self.key = key  # the prompt's key
        self.state = LiveState.RUNNING
        self.tokens = tokens  # prompt + output, from position `base` on
        self.base = 0
        self.keep = keep  # context tokens always kept
        self.local_seq: int | None = None
        self.local_pos: int | None = None
        self.global_seq: int | None = None
        self.global_pos: int | None = None
        self.own = None
        self.own_pos: int | None = None
        self.pending = len(tokens)
        self.sent: tuple[list[int], int, float] | None = None
        self.presumed = None

    @property
    def end(self) -> int:
        """Tokens so far (prompt + output)."""
        return self.base + len(self.tokens)

    def append(self, tokens: list[int]) -> None:
        self.pending = self.base + len(self.tokens)
        self.tokens += tokens

    def sure(self) -> bool:
        """Its last draft was accepted whole: the tokens appended since are that draft
        and the token the target sampled after it."""
        sent = self.sent
        if sent is None or not sent[0]:
            return False
        drafted = sent[0]
        new = self.base + len(self.tokens) - self.pending
        return new == len(drafted) + 1 and self.tokens[-new:-1] == drafted

    def context(self) -> list[int]:
        """The newest `keep` tokens (fewer while the request is shorter)."""
        return self.tokens[-self.keep:]

    def since(self, pos: int, stop: int | None = None) -> list[int]:
        """Tokens from position `pos` (to `stop`, or the end)."""
        base = self.base
        return self.tokens[pos - base:] if stop is None else self.tokens[pos - base:stop - base]

    def trim(self) -> None:
        """Drop tokens no tree needs any more, once there are enough of them."""
        need = self.base + len(self.tokens) - self.keep
        for pos in (self.local_pos, self.global_pos, self.own_pos):
            if pos is not None and pos < need:
                need = pos
        cut = need - self.base
        if cut > TRIM_SLACK:
            del self.tokens[:cut]
            self.base = need


class LiveSet:
    """The running requests of one engine and their groups.

    max_depth: the trees' depth (a request keeps max_depth + 1 context tokens); siblings:
    requests feed their prompt's tree; own: each may also feed a tree of its own (always
    without siblings), so its tokens are kept until that tree has them; to_global: they
    also feed the global tree (only with siblings).
    """

    def __init__(self, max_depth: int, siblings: bool, to_global: bool, own: bool = False):
        self.max_depth = max_depth
        self.siblings = siblings
        self.own = own or not siblings
        self.to_global = siblings and to_global
        self.running: dict[Hashable, LiveRequest] = {}
        self._groups: dict[str, list[LiveRequest]] = {}  # key -> running + finished
        self._expected: dict[str, int] = {}
        self._unsent: dict[LiveRequest, None] = {}  # global tree lacks tokens, in order
        # bumped whenever a request starts, gets tokens or stops: a tree fed from the
        # groups at one version has nothing new to take until it changes
        self.version = 0

    def expect(self, key: str, n: int) -> None:
        """`n` requests of prompt `key` form its group."""
        self._expected[key] = n

    def groups(self) -> list[tuple[str, list[LiveRequest]]]:
        """(prompt key, members) of every current group, in the order they started."""
        return list(self._groups.items())

    def members(self, key: str) -> list[LiveRequest]:
        """The current group of prompt `key` (empty when it has none)."""
        return self._groups.get(key, [])

    def start(self, req_id: Hashable, key: str, prompt_ids: list[int],
              output: list[int]) -> tuple[LiveRequest, list[LiveRequest]]:
        """Register a running request (or a resumed one, with its output so far).

        Returns it and the members it replaces (itself before a preemption), which have
        left the group: their tree sequences are the caller's to drop.
        """
        if req_id in self.running:
            raise ValueError(f"request {req_id!r} is already running")
        group = self._groups.setdefault(key, [])
        replaced = [m for m in group if m.req_id == req_id]
        for m in replaced:
            self._unsent.pop(m, None)
            group.remove(m)
        n_prompt = len(prompt_ids)
        req = LiveRequest(req_id, key, prompt_ids + output, self.max_depth + 1)
        if self.siblings:
            # the prompt-tree sequence starts at the response: the prompt's tokens are in
            # that tree already (its prompt and history sequences), and copies of them
            # would only raise counts the drafts do not depend on
            req.local_pos = n_prompt
            if self.to_global:
                req.global_pos = n_prompt
                if output:
                    self._unsent[req] = None
        if self.own:
            req.own_pos = 0
        req.pending = req.end - 1 if output else req.end
        self.version += 1
        group.append(req)
        self.running[req_id] = req
        return req, replaced

    def append_many(self, req_ids: Sequence[Hashable],
                    token_ids: Sequence[Sequence[int]]) -> None:
        """Tokens each request just generated (lists are taken as they are: vLLM's hold
        Python ints; other sequences are converted)."""
        running = self.running
        self.version += 1
        if not self.siblings:
            for req_id, toks in zip(req_ids, token_ids):
                if type(toks) is not list:
                    toks = _int_list(toks)
                if toks:
                    running[req_id].append(toks)
            return
        # The hot loop of a full batch: LiveRequest.append inlined.
        unsent = self._unsent if self.to_global else {}
        for req_id, req, toks in zip(req_ids, map(running.get, req_ids), token_ids):
            if type(toks) is not list:
                toks = _int_list(toks)
            if toks:
                if req is None:
                    raise KeyError(req_id)
                req.pending = req.base + len(req.tokens)
                req.tokens += toks
                unsent[req] = None

    def ends(self, req_ids: Sequence[Hashable]) -> list[int]:
        """Tokens so far (prompt + output) of each request; -1 for one not running."""
        running = self.running
        return [-1 if r is None else r.base + len(r.tokens) for r in map(running.get, req_ids)]

    def withdraw(self, req_id: Hashable) -> None:
        """The request leaves the running set but stays in its group, as though preempted:
        a `start` of the same id replaces it there."""
        if self.running.pop(req_id, None) is not None:
            self.version += 1

    def take_unsent(self) -> list[LiveRequest]:
        """Requests with tokens the global tree lacks, in order; the queue is emptied."""
        out = list(self._unsent)
        self._unsent.clear()
        return out

    def finish(self, req_id: Hashable) -> list[LiveRequest]:
        """The request stopped. Returns its group's members if that ended the group."""
        req = self.running.pop(req_id, None)
        if req is None:
            return []
        self.version += 1
        req.state = LiveState.FINISHED
        group = self._groups[req.key]
        finished = sum(1 for m in group if m.state is LiveState.FINISHED)
        expected = self._expected.get(req.key)
        if finished == len(group) and (expected is None or finished >= expected):
            return self.end_group(req.key)
        return []

    def end_group(self, key: str) -> list[LiveRequest]:
        """End prompt `key`'s group now. Returns its members, in order."""
        group = self._groups.pop(key, [])
        self.version += 1
        for m in group:
            self._unsent.pop(m, None)
        self._expected.pop(key, None)
        return group


def _int_list(tokens: Sequence[int]) -> list[int]:
    return tokens.tolist() if isinstance(tokens, np.ndarray) else [int(t) for t in tokens]


__all__ = ["LiveRequest", "LiveSet", "LiveState", "TRIM_SLACK"]
