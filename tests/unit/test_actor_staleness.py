"""`Actor.sampler_staleness` on a stand-in engine (CPU, no DeepSpeed): vLLM's log-probs are
simulated as the current or the previous policy's plus noise larger than what one step
moved them (as bf16 kernels against the trainer's are), and the statistic tells which
policy they came from; the mean |difference| alone cannot. The engine test in bf16 with
vLLM is tests/engine/test_sampler_staleness.py."""

from __future__ import annotations

import torch

from test_actor_devices import make_actor, tiny_module
from pipeline.train.batch import Batch


def cpu_actor():
    actor, _, engine = make_actor(kl_coef=0.0)
    torch.manual_seed(0)
    engine.module = tiny_module("cpu")
    for p in engine.module.parameters():
        torch.nn.init.normal_(p, std=0.05)
    engine.device = actor.device = torch.device("cpu")
    engine.backward = lambda loss, scale_wrt_gas=False: None

    def step():  # an optimiser step: every weight moves a little
        with torch.no_grad():
            for p in engine.module.parameters():
                p.add_(0.002 * torch.randn_like(p))
    engine.step = step
    return actor


def host_batch(n: int = 32, width: int = 64) -> Batch:
    """Enough response tokens (about 1,500) that the noise averages out."""
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(4, 12, (n,), generator=gen)
    total = torch.randint(48, width + 1, (n,), generator=gen)
    ids = torch.randint(0, 64, (n, width), generator=gen)
    return Batch(ids, prompt, total, torch.randn(n, generator=gen), torch.zeros(n, width - 1))


def as_sampler(batch: Batch, chunks: list[torch.Tensor]) -> torch.Tensor:
    out = torch.zeros(batch.size, batch.input_ids.shape[1] - 1)
    row = 0
    for c in chunks:
        out[row: row + c.shape[0], : c.shape[1]] = c
        row += c.shape[0]
    return out


def checked(stale: bool) -> dict:
    actor = cpu_actor()
    batch, gen = host_batch(), torch.Generator().manual_seed(1)
    before = as_sampler(batch, actor.score(batch))
    actor.update(host_batch(), keep_policy=True)  # two optimiser steps
    after = as_sampler(batch, actor.score(batch))
    noise = 0.05 * torch.randn(before.shape, generator=gen)
    sampled = (before if stale else after) + noise
    return actor.update(Batch(batch.input_ids, batch.prompt_lens, batch.total_lens,
                              batch.advantages, sampled))


def test_staleness_tells_the_previous_policy_from_the_current_one():
    fresh, stale = checked(stale=False), checked(stale=True)
    # what one step moved the log-probs is smaller than the noise
    assert fresh["sampler_policy_step"] < fresh["sampler_logprob_diff"]
    assert abs(fresh["sampler_logprob_diff"] - stale["sampler_logprob_diff"]) < \
        0.5 * fresh["sampler_logprob_diff"]
    assert fresh["sampler_staleness"] < 0.5 < stale["sampler_staleness"]


def test_no_previous_policy_no_staleness():
    actor = cpu_actor()
    batch = host_batch()
    metrics = actor.update(Batch(batch.input_ids, batch.prompt_lens, batch.total_lens,
                                 batch.advantages, torch.zeros(32, 63)))
    assert "sampler_logprob_diff" in metrics and "sampler_staleness" not in metrics


def test_the_old_log_prob_forward_hands_the_draft_its_teacher_per_row():
    """With teacher_k set, `update` keeps, per row in order, the current policy's k most
    likely tokens at each response position: those of the model's own logits there, read
    before the update moved the weights; handed out once."""
    from pipeline.train.teacher import top_k

    actor = cpu_actor()
    batch = host_batch(n=6)
    with torch.no_grad():
        logits = actor.engine.module(input_ids=batch.input_ids).logits  # causal: no padding effect
    want_ids, want_lps = top_k(logits, 3)
    assert actor.take_teachers() == []
    actor.teacher_k = 3
    actor.update(batch)
    teachers = actor.take_teachers()
    assert len(teachers) == batch.size and actor.take_teachers() == []
    for i, t in enumerate(teachers):
        p, n = int(batch.prompt_lens[i]), int(batch.total_lens[i])
        assert len(t) == n - p  # one row per response token
        assert torch.equal(t.ids, want_ids[i, p - 1:n - 1])
        assert torch.allclose(t.logprobs.float(), want_lps[i, p - 1:n - 1].float(), atol=1e-2)
