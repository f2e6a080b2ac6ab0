"""What the vLLM adapter reads of vLLM's V1 model runner, in one list (part of the adapter).

The adapter reaches past vLLM's public API in three places: the pass meter wraps two
runner methods (`pipeline.rollout.meter`), the proposer reads the runner's input batch and
request states and hands it draft probabilities for the rejection sampler
(`pipeline.rollout.proposer`) and the weight sync calls `reload_weights`
(`pipeline.rollout.engine`). Those exist on the V1 model runner
(`vllm/v1/worker/gpu_model_runner.py`, which the CPU runner subclasses) and not on Model
Runner V2 (`vllm/v1/worker/gpu/model_runner.py`), which vLLM 0.32 picks on a GPU whenever
Triton is present and the speculative method allows it: `spec.method: none` included.
So the adapter forces V1 (`VLLM_USE_V2_MODEL_RUNNER=0`, before vLLM reads its
environment) and checks at engine start that the runner has every name below. A unit test
checks the same names against the installed vLLM's source files, so an upgrade that
renames one fails in CI, not on a cluster.
"""

from __future__ import annotations

from typing import Any

# the environment variable vLLM reads (vllm/envs.py) to choose its model runner
RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"

# file (relative to the vllm package) -> class -> names the adapter uses on its instances
RUNNER_FILE = "v1/worker/gpu_model_runner.py"
INPUT_BATCH_FILE = "v1/worker/gpu_input_batch.py"
SCHEDULER_OUTPUT_FILE = "v1/core/sched/output.py"
V2_RUNNER_FILE = "v1/worker/gpu/model_runner.py"  # what the adapter must not run on

RUNNER = ("GPUModelRunner", ("execute_model", "propose_draft_token_ids", "get_model",
                             "reload_weights", "input_batch", "drafter", "requests",
                             "_draft_probs", "_draft_prob_req_ids",
                             "_get_spec_decode_draft_probs"))
INPUT_BATCH = ("InputBatch", ("req_ids", "req_id_to_index", "num_prompt_tokens",
                              "token_ids_cpu", "num_tokens_no_spec"))
SCHEDULER_OUTPUT = ("SchedulerOutput", ("total_num_scheduled_tokens", "num_scheduled_tokens",
                                        "scheduled_new_reqs", "scheduled_spec_decode_tokens",
                                        "scheduled_cached_reqs", "finished_req_ids"))
SOURCES = {RUNNER_FILE: RUNNER, INPUT_BATCH_FILE: INPUT_BATCH,
           SCHEDULER_OUTPUT_FILE: SCHEDULER_OUTPUT}
# set by the runner only when speculating, or read only by a draft model's sampled drafts
# (`spec.draft_probs`): checked in the source, not on every live runner
ONLY_WHEN_SPECULATING = ("drafter", "requests", "_draft_probs", "_draft_prob_req_ids",
                         "_get_spec_decode_draft_probs")


def missing(runner: Any) -> list[str]:
    """Names the adapter needs that `runner` (a live model runner) lacks, as
    'runner.x' / 'runner.input_batch.y'."""
    out = [f"runner.{name}" for name in RUNNER[1]
           if name not in ONLY_WHEN_SPECULATING and not hasattr(runner, name)]
    batch = getattr(runner, "input_batch", None)
    if batch is not None:
        out += [f"runner.input_batch.{name}" for name in INPUT_BATCH[1]
                if not hasattr(batch, name)]
    return out


def check(runner: Any, vllm_version: str) -> None:
    """RuntimeFailure (one line) unless `runner` is a model runner the adapter can drive."""
    from pipeline.errors import RuntimeFailure

    lacking = missing(runner)
    if lacking:
        raise RuntimeFailure(
            f"vLLM {vllm_version} built a model runner ({type(runner).__name__}) without "
            f"{', '.join(lacking)}, which rhymectl's adapter needs (vLLM's V1 runner has them; "
            f"{RUNNER_ENV}=0 selects it): install the tested vLLM release (rhymectl doctor)")


__all__ = ["RUNNER_ENV", "SOURCES", "V2_RUNNER_FILE", "check", "missing"]
