"""Crash safety without an engine: the fault helper, the run-directory lock, the commit
protocol's coverage checks (metrics/eval prefix hashes, history footers, checkpoint
manifests) and the disk-error line."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import faults
from pipeline.errors import UsageError
from pipeline.history.store import HistoryStore, RolloutRecord
from pipeline.loop import commit, lock
from pipeline.loop.metrics import MetricsLog
from pipeline.train import checkpoint

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ faults

def test_fault_spec_parses_points_counts_and_errnos():
    assert faults.parse("after_train") == {"after_train": (1, None)}
    assert faults.parse("mid_eval:3,mid_history_write:ENOSPC") == {
        "mid_eval": (3, None), "mid_history_write": (1, errno.ENOSPC)}
    with pytest.raises(ValueError, match="unknown point 'after_lunch'"):
        faults.parse("after_lunch")
    with pytest.raises(ValueError, match="neither a count"):
        faults.parse("after_train:0")


def test_fault_raises_the_injected_oserror_on_the_nth_hit(monkeypatch):
    monkeypatch.setenv(faults.ENV, "mid_index_build:2:EACCES")
    monkeypatch.setattr(faults, "_hits", {})
    faults.fault("mid_index_build", "/x/index")  # first hit: nothing
    faults.fault("after_train")  # another point: nothing
    with pytest.raises(OSError) as info:
        faults.fault("mid_index_build", "/x/index")
    assert info.value.errno == errno.EACCES and info.value.filename == "/x/index"
    faults.fault("mid_index_build")  # only the 2nd hit fires


def test_fault_kills_the_process_with_sigkill():
    code = ("from pipeline.faults import fault\nfault('after_sync')\nprint('survived')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, faults.ENV: "after_sync"}, timeout=60)
    assert proc.returncode == -signal.SIGKILL and "survived" not in proc.stdout


# ------------------------------------------------------------------ the lock

HOLD = ("import sys, time\nfrom pipeline.loop.lock import RunLock\n"
        "RunLock(sys.argv[1]).acquire()\nprint('held', flush=True)\ntime.sleep(60)")


def test_second_writer_gets_one_line_naming_the_holder_and_changes_nothing(tmp_path):
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], cwd=REPO,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = {p.name: p.read_bytes() for p in run.iterdir()}
        with pytest.raises(UsageError) as info:
            lock.RunLock(run).acquire()
        message = str(info.value)
        assert f"pid {holder.pid} on host {socket.gethostname()}" in message
        assert "\n" not in message and "wait for it to finish" in message
        with pytest.raises(UsageError, match=f"pid {holder.pid}"):
            lock.probe(run)
        assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    finally:
        holder.kill()
        holder.wait()


def test_a_dead_holders_lock_is_taken_over(tmp_path, capsys):
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], cwd=REPO,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    holder.send_signal(signal.SIGKILL)  # dies holding it: the name stays in the file
    holder.wait()
    assert json.loads((run / lock.LOCK_FILE).read_text())["pid"] == holder.pid
    lock.probe(run)  # free
    with lock.held(run, "rhymectl index build") as held:
        assert held.took_over["pid"] == holder.pid
        assert json.loads((run / lock.LOCK_FILE).read_text())["pid"] == os.getpid()
    assert f"took over the lock of rhymectl train pid {holder.pid}" in capsys.readouterr().err
    assert (run / lock.LOCK_FILE).read_text() == ""  # a clean release clears the name


def test_a_live_same_host_pid_in_the_file_is_respected_without_flock(tmp_path):
    """Where flock is a no-op (some network filesystems) the recorded pid still counts."""
    run = tmp_path / "run"
    run.mkdir()
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        (run / lock.LOCK_FILE).write_text(json.dumps(
            {"host": socket.gethostname(), "pid": sleeper.pid, "command": "rhymectl train",
             "since": 0}))
        with pytest.raises(UsageError, match=f"pid {sleeper.pid}"):
            lock.RunLock(run).acquire()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_check_run_dir_ignores_the_lock_file(tmp_path):
    from pipeline.config import load_config
    from pipeline.loop import rundir

    run = tmp_path / "run"
    lock.RunLock(run).acquire().release()
    cfg = load_config(REPO / "sample_configs/tiny.yaml", [f"run.dir={run}"])
    rundir.check_run_dir(cfg, resume=False, force=False)  # empty but for the lock: a new run
    rundir.check_run_dir(cfg, resume=True, force=False)  # killed before its first write
    (run / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="holds no rhymectl run"):
        rundir.check_run_dir(cfg, resume=True, force=False)


# ------------------------------------------------------------------ metrics coverage

def _log(tmp_path, name="metrics.jsonl", rows=3) -> MetricsLog:
    log = MetricsLog(tmp_path, name)
    for step in range(1, rows + 1):
        log.append({"step": step, "reward_mean": step / 10})
    return log


def test_cut_keeps_the_covered_prefix_and_drops_a_garbled_tail(tmp_path):
    log = _log(tmp_path)
    covered = log.coverage()
    assert covered["rows"] == 3
    with open(log.path, "a") as fh:  # provisional rows after the checkpoint, one garbled
        fh.write('{"step": 4}\n{"step": 5, "rew\x00\n{"step": 6}\n{"step": 7, "tor')
    assert log.cut(covered) > 0
    assert [r["step"] for r in log.read()] == [1, 2, 3]
    log.append({"step": 4})
    assert [r["step"] for r in log.read()] == [1, 2, 3, 4]


def test_a_garbled_line_inside_the_covered_prefix_is_refused(tmp_path):
    log = _log(tmp_path)
    covered = log.coverage()
    lines = log.path.read_text().splitlines(keepends=True)
    lines[1] = lines[1].replace('"step"', '"stXp"')
    log.path.write_text("".join(lines))
    with pytest.raises(UsageError, match="first 3 rows differ from what the checkpoint recorded"):
        log.cut(covered)
    with pytest.raises(UsageError, match="line 2 is not valid JSON|not a JSON"):
        log.path.write_text(lines[0] + '{"step": 2, "reward_mean"\n' + lines[2])
        log.read()  # readers name the line too


def test_an_eval_log_from_another_run_is_refused(tmp_path):
    ours = _log(tmp_path / "a", "eval.jsonl")
    covered = ours.coverage()
    other = MetricsLog(tmp_path / "b", "eval.jsonl")
    for step in (0, 2, 4, 6, 8):
        other.append({"step": step, "accuracy": 0.5})
    ours.path.write_bytes(other.path.read_bytes())
    with pytest.raises(UsageError, match="another run"):
        ours.cut(covered)
    ours.path.write_text('{"step": 1}\n')
    with pytest.raises(UsageError, match="shorter"):
        ours.cut(covered)


# ------------------------------------------------------------------ history and checkpoints

def _records(step: int) -> list[RolloutRecord]:
    return [RolloutRecord(f"p{i}", "h", 0, step, step, 0, [1, 2, 3], 3, "stop", 1.0, 0.1)
            for i in range(4)]


def test_history_check_refuses_a_truncated_or_missing_step_file(tmp_path):
    store = HistoryStore(tmp_path)
    for step in range(3):
        store.append(step, _records(step))
    covers = {"history_steps": 3, "history_rows": 12}
    commit.check_history(store, covers, Path("step-000003"))
    data = store.path(1).read_bytes()
    store.path(1).write_bytes(data[: len(data) // 2])
    with pytest.raises(UsageError, match="step-000001.parquet is corrupt or truncated"):
        commit.check_history(store, covers, Path("step-000003"))
    store.path(1).unlink()
    with pytest.raises(UsageError, match="step-000001.parquet is missing"):
        commit.check_history(store, covers, Path("step-000003"))


def test_checkpoint_manifest_detects_a_missing_shard(tmp_path):
    root = tmp_path / "checkpoints"
    tmp = checkpoint.prepare(root, 2)
    (tmp / "ds").mkdir()
    (tmp / "ds" / "mp_rank_00_model_states.pt").write_bytes(b"x" * 10)
    (tmp / "ds" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").write_bytes(b"y" * 20)
    final = checkpoint.commit(root, 2, {"step": 2}, tmp_path / "no-model", keep=2)
    state = checkpoint.read_state(final)
    assert state["files"]["ds/mp_rank_00_model_states.pt"] == 10
    assert checkpoint.verify(final, state) is None
    (final / "ds" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    assert checkpoint.verify(final, state) == "ds/zero_pp_rank_1_mp_rank_00_optim_states.pt missing"
    (final / "ds" / "mp_rank_00_model_states.pt").write_bytes(b"x")
    assert "has 1 bytes, 10 were written" in checkpoint.verify(final, state)


def test_resume_check_refuses_a_damaged_checkpoint(tmp_path):
    root = tmp_path / "checkpoints"
    tmp = checkpoint.prepare(root, 1)
    (tmp / "ds").mkdir()
    (tmp / "ds" / "shard.pt").write_bytes(b"z")
    final = checkpoint.commit(root, 1, {"step": 1, "world_size": 1}, tmp_path, keep=2)
    assert commit.check_resume(tmp_path, 1)["step"] == 1
    with pytest.raises(UsageError, match="written by 1 ranks, this run has 2"):
        commit.check_resume(tmp_path, 2)
    (final / "ds" / "shard.pt").unlink()
    with pytest.raises(UsageError, match=r"step-000001 is damaged \(ds/shard.pt missing\); delete"):
        commit.check_resume(tmp_path, 1)


def test_disk_errors_become_one_line_naming_the_file_and_the_way_back(tmp_path):
    exc = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "history/step-3"))
    line = commit.disk_error(exc, tmp_path)
    assert line.startswith(f"cannot write {tmp_path}/history/step-3: no space left on device")
    assert "rerun with --resume" in line and "\n" not in line
    assert "permission denied" in commit.disk_error(OSError(errno.EACCES, "x"), tmp_path)
    assert commit.disk_error(OSError(errno.ENOENT, "x"), tmp_path) is None


# ------------------------------------------------------------------ a full disk mid-write

def test_enospc_mid_history_write_leaves_the_committed_steps_and_no_temp_file(tmp_path, monkeypatch):
    store = HistoryStore(tmp_path)
    store.append(0, _records(0))
    monkeypatch.setattr(faults, "_hits", {})
    monkeypatch.setenv(faults.ENV, "mid_history_write:ENOSPC")
    with pytest.raises(OSError) as info:
        store.append(1, _records(1))
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(store.path(1))
    assert store.steps() == [0] and store.rows(0) == 4
    assert sorted(p.name for p in store.dir.iterdir()) == ["step-000000.parquet"]
    monkeypatch.delenv(faults.ENV)
    store.append(1, _records(1))  # space is back
    assert store.steps() == [0, 1]


def test_enospc_mid_index_build_keeps_the_previous_index(tmp_path, monkeypatch):
    from pipeline.history import index

    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0}}}')
    (model / "config.json").write_text(json.dumps({"hidden_size": 8, "torch_dtype": "float32",
                                                   "transformers_version": "4.50.0"}))
    run = tmp_path / "run"
    store = HistoryStore(run)
    store.append(0, _records(0))
    index.build(run, model, 2)
    before = {p.name: p.read_bytes() for p in (run / "index").iterdir()}
    store.append(1, _records(1))
    monkeypatch.setattr(faults, "_hits", {})
    monkeypatch.setenv(faults.ENV, "mid_index_build:ENOSPC")
    with pytest.raises(OSError) as info:
        index.build(run, model, 2)
    assert info.value.errno == errno.ENOSPC
    assert {p.name: p.read_bytes() for p in (run / "index").iterdir()} == before
    assert "no space left on device" in commit.disk_error(info.value, run)
    monkeypatch.delenv(faults.ENV)
    assert index.build(run, model, 2).last_step == 1


def test_a_run_dir_that_cannot_be_created_is_a_usage_error(tmp_path):
    """What the preflight cannot foresee (a path the kernel refuses) still fails with one
    line at the lock, the first write."""
    with pytest.raises(UsageError, match=r"run.dir = /proc/rhymectl-test/run cannot be created \("):
        lock.RunLock("/proc/rhymectl-test/run").acquire()
    (tmp_path / "f").write_text("")
    with pytest.raises(UsageError, match="cannot be created"):
        lock.RunLock(tmp_path / "f" / "run").acquire()
