"""The DeepSpeed adapter: the trainer side of the policy (the only module that imports
DeepSpeed's engine; `ds_ops` only pre-builds its CPU op).

One `Actor` per rank. A GRPO update is `update(batch)`: old log-probs are recomputed with
the current weights (so the first mini-batch is exactly on-policy, ratio 1), then one
optimiser step per PPO mini-batch, each accumulated over micro-batches. DeepSpeed averages
gradients over ranks and owns ZeRO partitioning, clipping and the optimiser state.

Devices: the rollouts arrive on the host; `update` moves the batch to the engine's device
once (`Batch.to`), and both the policy and the reference model run there: the reference
model is wrapped by DeepSpeed like the policy (ZeRO-3: partitioned; otherwise a full copy
per device, stage 0), as TRL's `prepare_deepspeed` does. Lengths stay on the host (they
size slices and masks); scalar metrics come back to the host once per update, not once per
micro-step.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Iterator

import torch

from pipeline.config.schema import Config
from pipeline.train import export, grpo, sampler_check, teacher
from pipeline.train.batch import Batch
from pipeline.train.ds_config import deepspeed_config, reference_config
from pipeline.train.logprobs import shifted_logprobs


def _logs_to_stderr(deepspeed) -> None:
    """DeepSpeed's logger writes to stdout; stdout is for results (one JSON object)."""
    import logging
    import sys

    for handler in deepspeed.utils.logger.handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream is sys.__stdout__:
            handler.setStream(sys.stderr)


@contextmanager
def partitioned_loading(ds_config: dict) -> Iterator[None]:
    """Under ZeRO-3, `from_pretrained` inside builds the model partitioned: each rank
    allocates only its shard (`deepspeed.zero.Init`) and the checkpoint's tensors are
    copied in one gathered layer at a time, read from the memory-mapped files, so no rank
    holds a full copy of the model (15 GB per model and rank for a 7B in bf16). transformers
    does this while an `HfDeepSpeedConfig` of a ZeRO-3 config is alive, as TRL and
    transformers' Trainer arrange. The object is dropped afterwards: transformers reads it
    in every later `from_pretrained` of the process too, and the trainer needs it for
    nothing else. Other stages load as before (DeepSpeed then holds a full copy anyway)."""
    if ds_config["zero_optimization"]["stage"] != 3:
        yield
        return
    import deepspeed
    from deepspeed.accelerator import get_accelerator
    from transformers.integrations import HfDeepSpeedConfig, unset_hf_deepspeed_config

    # zero.Init reads the world size from DeepSpeed's communicator, which otherwise comes
    # up only in `deepspeed.initialize` (with this backend); before it, one rank is assumed
    deepspeed.init_distributed(dist_backend=get_accelerator().communication_backend_name())
    keep = HfDeepSpeedConfig(ds_config)  # transformers keeps only a weak reference
    try:
        yield
    finally:
        unset_hf_deepspeed_config()
        del keep


class Actor:
    """The policy's DeepSpeed engine (and the reference model's, when `train.kl_coef` > 0).

    Built by `Actor.build`; the constructor takes the engines, so the update can be driven
    with any engine that offers DeepSpeed's surface (`module`, `device`, `backward`,
    `step`, `train`)."""

    def __init__(self, cfg: Config, engine: Any, ds_config: dict, ref: Any = None):
        self.cfg = cfg
        self.engine = engine
        self.ds_config = ds_config
        self.ref = ref
        self.device = torch.device(engine.device)
        self.micro = ds_config["train_micro_batch_size_per_gpu"]
        self.temperature = cfg.rollout.temperature or 1.0
        self._previous: list[torch.Tensor] | None = None  # `keep_policy`'s weights, on the host
        # the draft model's teacher: the policy's teacher_k most likely tokens at every
        # response position, read from the old-log-prob forward (`take_teachers`)
        self.teacher_k = teacher.teacher_k(cfg)
        self._teachers: list = []

    @classmethod
    def build(cls, cfg: Config, world_size: int) -> "Actor":
        import deepspeed
        from transformers import AutoModelForCausalLM

        _logs_to_stderr(deepspeed)
        dtype = torch.bfloat16 if cfg.deepspeed.bf16 else torch.float32
        ds_config = deepspeed_config(cfg, world_size)
        with partitioned_loading(ds_config):
            model = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=dtype)
        model.config.use_cache = False
        if cfg.train.gradient_checkpointing:
            # non-reentrant: the variant that works with ZeRO-3's parameter hooks and inputs
            # that need no grad
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=ds_config)
        ref = None
        if cfg.train.kl_coef > 0:
            ref_config = reference_config(ds_config)
            with partitioned_loading(ref_config):
                frozen = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=dtype)
            frozen.config.use_cache = False
            frozen.eval().requires_grad_(False)
            ref, *_ = deepspeed.initialize(model=frozen, config=ref_config)
            ref.eval()
        return cls(cfg, engine, ds_config, ref)

    # -- scoring ------------------------------------------------------------------------
    def _logprobs(self, model, b: Batch, teachers: list | None = None) -> torch.Tensor:
        """[n, L] log-probs of b's tokens under `model` (on the device); columns before the
        earliest response are 0: their logits are never computed (`logits_to_keep`).
        teachers: where given, each row's `pipeline.train.teacher.Teacher` (the policy's
        `teacher_k` most likely tokens at its response positions) is appended to it."""
        attn = self._attention(b)
        first = max(0, int(b.prompt_lens.min()) - 1)
        kwargs = {}
        if first and _accepts_logits_to_keep(model):
            kwargs["logits_to_keep"] = b.input_ids.shape[1] - first
        else:
            first = 0
        logits = model(input_ids=b.input_ids, attention_mask=attn, **kwargs).logits
        if teachers is not None:
            ids, lps = teacher.top_k(logits, self.teacher_k)
            teachers.extend(teacher.response_targets(ids, lps, b.prompt_lens, b.total_lens,
                                                     first))
        return shifted_logprobs(logits, b.input_ids, first, self.temperature)

    def _attention(self, b: Batch) -> torch.Tensor:
        mask = grpo.response_mask(torch.zeros_like(b.prompt_lens), b.total_lens,
                                  b.input_ids.shape[1])
        return mask.long().to(self.device)

    @torch.no_grad()
    def score(self, batch: Batch, reference: bool = False,
              teachers: list | None = None) -> list[torch.Tensor]:
        """Per micro-batch log-probs [n, L] of the current (or reference) policy, on the
        device; `batch` on the device (see `update`). teachers: see `_logprobs`."""
        model = self.ref if reference else self.engine.module
        model.eval()
        return [self._logprobs(model, batch.rows(s), teachers)
                for s in self._slices(0, batch.size)]

    def teachers(self, batch: Batch) -> list:
        """The policy's `Teacher` per row of `batch`, read from a forward of the current
        weights without an update (the draft model's warm-up, `pipeline.loop.warmup`);
        empty where `teacher_k` is 0. Every rank calls it (ZeRO-3's forward is collective),
        with as many rows."""
        out: list = []
        if self.teacher_k:
            self.score(batch.to(self.device), teachers=out)
        return out

    def take_teachers(self) -> list:
        """The last `update`'s `Teacher` per row of its batch, in order (empty where
        `teacher_k` is 0); handed out once."""
        out, self._teachers = self._teachers, []
        return out

    # -- the update ---------------------------------------------------------------------
    def update(self, batch: Batch, keep_policy: bool = False) -> dict[str, float]:
        """GRPO update over this rank's rollouts; returns mean metrics of all micro-batches.

        keep_policy: keep this rank's share of the weights before the update on the host,
        for the next update's sampler check (`sampler_staleness`); the loop asks for it on
        the step before a sampler-check step."""
        t = self.cfg.train
        batch = batch.to(self.device)
        self._teachers = []
        old = self.score(batch, teachers=self._teachers if self.teacher_k else None)
        ref = self.score(batch, reference=True) if self.ref is not None else None
        drift = self.sampler_drift(batch, old)
        staleness = self.sampler_staleness(batch, old)
        self._previous = self._local_weights() if keep_policy else None
        per_mini = self.ds_config["gradient_accumulation_steps"] * self.micro
        sums: dict[str, torch.Tensor] = {}
        count = 0
        self.engine.train()
        for _ in range(t.ppo_epochs):
            for start in range(0, batch.size, per_mini):
                mini = self._slices(start, min(start + per_mini, batch.size))
                total_tokens = sum(int(self._host_mask(batch.rows(s)).sum()) for s in mini)
                for s in mini:
                    k = s.start // self.micro
                    metrics = self._micro_step(batch.rows(s), old[k], ref[k] if ref else None,
                                               total_tokens, len(mini))
                    for key, value in metrics.items():
                        sums[key] = sums[key] + value if key in sums else value
                    count += 1
        out = {k: v / max(1, count) for k, v in host_floats(sums).items()}
        if drift is not None:
            out["sampler_logprob_diff"] = host_floats({"d": drift})["d"]
        out.update(staleness)
        return out

    def sampler_drift(self, batch: Batch, old: list[torch.Tensor]) -> torch.Tensor | None:
        """Mean |log p_vLLM - log p_trainer| over response tokens: ~0 when the engine
        samples from exactly the weights being trained (a broken weight sync shows here)."""
        if batch.sampler_logprobs is None or self.cfg.rollout.temperature != 1.0:
            return None
        return sampler_check.drift(self._rows(batch), old, self._mask_and_count)

    def sampler_staleness(self, batch: Batch, fresh: list[torch.Tensor]) -> dict[str, float]:
        """Whether vLLM sampled from the weights being trained or from the previous step's
        (a weight push that did not arrive), when `keep_policy` kept the previous ones
        (`pipeline.train.sampler_check.staleness`). Returns {} when there is nothing to
        compare."""
        previous, self._previous = self._previous, None
        if previous is None or batch.sampler_logprobs is None or self.cfg.rollout.temperature != 1.0:
            return {}
        with self._weights_of(previous):
            stale = self.score(batch)
        return sampler_check.staleness(self._rows(batch), fresh, stale, self._mask_and_count,
                                       host_floats)

    def _local_tensors(self) -> list[torch.Tensor]:
        """What this rank holds of each policy parameter: its ZeRO-3 partition, else the
        parameter. Under ZeRO-3 every gathered copy is released first (persistent small
        parameters too), so the next forward gathers all of them from the partitions."""
        if self._zero3():
            self.engine.empty_partition_cache()
        return [getattr(p, "ds_tensor", p) for p in self.engine.module.parameters()]

    def _local_weights(self) -> list[torch.Tensor]:
        """A host copy of `_local_tensors` (ZeRO-3: 1/world of the model per rank)."""
        return [t.data.detach().to("cpu", copy=True) for t in self._local_tensors()]

    @contextmanager
    def _weights_of(self, saved: list[torch.Tensor]) -> Iterator[None]:
        """Run the policy with `saved` (from `_local_weights`) in place of its weights,
        then restore them bit for bit. Every rank swaps its own share."""
        current = self._local_weights()
        self._load_local(saved)
        try:
            yield
        finally:
            self._load_local(current)

    def _load_local(self, tensors: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for target, value in zip(self._local_tensors(), tensors):
                target.data.copy_(value)

    def _micro_step(self, b: Batch, old: torch.Tensor, ref: torch.Tensor | None,
                    mini_tokens: int, n_micro: int) -> dict[str, torch.Tensor]:
        t = self.cfg.train
        mask = self._mask(b)
        new = self._logprobs(self.engine, b)
        loss, metrics = grpo.policy_loss(
            new, old, b.advantages, mask, t.clip_ratio_low, t.clip_ratio_high,
            agg=t.loss_agg_mode, ref_logp=ref, kl_coef=t.kl_coef, kl_kind=t.kl_type,
            clip_ratio_c=t.clip_ratio_c)
        # The loss is a mean within this micro-batch; weight it so that the accumulated
        # gradient is the mean over the whole mini-batch (tokens or sequences).
        tokens = int(self._host_mask(b).sum())
        share = tokens / max(1, mini_tokens) if t.loss_agg_mode == "token-mean" else 1 / n_micro
        self.engine.backward(loss * share, scale_wrt_gas=False)
        self.engine.step()
        out = {k: v.detach() for k, v in metrics.items()}
        out["loss"] = loss.detach()
        return out

    def _host_mask(self, b: Batch) -> torch.Tensor:
        """The response mask [n, L] on the host (counts, shares: no device sync)."""
        return grpo.next_token_mask(b.prompt_lens, b.total_lens, b.input_ids.shape[1])

    def _mask(self, b: Batch) -> torch.Tensor:
        return self._host_mask(b).to(self.device)

    def _mask_and_count(self, b: Batch) -> tuple[torch.Tensor, int]:
        host = self._host_mask(b)
        return host.to(self.device), int(host.sum())

    def _rows(self, batch: Batch) -> list[Batch]:
        """`batch`'s micro-batches, in `score`'s order."""
        return [batch.rows(s) for s in self._slices(0, batch.size)]

    def _slices(self, start: int, stop: int) -> list[slice]:
        return [slice(i, min(i + self.micro, stop)) for i in range(start, stop, self.micro)]

    # -- weights and checkpoints --------------------------------------------------------
    def _zero3(self) -> bool:
        return self.cfg.deepspeed.zero_stage == 3

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full parameters with Hugging-Face names, one at a time, in the model's dtype and
        on the engine's device. Under ZeRO-3 each is gathered and copied (the gathered
        storage is released when the next one is gathered); every rank must iterate."""
        import deepspeed

        for name, param in self.engine.module.named_parameters():
            if self._zero3():
                with deepspeed.zero.GatheredParameters([param]):
                    yield name, param.data.detach().clone()
            else:
                yield name, param.data.detach()

    def parameter_bytes(self) -> list[tuple[str, int]]:
        """(name, bytes) of every full parameter in the model's dtype, in `named_weights`
        order, without gathering (ZeRO-3 records the full shape as `ds_numel`)."""
        return [(name, getattr(p, "ds_numel", p.numel()) * p.element_size())
                for name, p in self.engine.module.named_parameters()]

    def save(self, directory: Path, hf_dir: Path | None) -> None:
        """DeepSpeed state under `directory/ds` (every rank); the policy in Hugging-Face
        format in `hf_dir` (rank 0), streamed one parameter at a time (`export`)."""
        self.engine.save_checkpoint(str(directory), tag="ds")
        if hf_dir is not None:
            export.write_streamed(self.named_weights(), self.parameter_bytes(), hf_dir)
            export.write_configs(self.engine.module, hf_dir)
        elif self._zero3():
            for _ in self.named_weights():  # every rank takes part in the gathers
                pass

    def load(self, directory: Path) -> None:
        path, _ = self.engine.load_checkpoint(str(directory), tag="ds")
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed state in {directory}")


def host_floats(values: dict[str, torch.Tensor]) -> dict[str, float]:
    """Device scalars -> Python floats in one transfer (one sync per update, not one per
    metric and micro-step)."""
    if not values:
        return {}
    keys = list(values)
    stacked = torch.stack([values[k].detach().float().reshape(()) for k in keys])
    return dict(zip(keys, stacked.cpu().tolist()))


def _accepts_logits_to_keep(model) -> bool:
    """Whether the model's forward takes `logits_to_keep` (transformers' causal LMs do)."""
    target = getattr(model, "module", model)  # a DeepSpeed engine wraps the module
    try:
        return "logits_to_keep" in inspect.signature(target.forward).parameters
    except (TypeError, ValueError):
        return False
