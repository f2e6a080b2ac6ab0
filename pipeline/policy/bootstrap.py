"""`init-model`: tokenizer + tiny model + SFT warm-up, saved in Hugging-Face format.

The output directory is built in a temp folder beside it and renamed into place, so a
crash never leaves a directory that looks like a model but is not. `rhymectl_model.json`
records what built it; a second call with the same settings returns at once. Only an
empty or new folder, or one that init-model built, is ever replaced (one built with other
settings only with `force`): the folder is removed before the new model takes its place.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Protocol

import torch

from pipeline.errors import UsageError, existing_part
from pipeline.policy.checks import MANIFEST, built_manifest
from pipeline.policy.model import TinyArch, build_model, count_parameters
from pipeline.policy.sft import (SFTSettings, encode_pairs, greedy_generate, heldout_exact,
                                 heldout_loss, run_sft)
from pipeline.policy.tokenizer import train_char_tokenizer
from pipeline.tasks.base import get_task, task_names

BUILD_VERSION = 2  # bump when the recipe changes, so stale caches are rebuilt


class BuildSpec(Protocol):
    """What a cached build is keyed by: `InitOptions`, or a family model's options."""

    def fingerprint(self) -> str: ...


def default_sft() -> SFTSettings:
    """The tiny policy's warm-up: 400 scheduled steps, stopped where 45 % of the held-out
    prompts' reference solutions are the model's greedy output (teacher-forced argmax,
    `sft.heldout_exact`; checked every 10 steps from 300 on, at most 800 steps). The
    warm-up sits on the steep part of its accuracy curve, where a fixed step count or a
    loss target lands at machine-dependent accuracy (49 % on one CPU kind, 38 % on
    another); RL then starts near 50 % on any machine."""
    return SFTSettings(target_exact=0.45, min_steps=300, max_steps=800, check_every=10)


@dataclass(frozen=True)
class InitOptions:
    task: str = "sort"
    seed: int = 0
    arch: TinyArch = field(default_factory=TinyArch)
    sft: SFTSettings = field(default_factory=default_sft)
    sft_rows: int = 20000
    eval_rows: int = 256

    def fingerprint(self) -> str:
        blob = json.dumps({"v": BUILD_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cached_manifest(out: Path, spec: BuildSpec) -> dict | None:
    """The manifest of `out` if it was built with exactly `spec`, else None."""
    try:
        manifest = json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("fingerprint") != spec.fingerprint():
        return None
    if not (out / "model.safetensors").is_file() or not (out / "tokenizer.json").is_file():
        return None
    return manifest


def check_target(out: Path, spec: BuildSpec, force: bool) -> None:
    """UsageError unless the model may be written to `out`: a new or empty folder, or one
    init-model built (with other settings: only with `force`). Checked before the build."""
    if not force and cached_manifest(out, spec):
        return  # a cache hit writes nothing
    probe = existing_part(out)
    if not probe.is_dir():
        where = "is a file" if probe == out else f"cannot be created: {probe} is a file"
        raise UsageError(f"--out {out} {where}; give a folder for the model")
    if probe != out or not any(out.iterdir()):
        return
    built = built_manifest(out)
    if built is None:
        raise UsageError(f"--out {out} holds files that init-model did not write (no {MANIFEST}); "
                         f"give a new or empty folder")
    if not force:
        raise UsageError(f"--out {out} holds a model built with other settings "
                         f"({built_settings(built)}); pass --force to replace it, or give another folder")


def built_settings(built: dict) -> str:
    """What a manifest says a model was built from, in a few words."""
    if "gguf" in built:
        return f"from {built['gguf']}, {built.get('dtype')}"
    what = f"family {built['family']}" if "family" in built else f"task {built.get('task')}"
    return f"{what}, seed {built.get('seed')}"


def held_out_rows(task_name: str, seed: int, n: int, exclude_ids: set[str]) -> list[dict]:
    """Prompts from a different seed that the SFT data never contained."""
    rows = get_task(task_name).generate(n * 3, seed + 7919)
    return [r for r in rows if r["id"] not in exclude_ids][:n]


def init_model(out: Path, spec: InitOptions, force: bool = False,
               on_sft_step: Callable[[int, float], None] | None = None) -> dict:
    """Build (or reuse) the tiny policy in `out`; returns its manifest."""
    if not force and (hit := cached_manifest(out, spec)):
        return {**hit, "cached": True}
    get_task(spec.task)  # fail fast on an unknown task
    check_target(out, spec, force)
    started = time.time()
    torch.manual_seed(spec.seed)
    texts = [r["prompt"] + r["solution"] for name in task_names()
             for r in get_task(name).generate(500, spec.seed)]
    tokenizer = train_char_tokenizer(texts)
    model = build_model(tokenizer, spec.arch, spec.seed)
    sft_rows = get_task(spec.task).generate(spec.sft_rows, spec.seed)
    evals = held_out_rows(spec.task, spec.seed, spec.eval_rows, {r["id"] for r in sft_rows})
    losses = run_sft(model, tokenizer, sft_rows, spec.sft, on_sft_step, heldout=evals)
    heldout = heldout_loss(model, encode_pairs(tokenizer, evals), tokenizer.pad_token_id)
    accuracy = greedy_accuracy(model, tokenizer, spec.task, evals, spec.arch.max_positions)
    manifest = {
        "fingerprint": spec.fingerprint(),
        "task": spec.task,
        "seed": spec.seed,
        "parameters": count_parameters(model),
        "arch": spec.arch.to_dict(),
        "sft": {"steps": len(losses), "scheduled_steps": spec.sft.steps,
                "target_loss": spec.sft.target_loss, "target_exact": spec.sft.target_exact,
                "loss_first": losses[0],
                "loss_last": losses[-1], "loss_min": min(losses),
                "loss_curve": summary_curve(losses)},
        "heldout": {"prompts": len(evals), "greedy_accuracy": accuracy,
                    "exact": round(heldout_exact(model, encode_pairs(tokenizer, evals),
                                                 tokenizer.pad_token_id), 5),
                    "loss": round(heldout, 5)},
        "build_seconds": round(time.time() - started, 1),
    }
    save_atomically(out, manifest, lambda tmp: (model.save_pretrained(tmp, safe_serialization=True),
                                                tokenizer.save_pretrained(tmp)))
    return {**manifest, "cached": False}


def greedy_accuracy(model, tokenizer, task_name: str, rows: list[dict], max_positions: int) -> float:
    task = get_task(task_name)
    responses = greedy_generate(model, tokenizer, [r["prompt"] for r in rows],
                                max_new_tokens=max_positions - 32)
    hits = [task.is_correct(r["prompt"], resp, r["answer"]) for r, resp in zip(rows, responses)]
    return sum(hits) / max(1, len(hits))


def summary_curve(losses: list[float], points: int = 10) -> list[float]:
    stride = max(1, len(losses) // points)
    return [round(sum(losses[i: i + stride]) / len(losses[i: i + stride]), 4)
            for i in range(0, len(losses), stride)]


def save_atomically(out: Path, manifest: dict, write: Callable[[Path], object]) -> None:
    """`write(folder)` saves the model and tokenizer; the folder, with the manifest, then
    replaces `out` in one rename."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        write(tmp)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
