"""The prepare scripts' bar over files (`common.workers.file_progress`, used by vocoder/, tts/ and vae/
prepare_data.py): under a terminal it shows done / total, the ETA and the skipped count; under a pipe (a log
file, CI) it prints nothing. Run in a child process whose stderr is a pseudo-terminal (`pty`, POSIX) or a pipe,
as a user's shell or a redirect gives it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from common.workers import file_progress
from tests.child_env import child_env

ROOT = Path(__file__).resolve().parents[2]
# 6 files, every even-numbered one skipped, and 1 refused before the work: 4 skipped in all
CHILD = ("from common.workers import file_progress\n"
         "for _ in file_progress(iter(range(6)), 6, 'prepare', lambda r: r % 2 == 1, skipped_before=1):\n"
         "    pass\n")


def _child(stderr: int) -> subprocess.CompletedProcess:
    env = child_env()
    return subprocess.run([sys.executable, "-c", CHILD], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=stderr, env=env, cwd=ROOT, timeout=60)


@pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals (pty) are POSIX")
def test_under_a_terminal_the_bar_shows_files_eta_and_skipped():
    import fcntl
    import pty
    import select
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a new pty is 0 columns wide
    try:
        assert _child(slave).returncode == 0
        out = b""
        while select.select([master], [], [], 0.5)[0]:  # what the child wrote, still held by the terminal
            out += os.read(master, 65536)
    finally:
        os.close(slave)
        os.close(master)
    text = out.decode("utf-8", "replace")
    last = text.replace("\r", "\n").strip().splitlines()[-1]
    assert last.startswith("prepare: 100%") and "6/6 [" in last and "<00:00" in last, last  # elapsed<ETA
    assert last.endswith(", skipped 4]"), last


def test_under_a_pipe_there_is_no_bar():
    done = _child(subprocess.PIPE)
    assert done.returncode == 0 and done.stderr == b""


def test_the_results_pass_through_in_order():
    assert list(file_progress(iter("abc"), 3, "prepare", lambda r: r == "b")) == ["a", "b", "c"]
