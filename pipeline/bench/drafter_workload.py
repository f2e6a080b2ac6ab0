"""Synthetic token streams for `rhymectl bench drafter`: one RL step's prompts, their
history (earlier epochs' responses) and this step's planned responses, at production shape.

Each prompt has a hidden "solution" stream, `SOLUTION_FACTOR` x the longest response long.
A response is a run of spans (geometric lengths, mean `SPAN` tokens); each span is, with
probability `rhyme`, a copy of the solution near the response's own position (shifted by a
normal drift of sd `DRIFT` tokens), else fresh tokens. So siblings and earlier epochs
repeat each other's spans, as GRPO groups and epochs do, and drafts from them are accepted
at rates set by `rhyme`. Fresh tokens are drawn Zipf-like (p ~ 1 / (rank + 2.7) ** 1.1,
Mandelbrot's fit of natural text) over the vocabulary, so frequent tokens also give the
short, spurious matches real text gives. Lengths are log-normal (sd `LENGTH_SIGMA` of the
log) with mean `mean_len`, cut at `MAX_LEN_FACTOR` x the mean.

Every stream is a pure function of (seed, prompt, epoch, sample): the same seed gives the
same workload whatever is generated first, and this step's planned responses can be made
only as far as a window needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

SPAN = 32  # mean span length, tokens
DRIFT = 64.0  # sd of a copied span's offset from the response's position, tokens
LENGTH_SIGMA = 0.5  # sd of log(length)
MAX_LEN_FACTOR = 2.5  # lengths are cut at this many times the mean
SOLUTION_FACTOR = 1.1
PROMPT_LEN = 256
ZIPF_EXPONENT, ZIPF_SHIFT = 1.1, 2.7


@dataclass(frozen=True)
class Shape:
    """One step's workload: `live` requests, `group` per prompt (live / group prompts),
    mean response length `mean_len` tokens, token ids below `vocab`, span repetition
    `rhyme` in [0, 1], `history_epochs` earlier epochs of `group` responses per prompt."""

    live: int = 512
    group: int = 16
    mean_len: int = 8192
    vocab: int = 152064
    rhyme: float = 0.6
    history_epochs: int = 2
    seed: int = 0
    prompt_len: int = PROMPT_LEN

    @property
    def prompts(self) -> int:
        return self.live // self.group

    @property
    def max_len(self) -> int:
        return int(MAX_LEN_FACTOR * self.mean_len)


@lru_cache(maxsize=4)
def _zipf_cdf(vocab: int) -> np.ndarray:
    p = 1.0 / (np.arange(1, vocab + 1, dtype=np.float64) + ZIPF_SHIFT) ** ZIPF_EXPONENT
    cdf = np.cumsum(p)
    return cdf / cdf[-1]


def _rng(shape: Shape, *key: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([shape.seed, *key]))


def zipf_tokens(rng: np.random.Generator, n: int, vocab: int) -> np.ndarray:
    """n token ids in [0, vocab), Zipf-like (id = frequency rank), int32."""
    ids = np.searchsorted(_zipf_cdf(vocab), rng.random(n), side="right")
    return np.minimum(ids, vocab - 1).astype(np.int32)


def prompt(shape: Shape, p: int) -> np.ndarray:
    """Prompt p's token ids (int32, `prompt_len` long)."""
    return zipf_tokens(_rng(shape, p, 0, 0), shape.prompt_len, shape.vocab)


def solution(shape: Shape, p: int) -> np.ndarray:
    """The stream prompt p's responses copy their rhyming spans from."""
    return zipf_tokens(_rng(shape, p, 1, 0), int(SOLUTION_FACTOR * shape.max_len) + 4 * SPAN,
                       shape.vocab)


def length(shape: Shape, p: int, epoch: int, sample: int) -> int:
    """Tokens of response `sample` to prompt p in `epoch` (log-normal, mean `mean_len`)."""
    rng = _rng(shape, p, 2, epoch * 65536 + sample)
    mu = np.log(shape.mean_len) - LENGTH_SIGMA ** 2 / 2
    return int(min(max(rng.lognormal(mu, LENGTH_SIGMA), 1), shape.max_len))


def response(shape: Shape, p: int, epoch: int, sample: int, n: int | None = None,
             sol: np.ndarray | None = None) -> np.ndarray:
    """Response `sample` to prompt p in `epoch` (epochs 0 .. history_epochs - 1 are the
    history, `history_epochs` the current step): its first n tokens (default: all of
    `length`; a larger n goes on in the same way). sol: `solution(shape, p)`, if made."""
    n = length(shape, p, epoch, sample) if n is None else n
    sol = solution(shape, p) if sol is None else sol
    rng = _rng(shape, p, 3, epoch * 65536 + sample)
    chunks = 2 * n // SPAN + 16
    lens = rng.geometric(1.0 / SPAN, chunks)
    while lens.sum() < n:  # (practically never)
        lens = np.concatenate([lens, rng.geometric(1.0 / SPAN, chunks)])
    starts = np.cumsum(lens) - lens
    copy = rng.random(len(lens)) < shape.rhyme
    drift = np.rint(rng.normal(0.0, DRIFT, len(lens))).astype(np.int64)
    offset = np.clip(starts + drift, 0, len(sol) - lens)
    fresh = zipf_tokens(rng, n, shape.vocab)
    chunk = np.repeat(np.arange(len(lens)), lens)[:n]
    pos = np.arange(n)
    src = offset[chunk] + pos - starts[chunk]
    return np.where(copy[chunk], sol[np.minimum(src, len(sol) - 1)], fresh).astype(np.int32)


@dataclass
class Workload:
    """prompts[p]: token ids; history[p]: [(epoch, response ids)], oldest first, the
    `group` responses of each of `history_epochs` epochs; planned[p][j]: this step's
    response j, cut at the window's end; lengths[p][j]: its full length."""

    shape: Shape
    prompts: list[np.ndarray]
    history: list[list[tuple[int, np.ndarray]]]
    planned: list[list[np.ndarray]]
    lengths: list[list[int]]

    @property
    def history_tokens(self) -> int:
        return int(sum(len(ids) for h in self.history for _, ids in h))


def make(shape: Shape, upto: int, min_len: int = 1, first: int = 0) -> Workload:
    """The workload of `shape`, this step's responses planned up to `upto` tokens; every
    planned length is at least `min_len` (a window starting at `min_len - 1` tokens finds
    every request still running). first: the first prompt's index (prompts first ..
    first + live / group - 1: another step's prompts)."""
    prompts, history, planned, lengths = [], [], [], []
    for p in range(first, first + shape.prompts):
        sol = solution(shape, p)
        prompts.append(prompt(shape, p))
        history.append([(e, response(shape, p, e, j, sol=sol))
                        for e in range(shape.history_epochs) for j in range(shape.group)])
        now = shape.history_epochs
        lens = [max(length(shape, p, now, j), min_len) for j in range(shape.group)]
        planned.append([response(shape, p, now, j, min(n, upto), sol)
                        for j, n in enumerate(lens)])
        lengths.append(lens)
    return Workload(shape, prompts, history, planned, lengths)


__all__ = ["Shape", "Workload", "make", "prompt", "response", "length", "zipf_tokens"]
