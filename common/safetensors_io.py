"""Read and write `.safetensors` files through the `safetensors` package, with one-line errors.

Why: pretrained weights (a diffusers `AutoencoderKL` folder, a single-file SD/SD3/FLUX checkpoint, most
hub models) ship as `.safetensors`, the format that cannot carry code (no pickle: reading one is as safe
as `torch.load(weights_only=True)` and more). The package reads every dtype the format has (F8_E4M3,
F8_E5M2, U16/U32/U64, ... — an fp8 FLUX/SD3 all-in-one file whose autoencoder is bf16 loads) and reads lazily:
`safe_open` memory-maps the file and checks its whole header against the file's size when it opens, and
only the tensors asked for are read (one part of a multi-GB checkpoint, never the rest).

What this module adds to the package: the package's errors (`SafetensorError`, with messages that differ
between its versions) become `SafetensorsError`, one line naming the file and the problem, which the
loaders turn into "the file is damaged or incomplete: download it again"; a missing or unreadable file
is the `OSError` that `open()` gives; the tensors returned are copies, not views of the mapped file (a
file replaced or cut in place later cannot crash the process); and files are written atomically
(`common.atomic_write`: whole or not at all, a full disk is one line).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as _serialize

from common.atomic_write import write_bytes
from common.errors import UserError


class SafetensorsError(UserError, ValueError):
    """A file that is not a well-formed safetensors file; the message names the file and the problem."""


# The package's header errors, as its versions word them (0.8: "header too small"; 0.4: "HeaderTooSmall").
_TOO_SHORT = re.compile(r"header too small|HeaderTooSmall", re.I)
_LENGTH = re.compile(r"header too large|HeaderTooLarge|invalid header length|InvalidHeaderLength", re.I)
_UNREADABLE = re.compile(r"JSON|UTF-?8|InvalidHeader|header start", re.I)
_SIZE = re.compile(r"not fully covered|MetadataIncompleteBuffer", re.I)
_OFFSETS = re.compile(r"offset|TensorInvalidInfo|InvalidOffset", re.I)
_PREFIX = "Error while deserializing header: "


def _error(path: Path, exc: BaseException) -> SafetensorsError:
    """The package's error for `path` as our one line (the same wording as before the package read them)."""
    detail = " ".join(str(exc).split()).removeprefix(_PREFIX)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            prefix = f.read(8)
        n = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else None
    except OSError:
        size, n = None, None
    if _TOO_SHORT.search(detail) or (size is not None and size < 8):
        return SafetensorsError(f"{path}: {size} bytes, too short to be a safetensors file")
    if _LENGTH.search(detail):
        return SafetensorsError(f"{path}: header length {n} does not fit the file ({size} bytes); truncated?")
    if _SIZE.search(detail):
        return SafetensorsError(f"{path}: the tensors' offsets do not match the file's size ({size} bytes); truncated?")
    if _OFFSETS.search(detail) and not _UNREADABLE.search(detail):
        return SafetensorsError(f"{path}: the tensors' offsets do not match their shapes and dtypes ({detail})")
    unknown = re.search(r"unknown variant `([^`]*)`, expected one of", detail)
    if unknown:  # the package's list of the dtypes it knows is too long for the line
        return SafetensorsError(f"{path}: a tensor has unsupported dtype {unknown.group(1)!r}")
    if _UNREADABLE.search(detail):
        return SafetensorsError(f"{path}: unreadable header ({detail})")
    return SafetensorsError(f"{path}: not a readable safetensors file ({detail})")


@contextmanager
def _opened(path: Path):
    """`safe_open(path)` (header read and checked, nothing else), its failures as ours."""
    try:
        handle = safe_open(str(path), framework="pt", device="cpu")
    except SafetensorError as exc:
        raise _error(path, exc) from None
    except OSError:
        # the package's OSError has no errno ("No such file or directory: x"): give the one open() gives,
        # FileNotFoundError / IsADirectoryError / PermissionError naming the path, as callers expect
        path.stat()
        open(path, "rb").close()
        raise
    with handle as f:
        yield f


def safetensors_header(path: str | Path) -> dict[str, dict]:
    """{tensor name: {"dtype": "BF16", "shape": [...]}} of a `.safetensors` file, from its header alone
    (no tensor is read). The whole header is checked against the file's size when the file is opened,
    so a truncated or malformed file is one clear error here, before any tensor is read."""
    path = Path(path)
    with _opened(path) as f:
        out = {}
        for name in f.keys():
            view = f.get_slice(name)  # lazy: the slice's dtype and shape, no data
            out[name] = {"dtype": view.get_dtype(), "shape": list(view.get_shape())}
    return out


def safetensors_metadata(path: str | Path) -> dict[str, str]:
    """The file's `__metadata__` (text only; {} when it has none), from the header alone."""
    path = Path(path)
    with _opened(path) as f:
        return dict(f.metadata() or {})


def load_safetensors(path: str | Path, names: Iterable[str] | None = None) -> dict[str, torch.Tensor]:
    """The tensors of a `.safetensors` file (CPU, the stored dtype, fp8 included): all of them, or only
    `names` (what reading one part of a multi-GB checkpoint needs, e.g. the autoencoder of a Stable
    Diffusion or FLUX file: the other tensors are never read). Names not in the file are skipped. The whole header is
    checked first: a truncated file is an error, never a partial read. A tensor whose dtype this torch
    has no type for is an error only when it is asked for."""
    path = Path(path)
    out: dict[str, torch.Tensor] = {}
    with _opened(path) as f:
        keys = list(f.keys())
        present = set(keys)
        wanted = keys if names is None else [k for k in names if k in present]
        for name in wanted:
            try:
                # a copy: the package's tensor is a view of the mapped file, which a later in-place
                # rewrite of the file would turn into a SIGBUS
                out[name] = f.get_tensor(name).clone()
            except (SafetensorError, AttributeError, TypeError, KeyError, ValueError, RuntimeError) as exc:
                try:
                    dtype = f.get_slice(name).get_dtype()
                except Exception:  # noqa: BLE001 - only for the message
                    dtype = "?"
                raise SafetensorsError(f"{path}: tensor {name!r} has unsupported dtype {dtype!r} "
                                       f"({' '.join(str(exc).split())})") from None
    return out


def save_safetensors(tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None) -> Path:
    """Writes `tensors` as a `.safetensors` file (contiguous CPU copies; tensors that share memory,
    e.g. tied weights, are stored once each), atomically. `metadata`: text only, default {"format": "pt"}."""
    path = Path(path)
    plain: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        ptr = t.untyped_storage().data_ptr() if t.numel() else 0
        if ptr and ptr in storages:  # the package refuses tensors that share memory
            t = t.clone()
        storages.add(ptr)
        plain[name] = t
    try:
        data = _serialize(plain, metadata=dict(metadata or {"format": "pt"}))
    except (SafetensorError, KeyError, ValueError, TypeError, RuntimeError) as exc:
        for name, t in plain.items():
            try:
                _serialize({name: torch.empty(0, dtype=t.dtype)})
            except Exception:  # noqa: BLE001 - finding which tensor it is
                raise SafetensorsError(f"{name}: dtype {t.dtype} cannot be stored in safetensors") from None
        raise SafetensorsError(f"{path}: cannot be written as safetensors ({' '.join(str(exc).split())})") from None
    write_bytes(path, data)
    return path
