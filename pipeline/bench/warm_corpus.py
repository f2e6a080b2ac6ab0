"""A warm-up corpus for the draft model (`pipeline.bench.draft_model_replay --warm-corpus`):
the run's starting policy's own responses to prompts of its data set that it does not train
on, so that the draft can learn the policy before the first step drafts.

The prompts are the data set's rows after the run's `data.train_size`, or for a built-in
task fresh ones drawn with a seed of their own and none of them a training prompt (encoded
as a run encodes them: `PromptEncoder`, the model's chat template), `samples` responses each,
sampled with transformers on the CPU at the run's temperature (research tool: no engine),
cut after the first end-of-sequence token. Stored as JSON: a list of [prompt ids, response
ids] pairs."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from pipeline.atomic import write_atomic

GENERATE_ROWS = 16  # prompts a `generate` call takes


def load_corpus(path: Path) -> list[tuple[list[int], list[int]]]:
    """The (prompt ids, response ids) pairs a corpus file holds; ValueError if it is not
    one."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, list) or not all(
            isinstance(x, list) and len(x) == 2 and all(
                isinstance(s, list) and all(isinstance(t, int) for t in s) for s in x)
            for x in data):
        raise ValueError(f"{path} is not a warm-up corpus (a JSON list of [prompt ids, "
                         "response ids] pairs); delete it to generate it again")
    return [(p, r) for p, r in data]


def make_corpus(cfg, prompts: int, samples: int, max_new: int, seed: int = 0,
                temperature: float | None = None) -> list[tuple[list[int], list[int]]]:
    """`samples` responses of the run's starting policy (`cfg.model.path`) to each of
    `prompts` prompts it does not train on (`pipeline.tasks.prompts.warmup_prompts`), at `temperature` (the run's
    `rollout.temperature` by default), at most `max_new` tokens each."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline.tasks.chat import PromptEncoder
    from pipeline.tasks.prompts import warmup_prompts

    path = str(cfg.model.path)
    tok = AutoTokenizer.from_pretrained(path)
    enc = PromptEncoder.from_config(cfg.data, tok)
    encoded = [enc.encode(p.text) for p in warmup_prompts(cfg.data, prompts)]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    t = cfg.rollout.temperature if temperature is None else temperature
    torch.manual_seed(seed)
    eos = tok.eos_token_id
    corpus = []
    for i in range(0, len(encoded), GENERATE_ROWS):
        part = encoded[i:i + GENERATE_ROWS]
        width = max(map(len, part))
        ids = torch.full((len(part), width), enc.pad_id)
        mask = torch.zeros((len(part), width), dtype=torch.long)
        for j, p in enumerate(part):  # left padding
            ids[j, width - len(p):] = torch.tensor(p)
            mask[j, width - len(p):] = 1
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=t > 0,
                                 temperature=t if t > 0 else None, top_p=1.0, top_k=0,
                                 max_new_tokens=max_new, num_return_sequences=samples,
                                 pad_token_id=enc.pad_id)
        for j in range(out.shape[0]):
            response = out[j, width:].tolist()
            if eos in response:
                response = response[:response.index(eos) + 1]
            corpus.append((part[j // samples], response))
        print(f"warm-up corpus: {len(corpus)} of {prompts * samples} responses", flush=True)
    return corpus


def add_warm_arguments(ap) -> None:
    """The `--warm-*` options of a replay tool that warms its draft up on a corpus
    (`draft_model_replay`, `eagle_replay`): `--warm-corpus` and how the corpus is made and
    trained on."""
    ap.add_argument("--warm-corpus", type=Path, default=None,
                    help="warm the draft up first on the corpus in FILE (made there if absent)")
    ap.add_argument("--warm-updates", type=int, default=200, help="AdamW updates of the warm-up")
    ap.add_argument("--warm-prompts", type=int, default=64,
                    help="data-set rows after the trained ones the corpus is made from")
    ap.add_argument("--warm-samples", type=int, default=4, help="responses per warm-up prompt")
    ap.add_argument("--warm-max-new", type=int, default=256, help="tokens per warm-up response")


def corpus_at(path: Path, cfg, prompts: int, samples: int, max_new: int,
              seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """The corpus stored at `path`, or a new one (`make_corpus`) written there."""
    if Path(path).exists():
        return load_corpus(path)
    corpus = make_corpus(cfg, prompts, samples, max_new, seed)
    write_atomic(Path(path), lambda tmp: tmp.write_text(json.dumps(corpus)))
    return corpus


__all__ = ["add_warm_arguments", "corpus_at", "load_corpus", "make_corpus"]
