"""A randomly initialised model of a real family's architecture, at CPU size.

The config is the family's own class (`Qwen2Config` → `Qwen2ForCausalLM`, `LlamaConfig` →
`LlamaForCausalLM`) with the release's conventions (`pipeline.policy.families`): grouped-
query attention (fewer KV heads than query heads), tied or untied embeddings, the rotary
settings, bos/eos ids in config.json and the list of stop ids in generation_config.json.
Only the sizes are small: a few million parameters, most of them embeddings.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig, PretrainedConfig
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from pipeline.errors import UsageError
from pipeline.policy.families import Family


@dataclass(frozen=True)
class FamilyArch:
    """Sizes. head_dim = hidden / heads: 32 here, as vLLM's CPU attention refuses 16."""

    layers: int = 4
    hidden: int = 128
    heads: int = 4
    kv_heads: int = 2  # GQA: two query heads share each KV head
    intermediate: int = 512

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def to_dict(self) -> dict:
        return asdict(self)


def padded_vocab(n_tokens: int, multiple: int) -> int:
    """`n_tokens` rounded up to `multiple`: Qwen2 releases have more embedding rows than
    tokenizer entries (151,936 for 151,665), which the trainer and vLLM must both accept."""
    return -(-n_tokens // multiple) * multiple


def _ids(tokenizer: PreTrainedTokenizerFast, tokens: tuple[str, ...]) -> int | list[int]:
    ids = tokenizer.convert_tokens_to_ids(list(tokens))
    return ids[0] if len(ids) == 1 else ids


def family_config(family: Family, tokenizer: PreTrainedTokenizerFast, arch: FamilyArch) -> PretrainedConfig:
    """The model config, as `config.json` will hold it (architectures is set on save)."""
    if arch.hidden % arch.heads or arch.heads % arch.kv_heads:
        raise UsageError(f"hidden {arch.hidden}, heads {arch.heads}, kv_heads {arch.kv_heads}: "
                         f"hidden must divide by heads and heads by kv_heads")
    extra = (dict(use_sliding_window=False, max_window_layers=arch.layers)
             if family.model_type == "qwen2" else
             dict(head_dim=arch.head_dim, attention_bias=family.attention_bias, mlp_bias=False))
    return AutoConfig.for_model(
        family.model_type,
        vocab_size=padded_vocab(len(tokenizer), family.vocab_multiple),
        hidden_size=arch.hidden,
        intermediate_size=arch.intermediate,
        num_hidden_layers=arch.layers,
        num_attention_heads=arch.heads,
        num_key_value_heads=arch.kv_heads,
        hidden_act="silu",
        max_position_embeddings=family.max_positions,
        rms_norm_eps=family.rms_norm_eps,
        rope_parameters=dict(family.rope),
        tie_word_embeddings=family.tie_embeddings,
        bos_token_id=tokenizer.convert_tokens_to_ids(family.config_bos),
        eos_token_id=_ids(tokenizer, family.config_eos),
        dtype="float32",
        **extra,
    )


def generation_config(family: Family, tokenizer: PreTrainedTokenizerFast) -> GenerationConfig:
    """Token ids only (no sampling defaults): vLLM stops on the tokenizer's eos and on every
    id of `eos_token_id` here, as with the real releases."""
    pad = tokenizer.convert_tokens_to_ids(family.pad) if family.pad else None
    return GenerationConfig(bos_token_id=tokenizer.convert_tokens_to_ids(family.config_bos),
                            eos_token_id=_ids(tokenizer, family.stop), pad_token_id=pad)


def build_family_model(config: PretrainedConfig, seed: int) -> PreTrainedModel:
    """A freshly initialised model; identical for the same seed and config."""
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def stop_ids(family: Family, tokenizer: PreTrainedTokenizerFast) -> list[int]:
    """Every id that ends a response: the tokenizer's eos and generation_config's list."""
    ids = tokenizer.convert_tokens_to_ids(list(family.stop))
    return sorted({tokenizer.eos_token_id, *ids})
