"""Checkpoints that are complete or absent, never in between.

Every rank writes into `checkpoints/.tmp-step-NNNNNN/`; rank 0 then writes `state.json`
and renames the folder to `step-NNNNNN`. A crash at any point leaves only a `.tmp-` folder,
which `latest()` ignores and the next save replaces. Contents:

    ds/                     DeepSpeed engine and optimiser state (all ranks' shards)
    policy/                 the policy in Hugging-Face format (safetensors + tokenizer)
    rng-rank{R}.safetensors torch RNG state of rank R
    state.json              step, epoch, policy version, history position, world size,
                            what the checkpoint covers (see loop.commit) and `files`, every
                            file above with its size (a missing shard is detected on resume)
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from pipeline.atomic import write_json_atomic

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "chat_template.jinja")


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:06d}"


def tmp_dir(root: Path, step: int) -> Path:
    return root / f".tmp-step-{step:06d}"


def latest(root: Path) -> Path | None:
    """The newest complete checkpoint under `root`."""
    done = [p for p in root.glob("step-*") if (p / "state.json").is_file()]
    return max(done, key=lambda p: int(p.name.split("-")[1])) if done else None


def prepare(root: Path, step: int) -> Path:
    """Rank 0: a fresh temp folder for this step's checkpoint."""
    tmp = tmp_dir(root, step)
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "policy").mkdir(parents=True)
    return tmp


def save_rng(directory: Path, rank: int) -> None:
    py = random.getstate()
    save_file({"torch_cpu": torch.get_rng_state(),
               "python": torch.tensor(list(py[1]), dtype=torch.int64)},
              str(directory / f"rng-rank{rank}.safetensors"),
              metadata={"python_version": str(py[0]), "python_gauss": json.dumps(py[2])})


def load_rng(directory: Path, rank: int) -> None:
    path = directory / f"rng-rank{rank}.safetensors"
    if not path.is_file():
        return
    from safetensors import safe_open

    tensors = load_file(str(path))
    with safe_open(str(path), "pt") as fh:
        meta = fh.metadata()
    torch.set_rng_state(tensors["torch_cpu"])
    random.setstate((int(meta["python_version"]), tuple(tensors["python"].tolist()),
                     json.loads(meta["python_gauss"])))


def commit(root: Path, step: int, state: dict, model_dir: Path, keep: int) -> Path:
    """Rank 0, after every rank has written: tokenizer, state.json, rename, prune."""
    tmp = tmp_dir(root, step)
    for name in TOKENIZER_FILES:
        if (model_dir / name).is_file():
            shutil.copy2(model_dir / name, tmp / "policy" / name)
    state = {**state, "files": manifest(tmp)}
    write_json_atomic(tmp / "state.json", state)
    final = step_dir(root, step)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    done = sorted((p for p in root.glob("step-*") if (p / "state.json").is_file()),
                  key=lambda p: int(p.name.split("-")[1]))
    for old in done[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def read_state(directory: Path) -> dict:
    from pipeline.errors import UsageError

    try:
        state = json.loads((directory / "state.json").read_text())
    except (OSError, ValueError):
        raise UsageError(f"{directory}/state.json is unreadable; delete {directory} to resume "
                         f"from the checkpoint before it") from None
    return state


def manifest(directory: Path) -> dict[str, int]:
    """Every file under `directory` (relative path -> bytes), state.json excepted."""
    return {str(p.relative_to(directory)): p.stat().st_size
            for p in sorted(directory.rglob("*")) if p.is_file() and p.name != "state.json"}


def verify(directory: Path, state: dict) -> str | None:
    """What is wrong with a checkpoint against its manifest ("ds/x missing"), or None.
    Checkpoints written before the manifest existed are not checked."""
    for rel, size in (state.get("files") or {}).items():
        path = directory / rel
        if not path.is_file():
            return f"{rel} missing"
        if path.stat().st_size != size:
            return f"{rel} has {path.stat().st_size} bytes, {size} were written"
    return None
