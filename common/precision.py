"""One precision policy for every trainer: autocast, GradScaler and backend flags.

Why one object: the precision string (`pl_trainer_precision`, `--mixed_precision`, `--precision`)
decides four coupled things (autocast dtype, whether a GradScaler is needed, which backend flags
are safe, what to tell the user). Spreading them over trainers is how runs end up "fp16" with no
scaler, or with TF32 set through the legacy API that raises when mixed with the new one. So every
trainer hands its own spelling (`pl_trainer_precision: 16-mixed`, `mixed_precision: true` +
`amp_dtype: bf16`, `--precision auto`, `--mixed_precision --use_bf16`) straight to `Precision`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch
from torch import nn

PRECISIONS = ("32-true", "16-mixed", "bf16-mixed")
_ALIASES = {
    "32": "32-true", "32-true": "32-true", "fp32": "32-true", "float32": "32-true", "no": "32-true",
    "false": "32-true", "16": "16-mixed", "16-mixed": "16-mixed", "fp16": "16-mixed",
    "float16": "16-mixed", "bf16": "bf16-mixed", "bf16-mixed": "bf16-mixed", "bfloat16": "bf16-mixed",
}


def bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu"


def normalize_precision(value: str | bool | int, device: torch.device | None = None,
                        amp_dtype: str | None = None) -> str:
    """Maps user spellings to one of PRECISIONS.

    `True` (a `mixed_precision: true` switch) means `amp_dtype` when given (`fp16`/`bf16`, the VITS
    and VAE switches' second key), else bf16 where the device has it, else fp16: bf16 needs no loss
    scaling. `auto` is bf16-mixed on a CUDA GPU with bf16 and 32-true everywhere else (a GPU
    without bf16, the CPU): fp16 needs loss scaling and the CPU has no fast fp16 path."""
    device = device or torch.device("cpu")
    if isinstance(value, bool):
        if not value:
            return "32-true"
        if amp_dtype is not None:
            return normalize_precision(amp_dtype, device)
        return "bf16-mixed" if bf16_supported(device) else "16-mixed"
    key = str(value).strip().lower()
    if key in ("true", "mixed", "yes"):
        return normalize_precision(True, device, amp_dtype)
    if key == "auto":
        return "bf16-mixed" if device.type == "cuda" and bf16_supported(device) else "32-true"
    if key not in _ALIASES:
        raise ValueError(f"unknown precision '{value}'; use one of {', '.join(PRECISIONS)}, auto "
                         "(or fp32/fp16/bf16)")
    return _ALIASES[key]


class Precision:
    """Applies a precision choice on `device` and records what it applied and what it could not.
    `precision` is any spelling `normalize_precision` reads (with `amp_dtype` for a boolean switch)."""

    def __init__(
        self,
        precision: str | bool = "32-true",
        device: torch.device | str = "cpu",
        amp_dtype: str | None = None,
        tf32: bool = False,
        cudnn_benchmark: bool = False,
        channels_last: bool = False,
        compile: bool = False,
        deterministic: bool = False,
    ) -> None:
        self.device = torch.device(device)
        self.applied: list[str] = []
        self.notes: list[str] = []
        self.precision = normalize_precision(precision, self.device, amp_dtype)
        self.channels_last = channels_last
        self.compile = compile
        is_cuda = self.device.type == "cuda"

        if self.precision == "bf16-mixed" and not bf16_supported(self.device):
            self.notes.append("bf16 is not supported on this GPU: using 16-mixed with a GradScaler instead")
            self.precision = "16-mixed"
        if self.precision == "16-mixed" and not is_cuda:
            self.notes.append("16-mixed on a CPU runs (GradScaler and all) but is slow; bf16-mixed is the fast CPU choice")
        self.amp_dtype: torch.dtype | None = {
            "32-true": None, "16-mixed": torch.float16, "bf16-mixed": torch.bfloat16
        }[self.precision]
        self.applied.append(f"precision {self.precision}" + (f" (autocast {self.amp_dtype})" if self.amp_dtype else ""))

        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision == "16-mixed")
        if self.scaler.is_enabled():
            self.applied.append("GradScaler on (dynamic loss scaling; non-finite steps are skipped)")

        if is_cuda:
            # Only the new TF32 API: mixing it with the legacy allow_tf32 flags raises RuntimeError.
            mode = "tf32" if tf32 else "ieee"
            torch.backends.cuda.matmul.fp32_precision = mode
            torch.backends.cudnn.conv.fp32_precision = mode
            self.applied.append(f"fp32 matmul/conv precision {mode}")
            torch.backends.cudnn.benchmark = bool(cudnn_benchmark)
            if cudnn_benchmark:
                self.applied.append("cudnn.benchmark on")
        else:
            if tf32:
                self.notes.append("tf32 requested but this is not a CUDA device: ignored")
            if cudnn_benchmark:
                self.notes.append("cudnn_benchmark requested but this is not a CUDA device: ignored")
        if deterministic:
            self._make_deterministic(is_cuda, cudnn_benchmark)
        if channels_last:
            self.applied.append("channels_last memory format for 4-D conv weights and inputs")
        if compile:
            self.applied.append("torch.compile on the model")

    def _make_deterministic(self, is_cuda: bool, cudnn_benchmark: bool) -> None:
        """Same inputs → same results run to run: deterministic kernels (a warning names any op that
        has none, rather than stopping a long run), cuDNN's deterministic algorithms, no autotuning
        (benchmark may pick a different algorithm per run), cuBLAS's fixed workspace."""
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        self.applied.append("deterministic algorithms on (torch.use_deterministic_algorithms, warn_only: an op "
                            "without a deterministic kernel warns)")
        if is_cuda:
            torch.backends.cudnn.deterministic = True
            torch.backends.cudnn.benchmark = False
            self.applied.append("cudnn.deterministic on, cudnn.benchmark off")
            if cudnn_benchmark:
                self.applied.remove("cudnn.benchmark on")
                self.notes.append("cudnn_benchmark requested but deterministic wins: benchmark off")

    @property
    def enabled(self) -> bool:
        return self.amp_dtype is not None

    def autocast(self) -> contextlib.AbstractContextManager:
        return torch.autocast(self.device.type, dtype=self.amp_dtype or torch.float32, enabled=self.enabled)

    def no_autocast(self) -> contextlib.AbstractContextManager:
        """For spectrograms, log-determinants and losses, which must be fp32."""
        return no_autocast(self.device.type)

    def prepare_model(self, model: nn.Module) -> nn.Module:
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)
        if self.compile:
            model = torch.compile(model)
        return model

    def prepare_input(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last and x.dim() == 4:
            return x.contiguous(memory_format=torch.channels_last)
        return x

    def report(self) -> list[str]:
        return [f"applied: {a}" for a in self.applied] + [f"not applied: {n}" for n in self.notes]

    def state_dict(self) -> dict:
        return {"precision": self.precision, "scaler": self.scaler.state_dict()}


@contextlib.contextmanager
def no_autocast(device_type: str = "cpu") -> Iterator[None]:
    with torch.autocast(device_type, enabled=False):
        yield


def fp32(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...] | torch.Tensor:
    out = tuple(t.float() for t in tensors)
    return out[0] if len(out) == 1 else out
