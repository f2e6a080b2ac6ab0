"""The tiny default policy: a Llama-shaped causal LM from `transformers`.

About a million parameters (4 layers, width 128, head dimension 32 — vLLM's CPU attention
refuses 16): big enough to learn insertion sort of short digit strings in minutes on two
cores, small enough that a rollout step takes seconds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast


@dataclass(frozen=True)
class TinyArch:
    layers: int = 4
    hidden: int = 128
    heads: int = 4
    head_dim: int = 32
    intermediate: int = 512
    max_positions: int = 256

    def to_dict(self) -> dict:
        return asdict(self)


def build_model(tokenizer: PreTrainedTokenizerFast, arch: TinyArch, seed: int) -> LlamaForCausalLM:
    """A freshly initialised model; identical for the same seed and architecture."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=arch.hidden,
        intermediate_size=arch.intermediate,
        num_hidden_layers=arch.layers,
        num_attention_heads=arch.heads,
        num_key_value_heads=arch.heads,
        head_dim=arch.head_dim,
        max_position_embeddings=arch.max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
