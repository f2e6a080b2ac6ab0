"""The shape of `history+group+model`'s draft model (`DraftShape`, `shape_for`), what a step of
it costs beside a target pass (`step_fraction`), and the GPU memory it takes
(`draft_memory`, an item of the memory plan): arithmetic on a policy's
Hugging Face config, no torch. The network: `pipeline.drafting.draft_model`."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    from pipeline.config.schema import Config
    from pipeline.model_shape import ModelShape

DRAFT_FRACTION = 0.10  # the most of the policy's parameters a draft's own may be
DRAFT_BATCH = 32  # responses per AdamW update of the draft (`TrainSettings.batch`)
# the fp32 logits one piece of the draft's loss may hold: a minibatch of 32 responses of 8k
# tokens over a 152k vocabulary would hold 160 GB at once. Above this the loss is summed in
# chunks of tokens whose logits the backward pass recomputes (3,530 tokens at a 152k
# vocabulary); a minibatch within it computes as one piece (SmolLM2's 32 x 256: 1.6 GB)
LOSS_CHUNK_BYTES = 2 << 30
# padded tokens one forward and backward of the draft's update may hold: a minibatch above
# it is split into pieces whose gradients add up (32 responses of 5k tokens kept 160k
# tokens' activations at once, 73 GiB at a 7B's width); SmolLM2's and the tiny policy's
# minibatches (32 x 320 and 32 x 192 tokens at most) stay one piece
MICRO_TOKENS = 1 << 14


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


def step_fraction(shape: DraftShape, head_rows: int | None, policy_params: int) -> float:
    """What one forward step of the draft costs, as a share of one target pass, where both
    are memory-bound (a decode pass on a GPU below its ridge: each reads its weights once).
    A step reads the draft's own parameters and the LM head's rows it computes (head_rows:
    its draft vocabulary; None: the whole vocabulary); the embedding's few looked-up rows
    are left out. A pass reads all of the policy's `policy_params`."""
    rows = shape.vocab_size if head_rows is None else int(head_rows)
    return (shape.own_parameters() + rows * shape.hidden_size) / float(policy_params)


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


def shape_for(config: Mapping, *, layers: int = 1, max_fraction: float = DRAFT_FRACTION,
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


def draft_memory(shape: "ModelShape", cfg: "Config") -> tuple[int, int, str] | None:
    """Bytes per GPU of a `model` method's draft model on the GPU (`spec.draft_device` cuda
    or auto; None on the CPU, where it takes none) in the rollout and train phases, and how
    they were counted: fp32 weights in both; in the rollout each running request's keys and
    values (held between passes, and a pass's batch of them); in the train phase its
    gradients, AdamW's two moments, one piece of a minibatch's activations (`MICRO_TOKENS`)
    and a chunk of logits with its gradient (`pipeline.drafting.draft_train`). None too
    where no draft of `spec.draft_layers` layers fits the policy (`shape_for` refuses it):
    preflight says so in its own line (`draft_shape_problems`), and there is no draft to
    count."""
    from dataclasses import replace

    from pipeline.config.methods import method

    spec = cfg.spec
    if spec.draft_device == "cpu" or not method(spec.method).model:
        return None
    try:
        d = shape_for({"hidden_size": shape.hidden, "num_attention_heads": shape.heads,
                       "num_key_value_heads": shape.kv_heads, "head_dim": shape.head_dim,
                       "intermediate_size": shape.intermediate, "vocab_size": shape.vocab,
                       "num_hidden_layers": shape.layers, "tie_word_embeddings": shape.tied},
                      layers=spec.draft_layers)
    except ValueError:
        return None
    params, seq = d.parameters(), cfg.data.max_prompt_length + cfg.rollout.max_tokens
    kv = 2 * 2 * 4 * cfg.rollout.max_num_seqs * seq * d.layers * d.kv_heads * d.head_dim
    layer = replace(shape, intermediate=d.intermediate_size, layers=d.layers)
    tokens = max(seq, min(DRAFT_BATCH * seq, MICRO_TOKENS))  # one piece of a minibatch
    acts = tokens * (d.layers * layer.layer_activation_bytes(seq, 4) + 8 * d.hidden_size)
    return (4 * params + kv, 16 * params + acts + 2 * LOSS_CHUNK_BYTES,
            f"spec.draft_device {spec.draft_device}: {params / 1e6:.0f}M fp32 parameters "
            f"({d.layers} layer{'s' * (d.layers != 1)} and its own embedding and head); "
            f"rollout: + keys and values of {cfg.rollout.max_num_seqs} requests x {seq} "
            f"tokens, twice; train: + gradients and AdamW moments, the activations of "
            f"{tokens} tokens of a {DRAFT_BATCH}-response minibatch, a logits chunk and its "
            f"gradient")


def sampled_drafts(cfg: "Config") -> bool:
    """Model drafts verified with their probabilities (spec.draft_probs, at T > 0): the
    rejection sampler then holds their distributions too."""
    from pipeline.config.methods import method

    return bool(method(cfg.spec.method).model and cfg.spec.draft_probs
                and cfg.rollout.temperature > 0)


__all__ = ["DRAFT_BATCH", "DRAFT_FRACTION", "DraftShape", "LOSS_CHUNK_BYTES", "MICRO_TOKENS",
           "draft_memory", "policy_parameters", "step_fraction", "sampled_drafts", "shape_for"]
