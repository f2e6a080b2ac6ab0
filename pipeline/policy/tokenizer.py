"""A character-level tokenizer trained with `tokenizers` on the built-in tasks' text.

Every character is one token (the tasks are digit manipulation, where sub-word merges would
hide the structure the tiny policy must learn). Printable ASCII is always in the vocabulary,
so any text encodes without unknown tokens. Saved as a `PreTrainedTokenizerFast`, which both
transformers and vLLM load from the model directory.
"""

from __future__ import annotations

import string
from typing import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<s>", "</s>"
SPECIAL_TOKENS = [PAD, UNK, BOS, EOS]


def train_char_tokenizer(texts: Iterable[str]) -> PreTrainedTokenizerFast:
    """Train on `texts`; ids are stable for a given text set (frequency, then character)."""
    tok = Tokenizer(models.WordLevel(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    trainer = trainers.WordLevelTrainer(special_tokens=SPECIAL_TOKENS, min_frequency=1,
                                        show_progress=False)
    alphabet = [c for c in string.printable if c not in "\r\x0b\x0c"]
    tok.train_from_iterator(list(texts) + alphabet, trainer)
    bos_id = tok.token_to_id(BOS)
    # vLLM and transformers both tokenize prompts with add_special_tokens=True: BOS first.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, bos_id)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS,
                                   pad_token=PAD, unk_token=UNK)
    fast.padding_side = "left"  # batched greedy generation in transformers
    return fast
