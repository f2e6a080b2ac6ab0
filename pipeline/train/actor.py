"""The DeepSpeed adapter: the trainer side of the policy (the only module that imports
DeepSpeed's engine; `ds_ops` only pre-builds its CPU op).

One `Actor` per rank. A GRPO update is `update(batch)`: old log-probs are recomputed with
the current weights (so the first mini-batch is exactly on-policy, ratio 1), then one
optimiser step per PPO mini-batch, each accumulated over micro-batches. DeepSpeed averages
gradients over ranks and owns ZeRO partitioning, clipping and the optimiser state.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from pipeline.config.schema import Config
from pipeline.train import grpo


@dataclass
class Batch:
    """One rank's rollouts, right-padded. input_ids [N, T] = prompt + response + padding."""

    input_ids: torch.Tensor
    prompt_lens: torch.Tensor  # [N]
    total_lens: torch.Tensor  # [N]
    advantages: torch.Tensor  # [N]
    sampler_logprobs: torch.Tensor | None = None  # [N, T-1], vLLM's, aligned like token_logprobs

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    def rows(self, index: slice) -> "Batch":
        width = int(self.total_lens[index].max())
        lp = None if self.sampler_logprobs is None else self.sampler_logprobs[index, : width - 1]
        return Batch(self.input_ids[index, :width], self.prompt_lens[index],
                     self.total_lens[index], self.advantages[index], lp)


def _logs_to_stderr(deepspeed) -> None:
    """DeepSpeed's logger writes to stdout; stdout is for results (one JSON object)."""
    import logging
    import sys

    for handler in deepspeed.utils.logger.handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream is sys.__stdout__:
            handler.setStream(sys.stderr)


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


class Actor:
    def __init__(self, cfg: Config, world_size: int):
        import deepspeed
        from transformers import AutoModelForCausalLM

        _logs_to_stderr(deepspeed)
        self.cfg = cfg
        dtype = torch.bfloat16 if cfg.deepspeed.bf16 else torch.float32
        model = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=dtype)
        model.config.use_cache = False
        self.ds_config = deepspeed_config(cfg, world_size)
        self.engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                               config=self.ds_config)
        self.micro = self.ds_config["train_micro_batch_size_per_gpu"]
        self.ref = self._reference(cfg, dtype) if cfg.train.kl_coef > 0 else None
        self.temperature = cfg.rollout.temperature or 1.0

    @staticmethod
    def _reference(cfg: Config, dtype):
        from transformers import AutoModelForCausalLM

        ref = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=dtype)
        ref.eval().requires_grad_(False)
        return ref

    # -- scoring ------------------------------------------------------------------------
    def _logprobs(self, model, b: Batch) -> torch.Tensor:
        attn = grpo.response_mask(torch.zeros_like(b.prompt_lens), b.total_lens, b.input_ids.shape[1])
        logits = model(input_ids=b.input_ids, attention_mask=attn.long()).logits
        return grpo.token_logprobs(logits, b.input_ids, self.temperature)

    @torch.no_grad()
    def score(self, batch: Batch, reference: bool = False) -> list[torch.Tensor]:
        """Per micro-batch log-probs [n, L] of the current (or reference) policy."""
        model = self.ref if reference else self.engine.module
        model.eval()
        return [self._logprobs(model, batch.rows(s)) for s in self._slices(0, batch.size)]

    # -- the update ---------------------------------------------------------------------
    def update(self, batch: Batch) -> dict[str, float]:
        """GRPO update over this rank's rollouts; returns mean metrics of all micro-batches."""
        t = self.cfg.train
        old = self.score(batch)
        ref = self.score(batch, reference=True) if self.ref is not None else None
        drift = self.sampler_drift(batch, old)
        per_mini = self.ds_config["gradient_accumulation_steps"] * self.micro
        sums: dict[str, float] = {}
        count = 0
        self.engine.train()
        for _ in range(t.ppo_epochs):
            for start in range(0, batch.size, per_mini):
                mini = self._slices(start, min(start + per_mini, batch.size))
                total_tokens = sum(int(self._mask(batch.rows(s)).sum()) for s in mini)
                for s in mini:
                    k = s.start // self.micro
                    metrics = self._micro_step(batch.rows(s), old[k], ref[k] if ref else None,
                                               total_tokens, len(mini))
                    for key, value in metrics.items():
                        sums[key] = sums.get(key, 0.0) + value
                    count += 1
        out = {k: v / max(1, count) for k, v in sums.items()}
        if drift is not None:
            out["sampler_logprob_diff"] = drift
        return out

    def sampler_drift(self, batch: Batch, old: list[torch.Tensor]) -> float | None:
        """Mean |log p_vLLM - log p_trainer| over response tokens: ~0 when the engine
        samples from exactly the weights being trained (a broken weight sync shows here)."""
        if batch.sampler_logprobs is None or self.cfg.rollout.temperature != 1.0:
            return None
        total, count = 0.0, 0
        for s, lp in zip(self._slices(0, batch.size), old):
            b = batch.rows(s)
            mask = self._mask(b)
            total += float((lp - b.sampler_logprobs).abs()[mask].sum())
            count += int(mask.sum())
        return total / max(1, count)

    def _micro_step(self, b: Batch, old: torch.Tensor, ref: torch.Tensor | None,
                    mini_tokens: int, n_micro: int) -> dict[str, float]:
        t = self.cfg.train
        mask = self._mask(b)
        new = self._logprobs(self.engine, b)
        loss, metrics = grpo.policy_loss(
            new, old, b.advantages, mask, t.clip_ratio_low, t.clip_ratio_high,
            agg=t.loss_agg_mode, ref_logp=ref, kl_coef=t.kl_coef, kl_kind=t.kl_type,
            clip_ratio_c=t.clip_ratio_c)
        # The loss is a mean within this micro-batch; weight it so that the accumulated
        # gradient is the mean over the whole mini-batch (tokens or sequences).
        share = (int(mask.sum()) / max(1, mini_tokens)) if t.loss_agg_mode == "token-mean" else 1 / n_micro
        self.engine.backward(loss * share, scale_wrt_gas=False)
        self.engine.step()
        out = {k: float(v) for k, v in metrics.items()}
        out["loss"] = float(loss.detach())
        return out

    def _mask(self, b: Batch) -> torch.Tensor:
        return grpo.next_token_mask(b.prompt_lens, b.total_lens, b.input_ids.shape[1])

    def _slices(self, start: int, stop: int) -> list[slice]:
        return [slice(i, min(i + self.micro, stop)) for i in range(start, stop, self.micro)]

    # -- weights and checkpoints --------------------------------------------------------
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (gathered) parameters with Hugging-Face names, one at a time."""
        import deepspeed

        zero3 = self.cfg.deepspeed.zero_stage == 3
        for name, param in self.engine.module.named_parameters():
            ctx = deepspeed.zero.GatheredParameters([param]) if zero3 else nullcontext()
            with ctx:
                yield name, param.data.detach().to(torch.float32).clone()

    def save(self, directory: Path, hf_dir: Path | None) -> None:
        """DeepSpeed state under `directory/ds` (every rank); HF policy in `hf_dir` (rank 0)."""
        self.engine.save_checkpoint(str(directory), tag="ds")
        if hf_dir is not None:
            state = {n: w for n, w in self.named_weights()}
            self.engine.module.save_pretrained(hf_dir, state_dict=state, safe_serialization=True)
        elif self.cfg.deepspeed.zero_stage == 3:
            for _ in self.named_weights():  # every rank takes part in the gathers
                pass

    def load(self, directory: Path) -> None:
        path, _ = self.engine.load_checkpoint(str(directory), tag="ds")
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed state in {directory}")
