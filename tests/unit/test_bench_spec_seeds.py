"""`rhymectl bench spec --seeds` (`pipeline.bench.spec_seeds`): ratios to suffix's passes
are taken within a seed and summarised over seeds; every seed gets its own training run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.bench.spec_seeds import across_seeds

ROOT = Path(__file__).resolve().parents[2]


def summary(suffix, hg, model):
    return {"none": {"passes": 1000, "critical_passes": 100},
            "suffix": {"passes": suffix[0], "critical_passes": suffix[1]},
            "history+group": {"passes": hg[0], "critical_passes": hg[1]},
            "history+group+model": {"passes": model[0], "critical_passes": model[1]}}


def test_ratios_are_taken_within_a_seed_then_summarised():
    per_seed = {0: summary((800, 80), (700, 60), (560, 52)),
                1: summary((600, 50), (540, 45), (420, 30)),
                2: summary((700, 70), (650, 60), (490, 42))}
    got = across_seeds(per_seed)
    m = got["history+group+model"]
    assert m["seeds"] == [0, 1, 2]
    assert m["passes_runs"] == [560, 420, 490] and m["passes"] == 490
    assert (m["passes_min"], m["passes_max"]) == (420, 560)
    assert m["passes_over_suffix_runs"] == [0.7, 0.7, 0.7]
    assert m["critical_over_suffix_runs"] == [0.65, 0.6, 0.6]
    assert m["critical_over_suffix"] == 0.6 and m["critical_over_suffix_max"] == 0.65
    # the median of the ratios (0.875, 0.9, 0.9286), not the ratio of the medians (650 / 700)
    assert got["history+group"]["passes_over_suffix"] == 0.9
    assert got["suffix"]["passes_over_suffix_runs"] == [1.0, 1.0, 1.0]
    assert "gap_passes" not in m


def test_a_seed_without_suffix_has_no_ratio_and_a_method_must_be_in_every_seed():
    per_seed = {0: summary((800, 80), (700, 60), (560, 52)),
                1: {"none": {"passes": 900, "critical_passes": 90},
                    "history+group": {"passes": 600, "critical_passes": 50}}}
    got = across_seeds(per_seed)
    assert set(got) == {"none", "history+group"}
    hg = got["history+group"]
    assert hg["passes_over_suffix_runs"] == [0.875, None]
    assert hg["passes_over_suffix"] == 0.875  # over the seeds that have one
    with pytest.raises(ValueError):
        across_seeds({})


def test_the_gap_closed_is_summarised_per_method():
    per_seed = {0: summary((800, 80), (700, 60), (560, 52)),
                1: summary((600, 50), (540, 45), (420, 30))}
    gaps = {0: {"methods": {"history+group+model": {"passes": 0.5, "critical_passes": 0.25},
                            "suffix": {"passes": -0.3, "critical_passes": None}}},
            1: None}
    got = across_seeds(per_seed, gaps)
    m = got["history+group+model"]
    assert m["gap_passes_runs"] == [0.5, None] and m["gap_passes"] == 0.5
    assert m["gap_critical"] == 0.25
    assert "gap_critical" not in got["suffix"] and got["suffix"]["gap_passes"] == -0.3
    assert "gap_passes" not in got["history+group"]


def _main(monkeypatch, capsys, *args):
    import typer

    import rhymectl.app
    from rhymectl import cmd_bench

    app = typer.Typer()
    cmd_bench.register(app)
    app.command("noop", hidden=True)(lambda: None)  # two entries: keep "bench" a subcommand
    monkeypatch.setattr(rhymectl.app, "app", app)
    with pytest.raises(SystemExit) as exc:
        rhymectl.app.main(list(args))
    captured = capsys.readouterr()
    return exc.value.code, captured.out, captured.err


def test_every_seed_trains_its_own_run_and_is_measured_on_it(tmp_path, monkeypatch, capsys):
    """The loop over seeds, the engine left out (its measuring is tested on its own)."""
    import pipeline.bench.spec_plan as spec_plan
    import pipeline.loop.preflight as preflight
    import rhymectl.cmd_bench_spec as cmd

    trained, measured = [], []
    monkeypatch.setattr(preflight, "preflight", lambda cfg, world_size: None)
    monkeypatch.setattr(spec_plan, "ensure_trained",
                        lambda plan, config, extra: trained.append((plan.run_dir, list(extra))))
    draws = {1: ((800, 80), (700, 60), (560, 52)), 2: ((600, 50), (540, 45), (420, 30))}

    def fake_measure(plan, names, config, overrides, plot, repeats, ceiling):
        seed = plan.cfg.run.seed
        measured.append((seed, plot, repeats))
        return {"methods": summary(*draws[seed]), "workload": {}}, plan.run_dir / "p.png"

    monkeypatch.setattr(cmd, "_measure", fake_measure)
    code, out, err = _main(monkeypatch, capsys, "bench", "spec", str(ROOT / "sample_configs/tiny.yaml"),
                           "--seeds", "1,2", "--run-dir", str(tmp_path / "b"), "--plot",
                           str(tmp_path / "x.png"), "--repeats", "2", "--json")
    assert code == 0, err
    assert [d for d, _ in trained] == [tmp_path / "b-seed1", tmp_path / "b-seed2"]
    assert [e[-1] for _, e in trained] == ["run.seed=1", "run.seed=2"]
    assert measured == [(1, tmp_path / "x-seed1.png", 2), (2, tmp_path / "x-seed2.png", 2)]
    result = json.loads(out)
    assert set(result["seeds"]) == {"1", "2"}
    assert result["plot"] == str(tmp_path / "x-seeds.png")
    assert (tmp_path / "x-seeds.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result["across_seeds"]["history+group+model"]["passes_over_suffix_runs"] == [0.7, 0.7]


def test_bad_seeds_exit_2_before_anything_runs(monkeypatch, capsys):
    code, out, err = _main(monkeypatch, capsys, "bench", "spec",
                           str(ROOT / "sample_configs/tiny.yaml"), "--seeds", "1,x")
    assert (code, out) == (2, "")
    assert err == "error: --seeds '1,x': give comma-separated integers, e.g. --seeds 0,1,2\n"


def test_the_summary_over_seeds_is_a_table(capsys, monkeypatch):
    from rhymectl.spec_tables import out, render_seeds

    monkeypatch.setattr(out, "width", 200)
    per_seed = {0: summary((800, 80), (700, 60), (560, 52)),
                1: summary((600, 50), (540, 45), (420, 30))}
    render_seeds(across_seeds(per_seed, {0: {"methods": {"history+group+model": {
        "passes": 0.5, "critical_passes": 0.25}}}, 1: None}))
    text = capsys.readouterr().out
    assert "over seeds 0, 1" in text and "gap closed" in text
    row = next(line for line in text.splitlines() if "history+group+model" in line)
    assert "490 (420–560)" in row and "0.70 (0.70–0.70)" in row and "50% (50%–50%)" in row
