"""RhymeProposer inside a real vLLM engine on the tiny policy: vLLM accepts the custom
proposer, greedy output is token-identical with and without speculation, and drafts from
history are accepted. The temperature-1 statistical test is test_drafting_lossless.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.costs import tau

REPO = Path(__file__).resolve().parents[2]

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; else sized from host RAM minus RSS

N_PROMPTS, GROUP, MAX_TOKENS = 8, 2, 64


def _llm(model_dir, **extra):
    from vllm import LLM
    return LLM(model=str(model_dir), tokenizer=str(model_dir), dtype="float32", seed=0,
               enforce_eager=True, gpu_memory_utilization=0.05, max_model_len=256,
               max_num_seqs=64, disable_log_stats=False, **extra)


def _greedy(llm, prompts):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    reqs = [TokensPrompt(prompt_token_ids=p) for p in prompts for _ in range(GROUP)]
    params = SamplingParams(n=1, temperature=0.0, max_tokens=MAX_TOKENS)
    return [list(o.outputs[0].token_ids) for o in llm.generate(reqs, [params] * len(reqs),
                                                               use_tqdm=False)]


def sort_prompts(model_dir) -> list[list[int]]:
    from transformers import AutoTokenizer

    from pipeline.tasks.base import get_task

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    return [tok(r["prompt"])["input_ids"] for r in get_task("sort").generate(N_PROMPTS, 3)]


def chat_prompts(model_dir) -> list[list[int]]:
    """GSM8K-format questions through the model's chat template, as training encodes them."""
    import json

    from transformers import AutoTokenizer

    from pipeline.config.schema import DataConfig
    from pipeline.tasks.chat import PromptEncoder

    rows = (REPO / "sample_data/gsm8k/test.jsonl").read_text().splitlines()[:N_PROMPTS]
    encoder = PromptEncoder.from_config(DataConfig(chat_template="auto"),
                                        AutoTokenizer.from_pretrained(str(model_dir)))
    assert encoder.format.template is not None
    return encoder.encode_many([json.loads(r)["question"] for r in rows])


def run_greedy_identity(model_dir, budget: str = "tree", prompts=None) -> dict:
    from pipeline.history.store import prompt_hash
    from pipeline.rollout import cpu_sampler_fix
    from pipeline.rollout.meter import PassMeter
    from pipeline.rollout.proposer import attach, speculative_config
    from pipeline.drafting.budget_throughput import ThroughputBudget, ThroughputConfig
    from pipeline.drafting.budget_tree import TreeBudget
    from pipeline.drafting.drafter import GroupDrafter
    from pipeline.drafting.inputs import DrafterConfig, HistoryResponse
    from pipeline.drafting.pass_caps import PassCaps

    cpu_sampler_fix.apply()
    prompts = prompts or sort_prompts(model_dir)
    plain = _greedy(_llm(model_dir), prompts)

    # tree, the default: as shipped, drafts of up to 16 tokens in thin passes (all of
    # these: 16 sequences), 8 in full ones (`PassCaps`)
    caps = PassCaps(8, 16, 296) if budget == "tree" else PassCaps(8)
    llm = _llm(model_dir, speculative_config=speculative_config(caps.most))
    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    # drafts up to the matched length (vLLM's factor), as these checks were measured with
    drafter = GroupDrafter(DrafterConfig.for_method("history+group", max_spec_factor=1.0))
    meter = PassMeter(runner)
    if budget == "critical":
        # The pass meter feeds the online cost model as the engine wires it, but with each
        # pass priced by a fixed CPU-like curve instead of its wall-clock seconds: what the
        # budget drafts must not depend on how loaded the test machine is (a CI run with
        # load ~4 once drafted too little for the tau check below).
        from pipeline.costs import DRAFT_COST
        from pipeline.drafting.budget_critical import CriticalBudget, CriticalConfig
        drafts = CriticalBudget(CriticalConfig(max_len=8))
        meter.listener = lambda tokens, s, prefill: prefill or drafts.observe_pass(
            tokens, DRAFT_COST.pass_seconds(tokens))
    elif budget == "tree":
        drafts = TreeBudget(caps.most)
    else:
        drafts = ThroughputBudget(ThroughputConfig(max_len=8))
    proposer = attach(runner, drafter, drafts, caps)
    rounds = []
    for _ in range(2):  # cold (siblings and self only), then with the first round as history
        meter.start()
        out = _greedy(llm, prompts)
        counts = meter.stop()
        proposer.end_step()
        rounds.append((out, proposer.reset_stats(), counts))
        for i, p in enumerate(prompts):
            drafter.set_history(prompt_hash(p), [HistoryResponse(t)
                                                 for t in out[i * GROUP:(i + 1) * GROUP]])
    return {"plain": plain, "rounds": rounds, "prompts": prompts}


# `tree` is the default; `throughput` runs inside a real engine in test_drafting_lossless
@pytest.mark.parametrize("budget", ["tree", "critical"])
def test_greedy_output_is_identical_with_history_and_sibling_drafts(tiny_model, budget):
    result = run_greedy_identity(tiny_model, budget)
    plain = result["plain"]
    (cold, cold_stats, _), (warm, warm_stats, warm_counts) = result["rounds"]
    assert cold == plain
    assert warm == plain
    # measured: cold 64 passes, tau 1.005 (greedy duplicates run in lockstep, so siblings
    # have nothing to offer); warm 20 passes, tau 2.1, 236 of 260 draft tokens accepted
    warm_tau, cold_tau = (tau(s.emitted, s.seq_passes) for s in (warm_stats, cold_stats))
    assert warm_stats.accepted > 0 and warm_tau > max(1.5, cold_tau)
    assert warm_stats.passes < cold_stats.passes
    if budget == "tree":
        assert warm_stats.longest > 8  # thin passes drafted longer than a full one may
    # the engine-side meter (used by `bench spec` for every method) agrees with the proposer
    # on the decode passes per sequence; it counts only tokens that reach the output (the
    # proposer also sees tokens sampled past a stop in a request's last pass) and only
    # draft tokens that were scheduled (drafts proposed in a last pass never are)
    generated, requests = sum(len(t) for t in warm), len(warm)
    decode = warm_counts.seq_passes - warm_counts.prefill_seq_passes
    assert decode == warm_stats.seq_passes and warm_counts.passes == warm_stats.passes
    assert generated - requests <= warm_stats.emitted
    assert 0 < warm_counts.draft_tokens <= warm_stats.drafted
    assert warm_counts.tau(generated, requests) > 1.5
    if budget == "tree":
        check_the_ceiling_marks_greedy_tokens(tiny_model, result["prompts"], plain)


def check_the_ceiling_marks_greedy_tokens(model_dir, prompts, outputs):
    """`bench spec --ceiling` marks a token as the policy's argmax by a transformers forward
    of the checkpoint; on vLLM's greedy output (every token vLLM's argmax) it must mark
    them all, and the oracle then drafts each response whole in its first decode pass."""
    from pipeline.bench.spec_ceiling import argmax_hits, load_policy
    from pipeline.draft_ceiling import oracle_passes

    model = load_policy(model_dir)
    hits = [argmax_hits(model, p, out) for p, out in
            zip([p for p in prompts for _ in range(GROUP)], outputs)]
    share = sum(map(sum, hits)) / sum(map(len, hits))
    assert share > 0.99, share  # float32 on both sides: a near-tie may flip, rarely
    whole = [oracle_passes(h, None) == min(2, len(h)) for h in hits]
    assert sum(whole) >= 0.9 * len(whole)


def test_greedy_output_is_identical_on_a_real_model_family(qwen2_model):
    """The Qwen2 stand-in (byte-level BPE, ChatML prompts, untied embeddings): drafts from
    history over an 8k vocabulary change nothing in greedy output."""
    result = run_greedy_identity(qwen2_model, "tree", chat_prompts(qwen2_model))
    plain = result["plain"]
    (cold, _, _), (warm, warm_stats, _) = result["rounds"]
    assert cold == plain and warm == plain
    assert warm_stats.accepted > 0 and warm_stats.passes < result["rounds"][0][1].passes
