"""`rhymectl bench spec`: method parsing, the report's arithmetic, and bad input (the
measurement itself starts vLLM once per method and is run by hand; see the README)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import UsageError
from pipeline.bench.spec import MethodResult
from pipeline.bench.spec_summary import summarize
from pipeline.config.methods import METHODS
from rhymectl.parsing import parse_methods
from rhymectl.app import main

REPO = Path(__file__).resolve().parents[2]


def test_methods_put_none_first_and_drop_duplicates():
    assert parse_methods("history+group,suffix,none,suffix") == ("none", "history+group", "suffix")
    assert parse_methods(" ngram ") == ("none", "ngram")
    assert parse_methods(",".join(METHODS)) == METHODS


@pytest.mark.parametrize("text", ["none,medusa", "", "history,group,hist"])
def test_unknown_methods_are_refused_listing_the_valid_ones(text):
    with pytest.raises(UsageError) as err:
        parse_methods(text)
    assert all(m in str(err.value) for m in METHODS)


def test_summary_arithmetic():
    base = MethodResult("none", rollout_s=2.0, requests=8, generated=80, passes=10,
                        scheduled_tokens=100, seq_passes=80, prefill_seq_passes=8,
                        samples=[(8, 0.010, False), (4, 0.006, False), (64, 0.5, True)],
                        outputs=[[1, 2]] * 8)
    spec = MethodResult("history", rollout_s=1.0, requests=8, generated=80, passes=5,
                        scheduled_tokens=150, seq_passes=32, prefill_seq_passes=8,
                        draft_tokens=60, drafter_s=0.05,
                        samples=[(24, 0.020, False), (12, 0.011, False), (64, 0.5, True)],
                        outputs=[[1, 2]] * 7 + [[1, 3]])
    s = summarize({"none": base, "history": spec}, temperature=0.0)
    assert s["none"]["tau"] == 1.0 and s["none"]["accept_rate"] == 0.0
    # 72 tokens after prefill over 24 decode seq-passes; 72 - 24 = 48 of 60 drafts accepted
    assert s["history"]["tau"] == 3.0 and s["history"]["accept_rate"] == 0.8
    assert s["history"]["speedup"] == 2.0 and s["none"]["speedup"] == 1.0
    assert s["history"]["tok_per_s"] == 80.0 and s["history"]["drafter_frac"] == 0.05
    # decode passes only: none costs 2 ms + 1 ms/token, history 2 ms + 0.75 ms/token
    assert s["none"]["floor_s"] == pytest.approx(0.080)
    assert s["history"]["floor_s"] == pytest.approx(0.060)
    assert s["none"]["identical"] is True and s["history"]["identical"] is False
    assert summarize({"none": base, "history": spec}, temperature=1.0)["history"]["identical"] is None


def test_drafter_parts_add_up_and_survive_the_worker_json():
    import dataclasses
    import json

    from pipeline.drafting.stats import DrafterTimes

    r = MethodResult("history+group", rollout_s=1.0, drafter_s=0.5)
    r.add_drafter_parts(DrafterTimes(live_in=0.1, queries=0.2, group_ends=0.05))
    r.add_drafter_parts(DrafterTimes(live_in=0.2, queries=0.1))
    back = MethodResult(**json.loads(json.dumps(dataclasses.asdict(r))))  # as run_isolated
    assert back.drafter_parts == pytest.approx({"live_in": 0.3, "queries": 0.3,
                                                "group_ends": 0.05})
    none = MethodResult("none", rollout_s=2.0)
    s = summarize({"none": none, "history+group": back}, temperature=1.0)
    assert s["history+group"]["drafter_live_in_s"] == 0.3
    assert s["history+group"]["drafter_group_ends_s"] == 0.05
    assert not any(k.startswith("drafter_live") for k in s["none"])


def run_cli(capsys, *args) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    return exit_info.value.code, capsys.readouterr().err


def test_cli_refuses_unknown_methods_before_any_work(capsys, tmp_path):
    code, err = run_cli(capsys, "bench", "spec", str(REPO / "sample_configs/tiny.yaml"),
                        "--methods", "none,eagle", "--run-dir", str(tmp_path / "b"))
    assert code == 2 and "unknown method 'eagle'" in err and "history+group" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "b").exists()


class _Engine:
    """Records what each generate call asked for (a stand-in for the vLLM engine: this
    tests the bench's warm-up logic only)."""

    drafting = None

    def __init__(self):
        self.asked = []

    def generate(self, prompts, sampling):
        self.asked.append((len(prompts), sampling.logprobs, sampling.seed))
        return []


@pytest.mark.parametrize("every, expected", [(10, [True, False]), (1, [True, False]),
                                             (0, [False])])
def test_warm_up_compiles_the_logprob_path_training_will_use(monkeypatch, tmp_path, every,
                                                             expected):
    """vLLM compiles its logprob gather on the first request that asks (~1.7 s on CPU):
    the unmeasured warm-up must take that, not the first measured check step."""
    from pipeline.bench import spec
    from pipeline.bench.spec_plan import Plan
    from pipeline.config import load_config

    engine = _Engine()
    monkeypatch.setattr(spec.dist, "init", lambda: None)
    monkeypatch.setattr(spec.RolloutEngine, "from_config", lambda cfg, spec=None: engine)
    cfg = load_config(None, [f"rollout.logprob_check_every={every}"])
    spec.run_method(Plan(cfg, tmp_path, 1, 1), "none", [], lambda: None, [[1, 2], [3]])
    assert [logprobs for _, logprobs, _ in engine.asked] == expected
    assert all(n == 2 and seed is None for n, _, seed in engine.asked)
    engine.asked.clear()
    spec.run_method(Plan(cfg, tmp_path, 1, 1), "none", [], lambda: None, [])
    assert engine.asked == []  # no held-out prompts: no warm-up
