"""The policy's most likely tokens at every response position: the draft model's teacher.

The draft model (`pipeline.drafting.draft_train`) learns the policy's distribution better
from the policy's own probabilities than from the one token sampled at each position
(distillation; docs/speculation.md estimates what it buys). The trainer's old-log-prob
forward already computes every response token's logits, so `top_k` reads the k most likely
tokens from them there, chunk by chunk (no fp32 copy of the [N, T, V] logits), and
`response_targets` cuts each row's response positions out: `Teacher` per rollout, k token
ids and their log-probabilities under the policy at temperature 1 (the draft's logits model
the policy's; both are divided by the rollout temperature where they are sampled from).

Log-probabilities are kept as float16 (16 bytes a response token at k = 8 with the int32
ids): a 512-response step of 8k-token responses is 64 MB, and what the draft trains on is
exactly what its checkpoint state saves, so a resumed run trains the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

Tensor = torch.Tensor
CHUNK_BYTES = 1 << 28  # fp32 working set of one chunk of logits (256 MiB); `pipeline.train.logprobs` too


@dataclass(frozen=True)
class Teacher:
    """One response's targets: ids [R, k] int32 and logprobs [R, k] float16 on the host,
    row r for response token r (the position that predicts it), most likely first."""

    ids: Tensor
    logprobs: Tensor

    def __post_init__(self):
        if self.ids.shape != self.logprobs.shape or self.ids.dim() != 2:
            raise ValueError(f"teacher ids {tuple(self.ids.shape)} and logprobs "
                             f"{tuple(self.logprobs.shape)} must be the same [R, k]")

    def __len__(self) -> int:
        return self.ids.shape[0]

    def cut(self, length: int) -> "Teacher":
        """The first `length` positions."""
        return Teacher(self.ids[:length], self.logprobs[:length])


def teacher_k(cfg, method_name: str | None = None) -> int:
    """How many of the policy's most likely tokens the draft model of `method_name` (the
    config's spec.method when None) learns at each response position: spec.draft_distill
    with a draft model at temperature > 0, else 0 (no draft model; greedy rollouts, whose
    sampled token is the policy's argmax)."""
    from pipeline.config.methods import method

    if not method(method_name or cfg.spec.method).model or not cfg.rollout.temperature:
        return 0
    return cfg.spec.draft_distill


def top_k(logits: Tensor, k: int, chunk_bytes: int = CHUNK_BYTES) -> tuple[Tensor, Tensor]:
    """The k most likely tokens of each position of `logits` [..., V] and their
    log-probabilities at temperature 1: (ids int32 [..., k], logprobs float16 [..., k]), on
    the logits' device; each chunk is upcast to fp32 on its own."""
    if not 0 < k <= logits.shape[-1]:
        raise ValueError(f"top_k: k = {k} must be in 1..{logits.shape[-1]} (the vocabulary)")
    flat = logits.reshape(-1, logits.shape[-1])
    rows = max(1, chunk_bytes // (4 * logits.shape[-1]))
    ids = torch.empty(flat.shape[0], k, dtype=torch.int32, device=logits.device)
    lps = torch.empty(flat.shape[0], k, dtype=torch.float16, device=logits.device)
    for i in range(0, flat.shape[0], rows):
        x = flat[i: i + rows].float()
        values, index = x.topk(k, dim=-1)
        lps[i: i + rows] = (values - torch.logsumexp(x, dim=-1, keepdim=True)).to(torch.float16)
        ids[i: i + rows] = index.to(torch.int32)
    return ids.view(*logits.shape[:-1], k), lps.view(*logits.shape[:-1], k)


def response_targets(ids: Tensor, logprobs: Tensor, prompt_lens, total_lens,
                     first: int = 0) -> list[Teacher]:
    """Per row, the `Teacher` of its response: `top_k` of logits [n, T - first, V] whose
    position j (column j + first of the row) predicts token j + first + 1, as
    `pipeline.train.logprobs.shifted_logprobs` reads them; moved to the host."""
    ids, logprobs = ids.cpu(), logprobs.cpu()
    out = []
    for i, (p, t) in enumerate(zip(prompt_lens, total_lens)):
        start, stop = int(p) - 1 - first, int(t) - 1 - first  # predict tokens p .. t-1
        if start < 0:
            raise ValueError(f"row {i}: its prompt starts before the logits kept (first = "
                             f"{first}, prompt length {int(p)})")
        out.append(Teacher(ids[i, start:stop].clone(), logprobs[i, start:stop].clone()))
    return out


def soft_targets(teacher: Teacher, temperature: float = 1.0) -> Tensor:
    """The teacher's k tokens' probabilities at `temperature`, renormalised over the k
    (float32 [R, k]): what the draft's cross-entropy is taken against."""
    return torch.softmax(teacher.logprobs.float() / float(temperature), dim=-1)


def policy_teachers(policy_dir, rollouts, k: int, rows: int = 4) -> list[Teacher]:
    """Per (prompt ids, response ids), the `Teacher` of the Hugging Face policy saved in
    `policy_dir`, computed here on the CPU in float32, `rows` rollouts a forward (right
    padding: causal attention never reads it). What a bench that replays recorded
    rollouts without a trainer teaches its draft model with."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(policy_dir), dtype=torch.float32)
    model.eval()
    out: list[Teacher] = []
    with torch.no_grad():
        for i in range(0, len(rollouts), rows):
            part = [(list(p), list(r)) for p, r in rollouts[i:i + rows]]
            seqs = [p + r for p, r in part]
            ids = torch.zeros(len(seqs), max(map(len, seqs)), dtype=torch.long)
            for j, s in enumerate(seqs):
                ids[j, :len(s)] = torch.tensor(s)
            prompt_lens = [len(p) for p, _ in part]
            first = max(0, min(prompt_lens) - 1)
            logits = model(input_ids=ids, logits_to_keep=ids.shape[1] - first).logits
            top_ids, top_lps = top_k(logits, k)
            out += response_targets(top_ids, top_lps, prompt_lens, [len(s) for s in seqs], first)
    return out


__all__ = ["Teacher", "policy_teachers", "response_targets", "soft_targets", "teacher_k",
           "top_k"]
