"""Read and write `.safetensors` files without the `safetensors` package (which is not a dependency).

Why: pretrained weights (a diffusers `AutoencoderKL` folder, most hub models) ship as
`.safetensors`, the format that cannot carry code: an 8-byte little-endian header length, a JSON
header `{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}`, then the raw
little-endian tensor bytes. Reading it needs nothing but `json` and `torch.frombuffer`, so a user can
fine-tune from such a folder with only this repo's requirements. The `safetensors` package, when
installed, reads the same files (the tests check both against each other when it is there).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from pathlib import Path

import torch

from common.atomic_write import write_bytes

_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
_NAMES = {v: k for k, v in _DTYPES.items()}
_MAX_HEADER = 100 * 1024 * 1024  # the format's own limit: a larger header is a corrupt or hostile file


class SafetensorsError(ValueError):
    """A file that is not a well-formed safetensors file; the message names the file and the problem."""


def safetensors_header(path: str | Path) -> dict[str, dict]:
    """{tensor name: {dtype, shape, data_offsets}} of a `.safetensors` file, read from its header alone
    (the tensors are not read). Every entry is checked against the file's size, so a truncated or
    malformed file is one clear error here, before any tensor is read."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise SafetensorsError(f"{path}: {size} bytes, too short to be a safetensors file")
        (n,) = struct.unpack("<Q", prefix)
        if n > _MAX_HEADER or 8 + n > size:
            raise SafetensorsError(f"{path}: header length {n} does not fit the file ({size} bytes); truncated?")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SafetensorsError(f"{path}: unreadable header ({exc})") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: unreadable header (not a JSON object)")
    body = size - 8 - n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise SafetensorsError(f"{path}: tensor {name!r} has unsupported dtype {info.get('dtype')!r}")
        begin, end = info["data_offsets"]
        count = 1
        for s in info["shape"]:
            count *= int(s)
        if not 0 <= begin <= end <= body or end - begin != count * torch.empty((), dtype=dtype).element_size():
            raise SafetensorsError(f"{path}: tensor {name!r} has offsets {begin}..{end} that do not match its "
                                   f"shape {info['shape']} and dtype {info['dtype']} (file {size} bytes)")
        out[name] = {**info, "data_offsets": [8 + n + begin, 8 + n + end]}  # absolute positions in the file
    return out


def load_safetensors(path: str | Path, names: Iterable[str] | None = None) -> dict[str, torch.Tensor]:
    """The tensors of a `.safetensors` file (CPU, the stored dtype): all of them, or only `names` (what
    reading one part of a multi-GB checkpoint needs, e.g. the VAE of a Stable Diffusion file). The whole
    header is checked first (`safetensors_header`): a truncated file is an error, never a partial read."""
    path = Path(path)
    header = safetensors_header(path)
    wanted = list(header) if names is None else [k for k in names if k in header]
    out: dict[str, torch.Tensor] = {}
    with open(path, "rb") as f:
        for name in wanted:
            info = header[name]
            dtype, (begin, end) = _DTYPES[info["dtype"]], info["data_offsets"]
            f.seek(begin)
            data = bytearray(f.read(end - begin))
            flat = torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)
            out[name] = flat.reshape([int(s) for s in info["shape"]])
    return out


def save_safetensors(tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None) -> Path:
    """Writes `tensors` in the safetensors layout (contiguous CPU copies, 8-byte aligned header)."""
    path = Path(path)
    header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
    blobs, offset = [], 0
    for name, t in tensors.items():
        if t.dtype not in _NAMES:
            raise SafetensorsError(f"{name}: dtype {t.dtype} cannot be stored in safetensors")
        raw = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    head += b" " * (-len(head) % 8)
    write_bytes(path, struct.pack("<Q", len(head)) + head + b"".join(blobs))
    return path
