"""One owner per run folder: the lock a training run holds from start to exit.

Why: two trainings started in the same run folder used to both run, and the second silently
overwrote the first's checkpoints and `config.yaml`; the "used folder" check runs only at start and
real runs save hours apart. So a run holds `<run_dir>/run.lock` for its whole life:

- created atomically (`O_CREAT | O_EXCL`: of two runs starting together exactly one gets it), holding
  the pid, host, start time and command line of its owner as JSON;
- a second run on the folder stops with exit 2 and names the holder;
- a lock whose process is gone on this host (a kill -9, a power cut) is stale: it is taken over with
  one line. A pid the system has since given to another process does not count as the holder (the
  process start time recorded beside it differs);
- a lock written on another host cannot be checked from here: it is refused with the instruction to
  remove it when that run is over;
- under torchrun only rank 0 takes it (the caller decides);
- released at exit: by the trainer's `main` (`common.exit_codes.run_main`), at interpreter exit, and
  on SIGTERM outside the training loop (under `run_main` that is its one line and exit 130; a trainer
  used without `run_main` exits normally with status 143); inside the loop the trainer's own
  SIGINT/SIGTERM handling saves and returns normally, which releases it too.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

from common.errors import ConfigError

LOCK_NAME = "run.lock"


class RunFolderInUse(ConfigError):
    """Another run holds the run folder (exit 2); the message names it and what to do."""


def _process_start(pid: int) -> str | None:
    """When `pid` started, in clock ticks since boot (/proc), or None where /proc does not tell."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22 of proc(5); the name before ")" may hold spaces


def process_is_running(pid: int, started: str | None = None) -> bool:
    """Whether process `pid` of this host runs (and, given `started` from `_process_start`, is still the
    process that had that pid then)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        pass
    now = _process_start(pid)
    return started is None or now is None or now == started


def _describe(holder: dict) -> str:
    return (f"pid {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}"
            + (f": {holder['command']}" if holder.get("command") else ""))


def _read(path: Path, wait_s: float = 2.0) -> dict | None:
    """The lock's content; a lock its owner is still writing is read again for up to `wait_s`.
    None when the file is gone; {} when it never becomes a lock this module wrote."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            holder = json.loads(path.read_text())
            if isinstance(holder, dict) and isinstance(holder.get("pid"), int) and holder.get("host"):
                return holder
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            return {}
        time.sleep(0.1)


class RunLock:
    """The lock of one run folder, held by this process until `release()`."""

    _held: dict[Path, RunLock] = {}

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / LOCK_NAME
        self.holder = {"pid": os.getpid(), "host": socket.gethostname(),
                       "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "process_start": _process_start(os.getpid()),
                       "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv else ""}
        self._old_sigterm = None

    # ------------------------------------------------------------------ taking it
    def acquire(self, flag: str = "--run_dir", log=print) -> RunLock:
        """Takes the lock or raises RunFolderInUse; a stale lock is taken over with one line."""
        for _ in range(3):  # another starter may win each race; three rounds settle it
            if self._create():
                self._on_exit_release()
                return self
            holder = _read(self.path)
            if holder is None:  # released between our try and the read: try again
                continue
            if not holder:
                raise RunFolderInUse(f"{self.path} exists but is not a lock this code wrote, so this run cannot "
                                     f"tell who owns {self.path.parent}; if no run uses that folder, remove "
                                     f"{self.path} and start again (or choose another {flag})")
            if holder["host"] != self.holder["host"]:
                raise RunFolderInUse(f"{self.path.parent} is locked by a run on another host ({_describe(holder)}); "
                                     f"this machine cannot tell whether it still runs. If it has finished, remove "
                                     f"{self.path} and start again; otherwise choose another {flag}")
            if holder["pid"] == self.holder["pid"]:  # this process took it before (a run called in-process)
                self._write_over()
                self._on_exit_release()
                return self
            if process_is_running(holder["pid"], holder.get("process_start")):
                raise RunFolderInUse(f"{self.path.parent} is in use by another run ({_describe(holder)}); "
                                     f"wait for it to end, stop it, or choose another {flag}")
            if self._take_over(holder):
                log(f"taking over the lock of {self.path.parent}: its run ({_describe(holder)}) is gone")
                self._on_exit_release()
                return self
        raise RunFolderInUse(f"{self.path.parent}: other runs keep taking its lock; choose another {flag}")

    def _create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(self.holder) + "\n")
            f.flush()
            os.fsync(f.fileno())
        return True

    def _write_over(self) -> None:
        tmp = self.path.with_name(f".{LOCK_NAME}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.holder) + "\n")
        os.replace(tmp, self.path)

    def _take_over(self, stale: dict) -> bool:
        """Moves the stale lock aside (one rename: of two takers only one moves it) and creates ours."""
        aside = self.path.with_name(f".{LOCK_NAME}.stale.{os.getpid()}.tmp")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return False
        if _read(aside, wait_s=0) != stale:  # another starter's fresh lock, not the stale one: put it back
            os.rename(aside, self.path)
            return False
        aside.unlink(missing_ok=True)
        return self._create()

    # ------------------------------------------------------------------ giving it back
    def release(self) -> None:
        """Removes the lock file if it is still ours (never another run's)."""
        RunLock._held.pop(self.path, None)
        if self._old_sigterm is not None and signal.getsignal(signal.SIGTERM) is _exit_on_sigterm:
            try:
                signal.signal(signal.SIGTERM, self._old_sigterm)
            except ValueError:  # not the main thread
                pass
        self._old_sigterm = None
        holder = _read(self.path, wait_s=0)
        if holder and holder.get("pid") == self.holder["pid"] and holder.get("host") == self.holder["host"]:
            self.path.unlink(missing_ok=True)

    def _on_exit_release(self) -> None:
        RunLock._held[self.path] = self
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # a plain kill would skip every cleanup
            try:
                self._old_sigterm = signal.signal(signal.SIGTERM, _exit_on_sigterm)
            except ValueError:  # not the main thread
                pass


def _exit_on_sigterm(signum, frame) -> None:  # noqa: ARG001
    raise SystemExit(128 + signal.SIGTERM)


def release_run_locks() -> None:
    """Releases every run-folder lock this process holds (a trainer's exit; also at interpreter exit)."""
    for lock in list(RunLock._held.values()):
        lock.release()


atexit.register(release_run_locks)
