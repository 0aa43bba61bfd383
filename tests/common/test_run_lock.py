"""The run folder's lock (`common.run_lock`, taken by `common.run_dir.prepare_run_dir`), against real
second processes: a live holder refuses the folder (exit-2 error naming it), a killed one's lock is
free at once and its file is taken with one line, another host's file is refused with the instruction
to remove it, a torchrun rank other than 0 takes nothing, and the lock goes away on a normal exit, an
exception and SIGTERM. The lock is the operating system's (flock / msvcrt.locking), never a pid
guess; the module imports without fcntl and then takes the msvcrt path, or goes on unguarded with one line.
The four trainers' use of it is checked in tests/test_run_contract.py."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common import run_lock
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
    """The pid of a dead run now names another, live process: the lock is free, so the file is taken."""
    stale = {"pid": os.getppid(), "host": socket.gethostname(), "started": "2020-01-01 00:00:00 UTC"}
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


HOST = socket.gethostname()
NOT_A_HOLDER = {  # a free lock whose file names no run: taken over, never a file to remove by hand
    "garbage": b"not json",
    "binary": bytes(range(256)) * 4,
    "half-written": json.dumps({"pid": 4242, "host": "gpu-node-7", "started": "2026-01-01"}).encode()[:25],
    "a JSON list": b"[1, 2]",
    "no host": json.dumps({"pid": 4242}).encode(),
    "a pid past Python's digit limit": b'{"pid": ' + b"9" * 5000 + b', "host": "gpu-node-7"}',
    "nested too deep": b"[" * 100_000,
    "5 MiB of garbage": b"x" * (5 << 20),
}


@pytest.mark.parametrize("content", NOT_A_HOLDER.values(), ids=NOT_A_HOLDER.keys())
def test_a_free_lock_whose_file_names_no_run_is_taken_over_with_one_line(tmp_path, content):
    (tmp_path / LOCK_NAME).write_bytes(content)
    lines: list[str] = []
    RunLock(tmp_path).acquire(log=lines.append)
    assert lines == [f"taking over the lock of {tmp_path}: its {LOCK_NAME} named no run (not a lock this code "
                     "wrote, or one cut short) and no run holds it"]
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()


def test_an_empty_lock_is_taken_over_silently(tmp_path):
    """What a run killed between creating the file and writing it leaves (and Windows' release, which
    cannot remove an open file, may leave): nothing to name."""
    (tmp_path / LOCK_NAME).write_bytes(b"")
    lines: list[str] = []
    RunLock(tmp_path).acquire(log=lines.append)
    assert lines == [] and json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()


@pytest.mark.parametrize("pid", [2**31, 2**32 + 7, 2**64, -1, "12x"])
def test_a_free_lock_with_any_pid_is_taken_over_and_another_hosts_still_refused(tmp_path, pid):
    """The pid is only shown, never asked about (a pid past 2**31 means nothing to os.kill or OpenProcess)."""
    lock = tmp_path / LOCK_NAME
    lock.write_text(json.dumps({"pid": pid, "host": HOST, "started": "2020-01-01 00:00:00 UTC"}))
    lines: list[str] = []
    RunLock(tmp_path).acquire(log=lines.append)
    assert lines == [f"taking over the lock of {tmp_path}: its run (pid {pid} on {HOST}, started 2020-01-01 "
                     "00:00:00 UTC) is gone"]
    release_run_locks()
    lock.write_text(json.dumps({"pid": pid, "host": "gpu-node-7", "started": "2026-01-01 10:00:00 UTC"}))
    with pytest.raises(RunFolderInUse, match=rf"another host \(pid {pid} on gpu-node-7, .*remove {lock}"):
        RunLock(tmp_path).acquire()


def test_a_live_holder_whose_file_is_garbage_still_refuses(tmp_path):
    proc = _holder(tmp_path)
    try:
        (tmp_path / LOCK_NAME).write_bytes(b"\x00garbage")  # overwritten in place: the holder's lock stands
        with pytest.raises(RunFolderInUse, match=rf"in use by another run \(its {LOCK_NAME} does not say which\)"):
            RunLock(tmp_path).acquire()
    finally:
        proc.kill()
        proc.wait(timeout=30)


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


# ---------------------------------------------------------------------- the operating system's lock
needs_flock = pytest.mark.skipif(run_lock.fcntl is None, reason="POSIX flock")


def _no_pid_checks(monkeypatch) -> None:
    """Makes `os.kill(pid, 0)` fail the test: the lock code never asks whether a pid lives (on Windows that
    signal is CTRL_C_EVENT); the test's own kills still work."""
    real_kill = os.kill

    def kill(pid, sig):
        if sig == 0:
            raise AssertionError(f"os.kill({pid}, 0) called")
        real_kill(pid, sig)
    monkeypatch.setattr(os, "kill", kill)


def _flock_is_free(path: Path) -> bool:
    fd = os.open(path, os.O_RDWR)
    try:
        run_lock.fcntl.flock(fd, run_lock.fcntl.LOCK_EX | run_lock.fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # (closing drops a lock this test took)


@needs_flock
def test_the_os_lock_decides_not_the_pid_in_the_file(tmp_path, monkeypatch):
    """While the holder lives, its lock refuses the folder whatever pid the file names; the message names
    what the file says."""
    proc = _holder(tmp_path)
    try:
        assert not _flock_is_free(tmp_path / LOCK_NAME)  # a second open+flock fails, in any process
        (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": 2**22 + 12345, "host": socket.gethostname(),
                                                      "started": "then", "command": "train.py --x 1"}))
        _no_pid_checks(monkeypatch)
        with pytest.raises(RunFolderInUse, match=rf"in use by another run \(pid {2**22 + 12345} on .*, started "
                                                 rf"then: train.py --x 1\); wait for it to end"):
            RunLock(tmp_path).acquire()
    finally:
        proc.kill()
        proc.wait(timeout=30)


@needs_flock
def test_a_killed_holder_frees_the_lock_at_once(tmp_path, monkeypatch):
    proc = _holder(tmp_path)
    assert not _flock_is_free(tmp_path / LOCK_NAME)
    proc.kill()  # SIGKILL: no cleanup runs, the file stays with its content
    proc.wait(timeout=30)
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == proc.pid
    assert _flock_is_free(tmp_path / LOCK_NAME)  # the system let it go with the process: nothing to guess
    _no_pid_checks(monkeypatch)
    lines: list[str] = []
    RunLock(tmp_path).acquire(log=lines.append)
    assert len(lines) == 1 and f"(pid {proc.pid} on " in lines[0] and lines[0].endswith("is gone")


@needs_flock
def test_in_process_a_second_open_is_refused_and_the_same_run_again_takes_it_over(tmp_path):
    first = RunLock(tmp_path).acquire()
    assert not _flock_is_free(tmp_path / LOCK_NAME)  # flock is per open file: this process too
    lines: list[str] = []
    second = RunLock(tmp_path).acquire(log=lines.append)  # a run called in-process again: no refusal
    assert lines == [] and first._fd is None and second._fd is not None
    first.release()  # it gave its descriptor away: nothing happens
    assert not _flock_is_free(tmp_path / LOCK_NAME)
    release_run_locks()
    assert not (tmp_path / LOCK_NAME).exists() and RunLock._held == {}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_leaves_its_parents_lock_alone(tmp_path):
    RunLock(tmp_path).acquire()
    pid = os.fork()
    if pid == 0:  # e.g. a DataLoader worker that runs the exit handlers
        try:
            release_run_locks()
        finally:
            os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    assert (tmp_path / LOCK_NAME).is_file() and json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    with pytest.raises(RunFolderInUse):
        _second_process_acquire(tmp_path)


def _second_process_acquire(run: Path) -> None:
    code = ("import sys\nfrom common.run_lock import RunLock, RunFolderInUse\n"
            "try:\n    RunLock(sys.argv[1]).acquire()\nexcept RunFolderInUse as e:\n    print(e); sys.exit(2)\n")
    res = subprocess.run([sys.executable, "-c", code, str(run)], cwd=REPO, capture_output=True, text=True,
                         env=child_env(), timeout=60)
    if res.returncode == 2:
        raise RunFolderInUse(res.stdout.strip())
    assert res.returncode == 0, res.stderr


class _FakeMsvcrt:
    """msvcrt.locking's contract on Linux: the byte range at the file position, LK_NBLCK fails with EACCES
    while another open file holds it (here through a real flock, so two open files conflict)."""
    LK_UNLCK, LK_LOCK, LK_NBLCK, LK_RLCK, LK_NBRLCK = 0, 1, 2, 3, 4

    def __init__(self, fcntl):
        self.fcntl, self.calls = fcntl, []

    def locking(self, fd, mode, nbytes):
        self.calls.append((mode, nbytes, os.lseek(fd, 0, os.SEEK_CUR)))
        if mode == self.LK_UNLCK:
            self.fcntl.flock(fd, self.fcntl.LOCK_UN)
            return
        try:
            self.fcntl.flock(fd, self.fcntl.LOCK_EX | self.fcntl.LOCK_NB)
        except BlockingIOError:
            raise OSError(errno.EACCES, "Permission denied") from None


@needs_flock
def test_without_fcntl_the_msvcrt_path_locks_one_byte_past_the_holders_text(tmp_path, monkeypatch):
    fake = _FakeMsvcrt(run_lock.fcntl)
    monkeypatch.setattr(run_lock, "fcntl", None)
    monkeypatch.setattr(run_lock, "msvcrt", fake)
    assert run_lock.lock_backend() == "msvcrt"
    lock = RunLock(tmp_path).acquire()
    assert fake.calls == [(fake.LK_NBLCK, 1, run_lock.WINDOWS_LOCK_OFFSET)]
    text = (tmp_path / LOCK_NAME).read_bytes()
    assert len(text) < run_lock.WINDOWS_LOCK_OFFSET and json.loads(text)["pid"] == os.getpid()  # readable
    other = RunLock(tmp_path)
    other._key = "another process"  # not this process's own lock again: the contention path
    with pytest.raises(RunFolderInUse, match=rf"in use by another run \(pid {os.getpid()} on "):
        other.acquire()
    assert fake.calls[-1] == (fake.LK_NBLCK, 1, run_lock.WINDOWS_LOCK_OFFSET)
    lock.release()
    assert fake.calls[-1] == (fake.LK_UNLCK, 1, run_lock.WINDOWS_LOCK_OFFSET)
    assert not (tmp_path / LOCK_NAME).exists()


def test_with_no_lock_module_the_run_goes_on_with_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(run_lock, "fcntl", None)
    monkeypatch.setattr(run_lock, "msvcrt", None)
    assert run_lock.lock_backend() is None
    lines: list[str] = []
    RunLock(tmp_path).acquire(log=lines.append)
    assert lines == [f"warning: {tmp_path / LOCK_NAME} cannot be locked: this Python has neither fcntl (POSIX) "
                     f"nor msvcrt (Windows) to lock files with; a second run started in {tmp_path} is not stopped"]
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    release_run_locks()
    assert not (tmp_path / LOCK_NAME).exists()


IMPORT_WITHOUT_POSIX = """
import sys, types
for name in ("fcntl", "termios", "pwd", "grp", "resource"):
    sys.modules[name] = None  # as on Windows: importing them fails
if sys.argv[1] == "msvcrt":
    fake = types.ModuleType("msvcrt")
    fake.LK_UNLCK, fake.LK_NBLCK = 0, 2
    fake.locking = lambda fd, mode, nbytes: None
    sys.modules["msvcrt"] = fake
import common.run_lock as m
print(m.lock_backend())
"""


@pytest.mark.parametrize("msvcrt", ["msvcrt", "none"])
def test_the_module_imports_without_fcntl(msvcrt):
    """A fresh interpreter (a reload here would replace the classes other modules hold) with the POSIX-only
    modules unavailable: the import works and picks msvcrt, or nothing."""
    res = subprocess.run([sys.executable, "-c", IMPORT_WITHOUT_POSIX, msvcrt], cwd=REPO, capture_output=True,
                         text=True, env=child_env(), timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == ("msvcrt" if msvcrt == "msvcrt" else "None")


def test_process_is_running_sends_no_signal(monkeypatch):
    """Kept for `common.atomic_write.remove_stale_temp_folders`; asks without os.kill(pid, 0)."""
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait(timeout=30)
    _no_pid_checks(monkeypatch)
    assert run_lock.process_is_running(os.getpid()) and run_lock.process_is_running(os.getppid())
    assert not run_lock.process_is_running(done.pid)  # reaped: gone (unless the pid was reused at once)
    assert not run_lock.process_is_running(10**30)
