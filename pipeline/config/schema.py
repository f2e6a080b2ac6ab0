"""The typed, nested, frozen config tree.

One dataclass per section; the field's type, default and allowed values are the whole
definition (no `cfg.get(key, default)` anywhere else). Names follow veRL where the concept is
shared (`rollout.n`, `rollout.temperature`, `data.train_batch_size`, ...). Constraints that
need more than a type live in `field(metadata={"check": ...})` and are enforced by
`pipeline.config.validate`, which reports every problem at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from pipeline.config.methods import METHODS

def _check(rule: str, fn) -> dict:
    """Metadata for a field: `fn(value) -> bool` must hold; `rule` says what is allowed."""
    return {"check": (rule, fn)}


def positive(default):
    return field(default=default, metadata=_check("a number > 0", lambda v: v > 0))


def non_negative(default):
    return field(default=default, metadata=_check("a number >= 0", lambda v: v >= 0))


def below_one(default):
    return field(default=default, metadata=_check("a number in [0, 1)", lambda v: 0 <= v < 1))


def fraction(default):
    return field(default=default, metadata=_check("a number in (0, 1]", lambda v: 0 < v <= 1))


@dataclass(frozen=True)
class DataConfig:
    """Where prompts come from and how responses are scored."""

    task: Optional[str] = "sort"  # built-in task; null when `path` names a user data set
    path: Optional[str] = None  # local .jsonl/.json/.parquet/arrow dir, or a `datasets` name
    eval_path: Optional[str] = None  # held-out prompts for a user data set (same format)
    split: str = "train"
    prompt_key: str = "prompt"
    answer_key: str = "answer"
    reward: Optional[str] = None  # task name or `module:function`; default: the task's own
    partial_credit: bool = True
    # training prompts: a built-in task generates this many (null: 256); a data set keeps
    # its first this many rows (null: all of them), e.g. to revisit prompts every few steps
    train_size: Optional[int] = positive(None)
    eval_size: int = positive(128)
    train_batch_size: int = positive(16)  # prompts per RL step (veRL name)
    max_prompt_length: int = positive(32)  # tokens, after the chat template
    # how a prompt becomes the policy's input: auto = the tokenizer's chat template when it
    # has one (an Instruct model), else the raw text; none = the raw text; or the path of a
    # Jinja template file. Applied once, where prompts are tokenized, for training and
    # evaluation alike (pipeline.tasks.chat)
    chat_template: str = "auto"
    system_prompt: Optional[str] = None  # a system message before every prompt (chat template)
    shuffle: bool = True
    seed: int = 0


@dataclass(frozen=True)
class ModelConfig:
    """The policy: a local Hugging-Face directory (or hub name where the hub is reachable)."""

    path: str = "models/tiny-sort"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    trust_remote_code: bool = False


@dataclass(frozen=True)
class RolloutConfig:
    """The vLLM rollout engine and its sampling parameters."""

    n: int = field(default=8, metadata=_check("an integer >= 2 (GRPO needs a group)", lambda v: v >= 2))
    temperature: float = non_negative(1.0)
    top_p: float = fraction(1.0)
    top_k: int = field(default=-1, metadata=_check("-1 (off) or an integer >= 1", lambda v: v == -1 or v >= 1))
    max_tokens: int = positive(160)  # response length cap, tokens
    gpu_memory_utilization: float = fraction(0.08)  # on CPU: fraction of host RAM
    kv_cache_gib: float = positive(1.0)  # VLLM_CPU_KVCACHE_SPACE on CPU
    enforce_eager: bool = True
    max_num_seqs: int = positive(256)
    tensor_parallel_size: int = positive(1)  # ranks per vLLM engine (a TP group)
    allow_untested_vllm: bool = False  # run on a vLLM release other than the tested one
    # steps on which vLLM returns the sampled tokens' logprobs, so the trainer can check
    # that the engine samples from the weights it trains (train_sampler_logprob_diff, at
    # temperature 1): steps 0, N, 2N, ... (a resumed run checks the same steps as an
    # uninterrupted one, so their metrics rows are equal); 0 never, 1 always. Training
    # never uses them (it recomputes its own), and asking costs vLLM per-token work:
    # 13-28 % of rollout time on the tiny model (docs/speculation.md)
    logprob_check_every: int = non_negative(10)


# spec.max_spec_factor when null, by method. rhymectl's drafters: 1.0, vLLM's own factor.
# On the real model's text (SmolLM2-135M, bench replay at T = 0.7 and T = 1) short matches
# are most of what the trees offer, and 0.5 left history+group behind suffix on the median
# step's critical path (1.09x at T = 0.7); 1.0 needs fewer target passes than suffix there
# and 1 % fewer than 0.5 on the sort task, for more verified draft tokens (0.5 had cut the
# sort task's CPU rollout time about 10 % at T = 1; docs/speculation.md, "Design
# decisions"). `suffix` keeps vLLM's own default
# (SpeculativeConfig.suffix_decoding_max_spec_factor).
DRAFTER_SPEC_FACTOR = 1.0
SUFFIX_SPEC_FACTOR = 1.0


@dataclass(frozen=True)
class SpecConfig:
    """Speculative decoding (drafts verified losslessly by vLLM's rejection sampler)."""

    method: Literal[METHODS] = "none"  # the registry in pipeline.config.methods
    num_speculative_tokens: int = positive(8)  # per-request draft length cap
    history_epochs: int = positive(2)  # K: epochs of history per prompt tree
    min_path_prob: float = fraction(0.1)  # cut drafts where the path probability falls below
    # a draft is at most max_spec_factor * (tokens of context matched) long: short matches
    # draft little. null: the method's default (`spec_factor()`), DRAFTER_SPEC_FACTOR for
    # rhymectl's drafters, vLLM's own 1.0 for `suffix`; a number sets it for both (for
    # suffix, vLLM's suffix_decoding_max_spec_factor)
    max_spec_factor: Optional[float] = positive(None)
    reward_weighted: bool = False  # RhymeRL's reward-aware tree
    max_cached_prompts: int = positive(4096)  # trees kept outside the current batch
    # tree: every request drafts what its trees support (path probability >= min_path_prob,
    # at most match length tokens), up to num_speculative_tokens, as SuffixDecoding does;
    # throughput: per-pass E/T with a fixed cost and per-request adaptive caps;
    # critical: shorten the step's critical path, per-token acceptance from the trees'
    # path counts, pass cost by spec.pass_cost. Measured in docs/speculation.md.
    budget: Literal["tree", "critical", "throughput"] = "tree"
    # the tree budget: cut each draft where its calibrated probability of acceptance so far
    # (learnt from the run's verified drafts) falls below min_accept, keeping one token
    # (0: no cut). Fewer verified draft tokens where the trees rarely match, for a few
    # more passes (docs/speculation.md, "Draft length")
    min_accept: float = below_one(0.0)
    # the pass cost the critical budget prices draft tokens with. fixed: one curve that
    # no machine load moves (pipeline.costs.DRAFT_COST), so a seeded rerun drafts, and so
    # samples, the same; online: refitted from the engine's measured pass seconds, which
    # follow the machine's load (reruns then differ from their first step on)
    pass_cost: Literal["fixed", "online"] = "fixed"
    # rhymectl's drafters. A pass is thin while it schedules at most thin_pass_tokens
    # tokens (running requests x (1 + cap)): a GPU runs it memory-bound, at about the same
    # cost whatever it verifies (296 is the ridge of the H100 7B roofline in
    # pipeline.costs). In a thin pass a request may draft up to thin_pass_tokens // rows - 1
    # tokens, between num_speculative_tokens and thin_draft_tokens (the vLLM engine is
    # built for thin_draft_tokens; 0 or at most num_speculative_tokens: never more), and
    # every draft that stops short of its cap where the suffix tree's depth ends is
    # continued from the tree (chain_drafts; in a fuller pass only those of the requests
    # predicted to end last and of requests whose last draft was accepted whole)
    chain_drafts: bool = True
    # rhymectl's drafters: the global tree (every prompt's history) is also asked where
    # the prompt's own trees' best draft is expected to yield fewer accepted tokens than
    # this (its score), and the better-scoring draft is kept. null: the method's default,
    # 1.0 (pipeline.drafting.inputs.GLOBAL_BELOW), and 0 beside a draft model, where the
    # model drafts instead (0: only where the prompt's trees offer nothing)
    global_below: Optional[float] = non_negative(None)
    # rhymectl's drafters with siblings: each request's own tree (its prompt and output
    # alone, as vLLM's suffix method keeps) beside its prompt's, where a phrase the request
    # keeps repeating is one sequence among its siblings' and history's. thin: fed and
    # asked only in thin passes (few requests, verifying about free; a full batch pays
    # nothing for it); always: every pass (a millisecond or more per pass of a full batch
    # on the drafter's critical path); never. With siblings off the own tree is always used
    own_tree: Literal["thin", "always", "never"] = "thin"
    thin_pass_tokens: int = non_negative(296)
    thin_draft_tokens: int = non_negative(16)
    # rhymectl's drafters: a pass with more running requests than this drafts nothing
    # (null: every pass may draft). On a GPU a full pass verifying drafts turns
    # compute-bound and leaves the CUDA graphs, so above a batch size drafting costs more
    # than it saves: 89 requests at 8 drafts and tau 3.4 for a 7B on an H100, 59 at tau
    # 2.5 (pipeline.gpu_cost, docs/speculation.md); a CPU pass shows nothing of it
    max_draft_rows: Optional[int] = positive(None)
    # history+group+model: the draft model beside the trees (pipeline.drafting.model_source):
    # its decoder layers (the MLP as wide as keeps it within 10 % of the policy's
    # parameters), and the AdamW updates (of 32 responses) and learning rate of its online
    # training between the trainer's update and the next rollout, on the responses of the
    # last draft_window steps (this step's and those before it);
    # draft_vocab: it trains and drafts over at most draft_vocab tokens, the most frequent in
    # the responses it trained on (its LM head, most of its cost per token, cut to those
    # rows, as EAGLE-3 and FR-Spec do; 0: the whole vocabulary). Lossless either way: the
    # target verifies every drafted token
    draft_layers: int = positive(1)
    draft_updates: int = positive(20)
    draft_window: int = positive(3)
    draft_lr: float = positive(3e-4)
    draft_vocab: int = non_negative(32768)
    # where the draft model drafts and trains: cpu (on the host, bit-reproducible), cuda,
    # or auto (the rollout engine's device: the GPU where vLLM runs on one). On a GPU its
    # kernels need not repeat bit for bit, so a seeded rerun may draft otherwise, and
    # tensor-parallel ranks (which must draft alike) are refused with it
    draft_device: Literal["cpu", "cuda", "auto"] = "cpu"
    # at temperature > 0: the draft model's drafts drawn from its distribution q and
    # verified with q (vLLM's rejection sampler accepts min(1, p/q) and corrects from
    # max(p - q, 0): lossless, and accepted where q covers p, not only at p's argmax);
    # false: its argmax, verified as a point mass. Greedy rollouts draft the argmax either way
    draft_probs: bool = True
    # at temperature > 0 the draft model learns the policy's distribution, not only the
    # token sampled at each position: cross-entropy against the policy's draft_distill most
    # likely tokens there (renormalised), read from the trainer's old-log-prob forward
    # (pipeline.train.teacher); 0: the sampled tokens. Greedy rollouts learn the sampled
    # tokens (the policy's argmax) either way
    draft_distill: int = non_negative(8)
    # before a fresh run's first step the draft learns the starting policy
    # (pipeline.loop.warmup): draft_warmup_updates updates against the policy's
    # draft_distill most likely tokens, on
    #   eval: the responses of the held-out evaluation before step 1 (greedy and mean@k),
    #     which the run generates anyway: no extra rollout (needs an evaluation set);
    #   rollout: rollout.n responses to each of draft_warmup_prompts prompts it does not
    #     train on (a data set's rows after data.train_size, a built-in task's of a seed
    #     of their own), sampled under a seed of their own: one extra rollout;
    #   none: no warm-up (the draft starts from the policy's first layer)
    draft_warmup: Literal["none", "eval", "rollout"] = "none"
    draft_warmup_prompts: int = positive(32)
    draft_warmup_updates: int = positive(200)

    def spec_factor(self) -> float:
        """max_spec_factor as `method` applies it: the number set, else the method's
        default (SUFFIX_SPEC_FACTOR for suffix, DRAFTER_SPEC_FACTOR for any other; none
        and ngram do not use it)."""
        if self.max_spec_factor is not None:
            return self.max_spec_factor
        return SUFFIX_SPEC_FACTOR if self.method == "suffix" else DRAFTER_SPEC_FACTOR


@dataclass(frozen=True)
class TailBatchingConfig:
    """Tail batching (RollPacker): launch more groups than the step trains on, train on the
    first to complete, drop the rest unfinished and regenerate their prompts in a later
    step with that step's policy (on-policy). 0 = off."""

    overprovision: float = non_negative(0.0)  # launch ceil(G * (1 + overprovision)) groups
    max_waits: int = non_negative(2)  # a prompt deferred this many times is not deferred again


@dataclass(frozen=True)
class SchedConfig:
    """Placement of one step's rollout work over the rollout workers."""

    # the placement registry's training policies (pipeline.sched.registry); auto: seer when W > 1
    policy: Literal["auto", "static", "histopipe", "tier2", "seer"] = "auto"
    chunk_tokens: int = positive(64)
    tier2_workers_frac: float = field(default=0.125, metadata=_check(  # tier2: reserved workers
        "a number in [0, 1)", lambda v: 0 <= v < 1))
    tier2_max_seqs: int = positive(8)  # tier2: sequences per reserved worker
    # a continuation moves to the least-loaded worker when that runs at least this many
    # fewer requests (seer; histopipe's overrunning responses); null: from the requests per
    # worker (pipeline.sched.settings.auto_migrate_gap; measured in docs/scheduling.md)
    migrate_gap: Optional[int] = positive(None)
    sim_requests_per_worker: int = positive(64)
    tail_batching: TailBatchingConfig = field(default_factory=TailBatchingConfig)
    # how long a rank waits on the coordination store (a slow peer, a long first chunk)
    # before it gives up, seconds
    store_timeout_s: float = positive(900.0)


@dataclass(frozen=True)
class TrainConfig:
    """GRPO and its optimiser."""

    total_steps: int = positive(20)
    lr: float = positive(1e-4)
    weight_decay: float = non_negative(0.0)
    grad_clip: float = non_negative(1.0)  # 0 = off
    ppo_mini_batch_size: int = positive(16)  # prompts per optimiser step (veRL name)
    ppo_micro_batch_size: int = positive(64)  # sequences per forward/backward
    ppo_epochs: int = positive(1)
    clip_ratio_low: float = fraction(0.2)
    clip_ratio_high: float = fraction(0.2)
    adv_estimator: Literal["grpo", "grpo_no_std"] = "grpo"
    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean"] = "token-mean"
    kl_coef: float = non_negative(0.0)  # 0 = no reference policy
    kl_type: Literal["low_var_kl", "k1", "k2"] = "low_var_kl"
    # dual-clip PPO (veRL's clip_ratio_c): for negative advantages the per-token loss is at
    # most clip_ratio_c * |A|; null = off. veRL's default when on is 3.0; must be > 1
    clip_ratio_c: Optional[float] = field(default=None, metadata=_check(
        "null (off) or a number > 1", lambda v: v > 1))
    # recompute activations in the backward pass (transformers' gradient checkpointing):
    # activation memory of one layer instead of all of them, about a third more compute
    gradient_checkpointing: bool = False


@dataclass(frozen=True)
class DeepSpeedConfig:
    """The trainer's DeepSpeed engine."""

    zero_stage: int = field(default=1, metadata=_check("0, 1, 2 or 3", lambda v: v in (0, 1, 2, 3)))
    bf16: bool = False
    torch_adam: bool = True


@dataclass(frozen=True)
class RunConfig:
    """Run directory, cadence and reproducibility."""

    dir: str = field(default="runs/tiny", metadata=_check(
        "a directory path without '..' components (writes stay inside it)",
        lambda v: bool(v.strip()) and "\0" not in v and ".." not in v.replace("\\", "/").split("/")))
    seed: int = 0
    checkpoint_every: int = positive(10)  # steps
    keep_checkpoints: int = positive(2)
    eval_every: int = non_negative(0)  # steps; 0 = before the first step and after the last only
    eval_n: int = non_negative(4)  # k samples per held-out prompt for mean@k; 0 = greedy only
    threads: int = non_negative(0)  # torch threads per rank; 0 = leave torch's default
    # how long a collective waits for the slowest rank, minutes. torch's default (NCCL 10,
    # gloo 30) is shorter than rank 0's file work at 7B scale (index, a 15 GB export,
    # checkpoints on shared storage) while the others wait in a barrier
    dist_timeout_min: float = positive(60.0)
    # metrics.jsonl is always written; console = the live view, tensorboard / wandb are extras
    loggers: tuple[Literal["jsonl", "console", "tensorboard", "wandb"], ...] = ("jsonl", "console")
    wandb_project: str = "rhymectl-grpo"
    wandb_mode: Literal["online", "offline"] = "online"  # offline: no network, `wandb sync` later


@dataclass(frozen=True)
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    spec: SpecConfig = field(default_factory=SpecConfig)
    sched: SchedConfig = field(default_factory=SchedConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    run: RunConfig = field(default_factory=RunConfig)
