"""The critical path of a rollout in target passes (`pipeline.critical_path`), on a hand-made
pass log whose answers are worked out below, and the pass meter that records such a log
from scheduler outputs (a stand-in runner; no vLLM)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pipeline.critical_path import PassLog, critical_path, tail_start
from pipeline.rollout.meter import PassMeter

# Eight requests A..H, six passes. Each pass: who runs (new ones in brackets) and the
# tokens each emits; "before" is the output tokens the running requests held before it.
#
#   pass 0  [A B C D E F G H]  1 each                     before  0   emitted  8
#   pass 1   A B C D E F G H   A-D +2 (3 each);
#                              E-H +1, finish with 2       before  8   emitted 12
#   pass 2   A B C D           A +3 (6), B +2 (5, done),
#                              C +1 (4, done), D +2 (5)    before 12   emitted  8
#   pass 3   A D               A +3 (9), D +1 (6, done)    before 11   emitted  4
#   pass 4   A                 A +2 (11)                   before  9   emitted  2
#   pass 5   A                 A +3 (14, done)             before 11   emitted  3
#
# Total 37 = A 14 + B 5 + C 4 + D 6 + E-H 4 x 2. The formula gives the same per pass, e.g.
# pass 2: before[3] - before[2] + finished (B 5 + C 4) = 11 - 12 + 9 = 8.
# Requests 8, so the tail starts after the last pass with at least 2 running (pass 3):
# tail passes 4 and 5, tail tau = (2 + 3) tokens / (1 + 1) sequence-passes = 2.5.
# Critical request A finished in pass 5: critical passes 6; it ran 6 passes and generated
# 14 tokens, the first in its prefill pass: critical tau = 13 / 5 = 2.6.
RUNNING = [8, 8, 4, 2, 1, 1]
NEW = [8, 0, 0, 0, 0, 0]
BEFORE = [0, 8, 12, 11, 9, 11]
TOKENS = [40, 24, 20, 10, 5, 5]  # scheduled tokens (prompts of 5; drafts): unused by the path
#           A  B  C  D  E  F  G  H
FINISH = [5, 2, 2, 3, 1, 1, 1, 1]
PASSES = [6, 3, 3, 4, 2, 2, 2, 2]
OUT = [14, 5, 4, 6, 2, 2, 2, 2]


def hand_log(**changes) -> PassLog:
    fields = dict(tokens=TOKENS, running=RUNNING, new=NEW, outputs_before=BEFORE,
                  finish=FINISH, passes=PASSES, tokens_out=OUT)
    return PassLog(**{**fields, **changes})


def test_emitted_tokens_per_pass_by_hand():
    assert hand_log().emitted() == [8, 12, 8, 4, 2, 3]
    assert sum(hand_log().emitted()) == sum(OUT)


def test_critical_and_tail_passes_and_taus_by_hand():
    path = critical_path(hand_log())
    assert (path.passes, path.critical_passes, path.tail_passes) == (6, 6, 2)
    assert path.critical_tau == pytest.approx(2.6)
    assert path.tail_tau == pytest.approx(2.5)


def test_a_wider_tail_threshold_moves_the_tail_start():
    # at half the requests (4) the tail starts after pass 2: passes 3, 4, 5, emitting
    # 4 + 2 + 3 = 9 tokens over 2 + 1 + 1 sequence-passes
    path = critical_path(hand_log(), tail_frac=0.5)
    assert path.tail_passes == 3 and path.tail_tau == pytest.approx(9 / 4)


def test_without_speculation_every_tau_is_one():
    # two requests, one token per pass: A runs passes 0-3 (4 tokens), B passes 0-1 (2)
    log = PassLog(tokens=[10, 2, 1, 1], running=[2, 2, 1, 1], new=[2, 0, 0, 0],
                  outputs_before=[0, 2, 2, 3], finish=[3, 1], passes=[4, 2], tokens_out=[4, 2])
    assert log.emitted() == [2, 2, 1, 1]
    path = critical_path(log, tail_frac=0.75)  # tail: fewer than 1.5 running, passes 2-3
    assert (path.critical_passes, path.tail_passes) == (4, 2)
    assert path.critical_tau == 1.0 and path.tail_tau == 1.0


def test_unknown_lengths_and_no_tail_leave_the_taus_undefined():
    path = critical_path(hand_log(tokens_out=[None] + OUT[1:]))
    assert path.critical_passes == 6 and path.tail_passes == 2
    assert path.critical_tau is None and path.tail_tau is None
    flat = critical_path(hand_log(), tail_frac=0.1)  # 0.8 requests: every pass runs more
    assert flat.tail_passes == 0 and flat.tail_tau is None
    assert critical_path(PassLog([], [], [], [], [], [], [])).critical_passes == 0


def test_of_requests_finishing_together_the_longest_is_the_critical_one():
    # B also finishes in pass 5, with fewer tokens than A: A stays the critical request
    path = critical_path(hand_log(finish=[5, 5, 2, 3, 1, 1, 1, 1]))
    assert path.critical_tau == pytest.approx(2.6)


def test_a_thin_first_pass_is_not_the_tail():
    # a prefill split over two passes (2 of 8 requests first): the tail is still the end
    assert tail_start([2, 8, 8, 3, 1], 8) == 4
    assert tail_start([1, 1], 8) == 0  # never a quarter running: every pass is tail


def test_malformed_logs_are_refused():
    with pytest.raises(ValueError, match="one value per pass"):
        hand_log(running=RUNNING[:-1])
    with pytest.raises(ValueError, match="one value per request"):
        hand_log(passes=PASSES[:-1])
    with pytest.raises(ValueError, match="finish pass outside"):
        hand_log(finish=[6] + FINISH[1:])


class FakeRunner:
    def __init__(self):
        self.seen = 0

    def execute_model(self, scheduler_output):
        self.seen += 1

    def propose_draft_token_ids(self, *args):
        return []


def scheduler_output(running: list[str], new: list[str] = (), before: list[int] = (),
                     tokens: int | None = None, finished: str = ""):
    """What the meter reads of vLLM's SchedulerOutput (internal ids `{id}-{8 chars}`);
    `finished`: the requests vLLM reports finished since the last pass."""
    cached = [r for r in running if r not in new]
    tokens = len(running) if tokens is None else tokens
    return SimpleNamespace(
        total_num_scheduled_tokens=tokens,
        num_scheduled_tokens={f"{r}-abcd1234": tokens // max(1, len(running)) for r in running},
        scheduled_new_reqs=[SimpleNamespace(req_id=f"{r}-abcd1234") for r in new],
        scheduled_cached_reqs=SimpleNamespace(num_output_tokens=list(before[:len(cached)])),
        scheduled_spec_decode_tokens={}, finished_req_ids={f"{r}-abcd1234" for r in finished})


def test_the_meter_records_the_hand_made_log():
    runner = FakeRunner()
    meter = PassMeter(runner)
    meter.start()
    everyone = list("ABCDEFGH")
    # vLLM reports a request finished in the next pass; the first pass also reports a
    # request of the rollout before (Z), which is not this one's
    passes = [(everyone, everyone, [], "Z"), (everyone, [], [1] * 8, ""),
              (list("ABCD"), [], [3] * 4, "EFGH"), (list("AD"), [], [6, 5], "BC"),
              (["A"], [], [9], "D"), (["A"], [], [11], "")]
    for (running, new, before, finished), tokens in zip(passes, TOKENS):
        runner.execute_model(scheduler_output(running, new, before, tokens, finished))
    counts = meter.stop()  # A is never reported: it ran to the last pass
    assert runner.seen == 6 and counts.passes == 6 and counts.pass_outputs_before == BEFORE
    assert counts.spans_exact
    log = counts.pass_log(dict(zip(everyone, OUT)))
    assert log == hand_log()
    assert counts.path_metrics() == {"spec_critical_passes": 6, "spec_tail_passes": 2}
    # without the lengths (training's metrics): the passes, no taus
    assert critical_path(counts.pass_log()).critical_tau is None


def test_async_scheduling_reports_late_and_an_empty_pass_still_counts_finishes():
    runner = FakeRunner()
    meter = PassMeter(runner)
    meter.start()
    # Y stops in pass 1 at its token cap and is not scheduled again, but is reported only
    # in pass 3; X stops in pass 3, runs one more pass before vLLM knows, and is reported
    # by a pass that schedules nothing
    for so in (scheduler_output(["X", "Y"], ["X", "Y"]), scheduler_output(["X", "Y"]),
               scheduler_output(["X"]), scheduler_output(["X"], finished="Y"),
               scheduler_output(["X"]), scheduler_output([], tokens=0, finished="X")):
        runner.execute_model(so)
    counts = meter.stop()
    assert counts.passes == 5 and counts.request_finish == {"X-abcd1234": 4, "Y-abcd1234": 1}
    assert counts.spans_exact  # X 5 passes + Y 2 = 7 scheduled pairs


def test_a_request_that_skipped_a_pass_makes_the_spans_inexact():
    runner = FakeRunner()
    meter = PassMeter(runner)
    meter.start()
    for so in (scheduler_output(["X", "Y"], ["X", "Y"]), scheduler_output(["X"]),
               scheduler_output(["X", "Y"])):  # Y preempted for a pass, then resumed
        runner.execute_model(so)
    counts = meter.stop()
    assert counts.pass_log().passes == [3, 3] and not counts.spans_exact


@pytest.mark.parametrize("class_name, field", [("CachedRequestData", "num_output_tokens"),
                                               ("NewRequestData", "req_id")])
def test_the_fields_the_meter_reads_inside_the_scheduler_output_exist_in_vllm(class_name, field):
    """`scheduled_cached_reqs.num_output_tokens` and `scheduled_new_reqs[i].req_id`, in the
    installed vLLM's source (the scheduler output's own fields are in
    `pipeline.rollout.runner_contract`); the meter reads them with defaults, so a rename
    would otherwise go unnoticed."""
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
