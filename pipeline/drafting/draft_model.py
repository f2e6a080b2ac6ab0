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

Drafting with it: `pipeline.drafting.draft_propose`; training it online and its state:
`pipeline.drafting.draft_train`. The model runs on the host CPU in float32 unless moved;
nothing here knows vLLM.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Mapping

import torch
import torch.nn.functional as F
from torch import nn



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
        # the draft vocabulary (None: all tokens) and its LM-head rows: buffers, so they move
        # with the model, kept out of its state dict (the trainer saves the counts they
        # are made from)
        self.register_buffer("draft_ids", None, persistent=False)
        self.register_buffer("_draft_head", None, persistent=False)

    def use_draft_vocab(self, ids: torch.Tensor | None) -> None:
        """Drafting (`forward(..., draft_vocab=True)`) scores only these token ids (a sorted
        1-D tensor; None: the whole vocabulary), with the LM head's rows of them as they
        are now: call again after the weights change. The LM head over a 50k-150k
        vocabulary is most of a one-layer draft's cost per token; training always uses
        the whole head."""
        if ids is None:
            self.draft_ids, self._draft_head = None, None
            return
        self.draft_ids = ids.to(torch.long)
        with torch.no_grad():
            self._draft_head = self._head().detach()[self.draft_ids].clone()

    def _rope(self, positions: torch.Tensor):
        freqs = positions.float()[..., None] * self.inv_freq  # [b, t, half]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # [b, 1, t, d]
        return emb.cos(), emb.sin()

    def forward(self, ids: torch.Tensor, positions: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, caches: list | None = None,
                draft_vocab: bool = False, last: bool = False) -> torch.Tensor:
        """Logits [b, t, vocab] of token ids [b, t]. positions: [b, t] (default 0..t-1);
        mask: a boolean [b, 1, t, keys] attention mask (default causal); caches: one list
        per layer, filled with its keys and values and extended on later calls;
        draft_vocab: logits over `draft_ids` only (column i is token draft_ids[i]), where
        a draft vocabulary is set; last: the last position's logits only ([b, 1, vocab]:
        a draft needs no others, and over a real vocabulary the LM head of a prefill's
        every position costs more than the rest of the draft)."""
        b, t = ids.shape
        if positions is None:
            positions = torch.arange(t).expand(b, t)
        if mask is None and caches is None:
            mask = torch.ones(t, t, dtype=torch.bool).tril()
        cos, sin = self._rope(positions)
        x = self.model.embed_tokens(ids)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, mask, None if caches is None else caches[i])
        if last:
            x = x[:, -1:]
        if draft_vocab and self._draft_head is not None:
            return self.model.norm(x) @ self._draft_head.T
        return self.logits(self.model.norm(x))

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """The final-norm hidden states [b, t, hidden] of right-padded ids (causal)."""
        b, t = ids.shape
        cos, sin = self._rope(torch.arange(t).expand(b, t))
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask, None)
        return self.model.norm(x)

    def _head(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head on final-norm hidden states [..., hidden]."""
        return hidden @ self._head().T

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


__all__ = ["DraftModel", "DraftShape", "from_policy", "policy_parameters", "shape_for"]
