"""The run-folder contract every trainer and script shares: never lose a run.

Why these rules:
- A re-run in a folder that already holds checkpoints is refused unless the user says what they want:
  `--resume auto` continues that run, `--overwrite` starts over and moves the old files aside (into
  `<run_dir>/overwritten-<time>/`), so nothing is ever deleted silently.
- An output location is checked before any work starts (it is a folder or can be made one, it is
  writable, there is room for one checkpoint when that size is known), so a bad path is one line and
  exit 2 instead of a traceback an hour into training.
- Temp files left by a kill in the middle of an atomic save (`.model_00000006.pt.<rand>.tmp`) are
  removed when that run starts again.
- An output folder never overlaps an input (`check_apart`): one that is, contains or lies inside the
  audio/image/data folder would overwrite the user's files, or move them into `overwritten-*/` on
  `--overwrite`; it is refused before anything is written (exit 2), naming both.
- A run folder has one owner: the main rank takes `<run_dir>/run.lock` (`common.run_lock`) before it
  changes anything there and holds it until the process exits, so a second run on the same folder
  stops at once (exit 2, naming the first) instead of overwriting its checkpoints hours later.
"""

from __future__ import annotations

import argparse
import errno
import os
import shutil
import tempfile
import time
from pathlib import Path

from common.atomic_write import MIB, free_mib
from common.distributed import launched_as_rank0
from common.errors import OutputPathError
from common.run_lock import LOCK_NAME, RunLock


class _RunFolder(argparse.Action):
    """Stores the run folder and, in `run_flag`, the spelling the user typed (--run_dir or an alias),
    so that messages about the folder name the flag the user knows."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        namespace.run_flag = option_string


def add_run_args(p: argparse.ArgumentParser, run_aliases: tuple[str, ...] = (), resume_aliases: tuple[str, ...] = (),
                 run_dest: str = "run_dir", run_help: str = "run folder: checkpoints, logs, config") -> None:
    """The one spelling of the run flags every trainer takes: --run_dir, --resume, --init_from,
    --overwrite (plus the aliases a trainer's guide already uses, e.g. --output_dir). `args.run_flag` is
    the spelling of the run-folder flag the user typed (the guide's alias, or --run_dir, when none was)."""
    p.add_argument("--run_dir", *run_aliases, dest=run_dest, default=None, help=run_help, action=_RunFolder)
    p.set_defaults(run_flag=run_aliases[0] if run_aliases else "--run_dir")
    p.add_argument("--resume", *resume_aliases, dest="resume", default=None,
                   help="'auto' (the newest intact checkpoint of the run folder, if any) or a checkpoint path")
    p.add_argument("--init_from", default=None,
                   help="start a new run from these weights only (mismatched layers re-initialised and listed)")
    p.add_argument("--overwrite", action="store_true",
                   help="start over in a used run folder; its old files are moved into <run_dir>/overwritten-<time>/")


def _existing_parent(path: Path) -> Path:
    p = path
    while not p.exists() and not p.is_symlink() and p != p.parent:
        p = p.parent
    return p


def _same_place(a: Path, b: Path) -> bool:
    """`a` and `b` name one file or folder: the same inode where both exist (a symlink, a bind mount, another
    case on a case-insensitive disk), else the same absolute path."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.normcase(str(a)) == os.path.normcase(str(b))


def is_within(path: str | Path, folder: str | Path) -> bool:
    """`path` is `folder` or lies somewhere under it (symlinks followed; `path` need not exist yet)."""
    p, f = Path(path).resolve(), Path(folder).resolve()
    return any(_same_place(q, f) for q in (p, *p.parents))


def outside(files: list[Path], folder: str | Path) -> list[Path]:
    """The files that lead outside `folder` (an absolute or `..` path, or a link to elsewhere). A preparation
    reads only what lies inside the folders it was given: a link or a metadata line must not pull in any
    file the user can read (round 3 of the reliability probes)."""
    return [f for f in files if not is_within(f, folder)]


def check_apart(output: str | Path, flag: str, inputs: dict[str, str | Path | list | tuple | None],
                suffix: str = "_prepared", doing: str = "writing there") -> None:
    """OutputPathError (exit 2) when the output folder `output` (the user's `flag`) is, contains or lies
    inside any existing input of `inputs` ({flag: path or paths}; a file counts when `output` contains it,
    e.g. the metadata file with outputs written next to it; `output` may be a file, e.g. a script's output wav that
    is its input): writing there would overwrite the user's files, and `--overwrite` would replace them or move
    them into `overwritten-*/`. Call it before anything is written."""
    out = Path(output)
    for in_flag, value in inputs.items():
        for given in (value if isinstance(value, (list, tuple)) else [value]):
            if not given or not Path(given).exists():
                continue  # a missing input is the caller's own message; nothing of it can be harmed
            inp = Path(given)
            if is_within(inp, out):
                how, outer = ("is" if is_within(out, inp) else "contains"), out
            elif is_within(out, inp):
                how, outer = "is inside", inp
            else:
                continue
            outer = outer.resolve()
            if outer.is_file():  # an output file that is the input file (an export's or inference's): a name beside it
                where = f"choose another name, e.g. {outer.with_name(outer.stem + suffix + outer.suffix)}"
            else:
                where = "choose a separate folder" + (f", e.g. {outer.parent / (outer.name + suffix)}" if outer.name else "")
            raise OutputPathError(f"{flag} {out} {how} {in_flag} {inp}: {doing} would overwrite or mix with your files, "
                                  f"and --overwrite would replace them or move them aside; {where} "
                                  "(inputs are never modified)")


def check_output_dir(path: str | Path, flag: str = "--run_dir", need_bytes: int | None = None) -> Path:
    """`path` is (or is made) a writable folder with room for `need_bytes`; else OutputPathError.

    Writes and removes one probe file, because permission bits alone do not tell (read-only mounts,
    /proc, a full disk)."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise OutputPathError(f"{flag} {p}: this is an existing file, not a folder; give a folder path")
    parent = _existing_parent(p)
    if not parent.is_dir():
        raise OutputPathError(f"{flag} {p}: {parent} is a file, so no folder can be made under it; "
                              "give another path")
    try:
        p.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write_probe.", suffix=".tmp", dir=p)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(b"0")
                f.flush()
                os.fsync(f.fileno())
        finally:
            Path(probe).unlink(missing_ok=True)
    except OSError as exc:
        reason = "the disk is full" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
        raise OutputPathError(f"{flag} {p}: cannot write there ({reason}); give a writable folder") from None
    if need_bytes:
        free = free_mib(p)
        if free == free and free * MIB < need_bytes:
            raise OutputPathError(f"{flag} {p}: only {free:.0f} MiB free, but one checkpoint needs about "
                                  f"{need_bytes / MIB:.0f} MiB; free some space or choose another folder")
    return p


def check_output_file(path: str | Path, flag: str = "--output_file") -> Path:
    """`path` can be written as a file: not a folder, its folder writable; a device such as
    /dev/full is probed by writing to it."""
    p = Path(path)
    if p.is_dir():
        raise OutputPathError(f"{flag} {p}: this is a folder; give a file name (e.g. {p / 'out'}{p.suffix or ''})")
    if p.exists() and not p.is_file():  # a device or a pipe: the only honest test is a write
        try:
            with open(p, "ab") as f:
                f.write(b"\n")
                f.flush()
        except OSError as exc:
            reason = "the device is full" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
            raise OutputPathError(f"{flag} {p}: cannot write there ({reason}); give a regular file path") from None
        return p
    check_output_dir(p.parent if str(p.parent) else Path("."), flag=f"{flag} {p}: its folder")
    return p


def remove_stale_temp_files(*folders: str | Path, log=print) -> list[Path]:
    """Deletes temp files an interrupted atomic save left behind (`.<name>.<rand>.tmp`, `*.json.tmp`)."""
    removed = []
    for folder in folders:
        d = Path(folder)
        if not d.is_dir():
            continue
        for f in sorted(d.iterdir()):
            if f.is_file() and f.name.endswith(".tmp") and (f.name.startswith(".") or f.name.endswith(".json.tmp")):
                f.unlink(missing_ok=True)
                removed.append(f)
    if removed:
        log(f"removed {len(removed)} temp file(s) left by an interrupted save: "
            + ", ".join(f.name for f in removed))
    return removed


def existing_checkpoints(ckpt_dir: str | Path) -> list[Path]:
    d = Path(ckpt_dir)
    return sorted(p for p in d.glob("*.pt") if p.is_file()) if d.is_dir() else []


def prepare_run_dir(run_dir: str | Path, ckpt_dir: str | Path | None = None, resume: str | None = None,
                    overwrite: bool = False, init_from: str | None = None, need_bytes: int | None = None,
                    keep: tuple[str, ...] = (), is_main: bool | None = None, run_flag: str = "--run_dir",
                    log=print, inputs: dict[str, str | Path | list | tuple | None] | None = None) -> Path:
    """The start of every training run (call on every rank; the others only check the flags: the main
    rank alone looks at and changes the folder, and `setup_distributed` holds them until it has).

    Checks the folder is writable (with room for one more checkpoint as large as the newest there),
    removes stale temp files, refuses a used folder without `--resume`/`--overwrite` (OutputPathError, exit 2) and, with `--overwrite`, moves everything in it
    except `keep` (e.g. a feature cache) and earlier `overwritten-*` folders into
    `<run_dir>/overwritten-<time>/`. A run folder that is, contains or lies inside one of `inputs` (the
    data the trainer reads, {flag: path or paths}, e.g. {"--data_dir": cfg.data_dir}) is refused before it
    is touched (`check_apart`): `--overwrite` would move the dataset aside. The main rank holds the folder's lock (`common.run_lock`) from here
    until the process exits; another run holding it is RunFolderInUse (exit 2).
    Returns the folder the old files went to, or `run_dir`."""
    run_dir = Path(run_dir)
    ckpt_dir = Path(ckpt_dir) if ckpt_dir is not None else run_dir
    if resume and resume != "auto" and overwrite:  # (`--resume auto --overwrite`: overwrite wins, launchers add auto)
        raise OutputPathError(f"--resume {resume} and --overwrite exclude each other: --resume continues a run, "
                              f"--overwrite starts a new one in {run_dir}")
    if resume and resume != "auto" and init_from:  # (`--resume auto --init_from`: said below when a run is there)
        raise OutputPathError(f"--resume {resume} and --init_from exclude each other: --resume continues a run, "
                              f"--init_from starts a new one from {init_from}'s weights")
    if inputs:  # every rank: a pure path check, so all of them stop together
        check_apart(run_dir, run_flag, inputs, suffix="_runs", doing="training there")
    if is_main is None:  # before the process group exists
        is_main = launched_as_rank0()
    if not is_main:  # nothing to look at: rank 0 alone writes here, and may be moving the folder aside now
        return run_dir
    found = existing_checkpoints(ckpt_dir)
    if need_bytes is None and found:  # one more checkpoint of the size the run already writes
        need_bytes = max(p.stat().st_size for p in found)
    check_output_dir(run_dir, run_flag, need_bytes)
    lock = RunLock(run_dir).acquire(run_flag, log=log)  # before any file here changes; held until exit
    try:
        return _start_in(run_dir, ckpt_dir, found, resume, overwrite, init_from, keep, log)
    except BaseException:
        lock.release()
        raise


def _start_in(run_dir: Path, ckpt_dir: Path, found: list[Path], resume: str | None, overwrite: bool,
              init_from: str | None, keep: tuple[str, ...], log) -> Path:
    """The main rank's part of `prepare_run_dir`, under the run folder's lock."""
    remove_stale_temp_files(run_dir, ckpt_dir, log=log)
    if not found or (resume and not overwrite):
        if found and init_from:  # the launchers add --resume auto: the same command again continues the run
            log(f"--init_from {init_from} is not used: --resume auto continues the run in {run_dir} ({len(found)} "
                "checkpoint(s)); --overwrite starts a new run from it (the old files are moved aside)")
        return run_dir
    if not overwrite:
        newest = max(found, key=lambda p: p.stat().st_mtime)
        what = "--init_from starts a new run; " if init_from else ""
        raise OutputPathError(f"{run_dir} already has {len(found)} checkpoint(s) (newest {newest.name}): {what}"
                              "pass --resume auto to continue that run, or --overwrite to start over "
                              f"(the old files are moved into {run_dir}/overwritten-<time>/)")
    if init_from and is_within(init_from, run_dir):  # moved aside, it would be "not found" a moment later
        raise OutputPathError(f"--init_from {init_from} lies inside {run_dir}, whose files --overwrite moves into "
                              f"{run_dir}/overwritten-<time>/: copy it out of the run folder first, or start the "
                              "new run in another folder (nothing was moved)")
    aside = move_aside(run_dir, keep=(*keep, LOCK_NAME))
    log(f"--overwrite: moved the previous run's files ({len(found)} checkpoint(s)) into {aside}")
    return aside


def move_aside(folder: Path, keep: tuple[str, ...] = ()) -> Path:
    """Moves everything in `folder` except `keep` and earlier `overwritten-*` folders into a new
    `<folder>/overwritten-<time>/` (renames on one filesystem: instant, nothing deleted); returns it."""
    aside = folder / time.strftime("overwritten-%Y%m%d-%H%M%S")
    n = 1
    while aside.exists():
        n += 1
        aside = folder / (time.strftime("overwritten-%Y%m%d-%H%M%S") + f"-{n}")
    aside.mkdir()
    for item in sorted(folder.iterdir()):
        if item == aside or item.name.startswith("overwritten-") or item.name in keep:
            continue
        shutil.move(str(item), str(aside / item.name))
    return aside


def refuse_to_replace(path: str | Path, overwrite: bool, flag: str) -> None:
    """An existing output file is replaced only when the user says so (`--overwrite`), like a used run
    folder: a second synthesis or export must not silently destroy the first. A device or a pipe
    (/dev/null) is not a file to protect."""
    p = Path(path)
    if p.is_file() and not overwrite:
        raise OutputPathError(f"{flag} {p} already exists; pass --overwrite to replace it, or choose another name")


def check_prepared_settings(folder: str | Path, old: dict | None, new: dict, overwrite: bool, flag: str,
                            log=print) -> None:
    """A prepared dataset folder is never a mix of two settings. `old` are the settings the folder was
    prepared with (None: none yet), `new` this run's. When they differ: without `overwrite` an
    OutputPathError names the changed keys and `--overwrite`; with it, the old files are moved into
    `<folder>/overwritten-<time>/` (one line) and the folder is prepared again from scratch."""
    if old is None or old == new:
        return
    changed = ", ".join(f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(set(old) | set(new), key=str)
                        if old.get(k) != new.get(k))
    folder = Path(folder)
    if not overwrite:
        raise OutputPathError(f"{flag} {folder} was prepared with other settings ({changed}); pass --overwrite to "
                              f"prepare it again with these (the old files are moved into {folder}/overwritten-<time>/), "
                              f"or choose another {flag}")
    aside = move_aside(folder)
    log(f"--overwrite: {folder} was prepared with other settings ({changed}); moved its files into {aside}")


def tensorboard_dir(run_dir: str | Path) -> Path:
    """The run's TensorBoard folder, `<run_dir>/logs` for every trainer (`tensorboard --logdir
    <run_dir>/logs`, as the guides say)."""
    return Path(run_dir) / "logs"
