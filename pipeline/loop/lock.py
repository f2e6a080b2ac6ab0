"""The run-directory lock: one writer per run directory, for the life of the run.

`RUN_DIR/.writer.lock` is held with `flock(LOCK_EX)` by the one process that writes the
run (rank 0 of `rhymectl train`, `rhymectl index build`, a bench that writes). While held
it names its holder as JSON: {"host", "pid", "command", "since"}. The kernel drops a flock
when its process dies, however it dies, so a lock left by a killed run is free at once; the
next writer takes it over and says whose it was. On the same host the holder's pid is also
checked, which keeps the lock meaningful on a filesystem where flock is a no-op.

A second writer gets one line naming the holder's host and pid (UsageError, exit 2) and
changes nothing: it fails before it creates or removes anything but the lock file itself.
Readers (`profile`, `index stats`, `report`) never take it.

The file is never deleted: removing a lock file while another process waits on it would
let two holders lock two different inodes.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from pipeline.errors import UsageError

LOCK_FILE = ".writer.lock"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _holder(fd: int) -> dict:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 4096)
    try:
        holder = json.loads(raw) if raw.strip() else {}
    except ValueError:
        holder = {}
    return holder if isinstance(holder, dict) else {}


def _describe(h: dict) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(h["since"])) \
        if isinstance(h.get("since"), (int, float)) else "an unknown time"
    return (f"{h.get('command', 'a writer')} pid {h.get('pid', '?')} on host "
            f"{h.get('host', '?')} (since {since})")


class RunLock:
    """An acquired lock on one run directory; `release()` (or process exit) frees it."""

    def __init__(self, run_dir: str | Path, command: str = "rhymectl train"):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self.command = command
        self.fd: int | None = None
        self.took_over: dict | None = None  # the dead holder this lock replaced, if any

    def acquire(self) -> "RunLock":
        """Take the lock or raise UsageError naming its holder."""
        if self.run_dir.exists() and not self.run_dir.is_dir():
            raise UsageError(f"run.dir = {self.run_dir} is a file; choose a directory")
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"run.dir = {self.run_dir} cannot be created ({exc.strerror}); "
                             f"choose a directory you can write to") from None
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise UsageError(f"{self.run_dir} is in use by {_describe(holder)}; wait for it to "
                             f"finish or stop it, or choose another run.dir") from None
        holder = _holder(fd)
        here = socket.gethostname()
        pid = holder.get("pid")
        if holder and holder.get("host") == here and isinstance(pid, int) and pid != os.getpid() \
                and _alive(pid):
            # flock granted yet the holder lives: a filesystem without flock, or a reused pid
            os.close(fd)
            raise UsageError(f"{self.run_dir} is in use by {_describe(holder)}; if that process "
                             f"is not a rhymectl writer, delete {self.path}")
        self.took_over = holder or None
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps({"host": here, "pid": os.getpid(), "command": self.command,
                                 "since": round(time.time(), 3)}).encode())
        os.fsync(fd)
        self.fd = fd
        return self

    def release(self) -> None:
        """Clear the holder and unlock (a clean exit; a crash leaves the name for the next)."""
        if self.fd is None:
            return
        try:
            os.ftruncate(self.fd, 0)
        except OSError:
            pass  # a full or read-only disk must not stop the unlock
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None


def probe(run_dir: str | Path) -> None:
    """Raise UsageError if a live writer holds the lock; touch nothing (the launcher's
    early check before it starts ranks, which take the lock themselves)."""
    path = Path(run_dir) / LOCK_FILE
    if not path.is_file():
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise UsageError(f"{run_dir} is in use by {_describe(_holder(fd))}; wait for it to "
                         f"finish or stop it, or choose another run.dir") from None
    finally:
        os.close(fd)


@contextmanager
def held(run_dir: str | Path, command: str):
    """`with held(run_dir, "rhymectl index build"):` — the lock for one write."""
    lock = RunLock(run_dir, command).acquire()
    announce(lock)
    try:
        yield lock
    finally:
        lock.release()


def announce(lock: RunLock) -> None:
    """One stderr line when a dead writer's lock was taken over."""
    if lock.took_over:
        print(f"note: took over the lock of {_describe(lock.took_over)}, which is no longer "
              f"running", file=sys.stderr)
