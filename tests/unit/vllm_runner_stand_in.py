"""The V1 model runner as far as the vLLM adapter reads it without speculation: the stand-in
that the recording and state-machine `vllm.LLM` doubles of the unit tests share."""

from __future__ import annotations

from types import SimpleNamespace


def runner_stand_in(reload_weights) -> SimpleNamespace:
    """`reload_weights(weights_iterator)` receives what `update_weights` loads."""
    return SimpleNamespace(
        input_batch=SimpleNamespace(req_ids=[], req_id_to_index={}, num_prompt_tokens=None,
                                    token_ids_cpu=None, num_tokens_no_spec=None),
        drafter=None, execute_model=lambda *a, **k: None,
        propose_draft_token_ids=lambda *a, **k: [],
        get_model=lambda: SimpleNamespace(config=SimpleNamespace(tie_word_embeddings=False)),
        reload_weights=reload_weights)
