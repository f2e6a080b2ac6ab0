"""torch.distributed for the loop: one group (gloo on CPU, nccl on GPU) shared by DeepSpeed,
vLLM's external launcher and the history exchange. A single process without torchrun still
gets a one-rank group, so every run takes the same code path."""

from __future__ import annotations

import itertools
import os
import socket
from datetime import timedelta
from typing import Any, Mapping

import torch
import torch.distributed as dist


def free_port() -> int:
    """A TCP port free on every interface (a TCPStore listens on all of them), from the
    system's ephemeral range."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def job_shape(environ: Mapping[str, str] | None = None, *,
              slurm: bool = False) -> tuple[int, int] | None:
    """(ranks in all, ranks per node) of the job this process belongs to, or None.

    torchrun's WORLD_SIZE and LOCAL_WORLD_SIZE when set. With `slurm`, else from Slurm's
    allocation: SLURM_NNODES nodes x (SLURM_GPUS_ON_NODE GPUs, one rank each, or without
    GPUs SLURM_NTASKS_PER_NODE tasks). Slurm describes the job a batch script is about to
    start, not this process (one rank outside torchrun): only a dry run asks for it.
    """
    env = os.environ if environ is None else environ
    if "WORLD_SIZE" in env:
        world = int(env["WORLD_SIZE"])
        return world, int(env.get("LOCAL_WORLD_SIZE", world))
    if not slurm:
        return None
    per_node = env.get("SLURM_GPUS_ON_NODE") or env.get("SLURM_NTASKS_PER_NODE")
    nodes = env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES")
    if not (per_node and nodes and per_node.isdigit() and nodes.isdigit()) or int(per_node) < 1:
        return None
    return int(nodes) * int(per_node), int(per_node)


def on_one_node() -> bool:
    """Every rank of this job runs on this process's node: one rank, or torchrun's
    LOCAL_WORLD_SIZE is the whole WORLD_SIZE. A launcher that does not say is not trusted
    to be on one node."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    local = os.environ.get("LOCAL_WORLD_SIZE")
    return world == 1 or (local is not None and int(local) == world)


def init(timeout_min: float | None = None) -> tuple[int, int]:
    """Initialise the process group from torchrun's environment (or a 1-rank default).
    `timeout_min`: how long a collective waits (`run.dist_timeout_min`); None keeps torch's
    default, for the benchmarks and tests that build a group without a run's config."""
    if not dist.is_initialized():
        if "RANK" not in os.environ:
            os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                              MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        timeout = {} if timeout_min is None else {"timeout": timedelta(minutes=timeout_min)}
        dist.init_process_group(backend=backend, **timeout)
    return dist.get_rank(), dist.get_world_size()


def leave() -> None:
    """Leave the process group, if joined. A rank that stops on bad input calls this:
    exiting with the group still up can abort in its destructor (SIGABRT, seen with gloo
    across nodes) while a peer is still finishing the collective that told both to stop."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def bind_cpu_threads() -> None:
    """Give each local rank its own cores (vLLM's CPU worker binds OpenMP threads)."""
    if torch.cuda.is_available() or "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if local_world <= 1:
        return
    cores = sorted(os.sched_getaffinity(0))
    share = max(1, len(cores) // local_world)
    rank = int(os.environ.get("LOCAL_RANK", 0))
    mine = cores[rank * share: (rank + 1) * share] or cores[-1:]
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, mine))
    torch.set_num_threads(len(mine))


def all_gather(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order (small Python objects: records, metrics)."""
    if dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if dist.get_world_size() > 1:
        dist.barrier()


class CoordinationStore:
    """A key-value store that every rank reads and writes without collectives: a
    torch.distributed `TCPStore` hosted by rank 0 on a free port, which the ranks learn over
    the process group. Every rank constructs it together (a broadcast); the run that creates
    it owns it. A blocking `get` gives up after `timeout_s` seconds.

    `channel()` hands out a fresh key namespace (a `PrefixStore`) per use, so one use never
    reads another's keys.
    """

    def __init__(self, timeout_s: float):
        rank = dist.get_rank()
        port = [free_port() if rank == 0 else 0]
        dist.broadcast_object_list(port, src=0)
        self.timeout_s = timeout_s
        self.store = dist.TCPStore(os.environ.get("MASTER_ADDR", "127.0.0.1"), port[0],
                                   dist.get_world_size(), is_master=rank == 0,
                                   timeout=timedelta(seconds=timeout_s))
        self._uses = itertools.count()

    def channel(self, name: str) -> dist.PrefixStore:
        """A namespace of its own: `name/<n>/` for the n-th channel of this store."""
        return dist.PrefixStore(f"{name}/{next(self._uses)}", self.store)

    def num_keys(self) -> int:
        return self.store.num_keys()
