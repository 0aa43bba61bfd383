"""The run folder's lock (`common.run_lock`, taken by `common.run_dir.prepare_run_dir`), against real
second processes: a live holder refuses the folder (exit-2 error naming it), a killed one is taken
over with one line, another host's lock is refused with the instruction to remove it, a torchrun rank
other than 0 takes nothing, and the lock goes away on a normal exit, an exception and SIGTERM.
The four trainers' use of it is checked in tests/test_run_contract.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.config import ConfigError
from common.run_dir import OutputPathError, prepare_run_dir
from common.run_lock import LOCK_NAME, RunFolderInUse, RunLock, release_run_locks
from tests.child_env import child_env

REPO = Path(__file__).resolve().parents[2]
HOLD = """
import sys, time
from common.config import ConfigError
from common.run_dir import prepare_run_dir
prepare_run_dir(sys.argv[1])
print("locked", flush=True)
if sys.argv[2] == "raise":
    raise ValueError("a bug after the start")
time.sleep(120)
"""


def _holder(run: Path, then: str = "sleep") -> subprocess.Popen:
    """A real second process that takes the lock of `run` and then sleeps (or raises)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run), then], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env())
    assert proc.stdout.readline().strip() == "locked", proc.stderr.read()
    return proc


@pytest.fixture(autouse=True)
def _release():
    yield
    release_run_locks()


def test_a_live_holder_refuses_the_folder_and_its_exit_releases_it(tmp_path):
    run = tmp_path / "run"
    proc = _holder(run)
    try:
        holder = json.loads((run / LOCK_NAME).read_text())
        assert holder["pid"] == proc.pid and holder["host"] == socket.gethostname() and holder["started"]
        with pytest.raises(RunFolderInUse, match=rf"in use by another run \(pid {proc.pid} on "
                                                 rf"{socket.gethostname()}, started .*; wait for it"):
            prepare_run_dir(run, resume="auto")
        assert issubclass(RunFolderInUse, ConfigError)  # exit 2 in every trainer
        proc.send_signal(signal.SIGTERM)  # outside a training loop: a normal exit that releases the lock
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        proc.kill()
    assert not (run / LOCK_NAME).exists()
    prepare_run_dir(run)  # free again
    assert json.loads((run / LOCK_NAME).read_text())["pid"] == os.getpid()


def test_an_exception_releases_the_lock(tmp_path):
    proc = _holder(tmp_path, then="raise")
    assert proc.wait(timeout=30) == 1 and "a bug after the start" in proc.stderr.read()
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_killed_holder_is_taken_over_with_one_line(tmp_path):
    proc = _holder(tmp_path)
    proc.kill()  # SIGKILL: nothing runs, the lock stays behind
    proc.wait(timeout=30)
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == proc.pid
    lines: list[str] = []
    prepare_run_dir(tmp_path, log=lines.append)
    assert len(lines) == 1 and lines[0].startswith(f"taking over the lock of {tmp_path}: its run (pid {proc.pid} on ")
    assert lines[0].endswith("is gone")
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()


def test_a_reused_pid_is_not_the_holder(tmp_path):
    """The pid of a dead run now names another process: its start time tells them apart."""
    if not Path(f"/proc/{os.getppid()}/stat").exists():
        pytest.skip("no /proc here")
    stale = {"pid": os.getppid(), "host": socket.gethostname(), "started": "2020-01-01 00:00:00 UTC",
             "process_start": "1"}
    (tmp_path / LOCK_NAME).write_text(json.dumps(stale))
    lines: list[str] = []
    RunLock(tmp_path).acquire(log=lines.append)
    assert len(lines) == 1 and "is gone" in lines[0]


def test_a_lock_from_another_host_is_refused_with_the_instruction_to_remove_it(tmp_path):
    lock = tmp_path / LOCK_NAME
    lock.write_text(json.dumps({"pid": 4242, "host": "gpu-node-7", "started": "2026-01-01 10:00:00 UTC"}))
    with pytest.raises(RunFolderInUse, match=rf"locked by a run on another host \(pid 4242 on gpu-node-7, .*"
                                             rf"If it has finished, remove {lock} and start again"):
        prepare_run_dir(tmp_path, run_flag="--output_dir")
    assert json.loads(lock.read_text())["host"] == "gpu-node-7"  # untouched


def test_an_unreadable_lock_is_refused(tmp_path):
    (tmp_path / LOCK_NAME).write_text("not json")
    with pytest.raises(RunFolderInUse, match="not a lock this code wrote"):
        RunLock(tmp_path).acquire()


def test_only_rank_0_takes_the_lock(tmp_path, monkeypatch):
    proc = _holder(tmp_path)
    try:
        monkeypatch.setenv("RANK", "1")
        assert prepare_run_dir(tmp_path) == tmp_path  # rank 1 of the holder's own job: no lock, no refusal
        monkeypatch.setenv("RANK", "0")
        with pytest.raises(RunFolderInUse):
            prepare_run_dir(tmp_path)
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_a_refused_used_folder_releases_the_lock_and_overwrite_keeps_it(tmp_path):
    (tmp_path / "model_00000001.pt").write_bytes(b"x")
    with pytest.raises(OutputPathError, match="--resume auto"):
        prepare_run_dir(tmp_path)
    assert not (tmp_path / LOCK_NAME).exists()
    aside = prepare_run_dir(tmp_path, overwrite=True)
    assert (aside / "model_00000001.pt").is_file() and (tmp_path / LOCK_NAME).is_file()
    assert not (aside / LOCK_NAME).exists()
    release_run_locks()
    assert not (tmp_path / LOCK_NAME).exists()


def test_init_from_with_resume(tmp_path):
    """`--resume PATH --init_from X` contradict each other (exit 2 before anything changes); the launchers'
    `--resume auto` with `--init_from X` starts from X in an empty folder and, with a run already there,
    continues it (the same command again after a crash) saying in one line that X is not used."""
    with pytest.raises(OutputPathError, match="--resume a.pt and --init_from exclude each other"):
        prepare_run_dir(tmp_path, resume="a.pt", init_from="x.ckpt")
    lines: list[str] = []
    prepare_run_dir(tmp_path, resume="auto", init_from="x.ckpt", log=lines.append)
    assert lines == []  # a new run: X is used
    release_run_locks()
    (tmp_path / "model_00000001.pt").write_bytes(b"x")
    prepare_run_dir(tmp_path, resume="auto", init_from="x.ckpt", log=lines.append)
    assert lines == [f"--init_from x.ckpt is not used: --resume auto continues the run in {tmp_path} (1 checkpoint(s)); "
                     "--overwrite starts a new run from it (the old files are moved aside)"]
    release_run_locks()


def test_of_runs_starting_together_exactly_one_gets_the_lock(tmp_path):
    race = ("import sys, time\nfrom common.run_lock import RunLock, RunFolderInUse\n"
            "time.sleep(max(0.0, float(sys.argv[2]) - time.time()))\n"
            "try:\n    RunLock(sys.argv[1]).acquire(); print('won', flush=True); time.sleep(5)\n"
            "except RunFolderInUse:\n    print('refused', flush=True)\n")
    start = time.time() + 1.5
    procs = [subprocess.Popen([sys.executable, "-c", race, str(tmp_path), str(start)], cwd=REPO, text=True,
                              stdout=subprocess.PIPE, env=child_env()) for _ in range(4)]
    try:
        answers = sorted(p.stdout.readline().strip() for p in procs)
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=30)
    assert answers == ["refused", "refused", "refused", "won"]
