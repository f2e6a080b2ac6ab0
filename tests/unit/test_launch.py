"""The library's rank entry point (`python -m pipeline.loop.launch`), which `train --nproc`
and `bench spec` start instead of the CLI: bad input is one line and exit code 2."""

from __future__ import annotations

from pathlib import Path

from pipeline.loop import launch

TINY = Path(__file__).resolve().parents[2] / "sample_configs/tiny.yaml"


def test_a_rank_reports_bad_input_as_one_line_with_exit_code_2(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("RHYMECTL_DEBUG", "0")
    summary = tmp_path / "summary.json"
    assert launch.main([str(TINY), "rollout.nn=4", "--summary", str(summary)]) == 2
    assert capsys.readouterr().err == ("error: unknown key rollout.nn in rollout; did you mean "
                                       "rollout.n?\n")
    assert launch.main([str(TINY), "model.path=models/none", "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: model.path = models/none does not exist") and err.count("\n") == 1
    assert not summary.exists()


def test_ranks_run_this_module_with_the_runs_flags(tmp_path):
    args = launch.rank_args(Path("c.yaml"), ["rollout.n=4"], True, False, tmp_path / "s.json")
    assert args == ["c.yaml", "rollout.n=4", "--resume", "--summary", str(tmp_path / "s.json")]
    cmd = launch.torchrun_command(2, launch.RANK_MODULE, *args)
    assert cmd[cmd.index("-m", 3):][:2] == ["-m", "pipeline.loop.launch"]
