"""A small draft model of the policy, trained online on the policy's own rollouts.

The trees (`pipeline.drafting.drafter`) draft what earlier responses and siblings wrote;
the tokens a step's longest responses compute for themselves are in no tree, and the
policy samples its own argmax for about 95 % of them at T = 1 (docs/speculation.md, the
oracle). A model of the policy drafts those. This module is that model as pure torch:

- `DraftShape`: a Llama-shaped causal LM of one or two decoder layers on the policy's
  tokenizer, its width the policy's so that the token embedding and LM head can be the
  policy's own (EAGLE's initialisation); `shape_for` sizes its MLP so that the draft's own
  parameters (everything but the embedding and LM head it takes from the policy) stay
  within a fraction of the policy's.
- `DraftModel`: the network. Its parameter names and maths are Hugging Face Llama's
  (`model.embed_tokens`, `model.layers.N.self_attn.q_proj`, ..., `model.norm`,
  `lm_head`), so `hf_config()` plus `state_dict()` are a `LlamaForCausalLM` directory,
  the kind vLLM's `draft_model` method loads. `from_policy` builds it from a policy's
  Hugging Face config and state dict.
- `DraftTrainer`: an online trainer. One call takes one step's rollouts (prompt ids,
  response ids) and runs a fixed number of AdamW updates on their response tokens, each
  token weighted by its response's length relative to the step's mean, since the longest
  responses set the step's critical path. A fixed number of updates, not a time budget,
  so that the same seed and rollouts give the same weights.
- `propose(model, contexts, k)`: k greedy draft tokens per context in one batched loop
  with a KV cache, and the model's probability of each drafted token (what a rule that
  chooses between draft sources needs to estimate acceptance).
- `save_state` / `load_state`: weights, optimiser moments and the trainer's counters in
  one safetensors file (no pickle), for checkpoints.

The model runs on the host CPU in float32 unless moved; nothing here knows vLLM.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Hashable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

FORMAT = "rhymectl-draft-model/1"  # the safetensors metadata tag of `save_state`


# -- shape --------------------------------------------------------------------------------
@dataclass(frozen=True)
class DraftShape:
    """A Llama-shaped draft: `layers` decoder layers of the policy's width."""

    vocab_size: int
    hidden_size: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    max_positions: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_embeddings: bool = True

    def layer_parameters(self) -> int:
        """Parameters of one decoder layer (attention, MLP, its two norms)."""
        h, d = self.hidden_size, self.head_dim
        attention = h * self.heads * d * 2 + h * self.kv_heads * d * 2
        return attention + 3 * h * self.intermediate_size + 2 * h

    def own_parameters(self) -> int:
        """Parameters besides the token embedding and LM head (those are the policy's)."""
        return self.layers * self.layer_parameters() + self.hidden_size

    def parameters(self) -> int:
        embed = self.vocab_size * self.hidden_size
        return self.own_parameters() + embed * (1 if self.tie_embeddings else 2)


def _rope_theta(config: Mapping) -> float:
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ("default", None):
        raise ValueError(f"rope type {kind!r} is not supported by the draft model "
                         "(only the default rotary embedding)")
    return float(theta)


def policy_parameters(config: Mapping) -> int:
    """Parameters of a Llama/Qwen2-shaped policy from its Hugging Face config (biases
    ignored: a rounding error at these sizes)."""
    h = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv = int(config.get("num_key_value_heads") or heads)
    d = int(config.get("head_dim") or h // heads)
    layer = h * heads * d * 2 + h * kv * d * 2 + 3 * h * int(config["intermediate_size"]) + 2 * h
    embed = int(config["vocab_size"]) * h
    tied = bool(config.get("tie_word_embeddings", False))
    return int(config["num_hidden_layers"]) * layer + h + embed * (1 if tied else 2)


def shape_for(config: Mapping, *, layers: int = 1, max_fraction: float = 0.10,
              multiple: int = 32) -> DraftShape:
    """The draft for a policy (its Hugging Face config as a dict): `layers` decoder layers
    with the policy's width, heads and vocabulary, and the widest MLP (a multiple of
    `multiple`, at most the policy's) that keeps the draft's own parameters within
    `max_fraction` of the policy's. Raises ValueError when even an MLP of `multiple`
    does not fit."""
    h = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    base = DraftShape(
        vocab_size=int(config["vocab_size"]), hidden_size=h, layers=int(layers), heads=heads,
        kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or h // heads), intermediate_size=0,
        max_positions=int(config.get("max_position_embeddings", 2048)),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)), rope_theta=_rope_theta(config),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)))
    room = max_fraction * policy_parameters(config) - base.own_parameters()
    width = int(room // (3 * h * layers)) // multiple * multiple
    width = min(width, int(config["intermediate_size"]))
    if width < multiple:
        raise ValueError(f"a {layers}-layer draft of width {h} does not fit in "
                         f"{max_fraction:.0%} of the policy's parameters; allow a larger "
                         "fraction or fewer layers")
    return DraftShape(**{**asdict(base), "intermediate_size": width})


# -- the network --------------------------------------------------------------------------
class _RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class _Attention(nn.Module):
    def __init__(self, s: DraftShape):
        super().__init__()
        self.s = s
        self.q_proj = nn.Linear(s.hidden_size, s.heads * s.head_dim, bias=False)
        self.k_proj = nn.Linear(s.hidden_size, s.kv_heads * s.head_dim, bias=False)
        self.v_proj = nn.Linear(s.hidden_size, s.kv_heads * s.head_dim, bias=False)
        self.o_proj = nn.Linear(s.heads * s.head_dim, s.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask, cache: list | None):
        s = self.s
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, s.heads, s.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if cache is not None:
            if cache:
                k = torch.cat((cache[0], k), dim=2)
                v = torch.cat((cache[1], v), dim=2)
            cache[:] = [k, v]
        if s.kv_heads != s.heads:
            k = k.repeat_interleave(s.heads // s.kv_heads, dim=1)
            v = v.repeat_interleave(s.heads // s.kv_heads, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, s.heads * s.head_dim))


class _MLP(nn.Module):
    def __init__(self, s: DraftShape):
        super().__init__()
        self.gate_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.up_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.down_proj = nn.Linear(s.intermediate_size, s.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Layer(nn.Module):
    def __init__(self, s: DraftShape):
        super().__init__()
        self.input_layernorm = _RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.self_attn = _Attention(s)
        self.post_attention_layernorm = _RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.mlp = _MLP(s)

    def forward(self, x, cos, sin, mask, cache):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class _Body(nn.Module):
    def __init__(self, s: DraftShape):
        super().__init__()
        self.embed_tokens = nn.Embedding(s.vocab_size, s.hidden_size)
        self.layers = nn.ModuleList(_Layer(s) for _ in range(s.layers))
        self.norm = _RMSNorm(s.hidden_size, s.rms_norm_eps)


class DraftModel(nn.Module):
    """The draft network (Hugging Face Llama's parameter names and maths)."""

    def __init__(self, shape: DraftShape, seed: int = 0):
        super().__init__()
        self.shape = shape
        gen = torch.Generator().manual_seed(int(seed))
        self.model = _Body(shape)
        self.lm_head = None if shape.tie_embeddings else nn.Linear(
            shape.hidden_size, shape.vocab_size, bias=False)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, 0.02, generator=gen)
        half = shape.head_dim // 2
        inv = 1.0 / shape.rope_theta ** (torch.arange(0, half, dtype=torch.float32) / half)
        self.register_buffer("inv_freq", inv, persistent=False)

    def _rope(self, positions: torch.Tensor):
        freqs = positions.float()[..., None] * self.inv_freq  # [b, t, half]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # [b, 1, t, d]
        return emb.cos(), emb.sin()

    def forward(self, ids: torch.Tensor, positions: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, caches: list | None = None) -> torch.Tensor:
        """Logits [b, t, vocab] of token ids [b, t]. positions: [b, t] (default 0..t-1);
        mask: a boolean [b, 1, t, keys] attention mask (default causal); caches: one list
        per layer, filled with its keys and values and extended on later calls."""
        b, t = ids.shape
        if positions is None:
            positions = torch.arange(t).expand(b, t)
        if mask is None and caches is None:
            mask = torch.ones(t, t, dtype=torch.bool).tril()
        cos, sin = self._rope(positions)
        x = self.model.embed_tokens(ids)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, mask, None if caches is None else caches[i])
        x = self.model.norm(x)
        head = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return x @ head.T

    def hf_config(self) -> dict:
        """A Hugging Face `LlamaForCausalLM` config for these weights."""
        s = self.shape
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                "vocab_size": s.vocab_size, "hidden_size": s.hidden_size,
                "num_hidden_layers": s.layers, "num_attention_heads": s.heads,
                "num_key_value_heads": s.kv_heads, "head_dim": s.head_dim,
                "intermediate_size": s.intermediate_size, "hidden_act": "silu",
                "max_position_embeddings": s.max_positions, "rms_norm_eps": s.rms_norm_eps,
                "rope_parameters": {"rope_theta": s.rope_theta, "rope_type": "default"},
                "tie_word_embeddings": s.tie_embeddings, "attention_bias": False,
                "mlp_bias": False, "dtype": "float32"}


def from_policy(config: Mapping, state: Mapping[str, torch.Tensor],
                shape: DraftShape | None = None, seed: int = 0) -> DraftModel:
    """A draft for the policy whose Hugging Face config (a dict) and state dict are given:
    shaped by `shape_for(config)` unless `shape` says otherwise, with the policy's token
    embedding, LM head and final norm copied, and each decoder layer started from the
    policy's layer of the same index (its attention and norms whole, its MLP cut to the
    draft's width: the first rows of gate and up, the first columns of down). The rest
    is drawn from `seed`."""
    shape = shape or shape_for(config)
    if shape.vocab_size != int(config["vocab_size"]) or shape.hidden_size != int(config["hidden_size"]):
        raise ValueError("the draft must have the policy's vocabulary and width to share "
                         "its embedding and LM head")
    model = DraftModel(shape, seed)
    own = dict(model.named_parameters())
    embed = state["model.embed_tokens.weight"]
    copies = {"model.embed_tokens.weight": embed, "model.norm.weight": state["model.norm.weight"]}
    if model.lm_head is not None:
        copies["lm_head.weight"] = state.get("lm_head.weight", embed)
    n_policy = int(config["num_hidden_layers"])
    width = shape.intermediate_size
    for i in range(min(shape.layers, n_policy)):
        pre = f"model.layers.{i}."
        for name in ("input_layernorm.weight", "post_attention_layernorm.weight",
                     "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                     "self_attn.v_proj.weight", "self_attn.o_proj.weight"):
            copies[pre + name] = state[pre + name]
        copies[pre + "mlp.gate_proj.weight"] = state[pre + "mlp.gate_proj.weight"][:width]
        copies[pre + "mlp.up_proj.weight"] = state[pre + "mlp.up_proj.weight"][:width]
        copies[pre + "mlp.down_proj.weight"] = state[pre + "mlp.down_proj.weight"][:, :width]
    with torch.no_grad():
        for name, value in copies.items():
            if own[name].shape != value.shape:
                raise ValueError(f"policy tensor {name} has shape {tuple(value.shape)}, the "
                                 f"draft needs {tuple(own[name].shape)}")
            own[name].copy_(value.to(own[name].dtype))
    return model


# -- drafting -----------------------------------------------------------------------------
@torch.inference_mode()
def propose(model: DraftModel, contexts: Sequence[Sequence[int]], k: int,
            temperature: float = 1.0) -> tuple[list[list[int]], list[list[float]]]:
    """k greedy draft tokens for each context (token ids: prompt and output so far), in one
    batched loop (one prefill of the left-padded contexts, then k - 1 one-token steps on a
    KV cache), and the model's probability of each drafted token at `temperature` (its
    estimate of the one-hot acceptance of that token where the model matches the
    policy). A context longer than the model's positions allow keeps its last tokens."""
    if k <= 0 or not contexts:
        return [[] for _ in contexts], [[] for _ in contexts]
    keep = max(1, model.shape.max_positions - k)
    ctx = [list(c)[-keep:] for c in contexts]
    if any(not c for c in ctx):
        raise ValueError("every context needs at least one token")
    b, width = len(ctx), max(map(len, ctx))
    ids = torch.zeros(b, width, dtype=torch.long)
    valid = torch.zeros(b, width + k, dtype=torch.bool)
    for j, c in enumerate(ctx):  # left padding: every row's next token is at `width`
        ids[j, width - len(c):] = torch.tensor(c, dtype=torch.long)
        valid[j, width - len(c):] = True
    valid[:, width:] = True
    positions = (valid[:, :width].long().cumsum(1) - 1).clamp(min=0)
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    mask = (causal[None] & valid[:, None, :width])[:, None]  # [b, 1, t, keys]
    # a padded query row attends to nothing real; let it see itself so softmax stays finite
    mask = mask | torch.eye(width, dtype=torch.bool)[None, None]
    caches: list = [[] for _ in model.model.layers]
    logits = model(ids, positions, mask, caches)[:, -1]
    nxt_pos = positions[:, -1] + 1
    tokens, probs = [], []
    inv_t = 1.0 / max(float(temperature), 1e-6)
    for step in range(k):
        p = torch.softmax(logits.float() * inv_t, dim=-1)
        tok = logits.argmax(-1)
        tokens.append(tok)
        probs.append(p.gather(1, tok[:, None])[:, 0])
        if step == k - 1:
            break
        keys = width + step + 1
        step_mask = valid[:, None, None, :keys]
        logits = model(tok[:, None], nxt_pos[:, None], step_mask, caches)[:, -1]
        nxt_pos = nxt_pos + 1
    toks = torch.stack(tokens, 1).tolist()
    ps = torch.stack(probs, 1).tolist()
    return toks, ps


class DraftCache:
    """The draft model's keys and values per request, kept from one pass to the next so
    that `propose_cached` runs only the tokens a request gained since its last draft
    (the accepted draft tokens and the pass's own token), not its whole context."""

    def __init__(self):
        self._rows: dict[Hashable, tuple[list[int], list[tuple[torch.Tensor, torch.Tensor]]]] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def forget(self, req_id: Hashable) -> None:
        """The request stopped (or its tokens were replaced): its entry goes."""
        self._rows.pop(req_id, None)

    def clear(self) -> None:
        self._rows.clear()


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@torch.inference_mode()
def propose_cached(model: DraftModel, cache: DraftCache, req_ids: Sequence[Hashable],
                   contexts: Sequence[Sequence[int]], k: int,
                   temperature: float = 1.0) -> tuple[list[list[int]], list[list[float]]]:
    """`propose` for running requests, reusing each request's keys and values from its
    last call as far as its context still agrees with what they were computed for (its
    context then, and the draft tokens after it). The drafts are `propose`'s; a context
    longer than the model's positions allow is recomputed whole (its window moved)."""
    if k <= 0 or not contexts:
        return [[] for _ in contexts], [[] for _ in contexts]
    keep = max(1, model.shape.max_positions - k)
    layers = len(model.model.layers)
    past_len, pasts, news, ctxs = [], [], [], []
    for req, c in zip(req_ids, contexts):
        c = [int(t) for t in c]
        if not c:
            raise ValueError("every context needs at least one token")
        if len(c) > keep:
            cache.forget(req)
            c = c[-keep:]
        held = cache._rows.get(req)
        p = 0 if held is None else min(_common_prefix(held[0], c), len(c) - 1)
        past_len.append(p)
        pasts.append(None if held is None or p == 0 else
                     [(kk[:, :p], vv[:, :p]) for kk, vv in held[1]])
        news.append(c[p:])
        ctxs.append(c)
    b = len(ctxs)
    P, N = max(past_len), max(map(len, news))
    s = model.shape
    # key slots: [left pad | past] [left pad | new], positions explicit for RoPE
    ids = torch.zeros(b, N, dtype=torch.long)
    qpos = torch.zeros(b, N, dtype=torch.long)
    kpos = torch.full((b, P + N), -1, dtype=torch.long)
    for j, (p, new) in enumerate(zip(past_len, news)):
        n = len(new)
        ids[j, N - n:] = torch.tensor(new, dtype=torch.long)
        qpos[j, N - n:] = torch.arange(p, p + n)
        kpos[j, P - p:P] = torch.arange(p)
        kpos[j, P + N - n:] = torch.arange(p, p + n)
    valid = kpos >= 0
    mask = valid[:, None, :] & (kpos[:, None, :] <= qpos[:, :, None])
    # a padded query slot attends to itself only, so that its softmax stays finite
    mask[:, :, P:] |= torch.eye(N, dtype=torch.bool)[None]
    caches: list = [[] for _ in range(layers)]
    if P:
        for i in range(layers):
            kk = torch.zeros(b, s.kv_heads, P, s.head_dim)
            vv = torch.zeros(b, s.kv_heads, P, s.head_dim)
            for j, (p, past) in enumerate(zip(past_len, pasts)):
                if p:
                    kk[j, :, P - p:] = past[i][0]
                    vv[j, :, P - p:] = past[i][1]
            caches[i] = [kk, vv]
    logits = model(ids, qpos, mask[:, None], caches)[:, -1]
    nxt_pos = qpos[:, -1] + 1
    tokens, probs = [], []
    inv_t = 1.0 / max(float(temperature), 1e-6)
    keys_valid = valid
    for step in range(k):
        prob = torch.softmax(logits.float() * inv_t, dim=-1)
        tok = logits.argmax(-1)
        tokens.append(tok)
        probs.append(prob.gather(1, tok[:, None])[:, 0])
        if step == k - 1:
            break
        keys_valid = torch.cat((keys_valid, torch.ones(b, 1, dtype=torch.bool)), dim=1)
        logits = model(tok[:, None], nxt_pos[:, None], keys_valid[:, None, None], caches)[:, -1]
        nxt_pos = nxt_pos + 1
    toks = torch.stack(tokens, 1).tolist()
    for j, req in enumerate(req_ids):
        slots = torch.nonzero(keys_valid[j])[:, 0]  # past, new, then the k - 1 drafted
        cache._rows[req] = (ctxs[j] + toks[j][:k - 1],
                            [(c[0][j][:, slots].clone(), c[1][j][:, slots].clone())
                             for c in caches])
    return toks, torch.stack(probs, 1).tolist()


# -- online training ----------------------------------------------------------------------
@dataclass(frozen=True)
class TrainReport:
    """One `DraftTrainer.train` call: weighted loss on its rollouts before and after."""

    loss_before: float
    loss_after: float
    updates: int
    tokens: int
    seconds: float


@dataclass(frozen=True)
class TrainSettings:
    """updates: AdamW steps per call; batch: responses per step; length_power: each
    response token weighs (length / mean length) ** length_power."""

    updates: int = 20
    batch: int = 32
    lr: float = 3e-3
    weight_decay: float = 0.0
    length_power: float = 1.0
    max_grad_norm: float = 1.0


class DraftTrainer:
    """Trains a `DraftModel` on each step's rollouts; deterministic given the seed (CPU)."""

    def __init__(self, model: DraftModel, settings: TrainSettings = TrainSettings(),
                 seed: int = 0):
        self.model = model
        self.settings = settings
        self.seed = int(seed)
        self.calls = 0  # train calls so far: the batch order's seed moves with it
        self.opt = torch.optim.AdamW(model.parameters(), lr=settings.lr, betas=(0.9, 0.99),
                                     weight_decay=settings.weight_decay)

    def _examples(self, rollouts: Sequence[tuple[Sequence[int], Sequence[int]]]):
        """(ids, first response position, weight) per rollout with a response; each
        sequence cut to the model's positions."""
        limit = self.model.shape.max_positions
        kept = [(list(p), list(r)) for p, r in rollouts if len(r) and len(p)]
        if not kept:
            return []
        mean = sum(len(r) for _, r in kept) / len(kept)
        power = self.settings.length_power
        return [((p + r)[:limit], len(p), (len(r) / mean) ** power) for p, r in kept
                if len(p) < limit]

    def _loss(self, batch) -> tuple[torch.Tensor, int]:
        """Weighted mean next-token cross-entropy over the response tokens of `batch`."""
        width = max(len(ids) for ids, _, _ in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        weight = torch.zeros(len(batch), width - 1)
        for j, (seq, start, w) in enumerate(batch):
            ids[j, :len(seq)] = torch.tensor(seq, dtype=torch.long)
            weight[j, start - 1:len(seq) - 1] = w  # positions that predict response tokens
        logits = self.model(ids[:, :-1])  # right padding: the causal mask suffices
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                             reduction="none").view_as(weight)
        return (ce * weight).sum() / weight.sum().clamp(min=1e-9), int((weight > 0).sum())

    def loss(self, rollouts: Sequence[tuple[Sequence[int], Sequence[int]]]) -> float:
        """The weighted loss on `rollouts` (no update)."""
        examples = self._examples(rollouts)
        if not examples:
            return float("nan")
        with torch.no_grad():
            total, weights = 0.0, 0.0
            for i in range(0, len(examples), self.settings.batch):
                part = examples[i:i + self.settings.batch]
                value, _ = self._loss(part)
                w = sum(x[2] * (len(x[0]) - x[1]) for x in part)
                total, weights = total + float(value) * w, weights + w
        return total / weights

    def train(self, rollouts: Sequence[tuple[Sequence[int], Sequence[int]]]) -> TrainReport:
        """`settings.updates` AdamW steps on minibatches of `rollouts` (prompt ids,
        response ids), reshuffled each pass over them from (seed, calls)."""
        start = time.perf_counter()
        examples = self._examples(rollouts)
        if not examples:
            return TrainReport(float("nan"), float("nan"), 0, 0, 0.0)
        before = self.loss(rollouts)
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.calls)
        s = self.settings
        order: list[int] = []
        tokens = 0
        self.model.train()
        for _ in range(s.updates):
            if len(order) < min(s.batch, len(examples)):
                order += torch.randperm(len(examples), generator=gen).tolist()
            picked, order = order[:s.batch], order[s.batch:]
            value, n = self._loss([examples[i] for i in picked])
            self.opt.zero_grad(set_to_none=True)
            value.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), s.max_grad_norm)
            self.opt.step()
            tokens += n
        self.model.eval()
        self.calls += 1
        return TrainReport(before, self.loss(rollouts), s.updates, tokens,
                           time.perf_counter() - start)


# -- state ----------------------------------------------------------------------------------
def save_state(trainer: DraftTrainer, path: str | Path) -> None:
    """The model's weights, AdamW's moments and the trainer's counters in one safetensors
    file at `path` (written in place: the caller's checkpoint writes atomically)."""
    from safetensors.torch import save_file

    tensors = {f"weight.{n}": p.detach().contiguous() for n, p in trainer.model.named_parameters()}
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    for p, st in trainer.opt.state.items():
        n = names[id(p)]
        tensors[f"adam.{n}.exp_avg"] = st["exp_avg"].contiguous()
        tensors[f"adam.{n}.exp_avg_sq"] = st["exp_avg_sq"].contiguous()
        tensors[f"adam.{n}.step"] = torch.as_tensor(st["step"], dtype=torch.float32).reshape(1)
    meta = {"format": FORMAT, "shape": json.dumps(asdict(trainer.model.shape)),
            "settings": json.dumps(asdict(trainer.settings)), "seed": str(trainer.seed),
            "calls": str(trainer.calls)}
    save_file(tensors, str(path), metadata=meta)


def load_state(path: str | Path) -> DraftTrainer:
    """The trainer `save_state` wrote: same weights, moments and counters, so that the
    next `train` call and every draft are those of the trainer that was saved."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        if meta.get("format") != FORMAT:
            raise ValueError(f"{path} is not a draft-model state ({FORMAT})")
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    model = DraftModel(DraftShape(**json.loads(meta["shape"])))
    trainer = DraftTrainer(model, TrainSettings(**json.loads(meta["settings"])),
                           int(meta["seed"]))
    trainer.calls = int(meta["calls"])
    params = dict(model.named_parameters())
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(tensors[f"weight.{n}"])
    for n, p in params.items():
        if f"adam.{n}.step" in tensors:
            trainer.opt.state[p] = {
                "step": tensors[f"adam.{n}.step"].reshape(()).clone(),
                "exp_avg": tensors[f"adam.{n}.exp_avg"].clone(),
                "exp_avg_sq": tensors[f"adam.{n}.exp_avg_sq"].clone()}
    model.eval()
    return trainer


def expected_accepted(probs: Sequence[float]) -> float:
    """Expected accepted tokens of a draft whose tokens are accepted with these
    probabilities in turn (each only if all before it were): sum of the prefix products."""
    total, run = 0.0, 1.0
    for p in probs:
        run *= float(p)
        total += run
    return total


__all__ = ["DraftCache", "DraftModel", "DraftShape", "DraftTrainer", "TrainReport", "TrainSettings",
           "expected_accepted", "from_policy", "load_state", "policy_parameters", "propose",
           "propose_cached", "save_state", "shape_for"]
