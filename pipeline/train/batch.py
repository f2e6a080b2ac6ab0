"""One rank's rollouts as the trainer takes them: right-padded token rows, their lengths,
advantages and the sampler's log-probs."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Batch:
    """One rank's rollouts, right-padded. input_ids [N, T] = prompt + response + padding.

    `prompt_lens` and `total_lens` always stay on the host; the other tensors move with
    `to(device)`."""

    input_ids: torch.Tensor
    prompt_lens: torch.Tensor  # [N]
    total_lens: torch.Tensor  # [N]
    advantages: torch.Tensor  # [N]
    sampler_logprobs: torch.Tensor | None = None  # [N, T-1], vLLM's, aligned like token_logprobs

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device: torch.device) -> "Batch":
        lp = None if self.sampler_logprobs is None else self.sampler_logprobs.to(device)
        return Batch(self.input_ids.to(device), self.prompt_lens, self.total_lens,
                     self.advantages.to(device), lp)

    def rows(self, index: slice) -> "Batch":
        width = int(self.total_lens[index].max())
        lp = None if self.sampler_logprobs is None else self.sampler_logprobs[index, : width - 1]
        return Batch(self.input_ids[index, :width], self.prompt_lens[index],
                     self.total_lens[index], self.advantages[index], lp)
