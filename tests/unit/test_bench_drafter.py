"""`rhymectl bench drafter`: the synthetic workload is a function of its seed, and a small
shape runs end to end with sane output (no timing assertions: timing is the bench's)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.bench import drafter_workload as wl
from rhymectl.app import main

SMALL = wl.Shape(live=32, group=8, mean_len=300, vocab=3000, rhyme=0.5, seed=11)


def _same(a: wl.Workload, b: wl.Workload) -> bool:
    return (all(np.array_equal(x, y) for x, y in zip(a.prompts, b.prompts))
            and all(e == f and np.array_equal(x, y) for ha, hb in zip(a.history, b.history)
                    for (e, x), (f, y) in zip(ha, hb))
            and all(np.array_equal(x, y) for pa, pb in zip(a.planned, b.planned)
                    for x, y in zip(pa, pb))
            and a.lengths == b.lengths)


def test_the_workload_is_a_function_of_its_seed():
    a, b = wl.make(SMALL, upto=200, min_len=50), wl.make(SMALL, upto=200, min_len=50)
    assert _same(a, b)
    c = wl.make(wl.Shape(**{**SMALL.__dict__, "seed": 12}), upto=200, min_len=50)
    assert not _same(a, c)
    # any response on its own is the one the whole workload holds, whatever came first
    alone = wl.response(SMALL, 3, 1, 5)
    assert np.array_equal(alone, a.history[3][1 * SMALL.group + 5][1])
    assert np.array_equal(wl.response(SMALL, 3, 2, 0, n=200)[:len(a.planned[3][0])],
                          a.planned[3][0])


def test_the_workload_has_its_shape():
    w = wl.make(SMALL, upto=120, min_len=80)
    assert len(w.prompts) == SMALL.live // SMALL.group == len(w.history)
    assert all(len(h) == SMALL.history_epochs * SMALL.group for h in w.history)
    assert all(min(n) >= 80 for n in w.lengths)
    assert all(len(p) == min(n, 120) for ps, ns in zip(w.planned, w.lengths)
               for p, n in zip(ps, ns))
    ids = np.concatenate([ids for h in w.history for _, ids in h])
    assert ids.min() >= 0 and ids.max() < SMALL.vocab
    lengths = [len(ids) for h in w.history for _, ids in h]
    assert 0.7 * SMALL.mean_len < np.mean(lengths) < 1.3 * SMALL.mean_len
    # spans repeat across siblings: far more shared 8-grams than chance gives
    def grams(x):
        return {tuple(x[i:i + 8]) for i in range(len(x) - 8)}
    a, b = w.history[0][0][1], w.history[0][1][1]
    assert len(grams(a) & grams(b)) > 0.1 * min(len(a), len(b))


def run_cli(capsys, *args) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    out = capsys.readouterr()
    return exit_info.value.code, out.out, out.err


def test_a_small_shape_runs_and_reports_both_proposers(capsys, tmp_path):
    code, out, err = run_cli(capsys, "bench", "drafter", "--live", "8,16", "--group", "4",
                             "--mean-len", "128", "--vocab", "3000", "--passes", "6",
                             "--repeats", "2", "--window", "3", "--gpu-ms", "1", "--json",
                             "--out", str(tmp_path))
    assert code == 0, err
    report = json.loads(out)
    for name in ("ours", "suffix"):
        side = report[name]
        assert 0 < side["per_pass_ms"]["median"] <= side["per_pass_ms"]["p99"]
        assert 1.0 <= side["tau"] <= 9.0 and 0.0 <= side["accept_rate"] <= 1.0
        assert side["build_s"] > 0 and side["passes"] == 6
    assert report["ours"]["history_bytes"] > 0 and report["ours"]["tree_bytes"] > 0
    assert set(report["ours"]["parts_ms"]) == {"wait", "update", "budget", "draft"}
    assert [p["live"] for p in report["points"]] == [8, 16]
    assert len(report["machine"]["loadavg_before"]) == 3
    assert report["plot"] == "bench-drafter-8-16x128.png"
    saved = (tmp_path / "bench-drafter-8-16x128.json").read_text()
    assert json.loads(saved)["ours"] == report["ours"]
    assert str(tmp_path) not in saved  # no absolute paths
    assert (tmp_path / "bench-drafter-8-16x128.png").stat().st_size > 0


@pytest.mark.parametrize("args,words", [
    (["--live", "30", "--group", "16"], "multiple of --group 16"),
    (["--live", "512", "--mean-len", "40000"], "--mean-len 40000"),
    (["--live", "five"], "--live 'five'"),
    (["spec.method=suffix"], "spec.method=suffix: give spec.KEY=VALUE"),
    (["model.path=x"], "model.path=x: give spec.KEY=VALUE"),
    (["spec.chain_drafts=maybe"], "spec.chain_drafts"),
])
def test_bad_shapes_are_refused_in_one_line(capsys, tmp_path, args, words):
    code, _, err = run_cli(capsys, "bench", "drafter", *args, "--out", str(tmp_path / "o"))
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_the_floor_lane_reports_one_bare_query_per_row(capsys, tmp_path):
    code, out, err = run_cli(capsys, "bench", "drafter", "--live", "16", "--group", "4",
                             "--mean-len", "128", "--vocab", "3000", "--passes", "6",
                             "--repeats", "1", "--window", "3", "--gpu-ms", "0", "--floor",
                             "--json", "--out", str(tmp_path))
    assert code == 0, err
    report = json.loads(out)
    assert report["workload"]["lanes"] == ["ours", "suffix", "floor"]
    floor = report["floor"]
    assert floor["passes"] == 6 and floor["per_pass_ms"]["median"] > 0
    # history alone drafts for this rhyming workload, never more than k tokens a row
    assert 0 < floor["drafted_per_pass"] <= 8 * 16 and floor["tau"] > 1.0


def test_spec_settings_reach_the_drafter_and_the_floor_lane(capsys, tmp_path):
    """spec.KEY=VALUE arguments are the drafter's settings, as in a config: with
    max_draft_rows=1 a pass of 16 running requests drafts nothing, and a spec factor of 0.1
    (a match of m tokens drafts at most m / 10) shortens the floor lane's bare queries."""
    args = ["bench", "drafter", "--live", "16", "--group", "4", "--mean-len", "128", "--vocab",
            "3000", "--passes", "6", "--repeats", "1", "--window", "3", "--gpu-ms", "0",
            "--floor", "--json"]
    code, out, err = run_cli(capsys, *args, "--out", str(tmp_path / "a"))
    assert code == 0, err
    default = json.loads(out)
    assert default["workload"]["spec"] == [] and default["ours"]["drafted_per_pass"] > 0
    code, out, err = run_cli(capsys, *args, "--out", str(tmp_path / "b"),
                             "spec.max_draft_rows=1", "spec.max_spec_factor=0.1",
                             "spec.budget=throughput")
    assert code == 0, err
    report = json.loads(out)
    assert report["workload"]["spec"] == ["spec.max_draft_rows=1", "spec.max_spec_factor=0.1",
                                          "spec.budget=throughput"]
    assert (default["workload"]["budget"], report["workload"]["budget"]) == ("tree", "throughput")
    assert report["ours"]["drafted_per_pass"] == 0 and report["ours"]["tau"] == 1.0
    assert report["suffix"]["drafted_per_pass"] > 0  # vLLM's proposer keeps its defaults
    assert report["floor"]["drafted_per_pass"] < default["floor"]["drafted_per_pass"]
    assert report["floor"]["drafted_per_pass"] <= 2 * 16


# a policy's Hugging Face config for the model lane: the draft gets one layer of width 64
POLICY = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
          "num_hidden_layers": 4, "intermediate_size": 256, "vocab_size": 3000,
          "max_position_embeddings": 1024, "tie_word_embeddings": True}


def test_the_model_lane_drafts_k_tokens_for_every_row_each_pass(capsys, tmp_path):
    """--model CONFIG: the draft model history+group+model starts for that policy drafts k
    tokens for every running request each pass (fewer rows as requests finish), with its
    shape, size and device in the report, and spec settings reach it (its draft
    vocabulary); --model-passes caps its passes alone."""
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "config.json").write_text(json.dumps(POLICY))
    code, out, err = run_cli(capsys, "bench", "drafter", "--live", "16", "--group", "4",
                             "--mean-len", "128", "--vocab", "3000", "--passes", "6",
                             "--repeats", "1", "--window", "3", "--gpu-ms", "0", "--json",
                             "--model", str(tmp_path / "policy"), "--model-passes", "4",
                             "--k", "5", "spec.draft_vocab=100", "--out", str(tmp_path / "o"))
    assert code == 0, err
    report = json.loads(out)
    assert report["workload"]["lanes"] == ["ours", "suffix", "model"]
    model = report["model"]
    assert model["passes"] == 4 and report["ours"]["passes"] == 6
    assert all(r > 0 for r in model["rows"])
    assert model["drafted_per_pass"] == pytest.approx(5 * np.mean(model["rows"]))
    d = report["workload"]["model"]
    assert d["shape"]["layers"] == 1 and d["shape"]["hidden_size"] == 64
    assert d["draft_vocab"] == 100 and d["device"] == "cpu"
    assert 0 < d["own_parameters"] <= 0.1 * d["policy_parameters"]
    assert str(tmp_path) not in (tmp_path / "o" / "bench-drafter-16x128.json").read_text()


@pytest.mark.parametrize("config,args,words", [
    (None, ["--model", "{dir}/nowhere"], "cannot read a Hugging Face config.json"),
    ({"hidden_size": 64}, ["--model", "{dir}/c.json"], "no num_attention_heads"),
    (POLICY, ["--model", "{dir}/c.json", "--vocab", "5000"], "fewer than --vocab 5000"),
    (POLICY, ["--model-passes", "3"], "--model-passes 3: give at least 1, with --model"),
])
def test_a_bad_model_lane_is_refused_in_one_line(capsys, tmp_path, config, args, words):
    if config is not None:
        (tmp_path / "c.json").write_text(json.dumps(config))
    args = [a.replace("{dir}", str(tmp_path)) for a in args]
    code, _, err = run_cli(capsys, "bench", "drafter", "--vocab", "3000", *args,
                           "--out", str(tmp_path / "o"))
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a CUDA device is here")
def test_a_model_lane_on_cuda_without_one_is_refused_before_any_work(capsys, tmp_path,
                                                                     monkeypatch):
    def no_work(*args, **kwargs):
        raise AssertionError("a workload was built before the refusal")

    monkeypatch.setattr(wl, "make", no_work)
    (tmp_path / "c.json").write_text(json.dumps(POLICY))
    code, _, err = run_cli(capsys, "bench", "drafter", "--vocab", "3000", "--model",
                           str(tmp_path / "c.json"), "spec.draft_device=cuda",
                           "--out", str(tmp_path / "o"))
    assert code == 2 and "spec.draft_device is cuda and torch sees no CUDA device" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "o").exists()


def test_a_small_soak_runs_every_step_from_history_on_disk(capsys, tmp_path):
    code, out, err = run_cli(capsys, "bench", "drafter", "--soak", "3", "--live", "16",
                             "--group", "4", "--mean-len", "64", "--vocab", "3000",
                             "--passes", "3", "--json", "--out", str(tmp_path))
    assert code == 0, err
    report = json.loads(out)
    assert [r["step"] for r in report["steps"]] == [0, 1, 2]
    # every step drafts from the history the run directory holds for its fresh prompts
    assert all(r["history_prompts"] == 4 and r["history_tokens"] > 0 and r["tau"] > 1.0
               for r in report["steps"])
    assert report["workload"]["steps"] == 3
