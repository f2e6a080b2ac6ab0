"""`rhymectl profile`: hand-checked rank stability and predictor errors, the PNG, the CLI."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from pipeline.errors import UsageError
from pipeline.history.store import HistoryStore, RolloutRecord
from pipeline.report.profile import predictor_errors, profile, rank_stability, ranks
from rhymectl import cmd_profile

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# Per-prompt lengths by epoch: c and d swap ranks in epoch 1; e is new in epoch 1.
LENGTHS = {
    "a": {0: [10, 10], 1: [12, 12]},
    "b": {0: [20, 20], 1: [18, 18]},
    "c": {0: [30, 30], 1: [44, 44]},
    "d": {0: [40, 40], 1: [36, 36]},
    "e": {1: [50, 50]},
}


def write_history(run_dir, lengths=LENGTHS):
    store = HistoryStore(run_dir)
    epochs = sorted({e for per in lengths.values() for e in per})
    for step, epoch in enumerate(epochs):
        store.append(step, [RolloutRecord(pid, "h", epoch, step, step, i, [], n, "stop", 0.0, 0.1)
                            for pid, per in lengths.items() for i, n in enumerate(per.get(epoch, []))])
    return run_dir


def test_rank_stability_by_hand():
    # ranks 1 2 3 4 vs 1 2 4 3: rho = 1 - 6 * 2 / (4 * 15) = 0.8; c and d move 1/4 > 10 %
    assert rank_stability(LENGTHS) == [{"epochs": [0, 1], "prompts": 4, "spearman": 0.8,
                                        "moved_over_10pct": 0.5}]


def test_predictor_errors_by_hand():
    # epoch 0 predicts a..d as 10 20 30 40 (errors 2 2 14 4), e gets the median 25 (error 25)
    [e1] = predictor_errors(LENGTHS)
    assert e1 == {"epoch": 1, "prompts": 5, "known": 4, "mae": 9.4, "mae_known": 5.5,
                  "mape_known": pytest.approx((2 / 12 + 2 / 18 + 14 / 44 + 4 / 36) / 4, abs=1e-4),
                  "spearman_known": 0.8,
                  "mae_fallback_only": 15.0}  # |25 - x| for 12 18 44 36 50: 13 7 19 11 25


def test_profile_summary(tmp_path):
    run = write_history(tmp_path / "run")
    report = profile(run)
    assert report["responses"] == 18 and report["prompts"] == 5 and report["epochs"] == [0, 1]
    assert report["length"]["max"] == 50 and report["length"]["p50"] == 30.0
    assert sum(report["histogram"]["counts"]) == 18
    # recency-weighted (1/2 for epoch 0): a 11.33, b 18.67, c 39.33, d 37.33, e 50 -> median d
    assert report["predictor"]["fallback"] == 37.33
    assert list(report["per_prompt"]) == ["e", "c", "d", "b", "a"]  # longest predicted first
    assert report["per_prompt"]["c"] == {"responses": 4, "epochs": 2, "mean": 37.0, "p50": 37.0,
                                         "max": 44, "std": 7.0, "predicted": pytest.approx(39.33, abs=0.01)}


def test_one_epoch_has_no_stability_or_errors_yet(tmp_path):
    run = write_history(tmp_path / "run", {"a": {0: [5, 7]}, "b": {0: [9]}})
    report = profile(run)
    assert report["rank_stability"] == [] and report["predictor"]["next_epoch_errors"] == []
    result = CliRunner().invoke(cli(), ["profile", str(run)])
    assert result.exit_code == 0, result.output
    assert "one epoch recorded" in result.stdout
    assert (run / "report" / "profile.png").read_bytes()[:8] == PNG_SIGNATURE


def test_ranks_average_ties_like_scipy_rankdata():
    assert ranks([3, 1, 2]).tolist() == [3, 1, 2]
    assert ranks([5, 5, 1, 7, 5]).tolist() == [3, 3, 1, 5, 3]  # the three 5s share (2+3+4)/3
    assert ranks([2.0, 2.0]).tolist() == [1.5, 1.5] and ranks([1]).tolist() == [1]


def test_constant_lengths_have_no_spearman():
    same = {p: {0: [10], 1: [10]} for p in "abc"}
    assert rank_stability(same)[0]["spearman"] is None


def cli() -> typer.Typer:
    app = typer.Typer()
    cmd_profile.register(app)
    app.command("noop", hidden=True)(lambda: None)
    return app


def test_profile_command_json_and_plot(tmp_path):
    run = write_history(tmp_path / "run")
    plot = tmp_path / "p.png"
    result = CliRunner().invoke(cli(), ["profile", str(run), "--json", "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    obj = json.loads(result.stdout)
    assert obj["plot"] == str(plot) and obj["rank_stability"][0]["spearman"] == 0.8
    assert plot.read_bytes()[:8] == PNG_SIGNATURE


def test_profile_command_console(tmp_path):
    run = write_history(tmp_path / "run")
    result = CliRunner().invoke(cli(), ["profile", str(run)])
    assert result.exit_code == 0, result.output
    for text in ("18 responses to 5 prompts", "rank stability", "0→1", "0.800", "50.0%", "█"):
        assert text in result.stdout


def test_profile_without_history_exits_2_through_main(tmp_path, monkeypatch, capsys):
    import rhymectl.app

    monkeypatch.setattr(rhymectl.app, "app", cli())
    with pytest.raises(SystemExit) as exc:
        rhymectl.app.main(["profile", str(tmp_path), "--json"])
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"error: {tmp_path} has no history ({tmp_path / 'history'}/step-*.parquet); "
                            "is it a run directory with at least one step of `rhymectl train`?\n")
    with pytest.raises(UsageError):
        profile(tmp_path)


def test_profile_command_has_help_with_example():
    result = CliRunner().invoke(cli(), ["profile", "--help"])
    assert result.exit_code == 0 and "Example: rhymectl profile" in result.stdout


def test_sibling_probe_by_hand():
    from pipeline.report.profile import sibling_probe

    # groups (shortest, longest): (2, 10), (4, 20), (1, 30), and a lone response left out
    lengths = {"a": {0: [10, 2, 5], 1: [20, 4]}, "b": {0: [30, 1]}, "c": {0: [7]}}
    got = sibling_probe(lengths)
    assert got["groups"] == 3
    assert got["spearman_first_longest"] == -0.5  # ranks (2, 3, 1) against (1, 2, 3)
    assert got["median_first_over_longest"] == 0.2  # of 0.2, 0.2, 0.0333
