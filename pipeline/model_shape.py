"""The shape of a dense decoder of the Llama family, as its config.json describes it: the
parameters of each module, in all, of the largest one, and the activations a layer keeps
for its backward. What the per-GPU memory plan (pipeline.memory_plan) counts with."""

from __future__ import annotations

from dataclasses import dataclass

MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


class PlanUnavailable(ValueError):
    """The model's config.json does not describe a model this plan can count."""


@dataclass(frozen=True)
class ModelShape:
    """A dense decoder of the Llama family as config.json describes it."""

    model_type: str
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool = False  # lm_head shares the embedding
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # qwen3: an RMSNorm over each head of q and k

    @classmethod
    def from_config(cls, config: dict) -> "ModelShape":
        """From a config.json mapping; missing optional fields take transformers' defaults for
        these model types (kv heads = heads, head_dim = hidden / heads, untied)."""
        if any(config.get(key) for key in MOE_KEYS):
            raise PlanUnavailable("config.json describes a mixture-of-experts model")

        def need(key: str) -> int:
            value = config.get(key)
            if type(value) is not int or value <= 0:
                raise PlanUnavailable(f"config.json has no {key}")
            return value

        model_type = str(config.get("model_type") or "unknown")
        hidden, heads = need("hidden_size"), need("num_attention_heads")
        attention_bias = bool(config.get("attention_bias", False))
        return cls(model_type, need("vocab_size"), hidden, need("intermediate_size"),
                   need("num_hidden_layers"), heads,
                   kv_heads=config.get("num_key_value_heads") or heads,
                   head_dim=config.get("head_dim") or hidden // heads,
                   tied=bool(config.get("tie_word_embeddings", False)),
                   qkv_bias=model_type == "qwen2" or attention_bias,  # qwen2: always
                   o_bias=attention_bias and model_type != "qwen2",
                   mlp_bias=bool(config.get("mlp_bias", False)),
                   qk_norm=model_type == "qwen3")

    def layer_modules(self) -> dict[str, int]:
        """Parameters of each module of one decoder layer."""
        h, i, d = self.hidden, self.intermediate, self.head_dim
        q, kv = self.heads * d, self.kv_heads * d
        modules = {
            "q_proj": h * q + q * self.qkv_bias, "k_proj": h * kv + kv * self.qkv_bias,
            "v_proj": h * kv + kv * self.qkv_bias, "o_proj": q * h + h * self.o_bias,
            "gate_proj": h * i + i * self.mlp_bias, "up_proj": h * i + i * self.mlp_bias,
            "down_proj": i * h + h * self.mlp_bias,
            "input_layernorm": h, "post_attention_layernorm": h}
        if self.qk_norm:
            modules.update(q_norm=d, k_norm=d)
        return modules

    @property
    def params(self) -> int:
        """Distinct parameters: embedding, layers, final norm, lm_head unless tied."""
        embedding = self.vocab * self.hidden
        return (embedding * (1 if self.tied else 2) + self.hidden
                + self.layers * sum(self.layer_modules().values()))

    @property
    def largest_layer(self) -> int:
        """The largest module's own parameters (DeepSpeed's `model_to_params`): the
        embedding or lm_head for these models."""
        return max(self.vocab * self.hidden, *self.layer_modules().values())

    def layer_activation_bytes(self, seq_len: int, nbytes: int) -> int:
        """Bytes one decoder layer keeps for its backward, per token, in transformers' eager
        layer with SDPA attention and `nbytes`-byte activations: each RMSNorm keeps an fp32
        copy of its input and its output; attention keeps q, k and v (k and v repeated to
        every head: a padding mask rules out SDPA's GQA path), SDPA's output, o_proj's
        contiguous input and SDPA's additive mask (one row of L per token); the MLP keeps
        SiLU's input and output, up_proj's output and down_proj's input."""
        norms = 2 * (4 + nbytes) * self.hidden
        attention = nbytes * (5 * self.heads * self.head_dim + seq_len)
        mlp = nbytes * 4 * self.intermediate
        return norms + attention + mlp
