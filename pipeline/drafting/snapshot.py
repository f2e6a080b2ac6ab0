"""The drafter's state between two RL steps, as a checkpoint holds it: what `--resume`
needs to draft, pass for pass, as the uninterrupted run would have.

Between steps no request is running, and what decides the next step's drafts is:

- each prompt held (`PromptTable.prompts`): its prompt ids, its history entries (tokens,
  reward copies), whether it is parked, and which of its entries the global tree holds;
- the global tree's history sequences, oldest first (its FIFO decides what the cap drops
  next);
- which prompts have a tree, in LRU order;
- the length evidence (`LengthEvidence`: every prompt's history lengths, the pool the
  remaining-length estimate of a prompt without history draws from);
- the draft budget's learned state (`Budget.state()`).

A C++ suffix tree cannot be saved, and its drafts depend on more than what it holds: it
breaks ties between children of equal count by the order their counts changed in, so a
tree that saw live siblings come and go can draft otherwise than one built from the same
history. So `canonicalize` rebuilds every tree from what it holds (prompt trees from their
history, the global tree from its FIFO) before the state is taken, and `restore` builds
them the same way: at that point the uninterrupted run and the resumed one hold identical
trees. Tokens are stored as int32 arrays (safetensors), the rest as JSON; nothing here
executes what it reads. Pure logic over the drafter's parts; no vLLM.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pipeline.atomic import write_atomic, write_json_atomic
from pipeline.drafting.prompt_state import HistoryEntry, PromptState

if TYPE_CHECKING:
    from pipeline.drafting.budget_api import Budget
    from pipeline.drafting.drafter import GroupDrafter

FORMAT = 1
STATE_DIR = "drafting"  # in a checkpoint folder: rank-R.json and rank-R.safetensors


def canonicalize(drafter: GroupDrafter) -> None:
    """Rebuild every tree the drafter holds from what it holds (see the module docstring).
    Called between steps, on every run alike, just before `capture`."""
    drafter.settle()
    table = drafter._table
    if drafter._live.running:
        raise RuntimeError("the drafter's state is taken between steps, with no request running")
    depth = drafter.config.max_depth
    for key in table.trees:
        p = table.prompts[key]
        table.graveyard.append(p.free_tree())
        p.build_tree(depth)
    table.stale.clear()
    table.global_tree.rebuild()
    for _ in table.bury():
        pass


def capture(drafter: GroupDrafter, budget: Budget) -> tuple[dict, dict[str, np.ndarray]]:
    """(JSON-friendly description, int32 token arrays) of the drafter's state."""
    drafter.settle()
    table = drafter._table
    owners: dict[int, tuple[int, int]] = {}  # id of an entry's global id list -> its place
    prompts, prompt_ids, tokens = [], [], []
    for i, p in enumerate(table.prompts.values()):
        entries = []
        for j, h in enumerate(p.history):
            owners[id(h.global_seqs)] = (i, j)
            entries.append([int(len(h.tokens)), int(h.copies)])
            tokens.append(np.asarray(h.tokens, dtype=np.int32))
        ids = p.prompt_ids
        prompts.append({"key": p.key, "parked": bool(p.parked),
                        "prompt_len": -1 if ids is None else len(ids), "entries": entries})
        if ids is not None:
            prompt_ids.append(np.asarray(ids, dtype=np.int32))
    fifo = []
    for owner, _ in table.global_tree.history():
        place = owners.get(id(owner))
        if place is None:
            raise RuntimeError("a global-tree sequence belongs to no prompt the drafter holds")
        fifo.append(list(place))
    index = {key: i for i, key in enumerate(table.prompts)}
    lengths = drafter.lengths
    meta = {"format": FORMAT, "prompts": prompts, "global_fifo": fifo,
            "trees": [index[k] for k in table.trees],
            "lengths": [[key, {str(e): ls for e, ls in lengths.by_epoch(key).items()}]
                        for key in lengths.prompts()],
            "budget": budget.state()}
    arrays = {"prompt_ids": _concat(prompt_ids), "history_tokens": _concat(tokens)}
    return meta, arrays


def restore(drafter: GroupDrafter, budget: Budget, meta: dict,
            arrays: dict[str, np.ndarray]) -> None:
    """Give a new drafter (nothing held yet) and budget the state `capture` took.
    ValueError when the description and the arrays do not fit together."""
    if meta.get("format") != FORMAT:
        raise ValueError(f"drafter state format {meta.get('format')!r}, expected {FORMAT}")
    drafter.settle()
    table = drafter._table
    if table.prompts or drafter._live.running:
        raise ValueError("a drafter state is restored into a new drafter only")
    prompt_ids = _split(arrays["prompt_ids"], [p["prompt_len"] for p in meta["prompts"]
                                               if p["prompt_len"] >= 0])
    sizes = [n for p in meta["prompts"] for n, _ in p["entries"]]
    tokens = _split(arrays["history_tokens"], sizes)
    states: list[PromptState] = []
    for p in meta["prompts"]:
        state = table.get(p["key"])
        if p["prompt_len"] >= 0:
            state.prompt_ids = next(prompt_ids).tolist()
        state.history = [HistoryEntry(next(tokens), int(c)) for _, c in p["entries"]]
        state.parked = bool(p["parked"])
        states.append(state)
    table.global_tree.rebuild((states[i].history[j].global_seqs, states[i].history[j].tokens)
                              for i, j in meta["global_fifo"])
    depth = drafter.config.max_depth
    for i in meta["trees"]:
        states[i].build_tree(depth)
        table.trees[states[i].key] = None
    for key, per_epoch in meta["lengths"]:
        drafter.lengths.set_history(key, {int(e): ls for e, ls in per_epoch.items()})
    if meta.get("budget") is not None:
        budget.load_state(meta["budget"])


def save(drafter: GroupDrafter, budget: Budget, directory: Path, rank: int) -> list[Path]:
    """`canonicalize`, then `capture` into DIR/drafting/rank-R.{json,safetensors}
    (atomic writes). Returns the files written."""
    from safetensors.numpy import save_file

    canonicalize(drafter)
    meta, arrays = capture(drafter, budget)
    folder = Path(directory) / STATE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    json_path, tensors_path = state_files(directory, rank)
    write_atomic(tensors_path, lambda tmp: save_file(arrays, str(tmp)))
    write_json_atomic(json_path, meta)
    return [json_path, tensors_path]


def load(drafter: GroupDrafter, budget: Budget, directory: Path, rank: int) -> bool:
    """`restore` from the files `save` wrote in DIR; False when DIR has none (a
    checkpoint written without them). ValueError when they are damaged."""
    from safetensors.numpy import load_file

    json_path, tensors_path = state_files(directory, rank)
    if not json_path.is_file():
        return False
    try:
        meta = json.loads(json_path.read_text())
        arrays = load_file(str(tensors_path))
        restore(drafter, budget, meta, arrays)
    except Exception as exc:  # noqa: BLE001 — json's, safetensors' and the layout's errors
        raise ValueError(f"{json_path.parent}: the drafter's state cannot be read ({exc})") \
            from exc
    return True


def state_files(directory: Path, rank: int) -> tuple[Path, Path]:
    folder = Path(directory) / STATE_DIR
    return folder / f"rank-{rank}.json", folder / f"rank-{rank}.safetensors"


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts).astype(np.int32) if parts else np.zeros(0, dtype=np.int32)


def _split(flat: np.ndarray, sizes: list[int]):
    """The pieces of `flat` of these sizes, one after the other (ValueError if they do
    not add up)."""
    flat = np.asarray(flat, dtype=np.int32)
    if sum(sizes) != len(flat):
        raise ValueError(f"drafter state: {len(flat)} tokens stored, {sum(sizes)} described")
    start = 0
    for n in sizes:
        yield flat[start:start + n].copy()
        start += n


__all__ = ["FORMAT", "STATE_DIR", "canonicalize", "capture", "load", "restore", "save",
           "state_files"]
