"""The pass meter tells prefill from decode as vLLM's scheduler does: a prompt prefilled in
parts, or a preempted request recomputing its prompt and output, is not decoding until its
computed tokens reach its prompt plus the output it holds. The scheduler outputs here carry
the fields vLLM 0.32.0's `SchedulerOutput`, `NewRequestData` and `CachedRequestData` have
(checked against the installed source below); the engine run with chunked prefill is
tests/engine/test_meter_chunked_prefill.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pipeline.rollout.meter import PassMeter


class FakeRunner:
    def execute_model(self, scheduler_output):
        return None

    def propose_draft_token_ids(self, *args):
        return []


def new(rid: str, prompt: int, computed: int = 0):
    return SimpleNamespace(req_id=rid, prompt_token_ids=list(range(prompt)),
                           num_computed_tokens=computed)


def output(new_reqs=(), cached=(), resumed=(), spec=None):
    """cached: (id, num_computed_tokens, num_output_tokens, scheduled tokens) per row."""
    scheduled = {r.req_id: r.prompt_len for r in new_reqs}
    for rid, _, _, tokens in cached:
        scheduled[rid] = tokens
    return SimpleNamespace(
        scheduled_new_reqs=list(new_reqs),
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=[c[0] for c in cached], resumed_req_ids=set(resumed),
            num_computed_tokens=[c[1] for c in cached],
            num_output_tokens=[c[2] for c in cached]),
        num_scheduled_tokens=scheduled, total_num_scheduled_tokens=sum(scheduled.values()),
        scheduled_spec_decode_tokens=spec or {}, finished_req_ids=set())


def part(rid: str, prompt: int, tokens: int):
    """A new request whose first pass prefills `tokens` of its `prompt` tokens."""
    r = new(rid, prompt)
    r.prompt_len = tokens
    return r


def metered(outputs):
    runner, flags = FakeRunner(), []
    meter = PassMeter(runner)
    meter.listener = lambda tokens, seconds, prefill: flags.append(prefill)
    meter.start()
    for so in outputs:
        runner.execute_model(so)
    return meter.stop(), flags


def test_a_prompt_prefilled_in_parts_is_one_prefill():
    counts, flags = metered([
        output([part("X", 10, 6)]),  # first part of X's prompt: no token
        output(cached=[("X", 6, 0, 4)]),  # the rest: X's first token
        output(cached=[("X", 10, 1, 3)], spec={"X": [7, 8]}),  # decoding, 2 drafts
        output(cached=[("X", 13, 4, 1)]),
    ])
    assert counts.seq_passes == 4 and counts.prefill_seq_passes == 2
    assert counts.silent_seq_passes == 1
    assert counts.request_first == {"X": 1}
    assert counts.pass_running == [0, 1, 1, 1] and counts.pass_new == [0, 1, 0, 0]
    assert flags == [True, True, False, False]
    assert counts.spans_exact
    # 6 tokens: the first, then 3 + 2 in two decode passes
    assert counts.tau(6, 1) == 2.5


def test_a_resumed_request_recomputes_before_it_decodes_again():
    counts, flags = metered([
        output([part("X", 10, 10), part("Y", 6, 6)]),
        output(cached=[("X", 10, 1, 1), ("Y", 6, 1, 1)]),
        output(cached=[("X", 11, 2, 1)]),  # Y preempted: its computed tokens go to 0
        # Y resumed: prompt and its 2 output tokens recomputed in two parts; the second
        # emits its next token, as a decode pass does
        output(cached=[("X", 12, 3, 1), ("Y", 0, 2, 5)], resumed=["Y"]),
        output(cached=[("X", 13, 4, 1), ("Y", 5, 2, 3)]),
        output(cached=[("X", 14, 5, 1), ("Y", 8, 3, 1)]),
    ])
    assert counts.seq_passes == 11
    assert counts.prefill_seq_passes == 3 and counts.silent_seq_passes == 1
    assert counts.request_first == {"X": 0, "Y": 0}
    assert counts.pass_running == [2, 2, 1, 1, 2, 2]
    assert flags == [True, False, False, True, False, False]
    # X: 6 tokens in 6 passes; Y: 4 in 5 passes of which one recomputed without emitting
    assert counts.tau(6 + 4, 2) == 1.0
    assert not counts.spans_exact  # Y sat out a pass


def test_a_cached_prefix_still_needs_its_last_prompt_token_computed():
    counts, _ = metered([output([SimpleNamespace(req_id="X", prompt_token_ids=[0] * 32,
                                                 num_computed_tokens=31, prompt_len=1)])])
    assert counts.prefill_seq_passes == 1 and counts.silent_seq_passes == 0


@pytest.mark.parametrize("class_name, field", [
    ("CachedRequestData", "req_ids"), ("CachedRequestData", "num_computed_tokens"),
    ("CachedRequestData", "num_output_tokens"), ("NewRequestData", "prompt_token_ids"),
    ("NewRequestData", "num_computed_tokens")])
def test_the_fields_the_meter_reads_exist_in_vllm(class_name, field):
    """The meter reads these with defaults; a rename would otherwise go unnoticed."""
    import ast
    import importlib.util
    from pathlib import Path

    from pipeline.rollout.runner_contract import SCHEDULER_OUTPUT_FILE

    vllm = Path(importlib.util.find_spec("vllm").origin).parent
    tree = ast.parse((vllm / SCHEDULER_OUTPUT_FILE).read_text())
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == class_name)
    fields = {n.target.id for n in cls.body
              if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    assert field in fields
