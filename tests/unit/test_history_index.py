"""The persistent history index: round trips, last-K trimming, incremental refresh, rollback,
fingerprints, corruption and the `rhymectl index` commands. No engines."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from pipeline.errors import UsageError
from pipeline.history import index
from pipeline.history.store import HistoryStore, RolloutRecord, prompt_hash
from rhymectl.app import main


def rec(pid, epoch, step, i, ids, reward=0.5):
    return RolloutRecord(prompt_id=pid, prompt_hash=prompt_hash([ord(c) for c in pid]), epoch=epoch,
                         step=step, policy_version=step, sample_index=i, response_ids=list(ids),
                         length=len(ids), finish_reason="stop", reward=reward, gen_seconds=0.1)


def step_records(step, epoch, pids=("a", "b"), n=2, salt=0):
    """n responses per prompt; ids and rewards differ by step, prompt, sample and salt."""
    return [rec(pid, epoch, step, i, [step * 100 + j * 10 + i + salt] * (1 + i + j + salt),
                reward=float(np.float32(0.1 * step + i)))
            for j, pid in enumerate(pids) for i in range(n)]


def expected(records, k):
    """The reference: per prompt, its last k epochs, oldest first, by step then order."""
    by_pid = {}
    for r in records:
        by_pid.setdefault(r.prompt_id, []).append(r)
    out = {}
    for recs in by_pid.values():
        keep = sorted({r.epoch for r in recs})[-k:]
        for r in sorted((r for r in recs if r.epoch in keep), key=lambda r: r.epoch):
            out.setdefault(r.prompt_hash, []).append((r.epoch, r.response_ids, r.reward))
    return out


@pytest.fixture
def model_dir(tmp_path) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0, "b": 1}}}')
    (d / "config.json").write_text(json.dumps({"hidden_size": 8, "torch_dtype": "float32",
                                               "transformers_version": "4.50.0"}))
    (d / "model.safetensors").write_bytes(b"w" * 16)
    return d


@pytest.fixture
def run(tmp_path) -> Path:
    return tmp_path / "run"


def fill(run, steps, epoch_of=lambda s: s, **kw) -> list[RolloutRecord]:
    store, records = HistoryStore(run), []
    for s in steps:
        recs = step_records(s, epoch_of(s), **kw)
        store.append(s, recs, overwrite=True)
        records += recs
    return records


def test_build_then_load_round_trips_responses_exactly(run, model_dir):
    records = fill(run, range(2))
    odd = [rec("c", 2, 2, 0, [2**31 - 1, 0, -5], reward=-1.25), rec("c", 2, 2, 1, [], reward=0.0)]
    HistoryStore(run).append(2, odd)
    records += odd
    stats = index.build(run, model_dir, 3)
    assert stats.rebuilt == "new index" and stats.steps_read == 3 and stats.warning is None
    loaded = index.load(run, model_dir, 3)
    assert loaded.responses() == expected(records, 3)
    arrays = loaded.responses(as_arrays=True)
    assert all(ids.dtype == np.int32 for resp in arrays.values() for _, ids, _ in resp)
    s = loaded.stats()
    tokens = sum(len(r.response_ids) for r in records)
    assert (s.prompts, s.responses, s.tokens) == (3, len(records), tokens)
    assert (s.history_epochs, s.last_step, s.epochs) == (3, 2, [0, 1, 2])
    assert s.current and s.stale_steps == 0 and s.stale_reason is None
    assert s.file_bytes == (run / "index" / "history.parquet").stat().st_size
    assert s.memory_bytes > 4 * tokens + 100 * len(records)
    assert s.fingerprint == index.fingerprint(model_dir)
    meta = json.loads((run / "index" / "meta.json").read_text())
    assert {k: meta[k] for k in ("format", "history_epochs", "last_step", "rows", "tokens")} == \
        {"format": 1, "history_epochs": 3, "last_step": 2, "rows": len(records), "tokens": tokens}
    assert sorted(p.name for p in (run / "index").iterdir()) == [".lock", "history.parquet", "meta.json"]
    assert json.dumps(s.as_dict())


def test_only_the_last_k_epochs_of_each_prompt_are_kept(run, model_dir):
    records = fill(run, range(4))  # a and b in epochs 0..3
    late = [rec("c", 0, 4, 0, [1]), rec("c", 3, 5, 0, [2, 2]), rec("c", 3, 5, 1, [3])]
    HistoryStore(run).append(4, late[:1])
    HistoryStore(run).append(5, late[1:])
    index.build(run, model_dir, 2)
    got = index.load(run, model_dir, 2).responses()
    assert got == expected(records + late, 2)
    assert {e for e, _, _ in got[prompt_hash([ord("a")])]} == {2, 3}
    assert [e for e, _, _ in got[prompt_hash([ord("c")])]] == [0, 3, 3]  # the last 2 it was seen in
    one = index.load(run, model_dir, 1)  # fewer epochs than built: cut on load
    assert one.responses() == expected(records + late, 1) and one.stats().history_epochs == 1
    more = index.load(run, model_dir, 5)  # more than built: not an error, stats say K = 2
    assert more.responses() == got and more.stats().history_epochs == 2


def test_incremental_refresh_reads_only_new_steps_and_equals_a_full_rebuild(run, model_dir):
    records = fill(run, range(3))
    assert index.build(run, model_dir, 2).steps_read == 3
    records += fill(run, range(3, 5), pids=("a", "b", "d"))
    stats = index.build(run, model_dir, 2)
    assert (stats.steps_read, stats.rebuilt, stats.last_step) == (2, None, 4)
    incremental = index.load(run, model_dir, 2).responses()
    assert incremental == expected(records, 2)
    sha = json.loads((run / "index" / "meta.json").read_text())["sha256"]
    full = index.build(run, model_dir, 2, rebuild=True)
    assert (full.steps_read, full.rebuilt) == (5, "requested")
    assert index.load(run, model_dir, 2).responses() == incremental
    assert json.loads((run / "index" / "meta.json").read_text())["sha256"] == sha
    mtime = (run / "index" / "history.parquet").stat().st_mtime_ns
    again = index.build(run, model_dir, 2)  # nothing new: nothing read or written
    assert (again.steps_read, again.rebuilt) == (0, None)
    assert (run / "index" / "history.parquet").stat().st_mtime_ns == mtime
    assert index.build(run, model_dir, 3).rebuilt == "history_epochs changed (2 -> 3)"


def test_rolled_back_or_rewritten_history_triggers_a_full_rebuild(run, model_dir):
    records = fill(run, range(4))
    index.build(run, model_dir, 2)
    HistoryStore(run).truncate_after(1)  # a resume from the step-1 checkpoint
    stale = index.load(run, model_dir, 2).stats()
    assert not stale.current and "rolled back" in stale.stale_reason
    stats = index.build(run, model_dir, 2)
    assert stats.rebuilt == "history rolled back (index at step 3, history at step 1)"
    assert stats.steps_read == 2
    assert index.load(run, model_dir, 2).responses() == expected(records[:8], 2)
    # resumed and trained past the index's last step: steps 2.. differ from what was folded in
    fill(run, range(2, 4))
    assert index.build(run, model_dir, 2).last_step == 3
    HistoryStore(run).truncate_after(1)
    redone = fill(run, range(2, 5), salt=1)
    stats = index.build(run, model_dir, 2)
    assert stats.rebuilt == "history rewritten (step 2)" and stats.steps_read == 5
    assert index.load(run, model_dir, 2).responses() == expected(records[:8] + redone, 2)


def test_fingerprint_mismatch_names_both_and_rebuild_fixes_it(run, model_dir, tmp_path):
    fill(run, range(2))
    index.build(run, model_dir, 2)
    other = tmp_path / "other"
    shutil.copytree(model_dir, other)
    (other / "tokenizer.json").write_text('{"model": {"vocab": {"a": 1, "b": 0}}}')
    old, new = index.fingerprint(model_dir), index.fingerprint(other)
    assert old["model"] == new["model"] and old["tokenizer"] != new["tokenizer"]
    for call in (lambda: index.load(run, other, 2), lambda: index.build(run, other, 2)):
        with pytest.raises(UsageError) as info:
            call()
        msg = str(info.value)
        assert (f"built for tokenizer {old['tokenizer']}, model {old['model']} but {other} has "
                f"tokenizer {new['tokenizer']}, model {new['model']}: rebuild it with "
                f"`rhymectl index build {run} --rebuild`") in msg and "\n" not in msg
    stats = index.build(run, other, 2, rebuild=True)
    assert stats.rebuilt == "fingerprint changed" and old["tokenizer"] in stats.warning
    assert index.load(run, other, 2).stats().fingerprint == new


def test_fingerprint_covers_tokenizer_and_architecture_not_weights(model_dir):
    fp = index.fingerprint(model_dir)
    (model_dir / "model.safetensors").write_bytes(b"v" * 99)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps(
        {**config, "torch_dtype": "bfloat16", "transformers_version": "9", "_name_or_path": "x"}))
    assert index.fingerprint(model_dir) == fp
    (model_dir / "config.json").write_text(json.dumps({**config, "hidden_size": 16}))
    assert index.fingerprint(model_dir)["model"] != fp["model"]
    (model_dir / "vocab.txt").write_text("a\nb\n")
    assert index.fingerprint(model_dir)["tokenizer"] != fp["tokenizer"]
    for name, what in (("tokenizer.json", "has no tokenizer file"), ("config.json", "has no config.json")):
        for f in ("tokenizer.json", "vocab.txt") if name == "tokenizer.json" else (name,):
            (model_dir / f).unlink()
        with pytest.raises(UsageError, match=f"model directory {model_dir} {what}"):
            index.fingerprint(model_dir)
        (model_dir / "tokenizer.json").write_text("{}")
    with pytest.raises(UsageError, match="model directory .*nowhere does not exist"):
        index.fingerprint(model_dir / "nowhere")


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _tamper(key, value):
    def edit(path: Path) -> None:
        meta = json.loads(path.read_text())
        meta[key] = value
        path.write_text(json.dumps(meta))
    return edit


@pytest.mark.parametrize("name, damage, reason", [
    ("history.parquet", _truncate, "history.parquet is .* bytes, meta.json says"),
    ("history.parquet", lambda p: p.unlink(), "history.parquet missing"),
    ("meta.json", _tamper("last_step", 0), "meta.json does not match history.parquet"),
    ("meta.json", _tamper("rows", 3), "meta.json does not match history.parquet"),
    ("meta.json", _tamper("sha256", "0" * 64), "sha256 of history.parquet differs"),
    ("meta.json", _tamper("format", 2), "meta.json format 2, expected 1"),
    ("meta.json", lambda p: p.write_text("{not json"), "meta.json unreadable"),
])
def test_a_corrupt_index_is_detected_and_rebuild_replaces_it(run, model_dir, name, damage, reason):
    records = fill(run, range(2))
    index.build(run, model_dir, 2)
    damage(run / "index" / name)
    for call in (lambda: index.load(run, model_dir, 2), lambda: index.build(run, model_dir, 2)):
        with pytest.raises(UsageError, match=f"history index {run / 'index'} is corrupt or truncated "
                                             f"\\({reason}.*\\): rebuild it with `rhymectl index "
                                             f"build {run} --rebuild`"):
            call()
    assert index.build(run, model_dir, 2, rebuild=True).rebuilt.startswith("corrupt index (")
    assert index.load(run, model_dir, 2).responses() == expected(records, 2)


def test_a_same_size_rewrite_of_the_parquet_is_caught_by_its_checksum(run, model_dir):
    fill(run, range(2))
    index.build(run, model_dir, 2)
    path = run / "index" / "history.parquet"
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(UsageError, match=r"corrupt or truncated \(sha256 of history.parquet differs"):
        index.load(run, model_dir, 2)


def test_missing_index_loads_as_none_and_no_history_is_refused(run, model_dir):
    assert index.load(run, model_dir, 2) is None
    with pytest.raises(UsageError, match=rf"^{run} has no history \({run / 'history'}/step-\*"
                                         rf"\.parquet\); train at least one step first$"):
        index.build(run, model_dir, 2)
    assert not (run / "index").exists()
    fill(run, [0])
    with pytest.raises(UsageError, match="history_epochs must be >= 1, got 0"):
        index.build(run, model_dir, 0)


# ------------------------------------------------------------------ CLI

def cli(capsys, *args) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return (0 if info.value.code is None else info.value.code), out, err


def fails(capsys, *args) -> str:
    code, out, err = cli(capsys, *args)
    assert code == 2, err
    assert out == "" and err.startswith("error: ") and err.count("\n") == 1
    return err[len("error: "):-1]


@pytest.fixture
def cli_run(run, model_dir, monkeypatch) -> Path:
    monkeypatch.setenv("RHYMECTL_DEBUG", "0")
    fill(run, range(3))
    (run / "config.yaml").write_text(f"model:\n  path: {model_dir}\nspec:\n  history_epochs: 2\n")
    return run


def test_cli_build_and_stats_json(capsys, cli_run, model_dir):
    code, out, err = cli(capsys, "index", "build", cli_run, "--json")
    assert code == 0, err
    built = json.loads(out)
    assert {"path", "prompts", "responses", "tokens", "memory_bytes", "file_bytes", "fingerprint",
            "history_epochs", "last_step", "epochs", "steps_read", "rebuilt"} <= set(built)
    assert (built["history_epochs"], built["last_step"], built["steps_read"]) == (2, 2, 3)
    assert built["epochs"] == [1, 2] and built["fingerprint"] == index.fingerprint(model_dir)
    fill(cli_run, [3])
    code, out, err = cli(capsys, "index", "stats", cli_run, "--json")
    assert code == 0, err
    stats = json.loads(out)
    assert (stats["current"], stats["stale_steps"], stats["prompts"]) == (False, 1, 2)
    assert stats["verified_against"] == str(model_dir) and stats["tokens"] == built["tokens"]
    code, out, err = cli(capsys, "index", "build", cli_run, "--epochs", "1")
    assert code == 0 and "history_epochs changed (2 -> 1)" in out and "4 history steps" in out
    code, out, _ = cli(capsys, "index", "stats", cli_run)
    assert code == 0 and "current" in out and "K 1" in out


def test_cli_errors_are_one_line_exit_2(capsys, cli_run, tmp_path, model_dir):
    assert fails(capsys, "index", "stats", cli_run) == (
        f"{cli_run} has no history index; build it with `rhymectl index build {cli_run}`")
    assert fails(capsys, "index", "build", tmp_path / "nope") == (
        f"{tmp_path / 'nope'} is not a directory; pass a run directory written by `rhymectl train`")
    bare = tmp_path / "bare"
    bare.mkdir()
    assert fails(capsys, "index", "build", bare).startswith(f"{bare} is not a run directory (no "
                                                            f"config.yaml)")
    assert fails(capsys, "index", "build", bare, "--model", model_dir, "--epochs", "2").startswith(
        f"{bare} has no history")
    (cli_run / "config.yaml").write_text("model: {}\n")
    assert fails(capsys, "index", "build", cli_run) == (
        f"{cli_run / 'config.yaml'} has no model.path; pass --model DIR")
    assert "has no spec.history_epochs" in fails(capsys, "index", "build", cli_run, "--model", model_dir)
    assert cli(capsys, "index", "build", cli_run, "--model", model_dir, "--epochs", "2")[0] == 0
    _truncate(cli_run / "index" / "history.parquet")
    assert "is corrupt or truncated" in fails(capsys, "index", "stats", cli_run, "--model", model_dir)


def test_cli_reads_the_runs_config_through_the_config_loader(capsys, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("model: {path: m}\nspec: {history_epochs: 0}\n")
    message = fails(capsys, "index", "build", run)
    assert "spec.history_epochs = 0 is not allowed" in message
    (run / "config.yaml").write_text("- a list\n")
    assert "must hold a mapping" in fails(capsys, "index", "build", run)
