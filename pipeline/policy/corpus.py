"""The text a family tokenizer is trained on: the math data plus generic text, all generated.

Nothing is downloaded, so the "generic" part is made here too: English sentences from a
small word list, numbers written as people write them, and made-up words that give BPE
enough distinct pairs to reach a vocabulary of real-model shape (8k and more). The same
seed gives the same texts, hence the same tokenizer.
"""

from __future__ import annotations

import random

from pipeline.policy.families import DEFAULT_SYSTEM
from pipeline.tasks.math_problems import math_rows
from pipeline.tasks.word_problems import gsm8k_rows

WORDS = (
    "the of and to in is that it was for on are as with his they at be this from have or by "
    "one had not but what all were when we there can an your which their said if do will each "
    "about how up out them then she many some so these would other into has more her two like "
    "him see time could no make than first been its who now people my made over did down only "
    "way find use may water long little very after words called just where most know get "
    "through back much go good new write our me man too any day same right look think also "
    "around another came come work three word must because does part even place well such here "
    "take why things help put years different away again off went old number great tell men say "
    "small every found still between name should home big give air line set own under read last "
    "never us left end along while might next sound below saw something thought both few those "
    "always looked show large often together asked house world going want school important "
    "until form food keep children feet land side without boy once animals life enough took "
    "sometimes four head above kind began almost live page got earth need far hand high year "
    "mother light parts country father let night following picture being study second eyes "
    "soon times story boys since white days ever paper hard near sentence better best across "
    "during become others however sure means knew try told young miles sun ways thing whole "
    "hear example heard several change answer room sea against top turned learn point city play "
    "toward five using himself usually money seen car morning given problem total each per "
    "solve equal sum product divide multiply remainder fraction probability area perimeter"
).split()
SYLLABLES = tuple(c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ou", "ai"))
PUNCTUATION = (".", ".", ".", "?", "!", ",", ";", ":")
LEXICON_WORDS = 8000  # made-up words, each used several times so that BPE merges it whole
MADE_UP_SHARE = 0.4


def _sentence(rng: random.Random, lexicon: list[str]) -> str:
    words = [rng.choice(lexicon if rng.random() < MADE_UP_SHARE else WORDS)
             for _ in range(rng.randint(4, 14))]
    if rng.random() < 0.3:
        words.insert(rng.randrange(len(words)), f"{rng.randint(0, 99999):,}")
    return " ".join(words).capitalize() + rng.choice(PUNCTUATION)


def _made_up_word(rng: random.Random) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4)))


def generic_text(n_paragraphs: int, seed: int) -> list[str]:
    """`n_paragraphs` paragraphs of English-like sentences, numbers and made-up words."""
    rng = random.Random(seed)
    lexicon = [_made_up_word(rng) for _ in range(LEXICON_WORDS)]
    return [" ".join(_sentence(rng, lexicon) for _ in range(rng.randint(2, 6))) for _ in range(n_paragraphs)]


def tokenizer_corpus(seed: int, math_rows_each: int = 3000, paragraphs: int = 6000) -> list[str]:
    """Texts to train a family tokenizer on: GSM8K- and MATH-format rows, the chat
    templates' plain words, and generic text."""
    texts = [f"{r['question']}\n{r['answer']}" for r in gsm8k_rows(math_rows_each, seed)]
    texts += [f"{r['problem']}\n{r['solution']}" for r in math_rows(math_rows_each, seed)]
    texts += [f"system\n{DEFAULT_SYSTEM}\nuser\nassistant\n"] * 10
    return texts + generic_text(paragraphs, seed)
