"""pipeline.process_exit: a process that ends with `exit_now` skips the interpreter's
teardown but not the orderly part of an exit: its code, other threads' work (a thread
pool's idle worker, which only threading's exit hook ends, included), atexit handlers and
buffered output all arrive."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.process_exit import exit_code

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import atexit, sys, threading, time
from pathlib import Path
from pipeline.process_exit import exit_now

out = Path(sys.argv[1])
atexit.register(lambda: (out / "atexit").write_text("ran"))
def late():
    time.sleep(0.3)
    (out / "thread").write_text("done")
threading.Thread(target=late).start()
from concurrent.futures import ThreadPoolExecutor
pool = ThreadPoolExecutor(1)  # its idle worker ends only by threading's exit hook
pool.submit(lambda: (out / "pool").write_text("done"))
sys.stdout.write("buffered, no newline")  # stdout is a pipe: block-buffered
exit_now(3)
print("never")
"""


def test_exit_now_keeps_the_code_threads_atexit_and_buffered_output(tmp_path):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True,
                          text=True, cwd=REPO, timeout=30)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "buffered, no newline"
    assert (tmp_path / "thread").read_text() == "done"
    assert (tmp_path / "pool").read_text() == "done"
    assert (tmp_path / "atexit").read_text() == "ran"


@pytest.mark.parametrize("value, code", [(None, 0), (0, 0), (2, 2), (130, 130), ("boom", 1)])
def test_exit_code_is_what_python_makes_of_systemexit(value, code, capsys):
    assert exit_code(value) == code
    assert capsys.readouterr().err == ("boom\n" if value == "boom" else "")


@pytest.mark.parametrize("args, code, stream, text", [
    (["--version"], 0, "stdout", "rhymectl "),
    (["train", "no-such.yaml"], 2, "stderr", "error: "),
])
def test_the_program_exits_with_mains_code(args, code, stream, text):
    proc = subprocess.run([sys.executable, "-m", "rhymectl", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=120)
    assert proc.returncode == code, proc.stderr
    assert getattr(proc, stream).startswith(text)
