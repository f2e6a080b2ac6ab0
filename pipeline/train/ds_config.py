"""What DeepSpeed is told: the policy's config (micro-batches, ZeRO stage, optimiser) and the
frozen reference model's. Plain dictionaries; the engine itself is pipeline.train.actor's."""

from __future__ import annotations

from pipeline.config.schema import Config


def micro_batch_size(per_rank_mini: int, cap: int) -> int:
    """The largest divisor of `per_rank_mini` sequences that is <= `cap`."""
    return max(d for d in range(1, min(cap, per_rank_mini) + 1) if per_rank_mini % d == 0)


def deepspeed_config(cfg: Config, world_size: int) -> dict:
    per_rank_mini = cfg.train.ppo_mini_batch_size // world_size * cfg.rollout.n
    micro = micro_batch_size(per_rank_mini, cfg.train.ppo_micro_batch_size)
    gas = per_rank_mini // micro
    return {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": gas,
        "train_batch_size": micro * gas * world_size,
        "gradient_clipping": cfg.train.grad_clip,
        "zero_optimization": {"stage": cfg.deepspeed.zero_stage},
        "bf16": {"enabled": cfg.deepspeed.bf16},
        "optimizer": {"type": "AdamW", "params": {
            "lr": cfg.train.lr, "weight_decay": cfg.train.weight_decay,
            "betas": [0.9, 0.999], "eps": 1e-8, "torch_adam": cfg.deepspeed.torch_adam}},
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


def reference_config(ds_config: dict) -> dict:
    """The DeepSpeed config of the frozen reference model (TRL's `prepare_deepspeed`): no
    optimiser; ZeRO-3 keeps it partitioned like the policy, any other stage becomes stage 0
    (a full copy on every device: nothing to shard without optimiser state)."""
    config = {k: v for k, v in ds_config.items() if k != "optimizer"}
    if config["zero_optimization"]["stage"] != 3:
        config["zero_optimization"] = {"stage": 0}
    return config
