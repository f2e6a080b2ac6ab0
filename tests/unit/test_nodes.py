"""Several nodes without an engine: the job's shape (ranks, ranks per node) from the command
line, torchrun or Slurm; `train --dry-run` refusing a TP group that would span nodes (one
line, exit 2); the shared run-directory check's verdicts; torchrun's exit code for ranks
that stopped on bad input."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import pytest

from pipeline import distributed
from pipeline.errors import UsageError
from pipeline.loop import shared_fs, torchrun
from pipeline.loop.lock import LOCK_FILE
from pipeline.loop.preflight import job_ranks
from rhymectl.app import main

TINY = str(Path(__file__).resolve().parents[2] / "sample_configs" / "tiny.yaml")
JOB_ENV = ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "SLURM_NNODES", "SLURM_JOB_NUM_NODES",
           "SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE", "SLURM_NTASKS_PER_NODE")
SPANS = ("rollout.tensor_parallel_size = 4 does not divide the 2 ranks per node, so a TP "
         "group would span nodes; use a divisor of 2")


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("RHYMECTL_DEBUG", "0")
    for name in JOB_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def model_dir(tmp_path_factory) -> Path:
    """Enough of a model directory for a dry run (a char tokenizer; no weights are read)."""
    from pipeline.policy.tokenizer import train_char_tokenizer

    d = tmp_path_factory.mktemp("model")
    train_char_tokenizer(["sort 123: abcdefghijklmnopqrstuvwxyz 0123456789 >|"]).save_pretrained(d)
    (d / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    (d / "model.safetensors").write_bytes(b"")
    return d


def cli(capsys, *args) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return (info.value.code or 0), out, err


def dry_run_error(capsys, tmp_path, *args) -> str:
    """The one error line of a dry run that must fail with exit 2 and write nothing."""
    code, out, err = cli(capsys, "train", TINY, *args, "--dry-run")
    assert code == 2, err
    assert out == "" and err.startswith("error: ") and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []
    return err[len("error: "):-1]


# -- the job's shape --------------------------------------------------------------------


def test_the_job_shape_comes_from_torchrun_else_from_slurm_for_a_dry_run():
    torchrun_env = {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "SLURM_NNODES": "4",
                    "SLURM_GPUS_ON_NODE": "4"}
    assert distributed.job_shape(torchrun_env) == (16, 8)
    assert distributed.job_shape(torchrun_env, slurm=True) == (16, 8)  # torchrun's wins
    slurm = {"SLURM_NNODES": "2", "SLURM_GPUS_ON_NODE": "8", "SLURM_NTASKS_PER_NODE": "1"}
    assert distributed.job_shape(slurm) is None  # a real run outside torchrun: one rank
    assert distributed.job_shape(slurm, slurm=True) == (16, 8)  # GPUs, not the one torchrun
    assert distributed.job_shape({"SLURM_JOB_NUM_NODES": "3", "SLURM_NTASKS_PER_NODE": "2"},
                                 slurm=True) == (6, 2)
    assert distributed.job_shape({"SLURM_NNODES": "2"}, slurm=True) is None
    assert distributed.job_shape({}, slurm=True) is None


def test_the_ranks_a_dry_run_checks(monkeypatch):
    assert job_ranks(1, None, dry_run=True) == (1, 1)
    assert job_ranks(8, None, dry_run=True) == (8, 8)
    assert job_ranks(8, 2, dry_run=True) == (16, 8)  # world size = N x --nproc
    monkeypatch.setenv("SLURM_NNODES", "2")
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "4")
    assert job_ranks(1, None, dry_run=True) == (8, 4)
    assert job_ranks(1, None, dry_run=False) == (1, 1)
    assert job_ranks(2, None, dry_run=True) == (2, 2)  # --nproc: this node's ranks
    with pytest.raises(UsageError, match=r"^--nnodes only describes a multi-node job to "
                                         r"--dry-run; start the job itself with one torchrun"):
        job_ranks(8, 2, dry_run=False)


# -- TP groups that would span nodes, at --dry-run ---------------------------------------


def test_a_dry_run_with_nnodes_refuses_a_tp_group_across_nodes(capsys, tmp_path, model_dir):
    assert dry_run_error(capsys, tmp_path, f"model.path={model_dir}",
                         "rollout.tensor_parallel_size=4", "--nproc", "2", "--nnodes", "2") == SPANS


def test_without_nnodes_the_same_ranks_on_one_node_pass(capsys, model_dir):
    """The gap --nnodes closes: 4 ranks on one node hold a group of 4."""
    code, out, err = cli(capsys, "train", TINY, f"model.path={model_dir}",
                         "rollout.tensor_parallel_size=4", "--nproc", "4", "--dry-run")
    assert (code, err) == (0, ""), err
    assert "world_size=4" in out


def test_a_dry_run_with_nnodes_and_a_tp_group_inside_a_node_passes(capsys, model_dir):
    code, out, err = cli(capsys, "train", TINY, f"model.path={model_dir}",
                         "rollout.tensor_parallel_size=2", "--nproc", "2", "--nnodes", "2",
                         "--dry-run")
    assert (code, err) == (0, ""), err
    assert "tensor_parallel_size: 2" in out and "world_size=4" in out


@pytest.mark.parametrize("env", [
    {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"},                # under torchrun
    {"SLURM_NNODES": "2", "SLURM_GPUS_ON_NODE": "2"},            # in a Slurm batch script
    {"SLURM_NNODES": "2", "SLURM_NTASKS_PER_NODE": "2"},         # one rank per Slurm task
])
def test_a_dry_run_in_the_jobs_environment_refuses_a_tp_group_across_nodes(
        capsys, tmp_path, monkeypatch, model_dir, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert dry_run_error(capsys, tmp_path, f"model.path={model_dir}",
                         "rollout.tensor_parallel_size=4") == SPANS


def test_nnodes_without_dry_run_is_refused(capsys, tmp_path, model_dir):
    code, out, err = cli(capsys, "train", TINY, f"model.path={model_dir}", "--nproc", "2",
                         "--nnodes", "2")
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith("error: --nnodes only describes a multi-node job to --dry-run")
    assert list(tmp_path.iterdir()) == []


# -- the shared run directory ------------------------------------------------------------


class Ranks:
    """`pipeline.distributed.all_gather` as rank `rank` of two sees it; the other rank's
    objects are given in call order."""

    def __init__(self, monkeypatch, rank: int, others: list):
        self.rank, self.others = rank, list(others)
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # one rank per node
        monkeypatch.setattr(distributed, "all_gather", self.all_gather)

    def all_gather(self, obj):
        other = self.others.pop(0)
        return [obj, other] if self.rank == 0 else [other, obj]


class Lock:
    def __init__(self, run_dir: Path, record: bytes):
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / LOCK_FILE
        self.path.write_bytes(record)


def test_a_single_node_run_skips_the_check(monkeypatch, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    monkeypatch.setattr(distributed, "all_gather", lambda obj: pytest.fail("a collective"))
    shared_fs.check(tmp_path / "nowhere", None)  # nothing read, nothing exchanged


def test_ranks_whose_launcher_does_not_give_the_ranks_per_node_are_checked(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert not distributed.on_one_node()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert distributed.on_one_node()
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert distributed.on_one_node()


def test_a_rank_that_reads_rank_0s_record_passes(monkeypatch, tmp_path):
    record = b'{"host": "node-a", "pid": 7}'
    Lock(tmp_path / "run", record)  # the same folder: a shared filesystem
    Ranks(monkeypatch, rank=1, others=[record, (True, "node-a")])
    shared_fs.check(tmp_path / "run", None)


@pytest.mark.parametrize("mine", [None, b'{"host": "node-b", "pid": 7}'])
def test_a_rank_that_does_not_see_rank_0s_record_stops(monkeypatch, tmp_path, mine):
    """Rank 1's run.dir is missing, or holds another lock record (its own disk)."""
    if mine is not None:
        Lock(tmp_path / "run", mine)
    monkeypatch.setattr(shared_fs, "VISIBLE_WITHIN_S", 0.0)
    Ranks(monkeypatch, rank=1, others=[b'{"host": "node-a", "pid": 7}', (True, "node-a")])
    with pytest.raises(UsageError) as info:
        shared_fs.check(Path("run"), None)
    assert str(info.value) == (
        "run.dir = run is not shared between the nodes: rank 1 on " + _host() + " did not "
        "find what rank 0 on node-a wrote there within 0 s; put run.dir on a filesystem every "
        "node mounts at the same path (every rank writes checkpoints there and reads them on "
        "--resume)")


def test_rank_0_stops_with_the_same_line(monkeypatch, tmp_path):
    lock = Lock(tmp_path / "run", b"rank 0's record")
    Ranks(monkeypatch, rank=0, others=[None, (False, "node-b")])
    with pytest.raises(UsageError, match=r"^run.dir = \S+ is not shared between the nodes: "
                                         r"rank 1 on node-b did not find what rank 0 on "):
        shared_fs.check(tmp_path / "run", lock)


def test_the_line_names_every_blind_rank_and_host_briefly():
    verdicts = [(True, "n0")] + [(False, f"n{1 + r // 4}") for r in range(12)]
    line = shared_fs.problem(Path("r"), verdicts)
    assert "ranks 1, 2, 3, 4, 5, 6, 7, 8, ... on n1, n2, n3 did not find what rank 0 on n0" in line
    assert shared_fs.problem(Path("r"), [(True, "n0"), (True, "n1")]) is None


def test_a_write_that_shows_late_is_waited_for(tmp_path):
    """A network filesystem may show rank 0's file after a while: the rank retries."""
    path = tmp_path / "run" / LOCK_FILE
    writer = threading.Timer(0.3, lambda: (path.parent.mkdir(), path.write_bytes(b"x")))
    writer.start()
    try:
        assert shared_fs.sees(path, b"x", within_s=60.0)
    finally:
        writer.cancel()
    assert not shared_fs.sees(path, b"y", within_s=0.0)


def _host() -> str:
    import socket

    return socket.gethostname()


# -- torchrun's exit code ----------------------------------------------------------------


@pytest.mark.parametrize("codes, usage", [
    ([2], True), ([2, 2], True),
    ([2, -signal.SIGTERM], True),   # the other rank was stopped because of the first
    ([2, -signal.SIGKILL], True),
    ([1], False), ([2, 1], False),  # a runtime failure is torchrun's own
    ([-signal.SIGTERM], False), ([2, -signal.SIGSEGV], False),
])
def test_ranks_that_stopped_on_bad_input_make_torchrun_exit_2(codes, usage):
    assert torchrun.usage_failure(codes) is usage


def test_torchrun_exits_2_without_a_traceback_when_a_rank_stopped_on_bad_input(monkeypatch,
                                                                               capsys):
    import torch.distributed.run as run
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    def failed(codes):
        def fake(argv):
            raise ChildFailedError("rank", {r: ProcessFailure(r, 100 + r, c, "")
                                            for r, c in enumerate(codes)})
        return fake

    monkeypatch.setattr(run, "main", failed([2, -signal.SIGTERM]))
    assert torchrun.main([]) == 2
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(run, "main", failed([1, -signal.SIGTERM]))
    with pytest.raises(ChildFailedError):
        torchrun.main([])


def test_a_node_that_lost_the_store_keeps_watching_its_ranks_for_a_grace_period():
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

    class Handler:
        store_up = True
        asked = 0

        def num_nodes_waiting(self):
            self.asked += 1
            if not self.store_up:
                raise RendezvousConnectionError("the store is gone")
            return 3

    now = [0.0]
    torchrun.tolerate_lost_store(Handler, 30.0, clock=lambda: now[0])
    torchrun.tolerate_lost_store(Handler, 30.0, clock=lambda: now[0])  # idempotent
    handler = Handler()
    assert handler.num_nodes_waiting() == 3
    handler.store_up = False
    assert handler.num_nodes_waiting() == 0  # lost at t = 0
    now[0] = 30.0
    assert (handler.num_nodes_waiting(), handler.asked) == (0, 2)  # not asked in the grace
    now[0] = 30.5
    with pytest.raises(RendezvousConnectionError):
        handler.num_nodes_waiting()  # still gone after the grace: torchrun's own error
    handler.store_up = True
    now[0] = 61.0
    assert handler.num_nodes_waiting() == 3  # back: the grace starts afresh next time
    handler.store_up = False
    assert handler.num_nodes_waiting() == 0
    assert handler.asked == 5
