"""Everything the trainer feeds the policy and the reference model is on their device.

On a CPU every tensor is on the host, so a missing `.to(device)` cannot show; here the
stand-in engine's modules live on the `meta` device (shapes only, no data) and a forward
pre-hook on each module fails the test when any input tensor is elsewhere. The update runs
end to end on meta; only turning metrics into numbers is impossible there, so
`host_floats` (one call per update) is replaced by zeros.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from pipeline.config import Config
from pipeline.train import actor as actor_mod
from pipeline.train.actor import Actor
from pipeline.train.batch import Batch
from pipeline.train.ds_config import reference_config


def tiny_module(device: str = "meta") -> torch.nn.Module:
    """A two-layer Qwen2 on `device`; on a real device its buffers (the rotary frequencies)
    are computed, where `to_empty` would leave them as whatever the memory held."""
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                      tie_word_embeddings=False, attn_implementation="eager")
    return Qwen2ForCausalLM(cfg).to(device)


class DeviceGuard:
    """Forward pre-hook: every tensor argument must be on the module's device."""

    def __init__(self, module: torch.nn.Module, name: str):
        self.name, self.calls, self.device = name, 0, next(module.parameters()).device
        module.register_forward_pre_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs):
        self.calls += 1
        for i, value in [*enumerate(args), *kwargs.items()]:
            if isinstance(value, torch.Tensor) and value.device != self.device:
                pytest.fail(f"{self.name} forward got {i}={tuple(value.shape)} on "
                            f"{value.device}, the module is on {self.device}")


class StandInEngine:
    """DeepSpeed's surface as the Actor uses it, around a module on `meta`."""

    def __init__(self, module):
        self.module, self.device, self.steps = module, torch.device("meta"), 0

    def __call__(self, **kwargs):
        return self.module(**kwargs)

    def backward(self, loss, scale_wrt_gas=False):
        assert loss.device == self.device

    def step(self):
        self.steps += 1

    def train(self):
        self.module.train()

    def eval(self):
        self.module.eval()


def host_batch(n: int = 4) -> Batch:
    """Rollouts as `loop.rollouts.to_batch` builds them: on the host."""
    gen = torch.Generator().manual_seed(0)
    prompt = torch.tensor([3, 4, 3, 5])[:n]
    total = torch.tensor([9, 12, 7, 12])[:n]
    ids = torch.randint(0, 64, (n, 12), generator=gen)
    return Batch(ids, prompt, total, torch.randn(n, generator=gen),
                 torch.zeros(n, 11))


def make_actor(kl_coef: float) -> tuple[Actor, list[DeviceGuard], StandInEngine]:
    cfg = Config()
    cfg = type(cfg)(**{**cfg.__dict__, "train": type(cfg.train)(**{
        **cfg.train.__dict__, "kl_coef": kl_coef}), "rollout": type(cfg.rollout)(**{
            **cfg.rollout.__dict__, "temperature": 1.0})})
    engine = StandInEngine(tiny_module())
    guards = [DeviceGuard(engine.module, "policy")]
    ref = None
    if kl_coef:
        ref = StandInEngine(tiny_module())
        guards.append(DeviceGuard(ref.module, "reference"))
    ds = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2}
    return Actor(cfg, engine, ds, ref), guards, engine


@pytest.fixture
def no_numbers_on_meta(monkeypatch):
    monkeypatch.setattr(actor_mod, "host_floats", lambda values: {k: 0.0 for k in values})


def test_update_feeds_the_policy_and_the_reference_on_their_device(no_numbers_on_meta):
    actor, guards, engine = make_actor(kl_coef=0.01)
    metrics = actor.update(host_batch())
    policy, reference = guards
    # 2 scoring micro-batches + 2 training micro-steps; the reference scores twice
    assert policy.calls == 4 and reference.calls == 2
    assert engine.steps == 2
    assert {"loss", "pg_loss", "kl", "sampler_logprob_diff"} <= set(metrics)


def test_the_guard_catches_a_host_tensor(no_numbers_on_meta):
    """The check can fail: scoring a batch that was not moved to the device."""
    actor, _, _ = make_actor(kl_coef=0.0)
    with pytest.raises(pytest.fail.Exception, match="on cpu, the module is on meta"):
        actor.score(host_batch())


def test_reference_config_drops_the_optimiser_and_shards_only_under_zero3():
    ds = {"zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW"}, "bf16": {}}
    assert reference_config(ds) == {"zero_optimization": {"stage": 0}, "bf16": {}}
    ds3 = {**ds, "zero_optimization": {"stage": 3}}
    assert reference_config(ds3) == {"zero_optimization": {"stage": 3}, "bf16": {}}
