"""What every `make gpu-check` section shares: its time budget (`Section`, `OverBudget`), the run's
device, synthetic data and error log (`Check`), and how a CPU says what it cannot measure."""

from __future__ import annotations

import gc
import re
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bench.gpu_trainers import TrainerSpec

NA_CPU = {
    "TF32": "n/a on CPU: TF32 is a CUDA tensor-core math mode",
    "torch.compile": "n/a on CPU: compiling takes minutes here and gained nothing on conv1d (DESIGN.md); "
                     "the GPU run measures it",
    "cudnn benchmark": "n/a on CPU: cuDNN autotuning is CUDA's",
}


class OverBudget(Exception):
    """A section's time is used up: what remains of it is skipped (with a note)."""


@dataclass
class Section:
    """One section's result as the report shows it, and its deadline."""

    name: str
    title: str
    budget_s: float
    status: str = "ok"  # ok | partial (some parts skipped or failed) | skipped | failed
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)
    markdown: list[str] = field(default_factory=list)
    deadline: float = 0.0

    def check_time(self, what: str) -> None:
        if time.monotonic() > self.deadline:
            raise OverBudget(f"{what}: skipped, the section's {self.budget_s:.0f} s budget is used up")

    def partial(self, note: str) -> None:
        self.notes.append(note)
        if self.status == "ok":
            self.status = "partial"


@dataclass
class Check:
    """The run: where it writes, CPU or GPU, and the synthetic data made once per trainer."""

    out: Path
    dry: bool
    device: torch.device
    tmp: Path
    errors: list[str] = field(default_factory=list)
    _data: dict = field(default_factory=dict)

    def data(self, spec: TrainerSpec) -> Path:
        if spec.name not in self._data:
            self._data[spec.name] = spec.make_data(self.tmp / f"data_{spec.name}", self.dry)
        return self._data[spec.name]

    def run_dir(self, label: str) -> Path:
        n = len(list(self.tmp.glob("run_*")))
        return self.tmp / f"run_{n:03d}_{re.sub(r'[^A-Za-z0-9]+', '_', label)[:40]}"

    def error(self, where: str) -> str:
        """Keeps the traceback for errors.log; returns the one line for the report."""
        self.errors.append(f"## {where}\n{traceback.format_exc()}")
        exc = sys.exc_info()[1]
        return f"{where}: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''} (errors.log)"

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def reset_memory(self) -> None:
        if self.device.type == "cuda":  # (a full gc.collect costs ~0.25 s a call on the CPU: only where it frees)
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)

    def peak_gib(self) -> float | None:
        return torch.cuda.max_memory_allocated(self.device) / 2**30 if self.device.type == "cuda" else None

    @property
    def card(self) -> str:
        return torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "CPU"


def fmt(v, spec: str = ".3f") -> str:
    """A number in `spec`, "n/a on CPU" for a measurement a CPU cannot make (None), text as it is."""
    if v is None:
        return "n/a on CPU"
    return format(v, spec) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)
