"""`pipeline.children.run` with real processes: a signal sent to the parent alone stops
the child too, and the parent reports it (the orphaned-torchrun bug: `kill` of
`rhymectl train --nproc N` left torchrun and its ranks training)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline import children

REPO = Path(__file__).resolve().parents[2]

# The child writes its pid, then sleeps; IGNORE names signals it ignores.
CHILD = """
import os, signal, sys, time
for name in sys.argv[2].split(",") if sys.argv[2] else []:
    signal.signal(getattr(signal, name), signal.SIG_IGN)
tmp = sys.argv[1] + ".tmp"
open(tmp, "w").write(str(os.getpid()))
os.replace(tmp, sys.argv[1])
time.sleep(120)
"""

# The parent runs the child through children.run and exits as the CLI does.
PARENT = """
import sys
from pipeline import children
try:
    code = children.run([sys.executable, "-c", sys.argv[1], sys.argv[2], sys.argv[3]],
                        grace_s=float(sys.argv[4]))
except children.Stopped as exc:
    print(exc, file=sys.stderr)
    sys.exit(exc.exit_code)
sys.exit(code)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def default_signals() -> None:
    """In the parent before it execs: the dispositions a shell gives a foreground command.
    A process inherits ignored signals, and Python installs its Ctrl-C handler only when
    SIGINT is not ignored at start. A test process left ignoring SIGINT by code it ran
    in-process made the parent ignore Ctrl-C, and the Ctrl-C test hang."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def start(tmp_path: Path, ignore: str = "", grace_s: float = 0.5):
    pidfile = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD, str(pidfile), ignore,
                               str(grace_s)], cwd=REPO, stderr=subprocess.PIPE, text=True,
                              preexec_fn=default_signals)
    deadline = time.monotonic() + 30
    while not pidfile.exists():
        assert parent.poll() is None and time.monotonic() < deadline, "the child did not start"
        time.sleep(0.05)
    return parent, int(pidfile.read_text())


@pytest.mark.parametrize("signum,ignore", [(signal.SIGTERM, ""), (signal.SIGHUP, ""),
                                           (signal.SIGTERM, "SIGTERM")])
def test_a_signal_to_the_parent_alone_stops_the_child(tmp_path, signum, ignore):
    """Forwarded; a child that ignores it is killed after the grace period."""
    parent, child = start(tmp_path, ignore)
    try:
        parent.send_signal(signum)
        _, err = parent.communicate(timeout=30)
        assert parent.returncode == 128 + signum, err  # exited itself, not killed by it
        assert f"stopped by {signal.Signals(signum).name}" in err
        assert not alive(child)
    finally:
        parent.kill()
        if alive(child):
            os.kill(child, signal.SIGKILL)


def test_ctrl_c_to_the_parent_alone_stops_a_child_that_did_not_get_it(tmp_path):
    """Ctrl-C normally reaches both; sent to the parent alone (or ignored by the child),
    the child gets SIGTERM after the grace period."""
    parent, child = start(tmp_path, "SIGINT")
    try:
        parent.send_signal(signal.SIGINT)
        _, err = parent.communicate(timeout=30)
        assert parent.returncode == 130, err
        assert not alive(child)
    finally:
        parent.kill()
        if alive(child):
            os.kill(child, signal.SIGKILL)


def test_exit_codes_and_output_lines_come_through():
    assert children.run([sys.executable, "-c", "import sys; sys.exit(3)"]) == 0 + 3
    lines = []
    code = children.run([sys.executable, "-c", "print('a'); print('b')"], on_line=lines.append)
    assert code == 0 and lines == ["a\n", "b\n"]
    # the handlers are restored afterwards
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
