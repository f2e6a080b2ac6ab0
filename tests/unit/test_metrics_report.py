"""Metrics log, live view and run report: round trips, crash safety, plots, the CLI."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from pipeline.errors import UsageError
from pipeline.loop.metrics import COLUMNS, MetricsLog, summarize_lengths
from rhymectl.live import LiveView
from pipeline.report.plots import write_report
from rhymectl import cmd_report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def step_record(step: int) -> dict:
    return {"step": step, "reward_mean": 0.25 + 0.05 * step, "accuracy": 0.1 * step,
            "resp_len_mean": 40.0 + step, "resp_len_p90": 80.0 + step, "resp_len_max": 131 - step,
            "time_rollout_s": 3.0, "time_reward_s": 0.1, "time_train_s": 1.5 + 0.1 * step,
            "time_sync_s": 0.2, "time_step_s": 5.0 + 0.1 * step, "gen_tokens_per_s": 812.5}


@pytest.fixture
def run_dir(tmp_path):
    log = MetricsLog(tmp_path / "run")
    for step in range(6):
        log.append(step_record(step))
    return tmp_path / "run"


def test_summarize_lengths_by_hand():
    # sorted 1..10: p90 at rank 0.9 * 9 = 8.1 -> 9 + 0.1 * (10 - 9) = 9.1
    assert summarize_lengths([10, 1, 2, 3, 4, 5, 6, 7, 8, 9]) == {"mean": 5.5, "p90": 9.1, "max": 10}
    assert summarize_lengths([7]) == {"mean": 7.0, "p90": 7.0, "max": 7}
    # [2, 4]: rank 0.9 -> 2 + 0.9 * 2 = 3.8
    assert summarize_lengths([4, 2]) == pytest.approx({"mean": 3.0, "p90": 3.8, "max": 4})
    assert summarize_lengths([]) == {"mean": 0.0, "p90": 0.0, "max": 0}


def test_log_round_trip_and_numpy_values(tmp_path):
    log = MetricsLog(tmp_path)
    assert log.read() == []
    records = [step_record(0), {"step": 1, "reward_mean": np.float32(0.5), "resp_len_max": np.int64(9)}]
    for record in records:
        log.append(record)
    assert log.read() == [step_record(0), {"step": 1, "reward_mean": 0.5, "resp_len_max": 9}]
    assert log.path.read_text().count("\n") == 2


def test_torn_last_line_is_ignored_and_cut_by_the_next_append(tmp_path):
    MetricsLog(tmp_path).append(step_record(0))
    with open(tmp_path / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 1, "reward_me')  # crash mid-write
    assert [r["step"] for r in MetricsLog(tmp_path).read()] == [0]
    log = MetricsLog(tmp_path)  # the resumed writer
    log.append(step_record(1))
    assert [r["step"] for r in log.read()] == [0, 1]


def test_corrupt_middle_line_names_file_and_line(tmp_path):
    log = MetricsLog(tmp_path)
    log.append(step_record(0))
    with open(log.path, "a") as fh:
        fh.write("not json\n")
    log.append(step_record(2))
    with pytest.raises(UsageError, match=r"metrics\.jsonl line 2 is not valid JSON"):
        log.read()


def test_truncate_after_keeps_steps_up_to_the_checkpoint(run_dir):
    log = MetricsLog(run_dir)
    assert log.truncate_after(3) == 4
    assert [r["step"] for r in log.read()] == [0, 1, 2, 3]
    log.append(step_record(4))
    assert [r["step"] for r in log.read()] == [0, 1, 2, 3, 4]
    assert not [p for p in run_dir.iterdir() if p.name.endswith(".tmp")]


def test_live_view_prints_one_plain_line_per_step_off_a_terminal():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=False, width=80)
    with LiveView(10, console, start_step=2) as view:
        assert not view.live
        view.update(step_record(2))
        view.update({"step": 3, "reward_mean": 0.5})
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("[3/10] step 2 | reward 0.350 | acc 0.200 | len mean 42.0")
    assert "len p90 82 | len max 129 | rollout s 3.00" in lines[0]
    assert lines[0].endswith("gen tok/s 812")  # not wrapped at 80 columns
    assert lines[1] == "[4/10] step 3 | reward 0.500 | " + " | ".join(
        f"{header} -" for _, header, _ in COLUMNS[2:])


def test_live_view_on_a_terminal_draws_the_table():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=160)
    with LiveView(4, console) as view:
        assert view.live
        view.update(step_record(0))
    text = buf.getvalue()
    assert "1/4" in text and "gen tok/s" in text and "812" in text


def test_write_report_writes_three_pngs(run_dir):
    paths = write_report(run_dir)
    assert [p.name for p in paths] == ["reward.png", "length.png", "phases.png"]
    for path in paths:
        assert path.parent == run_dir / "report"
        data = path.read_bytes()
        assert data[:8] == PNG_SIGNATURE and len(data) > 5000
    assert sorted(p.name for p in (run_dir / "report").iterdir()) == [
        "length.png", "phases.png", "reward.png"]  # no temp files left


def test_write_report_refuses_a_folder_without_metrics(tmp_path):
    with pytest.raises(UsageError, match="has no metrics.jsonl; is it a run directory"):
        write_report(tmp_path / "nope")


def test_write_report_refuses_a_file_as_out_dir(run_dir):
    (run_dir / "taken").write_text("")
    with pytest.raises(UsageError, match="taken is a file, not a folder; give --out a folder"):
        write_report(run_dir, run_dir / "taken")


def cli() -> typer.Typer:
    app = typer.Typer()
    cmd_report.register(app)
    app.command("noop", hidden=True)(lambda: None)  # two commands: keep "report" a subcommand
    return app


def test_report_command_json(run_dir, tmp_path):
    result = CliRunner().invoke(cli(), ["report", str(run_dir), "--out", str(tmp_path / "o"), "--json"])
    assert result.exit_code == 0, result.output
    obj = json.loads(result.stdout)
    assert obj["run_dir"] == str(run_dir) and obj["steps"] == 6
    assert obj["plots"] == [str(tmp_path / "o" / n) for n in ("reward.png", "length.png", "phases.png")]
    assert obj["last"] == step_record(5)


def test_report_command_missing_run_dir_is_a_usage_error(tmp_path):
    result = CliRunner().invoke(cli(), ["report", str(tmp_path / "missing")])
    assert isinstance(result.exception, UsageError)
    assert str(result.exception) == (f"{tmp_path / 'missing'} has no metrics.jsonl; is it a run "
                                     "directory written by `rhymectl train`?")


def test_report_command_missing_run_dir_exits_2_through_main(tmp_path, monkeypatch, capsys):
    import rhymectl.app

    monkeypatch.setattr(rhymectl.app, "app", cli())  # main()'s error mapping, this command
    with pytest.raises(SystemExit) as exc:
        rhymectl.app.main(["report", str(tmp_path / "missing"), "--json"])
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"error: {tmp_path / 'missing'} has no metrics.jsonl; is it a run "
                            "directory written by `rhymectl train`?\n")


def test_report_command_has_help_with_example():
    result = CliRunner().invoke(cli(), ["report", "--help"])
    assert result.exit_code == 0 and "Example: rhymectl report" in result.stdout
