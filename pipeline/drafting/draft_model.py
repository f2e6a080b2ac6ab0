"""A small draft model of the policy, trained online on the policy's own rollouts.

The trees (`pipeline.drafting.drafter`) draft what earlier responses and siblings wrote;
the tokens a step's longest responses compute for themselves are in no tree, and the
policy samples its own argmax for about 95 % of them at T = 1 (docs/speculation.md, the
oracle). A model of the policy drafts those. This module is that model as pure torch:

- `DraftShape`: a Llama-shaped causal LM of one or two decoder layers on the policy's
  tokenizer, its width the policy's so that the token embedding and LM head can be the
  policy's own (EAGLE's initialisation); `shape_for` sizes its MLP so that the draft's own
  parameters (everything but the embedding and LM head it takes from the policy) stay
  within a fraction of the policy's (both in `pipeline.draft_shape`, arithmetic the
  memory plan shares).
- `KVCache`: one layer's keys and values for a batch, appended in place.
- `DraftModel`: the network. Its parameter names and maths are Hugging Face Llama's
  (`model.embed_tokens`, `model.layers.N.self_attn.q_proj`, ..., `model.norm`,
  `lm_head`), so `hf_config()` plus `state_dict()` are a `LlamaForCausalLM` directory,
  the kind vLLM's `draft_model` method loads. `from_policy` builds it from a policy's
  Hugging Face config and state dict.

Drafting with it: `pipeline.drafting.draft_propose`; training it online and its state:
`pipeline.drafting.draft_train`. The model runs in float32 where its weights are (the
host CPU unless moved: `spec.draft_device`); nothing here knows vLLM.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

import torch
import torch.nn.functional as F
from torch import nn

# the shape is arithmetic on a config, which the memory plan (a lower layer) needs too
from pipeline.draft_shape import DraftShape, policy_parameters, shape_for


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


class KVCache:
    """One decoder layer's keys and values for a batch of rows: buffers [rows, kv_heads,
    capacity, head_dim] holding `length` key slots. A forward writes its keys and values
    in place after them (`append`), so the k one-token steps of a draft copy nothing
    already cached (appending by concatenation would copy every row's whole context at
    every step: at 512 requests of thousands of tokens, gigabytes a pass)."""

    __slots__ = ("k", "v", "length")

    def __init__(self, k: torch.Tensor, v: torch.Tensor, length: int = 0):
        self.k, self.v, self.length = k, v, int(length)

    @classmethod
    def empty(cls, shape: "DraftShape", rows: int, capacity: int,
              device: torch.device | str | None = None,
              dtype: torch.dtype = torch.float32) -> "KVCache":
        size = (rows, shape.kv_heads, capacity, shape.head_dim)
        return cls(torch.zeros(size, device=device, dtype=dtype),
                   torch.zeros(size, device=device, dtype=dtype))

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Writes k, v [rows, kv_heads, t, head_dim] after the cached slots; returns every
        slot's keys and values so far (views)."""
        n, t = self.length, k.shape[2]
        if n + t > self.capacity:
            raise ValueError(f"a KV cache of {self.capacity} slots cannot take {t} more "
                             f"after {n}")
        self.k[:, :, n:n + t] = k
        self.v[:, :, n:n + t] = v
        self.length = n + t
        return self.k[:, :, :n + t], self.v[:, :, :n + t]


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
            k, v = cache.append(k, v)
        # grouped-query attention without a copy of the keys for every head
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                             enable_gqa=s.kv_heads != s.heads)
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
        vocabulary is most of a one-layer draft's cost per token; the trainer trains over
        the same tokens (`pipeline.drafting.draft_train`)."""
        if ids is None:
            self.draft_ids, self._draft_head = None, None
            return
        self.draft_ids = ids.to(device=self.device, dtype=torch.long)
        with torch.no_grad():
            self._draft_head = self._head().detach()[self.draft_ids].clone()

    @property
    def device(self) -> torch.device:
        """Where the weights are (and every tensor a draft or an update makes)."""
        return self.inv_freq.device

    def new_caches(self, rows: int, capacity: int) -> list[KVCache]:
        """Empty KV caches, one per layer, for `rows` rows of up to `capacity` key slots,
        on the model's device and in its dtype."""
        dtype = self.model.norm.weight.dtype
        return [KVCache.empty(self.shape, rows, capacity, self.device, dtype)
                for _ in self.model.layers]

    def _rope(self, positions: torch.Tensor):
        freqs = positions.float()[..., None] * self.inv_freq  # [b, t, half]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # [b, 1, t, d]
        return emb.cos(), emb.sin()

    def forward(self, ids: torch.Tensor, positions: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, caches: list[KVCache] | None = None,
                draft_vocab: bool = False, last: bool = False) -> torch.Tensor:
        """Logits [b, t, vocab] of token ids [b, t]. positions: [b, t] (default 0..t-1);
        mask: a boolean [b, 1, t, keys] attention mask (default causal); caches: one
        `KVCache` per layer, which this call's keys and values are appended to;
        draft_vocab: logits over `draft_ids` only (column i is token draft_ids[i]), where
        a draft vocabulary is set; last: the last position's logits only ([b, 1, vocab]:
        a draft needs no others, and over a real vocabulary the LM head of a prefill's
        every position costs more than the rest of the draft)."""
        b, t = ids.shape
        if positions is None:
            positions = torch.arange(t, device=ids.device).expand(b, t)
        if mask is None and caches is None:
            mask = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()
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
        cos, sin = self._rope(torch.arange(t, device=ids.device).expand(b, t))
        mask = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask, None)
        return self.model.norm(x)

    def _head(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def logits(self, hidden: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
        """The LM head on final-norm hidden states [..., hidden]; over token ids `ids`
        alone where given (column i is token ids[i]; differentiable)."""
        return hidden @ (self._head() if ids is None else self.lm_head_rows(ids)).T

    def lm_head_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The LM head's rows of token ids [n] (differentiable)."""
        return self._head()[ids]

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


def policy_state(path: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """The Hugging Face config (a dict) and the float32 state dict of the policy directory."""
    from safetensors.torch import load_file

    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    state: dict[str, torch.Tensor] = {}
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path} holds no .safetensors weights for the draft model to start from")
    for f in files:
        state.update({k: v.float() for k, v in load_file(str(f)).items()})
    return config, state


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


__all__ = ["DraftModel", "DraftShape", "KVCache", "from_policy", "policy_parameters",
           "policy_state", "shape_for"]
