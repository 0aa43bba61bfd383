"""One owner per run folder: the lock a training run holds from start to exit.

Why: two trainings started in the same run folder used to both run, and the second silently
overwrote the first's checkpoints and `config.yaml`; the "used folder" check runs only at start and
real runs save hours apart. So a run holds `<run_dir>/run.lock` for its whole life:

- the lock is the operating system's: an exclusive advisory lock on `run.lock`, held through a file
  descriptor kept open for the run's life (`fcntl.flock(LOCK_EX | LOCK_NB)` on POSIX,
  `msvcrt.locking(LK_NBLCK)` on Windows). The system releases it the moment its process dies (a
  kill -9, a crash), so no pid is ever asked whether it still runs: a pid is reused, belongs to another
  machine on a shared disk, and on Windows `os.kill(pid, 0)` would send the holder CTRL_C_EVENT;
- the file holds the pid, host, start time and command line of its owner as JSON, written after the
  lock is taken, so that a second run on the folder stops with exit 2 and names the holder;
- a file left by a run that is gone has a free lock: it is simply taken, with one line naming that run;
  so is one that names no run (empty, cut short by a kill or a full disk, garbage, a pid past 2**31):
  its content never decides, the free lock does, and no file ever needs removing by hand;
- except a file that names a run on another host while its lock is free here: refused with the
  instruction to remove it when that run is over (file locks do not reach across machines on every
  shared file system);
- where no lock can be had (neither `fcntl` nor `msvcrt`, or a file system that refuses locks) the run
  goes on with one line saying that the folder is not guarded;
- under torchrun only rank 0 takes it (the caller decides);
- released at exit: by the trainer's `main` (`common.exit_codes.run_main`), at interpreter exit, and
  on SIGTERM outside the training loop (under `run_main` that is its one line and exit 130; a trainer
  used without `run_main` exits normally with status 143); inside the loop the trainer's own
  SIGINT/SIGTERM handling saves and returns normally, which releases it too.

On Windows the locked byte lies at `WINDOWS_LOCK_OFFSET` (1 GiB), far past the JSON: its byte-range locks
are mandatory and would block other processes from reading the holder's name in a locked range.
A process forked while holding the lock (e.g. DataLoader workers) shares it until it exits too.

The lock file is opened without following links (`O_NOFOLLOW`; on Windows, which has no such flag, `os.lstat`
looks first) and without blocking (`O_NONBLOCK`: a FIFO would wait for a writer forever), and anything but a
regular file there (a link, a folder, a FIFO, a device) is refused in one line naming it (`LockFileError`,
exit 2): a `run.lock` linked to another file must never make the run write its holder's line into that file.
"""

from __future__ import annotations

import atexit
import errno
import json
import os
import signal
import socket
import stat
import sys
import time
from pathlib import Path

from common.errors import ConfigError, file_kind

try:  # POSIX
    import fcntl
except ImportError:  # Windows
    fcntl = None
try:  # Windows
    import msvcrt
except ImportError:  # POSIX
    msvcrt = None

LOCK_NAME = "run.lock"
MAX_LOCK_BYTES = 1 << 20  # what is read of a lock file
WINDOWS_LOCK_OFFSET = 1 << 30  # the byte msvcrt.locking locks; beyond EOF is allowed, and < 2**31 for _locking
# "another process holds it": flock says EWOULDBLOCK, msvcrt's LK_NBLCK EACCES (EDEADLOCK after retries)
_HELD_ERRNOS = {e for e in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES, getattr(errno, "EDEADLK", None),
                            getattr(errno, "EDEADLOCK", None)) if e is not None}


class RunFolderInUse(ConfigError):
    """Another run holds the run folder (exit 2); the message names it and what to do."""


class LockFileError(ConfigError):
    """`run.lock` is there but is no regular file (a link, a folder, a FIFO): refused, never opened (exit 2)."""


class _NoLock(Exception):
    """This platform or file system gives no lock; the message says why."""


def lock_backend() -> str | None:
    """How the lock is taken here: "flock" (POSIX), "msvcrt" (Windows), or None (neither module exists)."""
    if fcntl is not None:
        return "flock"
    if msvcrt is not None:
        return "msvcrt"
    return None


def _try_lock(fd: int) -> bool:
    """Takes the exclusive lock on `fd` without waiting: True, or False when another open file holds it."""
    backend = lock_backend()
    try:
        if backend == "flock":
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        elif backend == "msvcrt":
            os.lseek(fd, WINDOWS_LOCK_OFFSET, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        else:
            raise _NoLock("this Python has neither fcntl (POSIX) nor msvcrt (Windows) to lock files with")
    except OSError as exc:
        if exc.errno in _HELD_ERRNOS:
            return False
        raise _NoLock(f"the file system refuses a lock on it ({exc.strerror or exc})") from None
    return True


def _unlock(fd: int) -> None:
    backend = lock_backend()
    if backend == "flock":
        fcntl.flock(fd, fcntl.LOCK_UN)
    elif backend == "msvcrt":
        os.lseek(fd, WINDOWS_LOCK_OFFSET, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)


def process_is_running(pid: int) -> bool:
    """Whether a process `pid` exists on this host: a guess (pids are reused) that the run lock never makes;
    `common.atomic_write.remove_stale_temp_folders` uses it for folders named by pid. No signal is sent
    (on Windows `os.kill(pid, 0)` is CTRL_C_EVENT)."""
    if os.name == "nt":
        return _windows_process_exists(pid)
    try:
        os.getpgid(pid)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    except (OverflowError, ValueError):  # not a pid
        return False
    return True


def _windows_process_exists(pid: int) -> bool:
    import ctypes
    from ctypes import wintypes

    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    kernel32.OpenProcess.restype = wintypes.HANDLE
    kernel32.OpenProcess.argtypes = (wintypes.DWORD, wintypes.BOOL, wintypes.DWORD)
    kernel32.GetExitCodeProcess.argtypes = (wintypes.HANDLE, ctypes.POINTER(wintypes.DWORD))
    kernel32.CloseHandle.argtypes = (wintypes.HANDLE,)
    if not 0 < pid < 2**32:
        return False
    handle = kernel32.OpenProcess(0x1000, False, pid)  # PROCESS_QUERY_LIMITED_INFORMATION
    if not handle:
        return ctypes.get_last_error() == 5  # ERROR_ACCESS_DENIED: it exists
    try:
        code = wintypes.DWORD()
        return not kernel32.GetExitCodeProcess(handle, ctypes.byref(code)) or code.value == 259  # STILL_ACTIVE
    finally:
        kernel32.CloseHandle(handle)


def _short(value: object, limit: int = 40) -> str:
    text = str(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _describe(holder: dict) -> str:
    return (f"pid {_short(holder.get('pid'))} on {_short(holder.get('host'))}, "
            f"started {_short(holder.get('started'))}" + (f": {holder['command']}" if holder.get("command") else ""))


def _parse(text: str) -> dict | None:
    """The holder a lock file names (a JSON object with a `host`; its pid is only shown, never asked
    about); None for an empty file; {} for anything else (a file cut short, garbage, not ours)."""
    if not text.strip():
        return None
    try:
        holder = json.loads(text)
    except (ValueError, RecursionError):  # not JSON (or an int past Python's digit limit, or nested too deep)
        return {}
    return holder if isinstance(holder, dict) and isinstance(holder.get("host"), str) and holder["host"] else {}


def _read(path: Path, wait_s: float = 2.0) -> dict | None:
    """The holder named by the lock file of another process; one it is still writing is read again for up
    to `wait_s`. None when the file is gone; {} when it never names a holder."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fd = _open_lock_file(path, os.O_RDONLY)
            try:
                holder = _parse(_read_fd(fd))
            finally:
                os.close(fd)
        except FileNotFoundError:
            return None
        except (OSError, LockFileError):
            holder = {}
        if holder or time.monotonic() > deadline:
            return holder or {}
        time.sleep(0.1)


def _not_regular(path: Path, mode: int) -> LockFileError:
    return LockFileError(f"{path} is {file_kind(mode)}, not a lock file this code wrote; the run refuses to open it: remove it "
                         f"(the run makes its own {LOCK_NAME}) and run again")


def _open_lock_file(path: Path, flags: int) -> int:
    """`os.open(path, flags)` of a regular file only, never through a link and never blocking: where the
    system has `O_NOFOLLOW` it refuses a link itself (ELOOP); without it (Windows) `os.lstat` looks first.
    `O_NONBLOCK` keeps a FIFO from waiting; whatever was opened is checked with `fstat` before it is used."""
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise _not_regular(path, st.st_mode)
    try:
        fd = os.open(path, flags | nofollow | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0), 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP or isinstance(exc, IsADirectoryError):  # it became a link or folder meanwhile
            raise _not_regular(path, os.lstat(path).st_mode) from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _not_regular(path, mode)
    return fd


def _read_fd(fd: int) -> str:
    """The lock file's text (its first MAX_LOCK_BYTES: ours is one short line; more is not ours anyway)."""
    os.lseek(fd, 0, os.SEEK_SET)
    chunks, size = [], 0
    while size < MAX_LOCK_BYTES and (chunk := os.read(fd, min(1 << 16, MAX_LOCK_BYTES - size))):
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")


class RunLock:
    """The lock of one run folder, held by this process until `release()`."""

    _held: dict[str, RunLock] = {}

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / LOCK_NAME
        self.holder = {"pid": os.getpid(), "host": socket.gethostname(),
                       "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                       "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv else ""}
        self._key = os.path.normcase(os.path.realpath(self.path))
        self._fd: int | None = None
        self._old_sigterm = None

    # ------------------------------------------------------------------ taking it
    def acquire(self, flag: str = "--run_dir", log=print) -> RunLock:
        """Takes the lock or raises RunFolderInUse; a file left by a run that is gone is taken with one line."""
        mine = RunLock._held.get(self._key)
        if mine is not None and mine is not self and mine._fd is not None and mine.holder["pid"] == os.getpid():
            # this process holds it already (a run called in-process): this lock takes its descriptor over
            self._fd, mine._fd = mine._fd, None
            self._old_sigterm, mine._old_sigterm = mine._old_sigterm, None
            self._write_holder()
            self._on_exit_release()
            return self
        for _ in range(5):  # the holder may release (and remove the file) while we look: try again
            fd = _open_lock_file(self.path, os.O_RDWR | os.O_CREAT)
            try:
                taken = _try_lock(fd)
            except _NoLock as why:
                log(f"warning: {self.path} cannot be locked: {why}; a second run started in {self.path.parent} "
                    "is not stopped")
                self._fd = fd
                self._write_holder()
                self._on_exit_release()
                return self
            if not taken:
                os.close(fd)
                holder = _read(self.path)
                if holder is None:  # released between our try and the read
                    continue
                who = f" ({_describe(holder)})" if holder else f" (its {LOCK_NAME} does not say which)"
                raise RunFolderInUse(f"{self.path.parent} is in use by another run{who}; "
                                     f"wait for it to end, stop it, or choose another {flag}")
            if not self._same_file(fd):  # its holder released and removed it after we opened it
                _unlock(fd)
                os.close(fd)
                continue
            try:
                text = _read_fd(fd)
                previous = _parse(text)
                self._check_previous(previous, flag)
            except BaseException:
                _unlock(fd)
                os.close(fd)
                raise
            self._fd = fd
            self._write_holder()
            self._on_exit_release()
            if previous:
                log(f"taking over the lock of {self.path.parent}: its run ({_describe(previous)}) is gone")
            elif text.strip():  # cut short by a kill or a full disk, or garbage: no run holds it, so it is ours
                log(f"taking over the lock of {self.path.parent}: its {LOCK_NAME} named no run (not a lock this "
                    "code wrote, or one cut short) and no run holds it")
            return self
        raise RunFolderInUse(f"{self.path.parent}: other runs keep taking its lock; choose another {flag}")

    def _check_previous(self, previous: dict | None, flag: str) -> None:
        """Refuses a free lock whose file names a run on another host (file locks may not reach across
        machines). Any other free lock is this run's, whatever its file holds (empty, cut short, garbage)."""
        if previous and previous["host"] != self.holder["host"]:
            raise RunFolderInUse(f"{self.path.parent} is locked by a run on another host ({_describe(previous)}); "
                                 f"its lock is free here, but file locks do not reach across machines on every "
                                 f"shared file system, so this machine cannot tell whether it still runs. If it has "
                                 f"finished, remove {self.path} and start again; otherwise choose another {flag}")

    def _same_file(self, fd: int) -> bool:
        """Whether `self.path` still names the file open as `fd` (not removed, nor replaced since)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        fst = os.fstat(fd)
        return (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino)

    def _write_holder(self) -> None:
        data = (json.dumps(self.holder) + "\n").encode()
        os.lseek(self._fd, 0, os.SEEK_SET)
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]
        os.ftruncate(self._fd, len(data))
        os.fsync(self._fd)

    # ------------------------------------------------------------------ giving it back
    def release(self) -> None:
        """Removes the lock file if it is still ours (never another run's) and gives the lock back."""
        if RunLock._held.get(self._key) is self:
            del RunLock._held[self._key]
        if self._old_sigterm is not None and signal.getsignal(signal.SIGTERM) is _exit_on_sigterm:
            try:
                signal.signal(signal.SIGTERM, self._old_sigterm)
            except ValueError:  # not the main thread
                pass
        self._old_sigterm = None
        fd, self._fd = self._fd, None
        if fd is None:
            return
        if self.holder["pid"] != os.getpid():  # a forked child: the lock stays its parent's
            os.close(fd)
            return
        ours = removed = False
        try:
            ours = self._same_file(fd)
            if ours:
                try:
                    self.path.unlink()  # POSIX: while still locked, so no run locks the removed file
                    removed = True
                except PermissionError:  # Windows: an open file cannot be removed; emptied, removed below
                    os.ftruncate(fd, 0)
        finally:
            try:
                _unlock(fd)
            except OSError:
                pass
            os.close(fd)
        if ours and not removed:
            try:
                self.path.unlink()
            except OSError:  # another run has opened it meanwhile: it is theirs now
                pass

    def _on_exit_release(self) -> None:
        RunLock._held[self._key] = self
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
