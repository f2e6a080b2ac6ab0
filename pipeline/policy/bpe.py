"""A byte-level BPE tokenizer in a family's conventions, trained locally with `tokenizers`.

The same pipeline as the real Qwen2/Llama-3 `tokenizer.json`: (NFC) → regex split →
byte-level → BPE, decoded byte-level, so any text (any unicode, any bytes) encodes without
unknown tokens and decodes back. The BPE vocabulary (256 byte symbols plus merges) comes
first; the family's special tokens follow it, so they hold the last ids as in the real
releases. Saved as a `PreTrainedTokenizerFast` (tokenizer.json + tokenizer_config.json with
the chat template), which both transformers and vLLM load.
"""

from __future__ import annotations

from typing import Iterable

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from tokenizers import processors, trainers
from transformers import PreTrainedTokenizerFast

from pipeline.errors import UsageError
from pipeline.policy.families import Family

MIN_VOCAB = 512  # the 256 byte symbols and some merges


def train_bpe_tokenizer(texts: Iterable[str], family: Family, vocab_size: int) -> PreTrainedTokenizerFast:
    """BPE with exactly `vocab_size` ordinary tokens, then `family.specials`.

    len(tokenizer) == vocab_size + len(family.specials). UsageError when the texts hold too
    few distinct pairs to reach `vocab_size` (give more text or a smaller vocabulary).
    """
    if vocab_size < MIN_VOCAB:
        raise UsageError(f"vocabulary size {vocab_size} is too small; use at least {MIN_VOCAB}")
    tok = Tokenizer(models.BPE(ignore_merges=family.ignore_merges))
    if family.nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(family.split_pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    if tok.get_vocab_size() != vocab_size:
        raise UsageError(f"the tokenizer corpus gives only {tok.get_vocab_size()} tokens, fewer "
                         f"than the {vocab_size} asked for; use a smaller vocabulary")
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in family.specials])
    byte_level = processors.ByteLevel(trim_offsets=False)
    if family.bos is None:
        tok.post_processor = byte_level
    else:  # every encode with special tokens starts with BOS, as Llama-3's does
        bos = (family.bos, tok.token_to_id(family.bos))
        tok.post_processor = processors.Sequence([byte_level, processors.TemplateProcessing(
            single=f"{family.bos}:0 $A:0", pair=f"{family.bos}:0 $A:0 {family.bos}:1 $B:1",
            special_tokens=[bos])])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=family.bos, eos_token=family.eos, pad_token=family.pad,
        chat_template=family.chat_template, model_max_length=family.max_positions,
        clean_up_tokenization_spaces=False)  # decode(encode(text)) == text
    return fast
