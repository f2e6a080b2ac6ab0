"""The per-GPU memory plan of one rank: a vLLM engine and a DeepSpeed trainer in one process.

Pure arithmetic on the model's config.json, the resolved Config, the world size and the
device size; no GPU, no weights. Why a plan does not fit, and what to change:
`pipeline.memory_fit`. Sizes are GiB (2**30 bytes) per GPU. A step has two phases:

  rollout  vLLM generates while awake; the trainer's states stay on the GPU (no offload).
  train    vLLM sleeps (level 2); the trainer runs one micro-batch forward and backward,
           then the optimizer step.

vLLM 0.32 while awake takes `rollout.gpu_memory_utilization` x the device: `request_memory`
claims that share at start-up (its free memory must hold it), and
`Worker.determine_available_memory` fills it with the weights, the peak activations of its
profile run, what was allocated outside torch since its start-up snapshot, the CUDA graphs
(profiled by default) and, with the rest, the KV cache. What existed before the snapshot
(CUDA context, NCCL communicators, the trainer's states) is outside the share. Asleep at
level 2 the CuMemAllocator unmaps every allocation of its pools (weights, KV cache and
workspace discarded; the runtime tag backed up to host memory); the CUDA graphs are captured
outside those pools (`sleep_mode_offload_cudagraph` is off by default) and stay, as do the
CUDA context and NCCL's buffers.

Outside the share too: what a speculative pass's rejection sampler takes beyond vLLM's
profile of it, which runs one draft per request (`_dummy_sampler_run` in
`v1/worker/gpu_model_runner.py`) while a full pass verifies up to num_speculative_tokens per
request, in fp32 rows of the vocabulary (`v1/sample/rejection_sampler.py`). vLLM allocates it
after the KV cache has taken the rest of the share, so it adds to the rollout phase.

The trainer follows DeepSpeed's ZeRO rules over the world size N: stage 1 partitions the
optimizer states, stage 2 the gradients too, stage 3 the weights too. bf16 keeps fp32 master
weights and Adam's two fp32 moments (12 bytes per parameter) and casts the gradients to fp32
for the optimizer step (4 more, during the step only).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from pipeline.config.methods import method
from pipeline.config.schema import Config
from pipeline.draft_shape import draft_memory, sampled_drafts
from pipeline.memory_fit import problems
from pipeline.memory_types import GIB, Item, MemoryPlan
from pipeline.model_shape import ModelShape

# Allowances, not derived: CUDA context + cuBLAS workspace + NCCL communicators (about half
# a GiB each on H100-class GPUs), and vLLM's CUDA graph pool for a 7B-class model (vLLM logs
# 0.3-1.5 GiB; 0 with enforce_eager).
CONTEXT_GIB = 1.0
CUDA_GRAPHS_GIB = 1.0
LOGPROB_CHUNK_GIB = 0.25  # the fp32 working set of one log-prob chunk (pipeline.train.logprobs)
# DeepSpeed's defaults (the actor's DeepSpeed config sets none of them), in elements.
REDUCE_BUCKET = 500_000_000  # zero_optimization.reduce_bucket_size
PREFETCH_BUCKET = 50_000_000  # zero_optimization.stage3_prefetch_bucket_size
COUNTED_TYPES = ("llama", "mistral", "qwen2", "qwen3")
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def micro_batch(cfg: Config, world_size: int) -> int:
    """Sequences per forward/backward: at most train.ppo_micro_batch_size and at most a
    rank's share of a mini-batch (the actor takes the largest divisor of the share)."""
    per_rank = max(1, cfg.train.ppo_mini_batch_size // world_size) * cfg.rollout.n
    return min(cfg.train.ppo_micro_batch_size, per_rank)


def build_plan(shape: ModelShape, cfg: Config, world_size: int, device_gib: Optional[float],
               device: str = "none", deepspeed: Optional[tuple[float, str]] = None) -> MemoryPlan:
    """The plan of one rank of `world_size` on a GPU of `device_gib` GiB (None: no check).
    `deepspeed`: DeepSpeed's estimate of the model states (GiB, source), shown beside ours."""
    trainer = _trainer_items(shape, cfg, world_size)
    vllm_weights = DTYPE_BYTES[cfg.model.dtype] * shape.params / cfg.rollout.tensor_parallel_size
    items = (*trainer, *_vllm_items(cfg, device_gib, vllm_weights / GIB),
             _sampler_item(shape, cfg), *_step_items(shape, cfg, world_size))
    draft = draft_memory(shape, cfg)  # a draft model on the GPU
    items += (Item("draft model", draft[0] / GIB, draft[1] / GIB, draft[2]),) if draft else ()
    notes = []
    if shape.model_type not in COUNTED_TYPES:
        notes.append(f"model_type {shape.model_type} is counted as a dense Llama-style decoder")
    seq_len = cfg.data.max_prompt_length + cfg.rollout.max_tokens
    plan = MemoryPlan(items, device_gib, device, world_size, shape.params, shape.largest_layer,
                      micro_batch(cfg, world_size), seq_len, sum(i.train for i in trainer[:3]),
                      deepspeed, (), cfg.rollout.gpu_memory_utilization, tuple(notes))
    if device_gib is None:
        return plan
    return replace(plan, problems=tuple(problems(plan, cfg, vllm_weights / GIB)))


def _trainer_items(shape: ModelShape, cfg: Config, n: int) -> tuple[Item, ...]:
    """Weights, gradients, optimizer states (in this order), the reference model."""
    p, stage = shape.params, cfg.deepspeed.zero_stage
    w = 2 if cfg.deepspeed.bf16 else 4
    trainer = "bf16" if w == 2 else "fp32"

    def per_gpu(nbytes_per_param: int, partitioned: bool) -> float:
        return nbytes_per_param * p / (n if partitioned else 1) / GIB

    def split(partitioned: bool) -> str:
        return f"partitioned over {n} ranks" if partitioned else "full on every GPU"

    weights, grads = per_gpu(w, stage == 3), per_gpu(w, stage >= 2)
    held = 12 if w == 2 or stage > 0 else 8  # fp32 ZeRO-0: torch's Adam, no master copy
    cast = 4 if w == 2 else 0
    what = ("fp32 master weights and Adam's two moments (12 B/param)" if held == 12
            else "Adam's two fp32 moments (8 B/param)")
    if cast:
        what += " + the fp32 gradients cast for the optimizer step (4 B/param, train phase)"
    ref = per_gpu(w, stage == 3) if cfg.train.kl_coef > 0 else 0.0
    return (
        Item("policy weights", weights, weights, f"{trainer} weights of {p / 1e9:.2f}B "
             f"parameters, {split(stage == 3)} (ZeRO-{stage})"),
        Item("gradients", grads if stage == 3 else 0.0, grads,
             f"{trainer} gradients, {split(stage >= 2)}; between steps only ZeRO-3 keeps its "
             f"flat gradient buffer"),
        Item("optimizer states", per_gpu(held, stage >= 1), per_gpu(held + cast, stage >= 1),
             f"{what}, {split(stage >= 1)}"),
        Item("reference model", ref, ref,
             f"train.kl_coef > 0: {trainer} weights wrapped by DeepSpeed, {split(stage == 3)}"
             if cfg.train.kl_coef > 0 else "train.kl_coef = 0: no reference model"))


def _vllm_items(cfg: Config, device_gib: Optional[float], weights: float) -> tuple[Item, ...]:
    """vLLM awake and asleep, and the process's CUDA context (outside vLLM's share)."""
    r = cfg.rollout
    share = None if device_gib is None else r.gpu_memory_utilization * device_gib
    tp = f" / {r.tensor_parallel_size} (TP)" if r.tensor_parallel_size > 1 else ""
    graphs = 0.0 if r.enforce_eager else CUDA_GRAPHS_GIB
    return (
        Item("vLLM awake", share, 0.0,
             f"rollout.gpu_memory_utilization {r.gpu_memory_utilization:g} x the device: "
             f"weights {weights:.1f} GiB ({cfg.model.dtype}{tp}), its profiled activations and "
             f"CUDA graphs, the rest KV cache; freed by sleep(level=2)"),
        Item("vLLM asleep", 0.0, graphs,
             "rollout.enforce_eager: no CUDA graphs to keep" if r.enforce_eager else
             f"its CUDA graph pool, which sleep does not free (allowance {CUDA_GRAPHS_GIB:g} GiB)"),
        Item("CUDA context + NCCL", CONTEXT_GIB, CONTEXT_GIB,
             f"CUDA context, cuBLAS workspace, NCCL communicators (allowance {CONTEXT_GIB:g} "
             f"GiB), outside vLLM's share"))


def drafting_pass(cfg: Config) -> tuple[int, int]:
    """(requests, draft tokens) of the largest pass that verifies drafts: at most
    rollout.max_num_seqs requests (rhymectl's drafters: spec.max_draft_rows) with
    spec.num_speculative_tokens each; a thin pass (rhymectl's drafters) drafts longer but
    schedules at most spec.thin_pass_tokens tokens in all. (0, 0) without speculation."""
    spec, rows = cfg.spec, cfg.rollout.max_num_seqs
    if spec.method == "none":
        return 0, 0
    drafter = method(spec.method).drafter
    if drafter and spec.max_draft_rows is not None:
        rows = min(rows, spec.max_draft_rows)
    full = rows * spec.num_speculative_tokens
    thin = drafter and spec.thin_draft_tokens > spec.num_speculative_tokens
    return rows, max(full, spec.thin_pass_tokens) if thin else full


def _sampler_item(shape: ModelShape, cfg: Config) -> Item:
    """The rejection sampler's working set beyond vLLM's profile of it, GiB.

    For T draft positions of B requests (`drafting_pass`), its peak holds these fp32
    [., vocab] tensors: the target logits, the clone the logits processors change and the
    softmax (3 T) with two [B, vocab] exponential tensors (recovered tokens), or, on a step
    that asks for log-probs (rollout.logprob_check_every), the first two with the final
    logits, the accepted logits and their log-softmax (2 T + 3 (T + B)); and the pass's
    logits in the model's dtype, T + B rows. The profile ran rollout.max_num_seqs = P
    requests with one draft each: 5 P fp32 rows and 2 P logits rows. Sampled model drafts
    add 2 T: their probabilities and vLLM's copy of them, never profiled."""
    rows, t = drafting_pass(cfg)
    if not t:
        return Item("rejection sampler", 0.0, 0.0, "spec.method none: no drafts to verify")
    profiled = cfg.rollout.max_num_seqs
    checks = cfg.rollout.logprob_check_every > 0
    probs = sampled_drafts(cfg)
    fp32_rows = (5 * t + 3 * rows if checks else 3 * t + 2 * rows) + 2 * t * probs - 5 * profiled
    logits_rows = t + rows - 2 * profiled
    nbytes = 4 * fp32_rows + DTYPE_BYTES[cfg.model.dtype] * logits_rows
    gib = max(0.0, nbytes * shape.vocab / GIB)
    copies = ("5 fp32 copies on log-prob-check steps (rollout.logprob_check_every)" if checks
              else "3 fp32 copies") + (" and 2 of the draft probabilities" * probs)
    return Item("rejection sampler", gib, 0.0,
                f"{rows} sequences x {cfg.spec.num_speculative_tokens} draft tokens "
                f"({t} positions) x vocab {shape.vocab}: {copies} and the pass's "
                f"{cfg.model.dtype} logits, beyond vLLM's one-draft profile; outside its share")


def _step_items(shape: ModelShape, cfg: Config, n: int) -> tuple[Item, ...]:
    """What one micro-batch's forward and backward add: activations, logits, ZeRO buffers."""
    w, stage, checkpointed = (2 if cfg.deepspeed.bf16 else 4, cfg.deepspeed.zero_stage,
                              cfg.train.gradient_checkpointing)
    micro, seq = micro_batch(cfg, n), cfg.data.max_prompt_length + cfg.rollout.max_tokens
    tokens, trainer = micro * seq, "bf16" if w == 2 else "fp32"
    layer = shape.layer_activation_bytes(seq, w)
    final_norm = (4 + w) * shape.hidden
    if checkpointed:
        acts = tokens * (shape.layers * w * shape.hidden + layer + final_norm)
        how = f"{shape.layers} layer inputs + one layer's {layer / 1024:.0f} KiB/token"
    else:
        acts = tokens * (shape.layers * layer + final_norm)
        how = (f"{shape.layers} layers x {layer / 1024:.0f} KiB/token; "
               f"train.gradient_checkpointing is off")
    items = [
        Item("activations", 0.0, acts / GIB,
             f"{micro} sequence{'s' * (micro != 1)} x {seq} tokens (data.max_prompt_length + "
             f"rollout.max_tokens): {how}"),
        # The log-probs' backward writes the logits' full gradient while the logits are
        # saved for it (pipeline.train.logprobs); the fp32 softmax goes chunk by chunk.
        Item("logits", 0.0, 2 * w * tokens * shape.vocab / GIB + 2 * LOGPROB_CHUNK_GIB,
             f"{trainer} logits [{micro}, {seq}, {shape.vocab}] and, in the backward, their "
             f"gradient; + two fp32 chunks of {LOGPROB_CHUNK_GIB * 1024:.0f} MiB for the "
             f"log-probs")]
    bucket = w * REDUCE_BUCKET / GIB
    if stage == 3:
        gathered = (2 * w * shape.largest_layer + w * PREFETCH_BUCKET) / GIB
        items.append(Item("ZeRO buffers", bucket, bucket + gathered,
                          f"gradient reduce bucket ({REDUCE_BUCKET:.0e} elements, held from "
                          f"start-up) + the largest layer gathered with its gradient "
                          f"({shape.largest_layer / 1e6:.0f}M params) + the prefetch bucket "
                          f"({PREFETCH_BUCKET:.0e})"))
    elif stage > 0:
        items.append(Item("ZeRO buffers", 0.0, bucket, f"gradient reduce bucket "
                          f"({REDUCE_BUCKET:.0e} elements) during the backward"))
    return tuple(items)
