"""One precision policy for every trainer: autocast, GradScaler and backend flags.

Why one object: the precision string decides four coupled things (autocast dtype, whether a
GradScaler is needed, which backend flags are safe, what to tell the user). Spreading them over
trainers is how runs end up "fp16" with no scaler, or with TF32 set through the legacy API that
raises when mixed with the new one. So every trainer's config has one field, `precision`
(`32-true | 16-mixed | bf16-mixed | auto`), handed straight to `Precision`.

The guides' other spellings are read only at the edge, when a config loads: a value alias
(`fp16`, `bf16`, `16`, …) by `precision_name`, and a pair of switches (`mixed_precision` +
`amp_dtype` / `use_bf16`) by `MixedPrecisionSwitch`, which a schema lists in its `MULTI_KEY_ALIASES`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from common.distributed import DistInfo, wrap_ddp
from common.errors import ConfigError

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


def precision_name(value: str | int) -> str:
    """A config's precision value in its one spelling: one of PRECISIONS, or `auto` (decided by the
    device when training starts). Lightning's and torch's spellings (`16`, `fp16`, `bf16`, …) are
    accepted; anything else raises ValueError naming the choices."""
    key = str(value).strip().lower()
    if key == "auto":
        return key
    if isinstance(value, bool) or key not in _ALIASES:
        raise ValueError(f"unknown precision '{value}'; use one of {', '.join(PRECISIONS)}, auto "
                         "(or fp32/fp16/bf16)")
    return _ALIASES[key]


def normalize_precision(value: str | int, device: torch.device | None = None) -> str:
    """Maps a precision spelling (`precision_name`) to one of PRECISIONS on `device`.

    `auto` is bf16-mixed on a CUDA GPU with bf16 and 32-true everywhere else (a GPU without bf16,
    the CPU): fp16 needs loss scaling and the CPU has no fast fp16 path."""
    device = device or torch.device("cpu")
    name = precision_name(value)
    if name == "auto":
        return "bf16-mixed" if device.type == "cuda" and bf16_supported(device) else "32-true"
    return name


def _switch_on(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.lower() in ("true", "yes", "1")
    raise ValueError(f"{key}: expected true/false, got {value!r}")


@dataclass(frozen=True)
class MixedPrecisionSwitch:
    """A guide's two-key spelling of `precision`: an on/off switch (`mixed_precision`) and a key that
    picks the autocast dtype (e.g. `amp_dtype: fp16|bf16`, or `use_bf16: true|false`).

    `common.config.load_config` calls `combine` once per layer (each YAML file of a `base_config`
    chain, then the command line as one layer) with the switch keys that layer gives and the precision
    the layers below set; the result is that layer's `precision`. The rule, as the guides' flags read:
    the switch off is 32-true; on, it is the dtype given beside it, else the dtype of a mixed precision
    below, else `default_mixed`; a dtype key alone changes the dtype of a mixed precision below and
    leaves 32-true alone."""

    switch: str  # e.g. "mixed_precision"
    dtype_key: str  # e.g. "amp_dtype" / "use_bf16"
    dtypes: tuple[tuple[Any, str], ...]  # (value of dtype_key, precision), e.g. (("fp16", "16-mixed"), ...)
    default_mixed: str  # the precision of the switch alone, over no mixed precision
    field: str = "precision"

    @property
    def keys(self) -> tuple[str, str]:
        return self.switch, self.dtype_key

    def _mixed_of(self, value: Any) -> str:
        if isinstance(self.dtypes[0][0], bool):  # a yes/no dtype key (`use_bf16`)
            value = _switch_on(value, self.dtype_key)
        for spelled, precision in self.dtypes:
            if value == spelled:
                return precision
        raise ValueError(f"{self.dtype_key}: {value!r} is not one of {[v for v, _ in self.dtypes]}")

    def combine(self, given: dict[str, Any], below: str) -> str:
        """This layer's precision from the switch keys it gives (`given`) over `below`."""
        below = precision_name(below)
        dtype = self._mixed_of(given[self.dtype_key]) if self.dtype_key in given else None
        below_mixed = below if below in ("16-mixed", "bf16-mixed") else None
        if self.switch in given:
            if not _switch_on(given[self.switch], self.switch):
                return "32-true"
            return dtype or below_mixed or self.default_mixed
        return dtype if below_mixed and dtype else below


# CUDA graph trees run a compiled function once to warm up, record it the second time, replay from the third
CUDA_GRAPHS_RECORDED_AFTER = 2


def compile_unavailable(device: torch.device) -> str | None:
    """Why `torch.compile` cannot work on `device` here, or None. Inductor writes Triton kernels for CUDA
    and C++ for the CPU: PyTorch ships no Triton for Windows, and no C++ compiler anywhere."""
    if device.type == "cuda":
        if importlib.util.find_spec("triton") is None:
            return "Triton is not installed (PyTorch ships none for Windows; there, pip install triton-windows)"
        return None
    if not any(shutil.which(c) for c in ("cl", "g++", "c++", "clang++")):
        return ("no C++ compiler on PATH (Inductor compiles CPU code with one; on Windows, Visual Studio's "
                "Build Tools and a Developer prompt)")
    return None


class Precision:
    """Applies a precision choice on `device` and records what it applied and what it could not.
    `precision` is any spelling `normalize_precision` reads (a config's `precision` field)."""

    def __init__(
        self,
        precision: str = "32-true",
        device: torch.device | str = "cpu",
        tf32: bool = False,
        cudnn_benchmark: bool = False,
        channels_last: bool = False,
        compile: bool = False,
        deterministic: bool = False,
        cuda_graphs: bool = False,
    ) -> None:
        self.device = torch.device(device)
        self.applied: list[str] = []
        self.notes: list[str] = []
        self.precision = normalize_precision(precision, self.device)
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
        why_not = compile_unavailable(self.device) if compile else None
        if why_not:  # a config or preset that asks for compile still trains, eagerly, and says so
            self.compile = False
            self.notes.append(f"torch.compile requested but {why_not}: the model trains eager")
        elif compile:
            self.applied.append("torch.compile on the model")
        self.cuda_graphs = self._check_cuda_graphs(cuda_graphs, compile, is_cuda)
        self._graph_steps = 0  # training steps marked for the CUDA graph trees (`step_begin`)

    def _check_cuda_graphs(self, asked: bool, compile: bool, is_cuda: bool) -> bool:
        """CUDA graphs through torch.compile's "reduce-overhead" mode (its CUDA graph trees: each compiled
        forward and backward replayed as one graph, no launch per kernel). Refused, in one line, where it
        would change nothing: without compile, or off CUDA."""
        if not asked:
            return False
        if not compile:
            raise ConfigError("cuda_graphs: true needs compile: true (the graphs are torch.compile's "
                              "reduce-overhead mode); set compile: true, or drop cuda_graphs")
        if not is_cuda:
            raise ConfigError(f"cuda_graphs: CUDA graphs need a CUDA device and this run is on {self.device.type}; "
                              "drop cuda_graphs (compile alone works here)")
        if self.compile:  # (compile can still have been turned off above: no Triton)
            self.applied.append("CUDA graphs (torch.compile mode reduce-overhead)")
        return self.compile

    def step_begin(self) -> None:
        """Marks a new training step for the CUDA graph trees: the outputs of the last step's replays may be
        overwritten from here on (without it a graph replayed twice across steps refuses to run). Once the
        graphs are recorded (a warm-up step, a recording step), says whether torch.compile ran any compiled
        graph without them: it skips them quietly (a mutated input, a CPU tensor inside), and the key would
        then change nothing."""
        if not self.cuda_graphs:
            return
        torch.compiler.cudagraph_mark_step_begin()
        self._graph_steps += 1
        if self._graph_steps == CUDA_GRAPHS_RECORDED_AFTER + 1:
            from torch._dynamo.utils import counters

            skipped = counters["inductor"]["cudagraph_skips"]
            if skipped:
                warnings.warn(f"cuda_graphs: torch.compile ran {skipped} compiled graph(s) of this process without "
                              "CUDA graphs (TORCH_LOGS=cudagraphs names why); they run as compiled kernels",
                              stacklevel=2)

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

    def prepare_model(self, model: nn.Module, info: DistInfo | None = None) -> nn.Module:
        """The network as trained, in the one build order of every trainer (DESIGN.md): channels_last, then
        DDP under torchrun (`info`), then compile. Compiling the DDP wrapper lets DDP's bucketed gradient
        hooks run outside the compiled graph, torch's recommended order."""
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)
        if info is not None:
            model = wrap_ddp(model, info)
        if self.compile:
            model = torch.compile(model, mode="reduce-overhead" if self.cuda_graphs else None)
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
