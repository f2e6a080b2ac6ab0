"""Fault injection for the crash-safety tests: die (or fail a write) at a named point.

    RHYMECTL_FAULT=point[:n][:ERRNO]

kills this process with SIGKILL the n-th time (default 1st) it reaches `point`, or, with
an errno name (ENOSPC, EACCES, EDQUOT, EROFS), raises that OSError there instead, as a
full disk or an unwritable directory would. Several faults may be given, comma-separated.
Unset (the normal case), `fault()` is one dictionary lookup. SIGKILL, not an exception:
nothing (no `finally`, no atexit, no flush) runs, as when the machine or the scheduler
kills the job.

The points, in the order one RL step reaches them (see pipeline.loop.run):
"""

from __future__ import annotations

import errno
import os
import signal

POINTS = (
    "after_rollout",            # responses generated, nothing trained
    "after_train",              # optimiser stepped, weights not yet in the engine
    "after_sync",               # weights pushed into vLLM
    "mid_history_write",        # step file written to its temp name, not renamed
    "mid_eval",                 # held-out prompts generated, row not written
    "after_metrics_append",     # metrics and eval rows on disk, no checkpoint yet
    "mid_index_build",          # index rows written to a temp file, not renamed
    "mid_checkpoint_write",     # every rank's shards in .tmp-step-N, no state.json
    "after_checkpoint_commit",  # step-N renamed into place: the step is committed
)
__doc__ += "".join(f"    {p}\n" for p in POINTS)

ENV = "RHYMECTL_FAULT"
ERRNOS = {"ENOSPC": errno.ENOSPC, "EACCES": errno.EACCES, "EDQUOT": errno.EDQUOT,
          "EROFS": errno.EROFS}
_hits: dict[str, int] = {}


def parse(spec: str) -> dict[str, tuple[int, int | None]]:
    """'mid_eval:2,after_train' -> {point: (n, errno or None)}; ValueError on a bad spec."""
    out = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        point, *rest = part.split(":")
        if point not in POINTS:
            raise ValueError(f"{ENV}: unknown point {point!r}; known: {', '.join(POINTS)}")
        n, code = 1, None
        for item in rest:
            if item.isdigit() and int(item) >= 1:
                n = int(item)
            elif item in ERRNOS:
                code = ERRNOS[item]
            else:
                raise ValueError(f"{ENV}: {item!r} in {part!r} is neither a count >= 1 nor one "
                                 f"of {', '.join(ERRNOS)}")
        out[point] = (n, code)
    return out


def fault(point: str, path: str | os.PathLike | None = None) -> None:
    """Fire the fault configured for `point`, if any. `path` names the file an injected
    OSError is about (what a real ENOSPC would carry)."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    wanted = parse(spec).get(point)
    if wanted is None:
        return
    _hits[point] = _hits.get(point, 0) + 1
    n, code = wanted
    if _hits[point] != n:
        return
    if code is not None:
        raise OSError(code, os.strerror(code), None if path is None else str(path))
    os.kill(os.getpid(), signal.SIGKILL)
