"""Reading back the files a preparation wrote (arrays, archives of arrays, JSON manifests), for the two
places that read them: a trainer's data loader, which stops on a damaged one, and the preparation itself,
which must make a damaged output again instead of keeping it.

A prepared file can be damaged after it was written whole (`common.atomic_write`): a copy cut short, a
disk that lost it, a sync tool that replaced it, a NaN written by another program. Every trainer follows
one rule (docs/conventions.md, "A damaged prepared file"): a damaged file stops the run with
`PreparedFileError`, one line naming the file and the command that makes it again (exit 2, it is a
`ConfigError`), never a traceback, and never a divergence (exit 3) for a NaN that was in the data. Skipping
it would change the data set under a running schedule (and an exact resume), and a damaged file is most
often one of several (a bad copy, a failing disk) that the user needs to hear about. Running the
preparation again makes a damaged file again (`npy_problem`, `npz_problem`) and keeps the others.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from common.errors import ConfigError

# numpy reading a file cut short or not an array file raises one of these (ValueError: a bad header, pickled
# data, "mmap length is greater than file size", a short read; EOFError: an empty file; BadZipFile: an archive)
READ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError)
CHUNK = 1 << 22  # values checked for NaN/inf at a time, so a memory-mapped array is never read whole at once


class PreparedFileError(ConfigError):
    """A prepared file that is missing, unreadable, cut short, of the wrong shape or holding NaN/inf values:
    the message names it and says how to make it again (exit 2).

    Raised in a DataLoader worker process, it reaches the trainer rebuilt from the worker's traceback text
    (`torch._utils.ExceptionWrapper`: "Caught PreparedFileError in DataLoader worker process 0. Original
    Traceback ..."): `__init__` keeps only this error's own line, so the user still reads one line."""

    def __init__(self, message: str = "", *args: object) -> None:
        super().__init__(worker_message(str(message), type(self)), *args)


def worker_message(text: str, kind: type[BaseException]) -> str:
    """`text` without the DataLoader's wrapping: the message after the last `<module>.<Class>: ` line of
    the worker's traceback; `text` itself when it is not such a wrapping."""
    if not text.startswith("Caught ") or "Traceback" not in text:
        return text
    marker = f"{kind.__module__}.{kind.__qualname__}: "
    at = text.rfind(marker)
    return text[at + len(marker):].strip() if at >= 0 else text


def damaged(path: str | Path, why: str, remedy: str) -> PreparedFileError:
    """The one line for a prepared file that cannot be used: `prepared file <path> <why>: <remedy>`."""
    return PreparedFileError(f"prepared file {path} {why}: {remedy}")


def _read_problem(exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError):
        return "is missing"
    return f"is damaged (cut short or not what the preparation wrote: {_first_sentence(exc)})"


def _first_sentence(exc: BaseException) -> str:
    """The first sentence of an error's text, at most 120 characters (numpy's go on with advice that does
    not apply: "... If you trust the file you can load it unsafely ...")."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.split(". ")[0].rstrip(".")[:120]


def open_npy(path: str | Path, mmap: bool = False) -> np.ndarray | str:
    """The array of a `.npy` file (memory-mapped with `mmap`), or why it cannot be read ("is missing",
    "is damaged (...)"). Pickled objects are never loaded."""
    try:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except READ_ERRORS as e:
        return _read_problem(e)


def open_npz(path: str | Path, keys: Sequence[str]) -> dict[str, np.ndarray] | str:
    """The arrays `keys` of a `.npz` archive, read whole, or why they cannot be (missing file, damaged
    archive, a key it lacks)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in keys if k not in z.files]
            if missing:
                return f"is damaged (it lacks {', '.join(missing)})"
            return {k: z[k] for k in keys}
    except READ_ERRORS as e:
        return _read_problem(e)


def nonfinite(array: np.ndarray) -> bool:
    """Whether a float array holds a NaN or an infinite value (read in chunks: fine for a memory-mapped one)."""
    if array.dtype.kind not in "fc":
        return False
    flat = array.reshape(-1)
    return any(not np.isfinite(flat[i:i + CHUNK]).all() for i in range(0, flat.size, CHUNK))


def shape_problem(array: np.ndarray, shape: Sequence[int | None]) -> str | None:
    """Why `array` does not have `shape` (None: any size along that axis), or None when it fits."""
    if array.ndim != len(shape) or any(want is not None and got != want for got, want in zip(array.shape, shape)):
        expected = "[" + ", ".join("any" if s is None else str(s) for s in shape) + "]"
        return f"has shape {list(array.shape)}, expected {expected}"
    return None


def array_problem(array: np.ndarray | str, shape: Sequence[int | None] | None = None,
                  finite: bool = True) -> str | None:
    """Why an array (or `open_npy`'s reason) cannot be used: not readable, another shape, NaN/inf values."""
    if isinstance(array, str):
        return array
    if shape is not None and (why := shape_problem(array, shape)):
        return why
    if finite and nonfinite(array):
        return "holds NaN or infinite values"
    return None


def npy_problem(path: str | Path, shape: Sequence[int | None] | None = None, finite: bool = True) -> str | None:
    """For a preparation deciding whether to keep a finished output: None when `path` reads back whole, has
    `shape` and (`finite`) only finite values; else why not (the whole file is read, memory-mapped)."""
    return array_problem(open_npy(path, mmap=True), shape, finite)


def npz_problem(path: str | Path, shapes: dict[str, Sequence[int | None] | None], finite: bool = True
                ) -> str | None:
    """`npy_problem` for the arrays of a `.npz` archive: `shapes` maps each key that must be there to its
    shape (or None: any)."""
    arrays = open_npz(path, list(shapes))
    if isinstance(arrays, str):
        return arrays
    for key, shape in shapes.items():
        if why := array_problem(arrays[key], shape, finite):
            return f"{key} {why}"
    return None


def load_npy(path: str | Path, remedy: str, mmap: bool = False, shape: Sequence[int | None] | None = None
             ) -> np.ndarray:
    """A trainer's read of a prepared `.npy`: the array, or `PreparedFileError` naming the file and `remedy`
    (missing, unreadable, another shape). NaN/inf are not checked here: `require_finite` on what is used."""
    array = open_npy(path, mmap)
    if why := array_problem(array, shape, finite=False):
        raise damaged(path, why, remedy)
    return array


def require_finite(array: np.ndarray, path: str | Path, remedy: str) -> np.ndarray:
    """`array` (read from `path`) when it holds only finite values, else `PreparedFileError`: a NaN in the
    data is a damaged file, not a diverging run."""
    if nonfinite(np.asarray(array)):
        raise damaged(path, "holds NaN or infinite values", remedy)
    return array


def json_problem(path: str | Path, kind: type = dict) -> tuple[object, str | None]:
    """(the JSON value in `path`, None), or (None, why it cannot be used: missing, unreadable, not UTF-8, not
    JSON, nested past the recursion limit, not a `kind`): the one reading behind every JSON file a run checks."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, "is missing"
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        return None, f"is damaged (not UTF-8 JSON: {_first_sentence(e)})"
    if not isinstance(value, kind):
        return None, f"is damaged (a JSON {type(value).__name__}, expected a {kind.__name__})"
    return value, None


def read_json(path: str | Path, remedy: str, kind: type = dict) -> object:
    """A prepared JSON file (a manifest, a speaker table) that must hold a `kind`: its content, or
    `PreparedFileError` naming it (`json_problem`)."""
    value, why = json_problem(path, kind)
    if why:
        raise damaged(path, why, remedy)
    return value
