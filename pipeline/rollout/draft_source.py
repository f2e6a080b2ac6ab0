"""The draft model of a `model` method (`spec.method: history+group+model`) as the rollout
engine starts it: a `pipeline.drafting.model_source.ModelSource` from the policy's
directory, on the device `spec.draft_device` names."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.config.methods import method
from pipeline.config.schema import SpecConfig

if TYPE_CHECKING:
    from pipeline.rollout.speculation import PolicySource


def draft_device(setting: str, engine_device=None) -> str:
    """Where the draft model runs (`spec.draft_device`): auto follows the rollout engine's
    device (vLLM's model runner's `device`; the CPU where there is none), so that on a GPU
    node the draft's forward and training run on the GPU, not on the host."""
    if setting == "cuda":
        import torch

        if not torch.cuda.is_available():
            from pipeline.errors import UsageError

            raise UsageError("spec.draft_device is cuda and torch sees no CUDA device on "
                             "this node; set it to auto (the rollout engine's device) or cpu")
    if setting != "auto":
        return setting
    kind = getattr(engine_device, "type", engine_device)
    return "cuda" if kind == "cuda" else "cpu"


def draft_model_source(spec: SpecConfig, policy: PolicySource | None, engine_device=None):
    """The `ModelSource` of a method with a draft model (None for the others), on the
    device `spec.draft_device` names (auto: `engine_device`'s kind)."""
    if not method(spec.method).model:
        return None
    if policy is None:
        raise ValueError(f"spec.method {spec.method} needs the policy's directory to start "
                         "its draft model from")
    from pipeline.drafting.draft_train import TrainSettings
    from pipeline.drafting.model_source import ModelSource
    from pipeline.drafting.pass_caps import PassCaps

    source = ModelSource.from_policy(
        policy.path, layers=spec.draft_layers, seed=policy.seed,
        settings=TrainSettings(updates=spec.draft_updates, window=spec.draft_window,
                               lr=spec.draft_lr, draft_vocab=spec.draft_vocab),
        max_len=PassCaps.from_spec(spec).most, priced=spec.budget != "tree",
        min_path_prob=spec.min_path_prob, sample=spec.draft_probs,
        device=draft_device(spec.draft_device, engine_device))
    source.set_temperature(policy.temperature)
    return source


__all__ = ["draft_device", "draft_model_source"]
