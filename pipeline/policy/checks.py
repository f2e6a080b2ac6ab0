"""Validation of a model directory before any heavy work."""

from __future__ import annotations

from pathlib import Path

from pipeline.errors import UsageError

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


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
        raise UsageError(f"{key} = {path} has no {', no '.join(missing)}; rebuild it with "
                         f"`rhymectl init-model --out {path} --force` or point {key} elsewhere")
    return p
