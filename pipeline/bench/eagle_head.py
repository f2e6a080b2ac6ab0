"""An EAGLE-1 draft head on the policy's hidden states, for the offline comparison
`pipeline.bench.eagle_replay` (research tool; the product's draft model is
`pipeline.drafting.draft_model`, which reads tokens only).

EAGLE-1 (Li et al., 2024) drafts from the target's last hidden state: at position t the
head reads the target's feature f_t (its final-norm hidden state, what the LM head reads)
and the token x_{t+1} sampled from it, fused by `fc` over their concatenation, runs one
decoder layer and predicts f_{t+1}; the target's own LM head (frozen) turns that into the
draft of x_{t+2}, and the next draft step reads the predicted feature and the drafted
token. Trained by the feature's smooth-L1 error plus `ce_weight` times the next token's
cross-entropy.

- `policy_features`: the features of token sequences under a Hugging Face policy;
- `EagleHead`: the head, its decoder layer started from one of the policy's (the shapes
  and maths of `pipeline.drafting.draft_model`, its MLP cut so that the layer and `fc`
  stay within a fraction of the policy's parameters, as the token draft's own do), `fc`
  started as "pass the feature through";
- `HeadTrainer`: AdamW updates on a window of steps' sequences, each response's positions
  weighted by its length over its step's mean, as `DraftTrainer` weights the token draft's;
- `draft_steps` / `draft`: k greedy draft tokens for a batch of contexts whose features
  are known up to the token before the last, as a verification pass leaves them;
  `prefix_states` / `draft_cached`: the same from states computed once per recorded
  sequence (what a replay, whose accepted prefixes are the recorded ones, can reuse).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.draft_shape import DraftShape, policy_parameters, shape_for
from pipeline.drafting.draft_model import KVCache, from_policy


@torch.no_grad()
def policy_features(policy_dir, seqs: Sequence[Sequence[int]], rows: int = 4) -> list[torch.Tensor]:
    """Per token sequence, the policy's final-norm hidden state at each position
    ([len, hidden], float32 on the CPU), `rows` sequences a forward (right padding)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(policy_dir), dtype=torch.float32).eval()
    out: list[torch.Tensor] = []
    for i in range(0, len(seqs), rows):
        part = [list(s) for s in seqs[i:i + rows]]
        ids = torch.zeros(len(part), max(map(len, part)), dtype=torch.long)
        for j, s in enumerate(part):
            ids[j, :len(s)] = torch.tensor(s)
        hidden = model.model(input_ids=ids).last_hidden_state
        out += [hidden[j, :len(s)].clone() for j, s in enumerate(part)]
    return out


class EagleHead(nn.Module):
    """fc over [embedding of x_{t+1}; f_t], one decoder layer, the policy's LM head."""

    def __init__(self, config: dict, state: dict, max_fraction: float = 0.1,
                 source_layer: int = 0, seed: int = 0):
        super().__init__()
        h = int(config["hidden_size"])
        fc = (2 * h * h + h) / policy_parameters(config)  # fc's share of the budget
        shape = shape_for(config, layers=1, max_fraction=max_fraction - fc, multiple=16)
        self.shape: DraftShape = shape
        embed = state["model.embed_tokens.weight"].float()
        self.register_buffer("embed", embed.clone(), persistent=False)
        self.register_buffer("head", state.get("lm_head.weight", embed).float().clone(),
                             persistent=False)
        gen = torch.Generator().manual_seed(int(seed))
        self.fc = nn.Linear(2 * h, h, bias=True)
        with torch.no_grad():
            self.fc.weight.normal_(0.0, 0.02, generator=gen)
            self.fc.weight[:, h:] += torch.eye(h)  # the feature passes through
            self.fc.bias.zero_()
        # the layer and RoPE of a one-layer token draft (`from_policy`: the policy layer's
        # attention and norms whole, its MLP cut to the width) started from `source_layer`
        src = f"model.layers.{source_layer}."
        as_first = {**state, **{"model.layers.0." + k[len(src):]: v
                                for k, v in state.items() if k.startswith(src)}}
        draft = from_policy(config, as_first, shape, seed=seed)
        self.layer = draft.model.layers[0]
        self.register_buffer("inv_freq", draft.inv_freq.clone(), persistent=False)

    def own_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, feats: torch.Tensor, next_ids: torch.Tensor, positions: torch.Tensor,
                mask: torch.Tensor | None, cache: KVCache | None = None) -> torch.Tensor:
        """Predicted features [b, t, hidden] from features [b, t, hidden] and the tokens
        sampled from them [b, t] at positions [b, t]."""
        x = self.fc(torch.cat((self.embed[next_ids], feats), dim=-1))
        freqs = positions.float()[..., None] * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]
        return self.layer(x, emb.cos(), emb.sin(), mask, cache)

    def logits(self, feats: torch.Tensor) -> torch.Tensor:
        return feats @ self.head.T


# -- drafting -----------------------------------------------------------------------------
@torch.inference_mode()
def draft_steps(head: EagleHead, contexts: Sequence[Sequence[int]],
                feats: Sequence[torch.Tensor], k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """k greedy draft tokens per context (token ids x_0..x_{m-1}) whose features f_0..f_{m-2}
    are `feats[i][:m - 1]` (the target has computed every position before the newest
    token), and the features the head predicted for them: ([b, k] ids, [b, k, hidden]).
    One prefill over the left-padded fused inputs, then k - 1 one-token steps on a KV
    cache."""
    b = len(contexts)
    lens = [len(c) - 1 for c in contexts]  # fused inputs per row
    if any(n < 1 for n in lens):
        raise ValueError("every context needs two tokens (a feature and the token after it)")
    width = max(lens)
    h = head.shape.hidden_size
    ids = torch.zeros(b, width, dtype=torch.long)
    f = torch.zeros(b, width, h)
    for i, (c, n) in enumerate(zip(contexts, lens)):  # left padding
        ids[i, width - n:] = torch.tensor(list(c[1:]))
        f[i, width - n:] = feats[i][:n]
    lengths = torch.tensor(lens)
    valid = torch.arange(width)[None] >= (width - lengths)[:, None]
    positions = (valid.long().cumsum(1) - 1).clamp(min=0)
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    # a padded query row attends to nothing real; let it see itself so softmax stays finite
    mask = (causal[None] & valid[:, None, :])[:, None] | torch.eye(width, dtype=torch.bool)[None, None]
    cache = KVCache.empty(head.shape, b, width + k)
    out = head(f, ids, positions, mask, cache)[:, -1:]  # [b, 1, h]
    return _steps(head, out, positions[:, -1:] + 1, valid, cache, k)


def _steps(head: EagleHead, out: torch.Tensor, pos: torch.Tensor, keys: torch.Tensor,
           cache: KVCache, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """k greedy tokens from the predicted features `out` [b, 1, h], each step after the
    first reading the last prediction and its token as the fused input at `pos` [b, 1]
    (then one further on); keys: which of the cache's slots are real ([b, slots])."""
    toks, preds = [], []
    for step in range(k):
        tok = head.logits(out).argmax(-1)  # [b, 1]
        toks.append(tok)
        preds.append(out)
        if step == k - 1:
            break
        keys = torch.cat((keys, torch.ones(len(keys), 1, dtype=torch.bool)), dim=1)
        out = head(out, tok, pos, keys[:, None, None, :], cache)
        pos = pos + 1
    return torch.cat(toks, dim=1), torch.cat(preds, dim=1)


def draft(head: EagleHead, contexts: Sequence[Sequence[int]], feats: Sequence[torch.Tensor],
          k: int) -> list[list[int]]:
    """`draft_steps`' tokens as lists."""
    return draft_steps(head, contexts, feats, k)[0].tolist()


@torch.inference_mode()
def prefix_states(head: EagleHead, seqs: Sequence[Sequence[int]],
                  feats: Sequence[torch.Tensor], rows: int = 8) -> list[tuple]:
    """Per whole sequence x_0..x_{n-1} with features f_0..f_{n-1}: the head's keys and
    values ([kv_heads, n - 1, head_dim] each) and outputs ([n - 1, hidden]) at every fused
    input t = 0..n-2, teacher forced. A replayed response's accepted prefix is always the
    recorded one, so every pass's prefix state is a prefix of these (`draft_cached`)."""
    out: list[tuple] = []
    for i in range(0, len(seqs), rows):
        part, fs = [list(s) for s in seqs[i:i + rows]], feats[i:i + rows]
        lens = [len(s) - 1 for s in part]
        b, width = len(part), max(lens)
        ids = torch.zeros(b, width, dtype=torch.long)
        f = torch.zeros(b, width, head.shape.hidden_size)
        for j, (s, n) in enumerate(zip(part, lens)):  # right padding: causal, never read
            ids[j, :n] = torch.tensor(s[1:])
            f[j, :n] = fs[j][:n]
        cache = KVCache.empty(head.shape, b, width)
        mask = torch.ones(width, width, dtype=torch.bool).tril()
        pred = head(f, ids, torch.arange(width).expand(b, width), mask, cache)
        out += [(cache.k[j, :, :n].clone(), cache.v[j, :, :n].clone(), pred[j, :n].clone())
                for j, n in enumerate(lens)]
    return out


@torch.inference_mode()
def draft_cached(head: EagleHead, states: Sequence[tuple], lengths: Sequence[int],
                 k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`draft_steps` of each row's first `lengths[i]` tokens, from its `prefix_states`
    instead of a prefill: the prefix's keys and values copied into a left-padded cache,
    then k one-token steps."""
    b = len(states)
    lens = [m - 1 for m in lengths]
    if any(n < 1 for n in lens):
        raise ValueError("every context needs two tokens (a feature and the token after it)")
    width = max(lens)
    cache = KVCache.empty(head.shape, b, width + k)
    for i, ((kk, vv, _), n) in enumerate(zip(states, lens)):
        cache.k[i, :, width - n:width] = kk[:, :n]
        cache.v[i, :, width - n:width] = vv[:, :n]
    cache.length = width
    keys = torch.arange(width)[None] >= (width - torch.tensor(lens))[:, None]
    out = torch.stack([st[2][n - 1] for st, n in zip(states, lens)])[:, None]  # [b, 1, h]
    return _steps(head, out, torch.tensor(lens)[:, None], keys, cache, k)


# -- training -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Example:
    """One sequence: token ids [n], the sampling policy's features [n, hidden], the first
    response position, and the weight of each of its response positions."""

    ids: torch.Tensor
    feats: torch.Tensor
    start: int
    weight: float


def examples_of(prompts, responses, feats, length_power: float = 1.0) -> list[Example]:
    """A step's sequences as examples, each response weighted by (its length / the step's
    mean) ** length_power."""
    mean = sum(map(len, responses)) / max(len(responses), 1)
    return [Example(torch.tensor(list(p) + list(r)), f, len(p),
                    (len(r) / mean) ** length_power if mean else 1.0)
            for p, r, f in zip(prompts, responses, feats) if len(r) >= 1]


@dataclass(frozen=True)
class HeadReport:
    loss_before: float
    loss_after: float
    seconds: float


class HeadTrainer:
    """AdamW on the head; each `train` call adds a step's examples to a window of the
    last `window` calls' and runs `updates` updates of `batch` sequences from it."""

    def __init__(self, head: EagleHead, updates: int = 20, batch: int = 32, window: int = 3,
                 lr: float = 1e-3, ce_weight: float = 0.1, seed: int = 0):
        self.head, self.updates, self.batch, self.window = head, updates, batch, window
        self.ce_weight = ce_weight
        self.opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)
        self.rng = random.Random(seed)
        self.steps: list[list[Example]] = []

    def _loss(self, batch: Sequence[Example]) -> torch.Tensor:
        """The weighted mean over response positions: input t reads (f_t, x_{t+1}) and is
        scored on f_{t+1} and x_{t+2}, for x_{t+2} a response token."""
        b, n = len(batch), max(len(e.ids) for e in batch) - 2
        h = self.head.shape.hidden_size
        ids = torch.zeros(b, n, dtype=torch.long)
        tgt = torch.zeros(b, n, dtype=torch.long)
        f, f_next = torch.zeros(b, n, h), torch.zeros(b, n, h)
        w = torch.zeros(b, n)
        for i, e in enumerate(batch):
            m = len(e.ids) - 2
            if m < 1:
                continue
            ids[i, :m], tgt[i, :m] = e.ids[1:m + 1], e.ids[2:m + 2]
            f[i, :m], f_next[i, :m] = e.feats[:m], e.feats[1:m + 1]
            w[i, max(e.start - 2, 0):m] = e.weight
        positions = torch.arange(n).expand(b, n)
        mask = torch.ones(n, n, dtype=torch.bool).tril()
        pred = self.head(f, ids, positions, mask)
        reg = F.smooth_l1_loss(pred, f_next, reduction="none").mean(-1)
        ce = F.cross_entropy(self.head.logits(pred).transpose(1, 2), tgt, reduction="none")
        return ((reg + self.ce_weight * ce) * w).sum() / w.sum().clamp(min=1e-9)

    def loss(self, examples: Sequence[Example]) -> float:
        with torch.no_grad():
            return float(sum(self._loss(examples[i:i + self.batch]) * len(examples[i:i + self.batch])
                             for i in range(0, len(examples), self.batch)) / max(len(examples), 1))

    def _update(self, pool: Sequence[Example]) -> None:
        batch = self.rng.sample(list(pool), min(self.batch, len(pool)))
        self.opt.zero_grad(set_to_none=True)
        loss = self._loss(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.head.parameters(), 1.0)
        self.opt.step()

    def warm_up(self, examples: Sequence[Example], updates: int) -> HeadReport:
        """`updates` updates on `examples` alone (kept out of the window)."""
        t = time.perf_counter()
        before = self.loss(examples)
        for _ in range(updates):
            self._update(examples)
        return HeadReport(before, self.loss(examples), time.perf_counter() - t)

    def train(self, examples: Sequence[Example]) -> HeadReport:
        t = time.perf_counter()
        self.steps = (self.steps + [list(examples)])[-self.window:]
        pool = [e for s in self.steps for e in s]
        before = self.loss(examples)
        for _ in range(self.updates):
            self._update(pool)
        return HeadReport(before, self.loss(examples), time.perf_counter() - t)


__all__ = ["EagleHead", "Example", "HeadTrainer", "draft", "draft_cached", "draft_steps",
           "examples_of", "policy_features", "prefix_states"]
