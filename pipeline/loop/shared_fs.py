"""Is run.dir one directory for every node? Checked once at start-up, before any heavy work.

A multi-node run needs run.dir on a filesystem that every node mounts at the same path:
every rank writes its DeepSpeed shards into `checkpoints/.tmp-step-N/` and rank 0 renames
that folder, and on `--resume` every rank reads its shards, its RNG state, the checkpoint's
`state.json`, the history and the index back from run.dir. On node-local disks each node
would write its own half-checkpoints and a resume would fail (or, worse, disagree between
ranks) hours later.

The probe is the record rank 0 writes into `RUN_DIR/.writer.lock` when it takes the lock
(host, pid, time in ms: `pipeline.loop.lock`), which is unique to this start, fsynced, never
left behind and already ignored by the run-directory checks. Rank 0 sends its bytes to every
rank over the process group; each rank then reads the file at its own run.dir and must
find the same bytes. Every rank learns every verdict, so a directory that some node does
not share stops every rank with the same line (UsageError, exit 2).

A network filesystem may cache "no such file" for a while (NFS caches failed lookups until
it revalidates the folder), and every rank looked run.dir up before rank 0 created it: a
rank that does not see the file lists the nearest folder it sees on the way there, which
refreshes that folder, and retries for up to `VISIBLE_WITHIN_S`.

All ranks on one node share its filesystem: a single-node run skips the check (no file
read, no collective).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from pipeline import distributed as dist
from pipeline.errors import UsageError, existing_part
from pipeline.loop.lock import LOCK_FILE, RunLock

VISIBLE_WITHIN_S = 20.0  # how long rank 0's write may take to show on another node
POLL_S = 0.25


def check(run_dir: Path, lock: RunLock | None) -> None:
    """On every rank, after rank 0 took the lock (`lock`; None on the other ranks):
    UsageError unless every rank reads rank 0's lock record at its own `run_dir`."""
    if dist.on_one_node():
        return
    record = lock.path.read_bytes() if lock is not None else None
    record = dist.all_gather(record)[0]  # rank 0's, written before it got here
    seen = lock is not None or sees(run_dir / LOCK_FILE, record, VISIBLE_WITHIN_S)
    verdicts = dist.all_gather((seen, socket.gethostname()))
    refusal = problem(run_dir, verdicts)
    if refusal:
        raise UsageError(refusal)


def sees(path: Path, record: bytes, within_s: float) -> bool:
    """`path` holds `record`, now or within `within_s` seconds."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            if path.read_bytes() == record:
                return True
        except OSError:
            pass  # not there (yet): another filesystem, or a stale lookup cache
        if time.monotonic() >= deadline:
            return False
        refresh(path.parent)
        time.sleep(POLL_S)


def refresh(folder: Path) -> None:
    """List the nearest folder on the way to `folder` that this node sees: a network
    filesystem rereads a folder it lists, which drops its cached "no such file" answers
    for the entries below it."""
    try:
        os.listdir(existing_part(folder))
    except OSError:
        pass


def problem(run_dir: Path, verdicts: list[tuple[bool, str]]) -> str | None:
    """The line every rank reports when some rank did not see rank 0's write, else None.
    verdicts: (saw it, host name) per rank, in rank order."""
    blind = [(rank, host) for rank, (seen, host) in enumerate(verdicts) if not seen]
    if not blind:
        return None
    hosts = _first(sorted({host for _, host in blind}), 4)
    ranks = _first([str(rank) for rank, _ in blind], 8)
    plural = "s" * (len(blind) > 1)
    return (f"run.dir = {run_dir} is not shared between the nodes: rank{plural} {ranks} on "
            f"{hosts} did not find what rank 0 on {verdicts[0][1]} wrote there "
            f"within {VISIBLE_WITHIN_S:.0f} s; put run.dir on a filesystem every node mounts "
            f"at the same path (every rank writes checkpoints there and reads them on --resume)")


def _first(names: list[str], n: int) -> str:
    return ", ".join(names[:n]) + (", ..." if len(names) > n else "")
