"""A `pipeline.drafting.draft_train.DraftTrainer`'s whole state in one safetensors file
(no pickle), for checkpoints: the model's weights, AdamW's moments, the trainer's counters,
its token counts (the draft vocabulary's source) and the rollouts of its window with their
teachers. `load_state` gives back a trainer whose next `train` call and every draft are
those of the trainer that was saved.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch

from pipeline.drafting.draft_model import DraftModel, DraftShape
from pipeline.drafting.draft_train import DraftTrainer, TrainSettings
from pipeline.train.teacher import Teacher

FORMAT = "rhymectl-draft-model/1"  # the safetensors metadata tag of `save_state`


def save_state(trainer: DraftTrainer, path: str | Path) -> None:
    """The model's weights, AdamW's moments and the trainer's counters in one safetensors
    file at `path` (written in place: the caller's checkpoint writes atomically)."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {f"weight.{n}": p.detach().cpu().contiguous()
                                        for n, p in trainer.model.named_parameters()}
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    for p, st in trainer.opt.state.items():
        n = names[id(p)]
        tensors[f"adam.{n}.exp_avg"] = st["exp_avg"].cpu().contiguous()
        tensors[f"adam.{n}.exp_avg_sq"] = st["exp_avg_sq"].cpu().contiguous()
        tensors[f"adam.{n}.step"] = torch.as_tensor(st["step"], dtype=torch.float32,
                                                    device="cpu").reshape(1)
    tensors["vocab.counts"] = trainer.counts.contiguous()
    for k, step in enumerate(trainer.window):
        for part, name in ((0, "prompts"), (1, "responses")):
            seqs = [pair[part] for pair in step]
            tensors[f"window.{k}.{name}"] = torch.cat(seqs) if seqs else \
                torch.zeros(0, dtype=torch.int32)
            tensors[f"window.{k}.{name}_len"] = torch.tensor([len(x) for x in seqs],
                                                            dtype=torch.int64)
        taught = [t for *_, t in step if t is not None]
        if taught:  # which rollouts have a teacher, and theirs in order (rows: responses')
            tensors[f"window.{k}.taught"] = torch.tensor([t is not None for *_, t in step],
                                                         dtype=torch.int8)
            tensors[f"window.{k}.teacher_ids"] = torch.cat([t.ids for t in taught])
            tensors[f"window.{k}.teacher_logprobs"] = torch.cat([t.logprobs for t in taught])
    meta = {"format": FORMAT, "shape": json.dumps(asdict(trainer.model.shape)),
            "settings": json.dumps(asdict(trainer.settings)), "seed": str(trainer.seed),
            "calls": str(trainer.calls), "window": str(len(trainer.window))}
    save_file(tensors, str(path), metadata=meta)


def _window_step(tensors: dict, k: int) -> list[tuple[torch.Tensor, torch.Tensor, Teacher | None]]:
    """The k-th step of a saved window: its (prompt, response, teacher or None) rollouts."""
    parts = []
    for name in ("prompts", "responses"):
        lengths = tensors[f"window.{k}.{name}_len"].tolist()
        parts.append(list(torch.split(tensors[f"window.{k}.{name}"].to(torch.int32), lengths)))
    teachers: list[Teacher | None] = [None] * len(parts[1])
    if f"window.{k}.taught" in tensors:  # a state written before distillation has none
        taught = [i for i, t in enumerate(tensors[f"window.{k}.taught"].tolist()) if t]
        lengths = [len(parts[1][i]) for i in taught]
        all_ids = tensors[f"window.{k}.teacher_ids"]
        all_lps = tensors[f"window.{k}.teacher_logprobs"]
        if len(taught) > len(parts[1]) or sum(lengths) != len(all_ids) \
                or all_ids.shape != all_lps.shape:
            raise ValueError(f"window step {k}: its teachers do not cover its responses")
        ids, lps = torch.split(all_ids, lengths), torch.split(all_lps, lengths)
        for i, a, b in zip(taught, ids, lps):
            teachers[i] = Teacher(a, b)
    return list(zip(*parts, teachers))


def load_state(path: str | Path, device: torch.device | str = "cpu") -> DraftTrainer:
    """The trainer `save_state` wrote: same weights, moments and counters, so that the
    next `train` call and every draft are those of the trainer that was saved; its model
    and moments on `device`."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        if meta.get("format") != FORMAT:
            raise ValueError(f"{path} is not a draft-model state ({FORMAT})")
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    model = DraftModel(DraftShape(**json.loads(meta["shape"]))).to(device)
    # a state written before windows trained on its last step alone, and goes on so
    settings = {"window": 1, **json.loads(meta["settings"])}
    trainer = DraftTrainer(model, TrainSettings(**settings), int(meta["seed"]))
    trainer.calls = int(meta["calls"])
    params = dict(model.named_parameters())
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(tensors[f"weight.{n}"])
    for n, p in params.items():
        if f"adam.{n}.step" in tensors:
            trainer.opt.state[p] = {
                "step": tensors[f"adam.{n}.step"].reshape(()).clone(),
                "exp_avg": tensors[f"adam.{n}.exp_avg"].to(p.device, copy=True),
                "exp_avg_sq": tensors[f"adam.{n}.exp_avg_sq"].to(p.device, copy=True)}
    if "vocab.counts" in tensors:  # a state written before draft vocabularies: none counted
        trainer.counts = tensors["vocab.counts"].clone()
    trainer.window = [_window_step(tensors, k) for k in range(int(meta.get("window", 0)))]
    model.eval()
    model.use_draft_vocab(trainer.draft_vocab())
    return trainer


__all__ = ["FORMAT", "load_state", "save_state"]
