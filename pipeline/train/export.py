"""The policy in Hugging-Face format, written one parameter at a time.

A 7B policy gathered whole, upcast to fp32 on the GPU and handed to `save_pretrained` as a
state dict costs 30 GB on rank 0's GPU and as much in host memory, and writes an fp32
checkpoint of a bf16 model. Here every parameter is gathered alone (ZeRO-3), copied to the
host in the model's dtype and added to the current safetensors shard; a full shard is
written and dropped. Host memory stays under one shard plus the largest parameter; the
device never holds more than one gathered parameter beyond the training state.

Files: `model.safetensors` when everything fits one shard, else
`model-0000k-of-0000N.safetensors` and `model.safetensors.index.json`, as transformers
writes them; `config.json` and `generation_config.json` beside them. vLLM and transformers
load either form.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Sequence

import torch
from safetensors.torch import save_file

from pipeline.atomic import write_atomic, write_json_atomic

SHARD_BYTES = 2 << 30
INDEX = "model.safetensors.index.json"


def plan_shards(sizes: Sequence[tuple[str, int]], shard_bytes: int = SHARD_BYTES) -> list[list[str]]:
    """Names in order, cut into shards of at most `shard_bytes` (a larger tensor alone)."""
    shards: list[list[str]] = [[]]
    used = 0
    for name, nbytes in sizes:
        if shards[-1] and used + nbytes > shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += nbytes
    return shards


def shard_names(count: int) -> list[str]:
    if count == 1:
        return ["model.safetensors"]
    return [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


def write_streamed(tensors: Iterable[tuple[str, torch.Tensor]], sizes: Sequence[tuple[str, int]],
                   out_dir: Path, shard_bytes: int = SHARD_BYTES) -> list[str]:
    """Write `tensors` (yielded in the order of `sizes`: (name, bytes)) as safetensors
    shards into `out_dir`; returns the file names. Each tensor is copied to the host as it
    arrives; a shard's tensors are released once it is written."""
    shards = plan_shards(sizes, shard_bytes)
    files = shard_names(len(shards))
    weight_map: dict[str, str] = {}
    total = 0
    stream = iter(tensors)
    for names, file in zip(shards, files):
        host: dict[str, torch.Tensor] = {}
        for expected in names:
            name, tensor = next(stream)
            if name != expected:
                raise RuntimeError(f"parameters arrived out of order: {name} for {expected}")
            host[name] = tensor.detach().to("cpu", copy=True).contiguous()
            total += host[name].numel() * host[name].element_size()
            weight_map[name] = file
        write_atomic(out_dir / file, lambda tmp, h=host: save_file(h, str(tmp),
                                                                   metadata={"format": "pt"}))
        del host
    if len(files) > 1:
        write_json_atomic(out_dir / INDEX, {"metadata": {"total_size": total},
                                            "weight_map": weight_map})
    return files


def write_configs(model, out_dir: Path) -> None:
    """config.json (and generation_config.json when the model has one) of a transformers
    model, with `dtype` as the weights are written."""
    model.config.save_pretrained(out_dir)
    generation = getattr(model, "generation_config", None)
    if generation is not None:
        try:
            generation.save_pretrained(out_dir)
        except ValueError:  # a generation config transformers itself would not save
            pass


def read_index(out_dir: Path) -> dict:
    """The shard index (tests, tools); {} for a single-file model."""
    path = out_dir / INDEX
    return json.loads(path.read_text()) if path.is_file() else {}


__all__ = ["plan_shards", "read_index", "shard_names", "write_configs", "write_streamed"]
