"""The one way the project writes a file: whole or not at all, and a full disk is one line (exit 2).

Why: a kill or a full disk in the middle of a write used to leave a truncated wav, a partial .onnx or
a half-written cache entry that a later run took for a finished one, and a full disk gave a
traceback. Every output (checkpoints, prepared datasets, reports, manifests, wavs, images, ONNX files,
feature caches) is therefore written to a temp file beside its destination (same folder, same
filesystem) and renamed over it with `os.replace`, which is atomic. Whatever goes wrong, the temp file
is removed and the destination keeps its previous content (or stays absent). ENOSPC / EDQUOT become
`DiskFullError`, "disk full while writing FILE: N MiB free" — an `OutputPathError`, so every script
and trainer exits 2 with that one line. So does a short write that carries no errno (numpy's
`np.save`/`tofile`: "N requested and M written"): a full disk is a run error, never one file's problem.

The final file gets the mode a plain `open()` would give it (0666 & ~umask; a folder 0777 & ~umask),
not the 0600 of `tempfile.mkstemp`, so a shared machine's group (or a web server) can read checkpoints
and datasets as it reads everything else the user writes.

Temp names: a file `.<name>.<random>.tmp` (what `common.run_dir.remove_stale_temp_files` cleans up),
a folder `<name>.tmp<pid>` (a prepared item made of several files; `remove_stale_temp_folders` cleans those).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from common.errors import OutputPathError

MIB = 1024 * 1024


class DiskFullError(OutputPathError):
    """The disk (or the user's quota) filled up while a file was written; no partial file is left."""


class FileInUseError(OutputPathError):
    """Windows would not replace or remove a file another program holds open, for all of `IN_USE_WAIT_S`."""


# Windows refuses to replace or delete a file another process has open (TensorBoard reading an event file,
# an antivirus scanning a new checkpoint, a viewer on best.pt): such a hold is usually brief, so the rename
# is retried with backoff this long before one line says which file and what to close.
ON_WINDOWS = os.name == "nt"
IN_USE_WAIT_S = 10.0


def _retry_while_in_use(action, path: Path, what: str) -> None:
    """Runs `action()`; on Windows, a PermissionError (a file held open elsewhere) is retried with backoff."""
    delay, waited = 0.05, 0.0
    while True:
        try:
            action()
            return
        except PermissionError:
            if not ON_WINDOWS:
                raise
            if waited >= IN_USE_WAIT_S:
                raise FileInUseError(f"cannot {what} {path}: another program holds it open (Windows cannot "
                                     f"{what} an open file); close it (TensorBoard, a viewer, a sync tool) and "
                                     f"run again") from None
            time.sleep(delay)
            waited += delay
            delay = min(2 * delay, 1.0)


def replace(src: str | Path, dst: str | Path) -> None:
    """`os.replace`, waiting out a brief hold on `dst` by another program on Windows."""
    _retry_while_in_use(lambda: os.replace(src, dst), Path(dst), "replace")


def remove(path: str | Path) -> None:
    """`unlink(missing_ok=True)`, waiting out a brief hold by another program on Windows."""
    _retry_while_in_use(lambda: Path(path).unlink(missing_ok=True), Path(path), "remove")


def free_mib(path: str | Path) -> float:
    """Free space on the filesystem holding `path` (or its nearest existing parent), in MiB."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free / MIB
    except OSError:
        return float("nan")



# numpy's C writer (`ndarray.tofile`, which `np.save` uses on a real file) reports a short fwrite as
# OSError("%ld requested and %ld written") with no errno: on a local disk that is a full disk (or quota).
_SHORT_WRITE = re.compile(r"\d+ requested and \d+ written")


def is_disk_full(exc: BaseException) -> bool:
    """ENOSPC / EDQUOT as Python sees it anywhere in the exception chain, a short write as numpy reports it
    ("N requested and M written", no errno), or as a C++ writer reports it (torch's zip writer:
    "enforce fail ... unexpected pos"; "No space left on device")."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and (e.errno in (errno.ENOSPC, errno.EDQUOT)
                                       or (e.errno is None and _SHORT_WRITE.search(str(e)))):
            return True
        if isinstance(e, RuntimeError) and ("unexpected pos" in str(e) or "No space left" in str(e)):
            return True
        e = e.__cause__ or e.__context__
    return False


def current_umask() -> int:
    """The process's umask. Linux reads it from /proc (no change, safe beside other threads); elsewhere it is
    set and restored at once, which a thread creating a file in that instant would see (umask 022 there)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def set_plain_mode(path: str | Path, folder: bool = False) -> None:
    """Gives `path` the mode a plain `open()` (`mkdir()`) would have: 0666 (0777) & ~umask. Not on Windows
    (mkstemp's mode means nothing there and chmod only sets read-only, which would block a later rotation);
    where chmod fails (a mount without permissions) the file stays as it is."""
    if ON_WINDOWS:
        return
    try:
        os.chmod(path, (0o777 if folder else 0o666) & ~current_umask())
    except (OSError, NotImplementedError):
        pass


def disk_full(path: str | Path, note: str = "") -> DiskFullError:
    """The one message for a full disk: which file, how much room is left, `note` (e.g. what is intact)."""
    path = Path(path)
    return DiskFullError(f"disk full while writing {path}: {free_mib(path.parent):.0f} MiB free{note}")


@contextmanager
def atomic_output(path: str | Path, folder: bool = False, fsync: bool = False, note: str = "") -> Iterator[Path]:
    """Yields a temp path beside `path` to write to; when the block ends without an error the temp
    file (or, with `folder`, the temp folder) replaces `path`. On any error the temp is removed and
    `path` keeps its previous content; a full disk raises `DiskFullError` (with `note` appended).
    `fsync` flushes the file to the disk before the rename (checkpoints: a power cut keeps either
    the old or the new file). A destination that exists but is no regular file (/dev/stdout, a pipe,
    a device) is written directly: renaming over it would replace the device itself. A folder where a file
    is to go (a run folder's `config.yaml` made a folder) is refused in one line before anything is written
    (OutputPathError, exit 2): os.replace would fail only after the work."""
    path = Path(path)
    tmp: Path | None = None
    if not folder and path.is_dir():
        raise OutputPathError(f"{path} is a folder, where a file of that name is written; move the folder aside "
                              "(or remove it) and run again")
    if not folder and path.exists() and not path.is_file() and not path.is_dir():
        try:
            yield path
        except BaseException as exc:
            if is_disk_full(exc):
                raise disk_full(path, note) from None
            raise
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if folder:
            tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        else:
            fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            os.close(fd)
            tmp = Path(name)
        yield tmp
        set_plain_mode(tmp, folder)  # mkstemp made 0600 (and so might a writer's own temp file): as open() would
        if fsync and not folder:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        if folder and path.is_dir():
            shutil.rmtree(path)
        replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            if tmp.is_dir():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                tmp.unlink(missing_ok=True)
        if is_disk_full(exc):
            raise disk_full(path, note) from None
        raise


def write_bytes(path: str | Path, data: bytes) -> Path:
    """`data` into `path`, atomically (see `atomic_output`)."""
    with atomic_output(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    """`text` into `path`, atomically (see `atomic_output`)."""
    return write_bytes(path, text.encode(encoding))


def save_png(image, path: str | Path, **options) -> Path:
    """A PIL image (or an HxWx3 uint8 array) as a PNG at `path`, atomically (see `atomic_output`);
    `options` go to PIL's PNG writer."""
    from PIL import Image  # only the image writers need PIL

    if not isinstance(image, Image.Image):
        image = Image.fromarray(image)
    with atomic_output(path) as tmp:
        image.save(tmp, format="PNG", **options)
    return Path(path)


def _write_all(fd: int, data: bytes) -> None:
    """`os.write` until every byte is out (one place for tests to fill the disk)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def append_text(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    """`text` appended to `path`: for a log that grows one line at a time and is never rewritten
    (metrics.jsonl). An append cannot be a rename, so on a full disk the file is cut back to its size
    before the append (no half line for a reader to choke on) and DiskFullError is raised."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)  # & ~umask, as open() does
    try:
        start = os.fstat(fd).st_size
        try:
            _write_all(fd, text.encode(encoding))
        except OSError as exc:
            if is_disk_full(exc):
                os.ftruncate(fd, start)
                raise disk_full(path) from None
            raise
    finally:
        os.close(fd)
    return path


def remove_stale_temp_folders(folder: str | Path, log=print) -> list[Path]:
    """Removes `<name>.tmp<pid>` folders that `atomic_output(folder=True)` of a process no longer
    running left in `folder` (a kill or a crash mid-write); those of live processes are kept."""
    from common.run_lock import process_is_running

    removed = []
    d = Path(folder)
    for p in sorted(d.glob("*.tmp[0-9]*")) if d.is_dir() else []:
        pid = p.name.rsplit(".tmp", 1)[1]
        if p.is_dir() and pid.isdigit() and (int(pid) == os.getpid() or not process_is_running(int(pid))):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    if removed:
        log(f"removed {len(removed)} unfinished item folder(s) left by an interrupted run in {d}")
    return removed
