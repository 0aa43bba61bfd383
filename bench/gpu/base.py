"""What every `make gpu-check` section shares: its time budget (`Section`, `OverBudget`), the run's
device, synthetic data and error log (`Check`), and how a CPU says what it cannot measure."""

from __future__ import annotations

import contextlib
import gc
import re
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bench.gpu.trainers import TrainerSpec

NA_CPU = {
    "TF32": "n/a on CPU: TF32 is a CUDA tensor-core math mode",
    "torch.compile": "n/a on CPU: compiling takes minutes here and gained nothing on conv1d (DESIGN.md); "
                     "the GPU run measures it",
    "cudnn benchmark": "n/a on CPU: cuDNN autotuning is CUDA's",
    "torch.compile + CUDA graphs": "n/a on CPU: CUDA graphs are CUDA's (the vocoder's cuda_graphs key refuses a CPU)",
}


class OverBudget(Exception):
    """A section's time is used up: what remains of it is skipped (with a note)."""


class Stopped(BaseException):
    """SIGINT / SIGTERM (a command limit, Ctrl-C): not an `Exception`, so no row's handler swallows it; the
    run writes its report with what it measured and ends."""


# A first-time torch.compile can take minutes and cannot be stopped part-way: a compiled measurement is
# started only when this much time is left, in its section and in the run's compile allowance (the estimate
# grows to the slowest compile seen).
COMPILE_NEED_S = 60.0
# A measurement whose set-up (data, build, the first step with cuDNN's autotuning) spent its section's budget
# still takes this many timed steps, within the run's own end: on the third lent H200 the set-ups of sections 2
# and 3 took 126 s and 71 s, and both sections ended with nothing measured, their set-up thrown away.
MIN_TIMED = 3


@dataclass
class Section:
    """One section's result as the report shows it, and its deadline."""

    name: str
    title: str
    budget_s: float
    # waiting | running | ok | partial (some parts skipped or failed) | skipped | failed | stopped (by a signal)
    status: str = "waiting"
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)
    markdown: list[str] = field(default_factory=list)
    deadline: float = 0.0
    started: float = 0.0
    run_end: float = 0.0  # the whole run's end (0: the section's deadline): a finishing measurement's limit

    def check_time(self, what: str, *, finishing: bool = False) -> None:
        """OverBudget once the section's time is used up. `finishing`: the measurement is past its set-up and
        short of its minimum (`MIN_TIMED`), so it runs on to the run's end and says it overran."""
        now = time.monotonic()
        if now <= self.deadline:
            return
        if finishing and now <= max(self.run_end, self.deadline):
            note = f"over the section's {self.budget_s:.0f} s budget after its set-up: finished its minimum measurement"
            if note not in self.notes:
                self.partial(note)
            return
        raise OverBudget(f"{what}: skipped, the section's {self.budget_s:.0f} s budget is used up")

    def timed_steps_left(self, i: int, warmup: int, steps: int, what: str) -> int | None:
        """Before step `i` of `warmup` untimed + `steps` timed ones: None to take it, else the number of timed
        steps done (the loop stops there and reports them; a note says so). Past the section's budget the loop
        still takes its warm-up and `MIN_TIMED` timed steps while the run's own time lasts; past that, before
        any timed step: OverBudget, as `check_time`."""
        finishing = i - warmup < min(MIN_TIMED, steps)
        try:
            self.check_time(f"{what} {i}", finishing=finishing)
        except OverBudget as e:
            if i <= warmup:  # no timed step yet: nothing to report
                raise
            self.partial(f"{e}: {i - warmup} of {steps} timed steps")
            return i - warmup
        return None

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Seconds spent in `name` (data, build, first step, ...) into data["phases_s"]: where a section's time
        went when it measured little."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.record_phase(name, time.perf_counter() - t0)

    def record_phase(self, name: str, seconds: float) -> None:
        """One set-up phase's seconds, measured by the caller (a step timed anyway)."""
        self.data.setdefault("phases_s", {})[name] = round(seconds, 2)

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def partial(self, note: str) -> None:
        self.notes.append(note)
        if self.status in ("ok", "running"):
            self.status = "partial"


@dataclass
class Check:
    """The run: where it writes, CPU or GPU, and the synthetic data made once per trainer."""

    out: Path
    dry: bool
    device: torch.device
    tmp: Path
    errors: list[str] = field(default_factory=list)
    compile_left_s: float = 0.0  # what is left of the run's allowance for compiled measurements
    compile_need_s: float = COMPILE_NEED_S
    passes: tuple[int, ...] = (0, 1, 2)  # the step tables' passes to run (--passes)
    reference_dir: Path | None = None  # an openvpi/SingingVocoders checkout for the reference section
    progress: Callable[[], None] = lambda: None  # rewrites report.md / report.json (after every measurement)
    _data: dict = field(default_factory=dict)

    def compile_skip(self, sec: Section, what: str) -> str | None:
        """Why a compiled measurement is not started now (None: start it), so that one compile cannot run
        past the section's budget or eat the time of the sections after it."""
        left = min(sec.left_s(), self.compile_left_s)
        if left >= self.compile_need_s:
            return None
        which = "section's time" if sec.left_s() < self.compile_left_s else "run's compile allowance"
        return (f"{what}: skipped, a compile needs ~{self.compile_need_s:.0f} s and {max(left, 0):.0f} s of the "
                f"{which} is left (--compile-minutes)")

    def compiled(self, seconds: float) -> None:
        """Books a compiled measurement's time (compile included) against the allowance."""
        self.compile_left_s -= seconds
        self.compile_need_s = max(self.compile_need_s, seconds)

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
