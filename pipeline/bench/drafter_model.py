"""The `model` lane of `rhymectl bench drafter` (`--model CONFIG`): what the draft model of
`spec.method: history+group+model` costs per pass at the bench's shape.

The draft is the one `history+group+model` would start for a policy of that Hugging Face
config (`pipeline.drafting.draft_model.shape_for`: `spec.draft_layers` decoder layers of
the policy's width, its MLP within 10 % of the policy's parameters), drafting from a
`spec.draft_vocab`-token vocabulary, on `spec.draft_device` (auto: the CPU, as there is no
engine here; `spec.draft_device=cuda` on a GPU node). Every pass it drafts k tokens for
every live request, as the proposer asks it (`propose_cached`: each request's keys and
values kept from its last draft, its context read from the batch as vLLM leaves it), and
never stops early: the cost of the model's every row drafting in full, the most the
proposer can ask of it in a pass. Its weights are random (the cost does not depend on
them), so its tau and acceptance on the synthetic streams mean nothing; its first call
runs the draft over every request's context so far (the prefill a request pays when the
model first drafts for it), untimed as the other lanes' first calls are.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from pipeline.bench import drafter_workload as wl
from pipeline.bench.drafter import Side
from pipeline.bench.drafter_sim import InputBatch, Lane
from pipeline.errors import UsageError

REQUIRED = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size",
            "vocab_size")


def read_policy_config(path: str | Path, vocab: int) -> dict:
    """The Hugging Face config (a dict) of `path` (a config.json or a model directory), whose
    vocabulary holds the bench's `vocab` token ids; UsageError naming what is wrong."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    try:
        config = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"--model {path}: cannot read a Hugging Face config.json there "
                         f"({exc.__class__.__name__}); give a model directory or its "
                         "config.json") from None
    missing = [k for k in REQUIRED if not isinstance(config, dict) or k not in config]
    if missing:
        raise UsageError(f"--model {file}: not a decoder's Hugging Face config (no "
                         f"{', '.join(missing)}); give a Llama/Qwen2-style config.json")
    if int(config["vocab_size"]) < vocab:
        raise UsageError(f"--model {file}: its vocabulary has {config['vocab_size']} tokens, "
                         f"fewer than --vocab {vocab}; lower --vocab to at most that")
    return config


def _draft(config: dict, spec):
    """The lane's draft for the policy `config` under `spec`: (its shape, the tokens it
    drafts from, its device)."""
    from pipeline.drafting.draft_model import shape_for
    from pipeline.rollout.draft_source import draft_device

    shape = shape_for(config, layers=spec.draft_layers)
    vocab = spec.draft_vocab if 0 < spec.draft_vocab < shape.vocab_size else shape.vocab_size
    return shape, vocab, draft_device(spec.draft_device)


def describe(config: dict, spec) -> dict:
    """What the model lane times: the draft's shape, parameters and where it runs."""
    from dataclasses import asdict

    from pipeline.drafting.draft_model import policy_parameters

    shape, vocab, device = _draft(config, spec)
    return {"shape": asdict(shape), "own_parameters": shape.own_parameters(),
            "parameters": shape.parameters(), "policy_parameters": policy_parameters(config),
            "draft_vocab": vocab, "device": device}


def build_model_lane(work: wl.Workload, batch: InputBatch, k: int, max_model_len: int,
                     start: int, spec=None, config: dict | None = None) -> Side:
    """The model lane on `work` (`pipeline.bench.drafter`'s builders' signature), the draft
    shaped for the policy `config` and set up by `spec` (a SpecConfig)."""
    import torch

    from pipeline.config.schema import SpecConfig
    from pipeline.drafting.draft_model import DraftModel
    from pipeline.drafting.draft_propose import DraftCache, propose_cached

    spec = spec or SpecConfig(method="history+group+model", num_speculative_tokens=k)
    t0 = time.perf_counter()
    shape, vocab, device = _draft(config, spec)
    model = DraftModel(shape, seed=0).to(device).eval()
    if vocab < shape.vocab_size:
        model.use_draft_vocab(torch.arange(vocab))
    build_s = time.perf_counter() - t0
    cache = DraftCache()
    held: set[str] = set()

    def propose(sampled):
        ids, ends, tokens = batch.req_ids, batch.num_tokens_no_spec, batch.token_ids_cpu
        for gone in held.difference(ids):  # finished requests
            cache.forget(gone)
        held.clear()
        held.update(ids)
        contexts = [tokens[i, :int(ends[i])].tolist() for i in range(len(ids))]
        drafts, _ = propose_cached(model, cache, list(ids), contexts, k)
        return drafts

    lane = Lane("model", work, batch, propose, start)
    return Side(lane, build_s, 0, cache.clear)


__all__ = ["build_model_lane", "describe", "read_policy_config"]
