"""Validation of a model directory before any heavy work."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.errors import UsageError

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
MANIFEST = "rhymectl_model.json"  # what `init-model` built a directory with


def built_manifest(path: str | Path) -> dict | None:
    """The record `init-model` left in the directory (None: it did not build it)."""
    try:
        manifest = json.loads((Path(path).expanduser() / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def model_config(model_dir: str | Path) -> dict:
    """The model's config.json ({} where it is not a JSON object). UsageError when that
    file cannot be read."""
    model_dir = Path(model_dir).expanduser()
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{model_dir}/config.json cannot be read ({exc}); rebuild the model "
                         f"directory") from None
    return config if isinstance(config, dict) else {}


def model_context(model_dir: str | Path) -> int | None:
    """The model's context in tokens: `max_position_embeddings` in its config.json (None
    where it names none). UsageError when that file cannot be read."""
    context = model_config(model_dir).get("max_position_embeddings")
    return context if isinstance(context, int) and not isinstance(context, bool) else None


def fix_hint(path: str | Path, key: str = "model.path") -> str:
    """How to mend a broken model directory: init-model rebuilds only folders it built (or
    empty ones); anything else is the user's and is never replaced."""
    p = Path(path).expanduser()
    if built_manifest(p) is not None or (p.is_dir() and not any(p.iterdir())):
        return f"rebuild it with `rhymectl init-model --out {path} --force` or point {key} elsewhere"
    return f"point {key} at a complete Hugging-Face model directory"


def check_model_dir(path: str | Path, key: str = "model.path") -> Path:
    """A local directory holding config.json, weights and a tokenizer.

    Hub names are not resolved here on purpose: cluster jobs should not download at start-up
    (and these machines cannot). `huggingface-cli download ORG/NAME --local-dir DIR` first.
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise UsageError(f"{key} = {path} does not exist; run `rhymectl init-model --out {path}` "
                         f"or point {key} at a local Hugging-Face model directory")
    if not p.is_dir():
        raise UsageError(f"{key} = {path} is a file; it must be a model directory")
    missing = []
    if not (p / "config.json").is_file():
        missing.append("config.json")
    if not any((p / f).is_file() for f in WEIGHT_FILES):
        missing.append("weights (model.safetensors)")
    if not any((p / f).is_file() for f in TOKENIZER_FILES):
        missing.append("tokenizer (tokenizer.json)")
    if missing:
        raise UsageError(f"{key} = {path} has no {', no '.join(missing)}; {fix_hint(path, key)}")
    return p
