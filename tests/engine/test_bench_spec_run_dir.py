"""`rhymectl bench spec` refuses bad epochs and foreign run directories (needs a real model
directory for the config checks; nothing is trained)."""

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
