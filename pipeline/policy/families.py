"""The conventions of the real model families that `init-model --family` imitates.

What a user's Qwen2.5 or Llama-3 checkpoint brings, at CPU size: the architecture class,
the special tokens (appended after the byte-level BPE vocabulary, as in the real releases,
so their ids are the last ones), the chat template, which tokens stop generation, tied or
untied embeddings, the rotary settings and the pre-tokenizer's split pattern.

    qwen2  Qwen2.5-7B-Instruct:  untied, q/k/v biases, no BOS, ChatML, digits split one by
           one, NFC-normalised text, embedding rows padded past the tokenizer
    llama  Llama-3.2-1B-Instruct: tied, BOS on every encode, Llama-3 headers, up to three
           digits a token, no pad token (as released), llama3 rope scaling
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import UsageError

QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")

DEFAULT_SYSTEM = "You are a helpful assistant."

# Qwen2.5-Instruct's template without tool calls: a default system turn unless the
# conversation brings its own.
CHATML_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\n" + DEFAULT_SYSTEM + "<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message['role'] == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Meta-Llama-3-Instruct's template, verbatim: BOS is part of the rendered text.
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


def _llama3_specials() -> tuple[str, ...]:
    """Llama-3's 256 special tokens in id order: the named ones among reserved ones."""
    named = {0: "<|begin_of_text|>", 1: "<|end_of_text|>", 4: "<|finetune_right_pad_id|>",
             6: "<|start_header_id|>", 7: "<|end_header_id|>", 8: "<|eom_id|>", 9: "<|eot_id|>",
             10: "<|python_tag|>"}
    out, reserved = [], 0
    for i in range(256):
        if i in named:
            out.append(named[i])
        else:
            out.append(f"<|reserved_special_token_{reserved}|>")
            reserved += 1
    return tuple(out)


@dataclass(frozen=True)
class Family:
    name: str
    architecture: str  # config.json's architectures[0]
    model_type: str  # transformers' config type
    specials: tuple[str, ...]  # appended after the BPE vocabulary, in this (id) order
    bos: str | None  # None: nothing is prepended when encoding
    eos: str  # the tokenizer's eos: the end of an assistant turn
    pad: str | None
    stop: tuple[str, ...]  # generation_config.json eos_token_id, the release's order
    config_eos: tuple[str, ...]  # config.json eos_token_id (one: written as an int)
    config_bos: str  # config.json bos_token_id
    split_pattern: str
    nfc: bool  # NFC-normalise text before splitting
    ignore_merges: bool  # a whole pre-token in the vocabulary is one token (Llama-3's BPE)
    chat_template: str
    tie_embeddings: bool
    attention_bias: bool  # q/k/v biases (Qwen2's come with the architecture)
    vocab_multiple: int  # config vocab_size is len(tokenizer) rounded up to this
    rope: dict
    max_positions: int
    rms_norm_eps: float


QWEN2 = Family(
    name="qwen2", architecture="Qwen2ForCausalLM", model_type="qwen2",
    specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
    bos=None, eos="<|im_end|>", pad="<|endoftext|>",
    stop=("<|im_end|>", "<|endoftext|>"), config_eos=("<|im_end|>",), config_bos="<|endoftext|>",
    split_pattern=QWEN2_SPLIT, nfc=True, ignore_merges=False, chat_template=CHATML_TEMPLATE,
    tie_embeddings=False, attention_bias=True, vocab_multiple=128,
    rope={"rope_type": "default", "rope_theta": 1000000.0}, max_positions=32768,
    rms_norm_eps=1e-6,
)

LLAMA = Family(
    name="llama", architecture="LlamaForCausalLM", model_type="llama",
    specials=_llama3_specials(),
    bos="<|begin_of_text|>", eos="<|eot_id|>", pad=None,
    stop=("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"),
    config_eos=("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"), config_bos="<|begin_of_text|>",
    split_pattern=LLAMA3_SPLIT, nfc=False, ignore_merges=True, chat_template=LLAMA3_TEMPLATE,
    tie_embeddings=True, attention_bias=False, vocab_multiple=1,
    rope={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    max_positions=131072, rms_norm_eps=1e-5,
)

FAMILIES = {f.name: f for f in (QWEN2, LLAMA)}


def get_family(name: str) -> Family:
    """The family called `name`; UsageError naming the valid ones if unknown."""
    if name not in FAMILIES:
        raise UsageError(f"unknown model family {name!r}; use one of {', '.join(FAMILIES)}")
    return FAMILIES[name]
