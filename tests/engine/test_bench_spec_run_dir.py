"""`rhymectl bench spec` refuses bad epochs and foreign run directories (needs a real model
directory for the config checks; nothing is trained), and its critical-path keys come out
of the real engine's pass meter."""

from __future__ import annotations

from pathlib import Path

import pytest

from rhymectl.app import main

REPO = Path(__file__).resolve().parents[2]


def run_cli(capsys, *args):
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    return exit_info.value.code, capsys.readouterr().err

def test_cli_refuses_one_epoch_and_foreign_directories(capsys, tmp_path, tiny_model):
    cfg = (str(REPO / "sample_configs/tiny.yaml"), f"model.path={tiny_model}", "data.train_size=32")
    code, err = run_cli(capsys, "bench", "spec", *cfg, "--epochs", "1", "--run-dir", str(tmp_path / "b"))
    assert code == 2 and "--epochs 1" in err
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    code, err = run_cli(capsys, "bench", "spec", *cfg, "--run-dir", str(other))
    assert code == 2 and "holds no rhymectl run" in err
    assert [p.name for p in other.iterdir()] == ["notes.txt"]


def test_critical_path_keys_from_the_real_engine(tiny_model, one_rank):
    """One step of 4 prompts x 8 on the real engine without speculation and with
    history+group (siblings only: no history yet): the meter's pass log agrees with the
    completions, and the bench's per-step and GPU-estimate keys are there."""
    from dataclasses import replace

    from transformers import AutoTokenizer

    from pipeline.bench.spec import STEP_KEYS, MethodResult
    from pipeline.bench.spec_summary import summarize
    from pipeline.bench.spec_repeats import aggregate
    from pipeline.config import load_config
    from pipeline.critical_path import critical_path
    from pipeline.rollout.contract import Sampling
    from pipeline.rollout.engine import RolloutEngine
    from pipeline.tasks.base import get_task

    cfg = load_config(REPO / "sample_configs/tiny.yaml", [f"model.path={tiny_model}"])
    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    prompts = [tok(r["prompt"])["input_ids"] for r in get_task("sort").generate(4, 11)]
    sampling = Sampling(n=8, temperature=1.0, max_tokens=64, seed=3, logprobs=False)
    # `one_rank`: one 1-rank group for both engines, as the bench does (`run_method`)
    results = {}
    for method in ("none", "history+group"):
        engine = RolloutEngine.from_config(cfg, spec=replace(cfg.spec, method=method))
        result = engine.generate(prompts, sampling)
        groups, counts = result.groups, result.stats.passes
        lengths = [len(c.token_ids) for g in groups for c in g]
        log = counts.pass_log({c.request_id: len(c.token_ids) for g in groups for c in g})
        path = critical_path(log)
        # every request joined to its completion, and ran in every pass of its span
        assert sorted(log.tokens_out) == sorted(lengths) and counts.spans_exact
        emitted = log.emitted()
        assert sum(emitted) == sum(lengths)
        # a pass emits at least one token per running request, at most what it scheduled
        assert all(r <= e <= t for r, e, t in zip(log.running, emitted, log.tokens))
        assert path.critical_passes == path.passes == counts.passes  # one plain generate
        if method == "none":  # one token per request and pass
            assert emitted == list(log.running) and log.passes == log.tokens_out
            assert path.critical_passes == max(lengths) and path.critical_tau == 1.0
            assert path.tail_tau in (None, 1.0)
        else:
            assert path.critical_tau >= 1.0
            metrics = result.stats.spec_metrics()
            assert metrics["spec_critical_passes"] == path.critical_passes
            assert metrics["spec_tail_passes"] == path.tail_passes
        results[method] = MethodResult(method)
        results[method].add(counts, 1.0, groups)
        del engine
    summary = aggregate([summarize(results, temperature=1.0)])
    for name, m in summary.items():
        for key in STEP_KEYS:
            assert key in m and len(m[f"{key}_steps"]) == 1, (name, key)
        for key in ("gpu_estimate_s", "gpu_estimate_tail_s", "gpu_estimate_speedup",
                    "gpu_estimate_with_drafter_s", "gpu_estimate_model"):
            assert key in m, (name, key)
        assert m["gpu_estimate_s"] > 0
    assert summary["none"]["critical_tau"] == 1.0


def test_the_draft_warm_up_a_training_run_gives_is_counted_apart(tiny_model, one_rank):
    """With spec.draft_warmup the bench gives a draft model's engine the warm-up a fresh
    training run gives it (the same responses, teacher and updates) before any history, on
    the real engine: a warm-up rollout's passes are reported apart from the measured
    steps', the evaluation's are not counted (the run pays them anyway), and the draft
    learnt (its loss fell, its weights moved)."""
    from dataclasses import replace
    from types import SimpleNamespace

    import torch
    from transformers import AutoTokenizer

    from pipeline.bench.spec_warmup import draft_warmup_work, warm_draft
    from pipeline.config import load_config
    from pipeline.rollout.engine import RolloutEngine
    from pipeline.tasks.chat import PromptEncoder

    cfg = load_config(REPO / "sample_configs/tiny.yaml",
                      [f"model.path={tiny_model}", "spec.method=history+group+model",
                       "spec.draft_warmup=rollout", "spec.draft_warmup_prompts=4",
                       "spec.draft_warmup_updates=10", "rollout.n=4", "rollout.max_tokens=48",
                       "data.eval_size=3", "run.eval_n=2"])
    encoder = PromptEncoder.from_config(cfg.data, AutoTokenizer.from_pretrained(str(tiny_model)))
    work, extra = draft_warmup_work(SimpleNamespace(cfg=cfg), encoder)
    assert extra and [(len(p), s.n) for p, s in work] == [(4, 4)]
    engine = RolloutEngine.from_config(cfg)
    model = engine.drafting.model.trainer.model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    warm = warm_draft(SimpleNamespace(cfg=cfg), engine, cfg.spec.method, work, extra)
    assert warm["responses"] == 16 and 0 < warm["critical_passes"] <= warm["passes"]
    assert warm["loss_after"] < warm["loss_before"]
    assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())
    evaluated = SimpleNamespace(cfg=replace(cfg, spec=replace(cfg.spec, draft_warmup="eval")))
    work, extra = draft_warmup_work(evaluated, encoder)  # greedy, then eval_n samples each
    assert not extra and [(len(p), s.n, s.temperature) for p, s in work] == \
        [(3, 1, 0.0), (3, 2, cfg.rollout.temperature)]
    warm = warm_draft(evaluated, engine, cfg.spec.method, work, extra)
    assert warm["responses"] == 9 and warm["passes"] == warm["critical_passes"] == 0
    del engine
