"""The run directory: its identity (config + model fingerprints) and the checks that keep
one run from overwriting or resuming another.

    RUN_DIR/config.yaml     resolved config        RUN_DIR/run.json   fingerprints
    RUN_DIR/metrics.jsonl   one line per step      RUN_DIR/history/   rollout store
    RUN_DIR/checkpoints/step-NNNNNN/   complete checkpoints only (see train.checkpoint)
    RUN_DIR/index/          history index: last K epochs per prompt (see history.index)
    RUN_DIR/eval.jsonl      held-out evaluations   RUN_DIR/.writer.lock  the writer's lock

A run exists once run.json does: `start` writes it first, then config.yaml. A process
killed before run.json leaves nothing of its own but the lock, so `--resume` there starts
the run (Slurm requeues and job scripts that always pass --resume work even when the first
attempt died during start-up); one killed between the two leaves run.json, and resume
writes the missing config.yaml.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from pipeline.atomic import write_json_atomic, write_text_atomic
from pipeline.config import Config, to_dict, to_yaml
from pipeline.errors import UsageError, existing_part
from pipeline.loop.lock import LOCK_FILE

# Keys a resumed run may change without becoming a different run.
RESUMABLE_KEYS = ("run.dir", "train.total_steps", "run.checkpoint_every", "run.keep_checkpoints",
                  "run.eval_every", "run.threads")
OWN_ENTRIES = {"config.yaml", "run.json", "metrics.jsonl", "eval.jsonl", "history", "checkpoints",
               "report", "index"}


def config_fingerprint(cfg: Config) -> str:
    tree = to_dict(cfg)
    for key in RESUMABLE_KEYS:
        section, name = key.split(".")
        tree[section].pop(name, None)
    return hashlib.sha256(json.dumps(tree, sort_keys=True).encode()).hexdigest()[:16]


def model_fingerprint(model_dir: str | Path) -> str:
    """Config and tokenizer contents plus weight file names and sizes (cheap for 7B too)."""
    d = Path(model_dir)
    h = hashlib.sha256()
    # the chat template of data.chat_template: auto lives in tokenizer_config.json or, as
    # transformers 5 writes it, chat_template.jinja
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (d / name).is_file():
            h.update(name.encode() + (d / name).read_bytes())
    for f in sorted(d.glob("*.safetensors")) + sorted(d.glob("*.bin")):
        h.update(f"{f.name}:{f.stat().st_size}".encode())
    return h.hexdigest()[:16]


def data_fingerprint(cfg: Config) -> str | None:
    """A local `data.path`'s contents (a file's bytes; a folder's file names and sizes).
    None for the built-in task, whose rows follow from the config, and for a hub name."""
    if cfg.data.path is None:
        return None
    p = Path(cfg.data.path).expanduser()
    h = hashlib.sha256()
    if p.is_file():
        with open(p, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    elif p.is_dir():
        for f in sorted(x for x in p.rglob("*") if x.is_file()):
            h.update(f"{f.relative_to(p)}:{f.stat().st_size}".encode())
    else:
        return None
    return h.hexdigest()[:16]


def template_fingerprint(cfg: Config) -> str | None:
    """The contents of a `data.chat_template` file; None for auto and none (the config
    fingerprint has the setting, the model fingerprint the tokenizer's own template)."""
    choice = cfg.data.chat_template.strip()
    p = Path(choice).expanduser()
    if choice in ("auto", "none") or not p.is_file():
        return None
    return hashlib.sha256(p.read_bytes()).hexdigest()[:16]


def identity(cfg: Config) -> dict:
    return {"config": config_fingerprint(cfg), "model": model_fingerprint(cfg.model.path),
            "model_path": cfg.model.path, "data": data_fingerprint(cfg),
            "chat_template": template_fingerprint(cfg)}


def check_writable(run_dir: str | Path) -> None:
    """UsageError unless run.dir is a directory this process can write, or can be created
    as one: its nearest existing ancestor must be a writable directory."""
    d = Path(run_dir)
    probe = existing_part(d)
    if probe == d and not d.is_dir():
        raise UsageError(f"run.dir = {d} is a file; choose a directory")
    if not probe.is_dir():
        raise UsageError(f"run.dir = {d} cannot be created: {probe} is a file; choose another "
                         f"run.dir")
    if not os.access(probe, os.W_OK | os.X_OK):
        what = "is not writable" if probe == d else f"cannot be created: {probe} is not writable"
        raise UsageError(f"run.dir = {d} {what}; choose a directory you can write to")


def check_run_dir(cfg: Config, resume: bool, force: bool) -> None:
    """Refuse, before any work, to overwrite or resume a run that is not this one."""
    d = Path(cfg.run.dir)
    entries = {p.name for p in d.iterdir()} - {LOCK_FILE} if d.is_dir() else set()
    if d.exists() and not d.is_dir():
        raise UsageError(f"run.dir = {d} is a file; choose a directory")
    if not entries:  # nothing yet, or a start killed before its first write: `start` begins it
        return
    if "run.json" not in entries:
        raise UsageError(f"run.dir = {d} is not empty and holds no rhymectl run (no run.json); "
                         f"choose another run.dir")
    try:
        old = json.loads((d / "run.json").read_text())
    except (OSError, ValueError):
        raise UsageError(f"{d}/run.json is unreadable; remove the directory or choose another "
                         f"run.dir") from None
    if resume:
        new = identity(cfg)
        own_config = f"use the run's own config ({d}/config.yaml)"
        for key, what, fix in (("config", "config", own_config), ("model", "model", own_config),
                               ("data", "data set",
                                f"restore data.path = {cfg.data.path} as the run read it"),
                               ("chat_template", "chat template",
                                f"restore {cfg.data.chat_template} as the run read it")):
            if key in ("data", "chat_template") and key not in old:
                continue  # a run.json from before this fingerprint was recorded
            if old.get(key) != new[key]:
                raise UsageError(
                    f"--resume: {d} was written with another {what} (fingerprint {old.get(key)}, "
                    f"this one {new[key]}); {fix} or a new run.dir")
        return
    if not force:
        raise UsageError(f"run.dir = {d} already holds a run; pass --resume to continue it or "
                         f"--force to replace it")


def start(cfg: Config, resume: bool, force: bool) -> Path:
    """Create (or, with --force, clear) the run directory; rank 0 only."""
    d = Path(cfg.run.dir)
    if force and not resume and (d / "run.json").is_file():
        for entry in d.iterdir():
            if entry.name in OWN_ENTRIES:
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    d.mkdir(parents=True, exist_ok=True)
    fresh = not resume or not (d / "run.json").is_file()
    if resume and fresh:
        print(f"note: --resume: {d} holds no run yet (none was started, or the first start "
              f"was killed before it wrote anything); starting it", file=sys.stderr)
    if fresh:
        write_json_atomic(d / "run.json", identity(cfg))  # first: from here on the run exists
    if fresh or not (d / "config.yaml").is_file():
        write_text_atomic(d / "config.yaml", to_yaml(cfg))
    return d
