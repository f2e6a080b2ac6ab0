"""`init-model --family`: a CPU-size stand-in of a real model family, built locally.

Real tokenizer, chat template and architecture plumbing (byte-level BPE with the family's
special tokens, Qwen2/Llama classes, GQA, tied or untied embeddings, stop ids) at a few
million parameters; not a capable model. A short SFT warm-up on GSM8K-format rows, each
prompt rendered by the chat template and each target ending with the end-of-turn token,
teaches it the answer format, so that GRPO rewards start above zero. Held out: the
shipped GSM8K test rows (`pipeline.tasks.sample_data`), which SFT never sees.

Caching, the manifest and the folder rules are the default model's (`bootstrap`).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from pipeline.policy.bootstrap import cached_manifest, check_target, save_atomically, summary_curve
from pipeline.policy.bpe import train_bpe_tokenizer
from pipeline.policy.corpus import tokenizer_corpus
from pipeline.policy.families import Family, get_family
from pipeline.policy.family_model import (FamilyArch, build_family_model, family_config,
                                          generation_config, stop_ids)
from pipeline.policy.model import count_parameters
from pipeline.policy.sft import (SFTSettings, encode_pairs, greedy_generate, pad_id, response_loss,
                                 train_on_examples)
from pipeline.tasks.math_rewards import gsm8k_reward
from pipeline.tasks.sample_data import sample_split
from pipeline.tasks.word_problems import gsm8k_rows

FAMILY_BUILD_VERSION = 2  # bump when the recipe changes, so stale caches are rebuilt
EVAL_MAX_NEW_TOKENS = 160  # the longest reference answer has 122 tokens (qwen2)


def default_sft() -> SFTSettings:
    return SFTSettings(steps=300, batch_tokens=2048, lr=3e-3, warmup=30)


@dataclass(frozen=True)
class FamilyOptions:
    family: str = "qwen2"
    seed: int = 0
    vocab_size: int = 8192  # BPE tokens; the family's special tokens come on top
    arch: FamilyArch = field(default_factory=FamilyArch)
    sft: SFTSettings = field(default_factory=default_sft)
    sft_rows: int = 4000
    eval_rows: int = 100  # the shipped GSM8K test rows (all 100 by default)

    def fingerprint(self) -> str:
        blob = json.dumps({"v": FAMILY_BUILD_VERSION, "kind": "family", **asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def chat_prompt(tokenizer: PreTrainedTokenizerFast, question: str) -> str:
    """`question` as one user turn, rendered by the tokenizer's chat template up to the
    assistant's turn (what the policy continues)."""
    return tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                         add_generation_prompt=True, tokenize=False)


def special_token_ids(family: Family, tokenizer: PreTrainedTokenizerFast) -> dict[str, int]:
    """The named special tokens (Llama-3's reserved ones left out) and their ids."""
    return {t: tokenizer.convert_tokens_to_ids(t) for t in family.specials if "reserved" not in t}


def build_tokenizer_and_model(spec: FamilyOptions) -> tuple[Family, PreTrainedTokenizerFast, PreTrainedModel]:
    """The untrained model and its tokenizer (seconds; no SFT)."""
    family = get_family(spec.family)
    tokenizer = train_bpe_tokenizer(tokenizer_corpus(spec.seed), family, spec.vocab_size)
    model = build_family_model(family_config(family, tokenizer, spec.arch), spec.seed)
    model.generation_config = generation_config(family, tokenizer)
    return family, tokenizer, model


def init_family_model(out: Path, spec: FamilyOptions, force: bool = False,
                      on_sft_step: Callable[[int, float], None] | None = None) -> dict:
    """Build (or reuse) the family model in `out`; returns its manifest."""
    if not force and (hit := cached_manifest(out, spec)):
        return {**hit, "cached": True}
    get_family(spec.family)  # fail fast on an unknown family
    check_target(out, spec, force)
    started = time.time()
    torch.manual_seed(spec.seed)
    family, tokenizer, model = build_tokenizer_and_model(spec)
    evals = sample_split("gsm8k")["test"][: spec.eval_rows]
    held_out = {r["question"] for r in evals}
    rows = [r for r in gsm8k_rows(spec.sft_rows + len(held_out), spec.seed + 1)
            if r["question"] not in held_out][: spec.sft_rows]
    pairs = [{"prompt": chat_prompt(tokenizer, r["question"]), "solution": r["answer"]} for r in rows]
    examples = encode_pairs(tokenizer, pairs, add_special_tokens=False)
    losses = train_on_examples(model, examples, pad_id(tokenizer), spec.sft, on_sft_step, response_loss)
    heldout = heldout_rewards(model, tokenizer, family, evals)
    manifest = {
        "fingerprint": spec.fingerprint(),
        "family": family.name,
        "architecture": family.architecture,
        "task": "gsm8k",
        "seed": spec.seed,
        "parameters": count_parameters(model),
        "vocab": {"tokenizer": len(tokenizer), "embedding_rows": model.config.vocab_size},
        "special_tokens": special_token_ids(family, tokenizer),
        "stop_ids": stop_ids(family, tokenizer),
        "arch": spec.arch.to_dict(),
        "sft": {"steps": spec.sft.steps, "rows": len(rows), "loss_first": losses[0],
                "loss_last": losses[-1], "loss_min": min(losses), "loss_curve": summary_curve(losses)},
        "heldout": heldout,
        "build_seconds": round(time.time() - started, 1),
    }
    save_atomically(out, manifest, lambda tmp: save_family(tmp, model, tokenizer))
    return {**manifest, "cached": False}


def heldout_rewards(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, family: Family,
                    rows: list[dict]) -> dict:
    """Greedy responses to chat-rendered GSM8K questions, scored by the built-in gsm8k
    reward: mean reward with partial credit (format credit counts) and exact accuracy."""
    responses = greedy_generate(model, tokenizer, [chat_prompt(tokenizer, r["question"]) for r in rows],
                                max_new_tokens=EVAL_MAX_NEW_TOKENS, add_special_tokens=False,
                                stop_ids=stop_ids(family, tokenizer))
    scores = [gsm8k_reward(r["question"], resp, r["answer"], partial_credit=True)
              for r, resp in zip(rows, responses)]
    n = max(1, len(rows))
    return {"prompts": len(rows), "reward_mean": round(sum(scores) / n, 4),
            "greedy_accuracy": sum(s == 1.0 for s in scores) / n,
            "with_final_answer": sum("####" in resp for resp in responses) / n}


def save_family(folder: Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast) -> None:
    """Weights, config.json, generation_config.json and the tokenizer, laid out as the real
    releases are: the chat template inside tokenizer_config.json, and the tokenizer class
    named PreTrainedTokenizerFast (which older transformers also know)."""
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder, save_jinja_files=False)
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
