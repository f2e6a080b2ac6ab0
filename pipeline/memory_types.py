"""The per-GPU memory plan's values (`pipeline.memory_plan` computes them,
`pipeline.memory_fit` explains a plan that does not fit): one holder of memory per `Item`,
GiB per GPU in each phase, and the `MemoryPlan` of one rank."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

GIB = 2 ** 30


@dataclass(frozen=True)
class Item:
    """One holder of GPU memory, GiB per GPU in each phase (None: unknown without a device size)."""

    name: str
    rollout: Optional[float]
    train: float
    basis: str


@dataclass(frozen=True)
class MemoryPlan:
    items: tuple[Item, ...]
    device_gib: Optional[float]  # None: no GPU to check against (a CPU run)
    device: str  # where the size came from
    world_size: int
    params: int
    largest_layer: int
    micro_batch: int  # sequences per forward/backward (an upper bound of the actor's)
    seq_len: int  # tokens per sequence, at most
    model_states_gib: float  # weights + gradients + optimizer states, train phase
    deepspeed: Optional[tuple[float, str]]  # DeepSpeed's own figure for the same, and its source
    problems: tuple[str, ...]  # why it cannot fit (empty: fits, or no device)
    vllm_fraction: float  # of the device, vLLM's while awake
    notes: tuple[str, ...] = ()

    def peak(self, phase: str) -> Optional[float]:
        values = [getattr(item, phase) for item in self.items]
        return None if None in values else sum(values)

    @property
    def peak_phase(self) -> tuple[str, Optional[float]]:
        """The phase with the larger peak (train when the rollout's is unknown)."""
        rollout, train = self.peak("rollout"), self.peak("train")
        return ("rollout", rollout) if rollout is not None and rollout > train else ("train", train)

    @property
    def fits(self) -> Optional[bool]:
        return None if self.device_gib is None else not self.problems

    def to_dict(self) -> dict:
        phase, peak = self.peak_phase
        out = asdict(self)
        out["items"] = [{"name": i.name, "rollout_gib": i.rollout, "train_gib": i.train,
                         "basis": i.basis} for i in self.items]
        out["deepspeed"] = (None if self.deepspeed is None else
                            {"gib": self.deepspeed[0], "source": self.deepspeed[1]})
        out.update(peak={"rollout_gib": self.peak("rollout"), "train_gib": self.peak("train"),
                         "phase": phase, "gib": peak}, fits=self.fits)
        return out


__all__ = ["GIB", "Item", "MemoryPlan"]
