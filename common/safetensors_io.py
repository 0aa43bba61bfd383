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


def load_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a `.safetensors` file (CPU, the stored dtype). Every offset is checked against
    the file, so a truncated or malformed file is one clear error, never a partial read."""
    path = Path(path)
    data = path.read_bytes()
    if len(data) < 8:
        raise SafetensorsError(f"{path}: {len(data)} bytes, too short to be a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if n > _MAX_HEADER or 8 + n > len(data):
        raise SafetensorsError(f"{path}: header length {n} does not fit the file ({len(data)} bytes); truncated?")
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SafetensorsError(f"{path}: unreadable header ({exc})") from None
    body = memoryview(data)[8 + n:]
    out: dict[str, torch.Tensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise SafetensorsError(f"{path}: tensor {name!r} has unsupported dtype {info.get('dtype')!r}")
        begin, end = info["data_offsets"]
        shape = [int(s) for s in info["shape"]]
        count = 1
        for s in shape:
            count *= s
        nbytes = count * torch.empty((), dtype=dtype).element_size()
        if not 0 <= begin <= end <= len(body) or end - begin != nbytes:
            raise SafetensorsError(f"{path}: tensor {name!r} has offsets {begin}..{end} that do not match its "
                                   f"shape {shape} and dtype {info['dtype']} (file {len(data)} bytes)")
        flat = torch.frombuffer(bytearray(body[begin:end]), dtype=dtype) if nbytes else torch.empty(0, dtype=dtype)
        out[name] = flat.reshape(shape)
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
