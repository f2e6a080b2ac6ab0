"""Drafts are a function of what the requests emitted, never of the drafter thread's
timing: presumed drafts, background work cut short at random points, and inline work give
the same drafts pass by pass (docs/speculation.md, "Reproducible speculation")."""

from __future__ import annotations

import random

import pytest

from pipeline.drafting import background
from pipeline.drafting.drafter import GroupDrafter
from pipeline.drafting.inputs import DrafterConfig, HistoryResponse
from pipeline.history.store import prompt_hash

VOCAB = 12


def _workload(seed: int = 5, prompts: int = 6, group: int = 6, length: int = 90):
    """Prompts, their history (two epochs of noisy copies of a per-prompt pattern) and the
    responses the target 'samples' this step (another noisy copy): rhyming, not equal."""
    rng = random.Random(seed)
    out = []
    for p in range(prompts):
        prompt = [100 + p, 101 + p, 102 + p]
        pattern = [rng.randrange(VOCAB) for _ in range(length)]

        def noisy(rate):
            return [rng.randrange(VOCAB) if rng.random() < rate else t for t in pattern]

        history = [noisy(0.15) for _ in range(2 * group)]
        targets = [noisy(0.2)[: rng.randrange(length // 2, length)] for _ in range(group)]
        out.append((prompt, history, targets))
    return out


def _run(presume: bool, threaded: bool, cap: int = 6) -> list[list[list[int]]]:
    """Every pass's drafts, the proposer's way: tokens in, drafts out, after_pass."""
    d = GroupDrafter(DrafterConfig(max_spec_factor=4.0, min_path_prob=0.5, chain=True,
                                   thin_pass_tokens=64,
                                   chain_longest=0.25, background=threaded))
    targets, pos = {}, {}
    work = _workload()
    for prompt, history, _ in work:
        d.set_history(prompt_hash(prompt), [HistoryResponse(h, None) for h in history])
    for p, (prompt, _, group) in enumerate(work):
        d.expect_group(prompt, len(group))
        for g, target in enumerate(group):
            rid = f"{g}_{p}"
            d.start(rid, prompt)
            targets[rid], pos[rid] = target, 0
    passes, emitted = [], {}
    while targets:
        running = list(targets)
        if emitted:
            d.append_many(list(emitted), list(emitted.values()))
        drafts = d.draft_many(running, [cap] * len(running))
        passes.append([list(x.token_ids) for x in drafts])
        emitted = {}
        for rid, draft in zip(running, drafts):
            t, i = targets[rid], pos[rid]
            k = 0
            while k < len(draft.token_ids) and i + k < len(t) and draft.token_ids[k] == t[i + k]:
                k += 1
            emitted[rid] = t[i:i + k + 1]
            pos[rid] = i + len(emitted[rid])
        for rid in [r for r in running if pos[r] >= len(targets[r])]:
            d.append(rid, emitted.pop(rid))
            d.finish(rid)
            del targets[rid]
        d.after_pass(presume=presume)
    d.end_step()
    d.close()
    return passes


def test_presumed_drafts_are_the_drafts_a_fresh_query_gives():
    """Every presumed draft worked out (inline) against none (presume off): the same."""
    fresh = _run(presume=False, threaded=False)
    presumed = _run(presume=True, threaded=False)
    assert len(fresh) > 10 and sum(map(len, sum(fresh, []))) > 100
    assert presumed == fresh


def test_drafts_do_not_follow_the_drafter_threads_timing(monkeypatch):
    """The thread slowed by random sleeps, so that waits cut presuming at other points in
    every run: the drafts of an undisturbed inline run, pass by pass."""
    reference = _run(presume=True, threaded=False)
    monkeypatch.setenv(background.DELAY_ENV, "0.0004")
    for _ in range(2):
        assert _run(presume=True, threaded=True) == reference


def test_the_delay_hook_is_off_by_default_and_ignores_garbage(monkeypatch):
    monkeypatch.delenv(background.DELAY_ENV, raising=False)
    assert background.delay_hook_s() == 0.0
    monkeypatch.setenv(background.DELAY_ENV, "fast")
    assert background.delay_hook_s() == 0.0
    monkeypatch.setenv(background.DELAY_ENV, "0.01")
    assert background.delay_hook_s() == pytest.approx(0.01)
