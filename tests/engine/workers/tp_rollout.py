"""Run under torchrun (2 ranks) by tests/engine/test_tp_rollout.py: one vLLM engine with
tensor_parallel_size=2 over both ranks (external_launcher). Checks, per rank: the engine is
sharded, both ranks get the same completions, and after `update_weights` with perturbed
weights every shard holds its rows of the new embedding and greedy output equals
transformers' greedy output on the same weights. Each rank writes its findings as JSON."""

import json
import sys

import torch

from pipeline.config.schema import ModelConfig, RolloutConfig
from pipeline import distributed as dist
from pipeline.rollout.engine import RolloutEngine, Sampling
from pipeline.tasks.base import get_task


def main(model: str, out: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rank, world = dist.init()
    engine = RolloutEngine(ModelConfig(path=model),
                           RolloutConfig(max_num_seqs=8, tensor_parallel_size=2), 256, seed=0)
    tok = AutoTokenizer.from_pretrained(model)
    prompts = [tok(r["prompt"])["input_ids"] for r in get_task("sort").generate(4, 5)]
    greedy = Sampling(n=1, temperature=0.0, max_tokens=40)
    before = [g[0].token_ids for g in engine.generate(prompts, greedy).groups]
    sampled = engine.generate(prompts, Sampling(n=2, temperature=1.0, max_tokens=40, seed=7)).groups

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for _, p in hf.named_parameters():
            p.add_(0.3 * p.std().clamp(min=1e-3) * torch.randn(p.shape, generator=gen))
    engine.update_weights(hf.named_parameters(), 1)
    vocab = dict(engine.model_runner().get_model().named_parameters())["model.embed_tokens.weight"]
    full = dict(hf.named_parameters())["model.embed_tokens.weight"]
    start = rank * vocab.shape[0]
    rows = max(0, min(vocab.shape[0], full.shape[0] - start))
    after = [g[0].token_ids for g in engine.generate(prompts, greedy).groups]
    reference = []
    for ids in prompts:
        gen_ids = hf.generate(torch.tensor([ids]), max_new_tokens=40, do_sample=False,
                              eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        reference.append([t for t in gen_ids[0, len(ids):].tolist()])
    result = {
        "rank": rank, "world": world,
        "embed_rows": list(vocab.shape), "vocab": full.shape[0],
        "shard_matches": bool(torch.equal(vocab[:rows], full[start:start + rows].to(vocab.dtype))),
        "padding_zero": bool((vocab[rows:] == 0).all()),
        "before": before, "after": after, "reference": reference,
        "sampled": [[c.token_ids for c in g] for g in sampled],
    }
    with open(f"{out}.{rank}", "w") as fh:
        json.dump(result, fh)
    dist.barrier()


if __name__ == "__main__":
    main(*sys.argv[1:])
