"""Model files a config names (a speaker encoder, metric weights, an f0 network) are data: read, never run.

Why: a `.pt` read by plain `torch.load`, a TorchScript module or a `torch.export` program (`.pt2`) can carry
pickled objects or code that runs as the file loads, with the user's rights; a metric's weights file is often
downloaded from a page or a hub and never looked at. So every weights file goes through this module:

- **weights** (`load_weights`): a `.safetensors` file (`common.safetensors_io`, which cannot carry code), or a
  state dict read by `common.checkpoint.load_checkpoint` (`torch.load(weights_only=True)`, zip records and
  CRCs checked first): pickled code is refused in one line naming the file. Only a regular file is opened (a
  FIFO would block, a folder is no file). Floating tensors of another dtype (fp16, bf16, fp64) become float32
  (the networks run in fp32); a NaN or infinite value is refused naming the file and the tensor, because a
  metric computed with it is NaN and ranks nothing (`--best_by`).
- **code files** (`code_kind`, `allow_code_file`): a TorchScript module or a `.pt2` program is loaded only
  with the explicit opt-in `TRUST_CODE_FILES=1` in the environment, which trusts every such file a config
  names to run its code; without it, one line naming the file, the opt-in and the safe alternative.
- **outputs** (`check_output`): what a user's module returns is checked (a tensor, floating, the expected
  rank, at most `max_elements`) before it is used, so a wrong file is one line naming it, not a traceback
  or a 2 GB allocation further on.

Errors are `ModelFileError` (a `UserError`: exit 2 where it stops a run); a caller whose metric can simply be
off (a speaker-similarity or rFID metric) says the same text in its one "off" line instead.
"""

from __future__ import annotations

import os
import stat
import zipfile
from pathlib import Path

import torch

from common.errors import UserError, file_kind

TRUST_CODE_ENV = "TRUST_CODE_FILES"  # "1" (or "true"/"yes"): TorchScript and .pt2 files may run their code
CODE_SUFFIXES = {".pt2": "a torch.export program (.pt2)", ".jit": "a TorchScript module",
                 ".ts": "a TorchScript module", ".torchscript": "a TorchScript module"}


class ModelFileError(UserError, ValueError):
    """A model file that cannot be used as it is: the message names the file and what to do."""


def regular_file(path: str | os.PathLike, what: str) -> Path:
    """`path` when it names a regular file (through links: a hub cache links its files); else ModelFileError.
    Only `os.stat` looks at it, so a FIFO is never opened (an open would wait for a writer forever)."""
    p = Path(path).expanduser()
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        raise ModelFileError(f"{what} {p} does not exist; give the file's path") from None
    except OSError as exc:
        raise ModelFileError(f"{what} {p} cannot be read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(mode):
        raise ModelFileError(f"{what} {p} is {file_kind(mode)}; give the weights file itself")
    return p


def code_kind(path: Path) -> str | None:
    """What kind of code-carrying file `path` is ("a TorchScript module", "a torch.export program (.pt2)"), or
    None for anything else. From the suffix, or for a zip (`torch.jit.save` writes `.pt` too) from its
    records: TorchScript keeps `code/` and `constants.pkl`, which `torch.save` never writes."""
    kind = CODE_SUFFIXES.get(path.suffix.lower())
    if kind is not None:
        return kind
    try:
        if not zipfile.is_zipfile(path):
            return None
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (OSError, zipfile.BadZipFile, ValueError):
        return None
    if any("/code/" in n or n.endswith("/constants.pkl") for n in names):
        return "a TorchScript module"
    if any(n.endswith("/archive_format") or "/serialized_exported_program" in n for n in names):
        return "a torch.export program (.pt2)"
    return None


def code_files_trusted() -> bool:
    """Whether the user opted in to run the code of TorchScript / `.pt2` files (`TRUST_CODE_FILES=1`)."""
    return os.environ.get(TRUST_CODE_ENV, "").strip().lower() in ("1", "true", "yes")


def allow_code_file(path: Path, kind: str, what: str) -> str:
    """The one line to say before loading `path` (a code-carrying file of `kind`) when the opt-in is given;
    without it, ModelFileError naming the file, the opt-in and the safe alternative."""
    if not code_files_trusted():
        raise ModelFileError(f"{what} {path} is {kind}, which runs code stored in the file when it loads: give its "
                             f"state dict (torch.save(model.state_dict()) or .safetensors) instead, or, if you trust "
                             f"the file, set {TRUST_CODE_ENV}=1 (it lets every TorchScript / .pt2 file a config names "
                             "run its code)")
    return f"{what}: loading {path} ({kind}) with its code, trusted by {TRUST_CODE_ENV}=1"


def load_weights(path: str | os.PathLike, what: str) -> dict:
    """The tensors (and plain data) of a weights file, read without running code: `.safetensors`, or a
    `torch.save` file read weights-only. A code-carrying file is refused here (its loader is another path)."""
    from common.checkpoint import CheckpointError, load_checkpoint
    from common.safetensors_io import load_safetensors

    p = regular_file(path, what)
    if p.suffix.lower() == ".safetensors":
        return load_safetensors(p)
    kind = code_kind(p)
    if kind is not None:
        raise ModelFileError(f"{what} {p} is {kind}, not a weights file: give its state dict "
                             "(torch.save(model.state_dict())) or a .safetensors file")
    try:
        return load_checkpoint(p)
    except CheckpointError as exc:
        raise ModelFileError(f"{what}: {exc}") from None


def float32_weights(state: dict, path: str | os.PathLike, what: str) -> dict:
    """`state` with every floating tensor as float32 (fp16 / bf16 / fp64 files are converted: the networks run
    in fp32 and would otherwise fail on mixed dtypes); a NaN or infinite value is ModelFileError naming the
    file and the tensor. Nested dicts are walked; other values are kept as they are."""
    out = {}
    for name, value in state.items():
        if isinstance(value, dict):
            out[name] = float32_weights(value, path, what)
            continue
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            if value.numel() and not bool(torch.isfinite(value).all()):
                raise ModelFileError(f"{what} {path}: tensor {name!r} holds NaN or infinite values; the file is "
                                     "damaged or was saved from a diverged model: give an intact copy")
            value = value.float()
        out[name] = value
    return out


def check_output(out: object, source: str, what: str, ndims: tuple[int, ...], max_elements: int) -> torch.Tensor:
    """`out`, a module's return value, when it is a floating tensor of one of `ndims` ranks with at most
    `max_elements` values; else ModelFileError naming `source` (the file) and what came back."""
    if not isinstance(out, torch.Tensor):
        raise ModelFileError(f"{what} {source} returned {type(out).__name__}, not a tensor; give a module whose "
                             "forward returns one tensor")
    if not out.is_floating_point():
        raise ModelFileError(f"{what} {source} returned a tensor of dtype {out.dtype}, not floating point")
    if out.dim() not in ndims or out.numel() > max_elements or out.numel() == 0:
        raise ModelFileError(f"{what} {source} returned a tensor of shape {list(out.shape)} ({out.numel()} values); "
                             f"expected {' or '.join(f'{n}-D' for n in ndims)} with 1 to {max_elements} values")
    return out
