"""The one training loop: every trainer supplies its step, validation, log and state, this file the rest.

Why one loop: epochs, the resume skip, the log/validate/save cadence, both guards on every optimizer,
signals, the time limit, all ranks stopping at the same step, the progress bar, the health scalars and
the closing line used to be written four times, each a little differently (a time-limit stop that
validated in one trainer and not in another, a final save that one trainer forgot after a signal,
`lr_g` in one trainer's TensorBoard and `lr` in the next). Here they are written once: `fit` takes a
trainer (the `Trainer` protocol), its `Cadence` (from the five cadence keys every trainer takes:
`log_every`, `validate_every`, `save_every`, `max_minutes`, `stop_at_step`), its `RunStop` and its
`RunCheckpoints` (common/checkpoint.py), and returns one `RunResult`.

The cadence, after every optimizer step (the same rule for every trainer; docs/conventions.md):
1. `RunStop.check` decides, alike on every rank, whether the run stops after this step (signal, time
   limit, stop_at_step); the run also ends at `Cadence.total_steps`.
2. Where the run ends, `check_run_ended_good` runs first: inside a non-finite or diverging streak there
   is no good state to save, and the run fails with exit 3 naming the last good checkpoint.
3. Log at step 1, every `log_every` steps, and at the step the run ends.
4. Validate every `validate_every` steps (from epoch `validate_from_epoch` on), and where the run ends
   normally: its plan done, or its time limit (a time-boxed run is a finished run). A signal or
   `stop_at_step` ends it as if interrupted: no validation, so the stop is quick, and resume is exact.
5. Save after every validation (with its metric, for best.pt), every `save_every` steps, and where the
   run ends (the stop save: always one checkpoint at a stop, written once even when 4 and 5 coincide).
6. An epoch ends when its batches run out or, where `steps_per_epoch` is given, after that many steps
   (without fetching another batch); an epoch that ends on the run's last step counts as ended.

Non-finite steps are counted on the device (`NonFiniteGuard.record`, no host sync per step); the counters
are read, and a streak of `max_consecutive` judged (`NonFiniteError`, exit 3), at each log point (`health`),
at each save (`saving_blocked`) and where the run ends (`check_run_ended_good`): up to `log_every` steps
after the streak reached its limit.

Health scalars, the same names in every trainer (written with the step's own logs at each log point):
`lr` and `skipped_steps` for a trainer with one optimizer, `lr_<name>` and `skipped_<name>` per optimizer
for one with several (`lr_generator`, `skipped_discriminator`, ...), `data_wait_fraction` and `samples_per_s`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from common.atomic_write import write_text
from common.best_by import best_value
from common.guards import DivergenceGuard, NonFiniteGuard, check_run_ended_good
from common.log import Printer, Progress, RunLogger
from common.ranges import NonNegativeFloat, NonNegativeInt, PositiveInt
from common.stopping import SIGNAL, STOP_AT_STEP, RunStop


@dataclass
class CadenceKeys:
    """The five cadence keys of every trainer's config, with one meaning and range everywhere. A trainer's
    schema (or its `train:` section) derives from this; it may give other defaults, and keeps the spellings
    its guides use as `ALIASES` (`val_check_interval`, `log_interval`, `print_step`, `save_step`, ...)."""

    log_every: PositiveInt = 100  # steps between log points (TensorBoard scalars, the bar's figures)
    validate_every: NonNegativeInt = 1000  # steps between validations (each also saves); 0: only at the end
    save_every: NonNegativeInt = 0  # steps between extra checkpoints; 0: at validations and at the end only
    max_minutes: NonNegativeFloat | None = 0.0  # wall-clock budget; the run validates, saves and stops (0, null: none)
    stop_at_step: NonNegativeInt = 0  # save and stop at this step as if interrupted, plan unchanged (0: none)


@dataclass(frozen=True)
class Cadence:
    """When the loop logs, validates and saves, in optimizer steps; 0 means never (see the module docstring).
    `Cadence.of(keys, total_steps, ...)` reads the three cadence keys every trainer's config has."""

    total_steps: int  # the plan: the run ends after this optimizer step
    log_every: int
    validate_every: int = 0
    save_every: int = 0
    validate_from_epoch: int = 0  # no cadence validation before this epoch (a warm-up with nothing to measure)
    validate_at_end: bool = True  # validate where the run ends normally
    steps_per_epoch: int = 0  # 0: an epoch ends when its batches run out
    batches_per_step: int = 1  # what `batch_in_epoch` advances by per step (micro-batches per optimizer step)

    @classmethod
    def of(cls, keys: Any, total_steps: int, **kw: Any) -> Cadence:
        """From a config section holding `log_every`, `validate_every` and `save_every` (`kw` may replace one)."""
        given = {"log_every": keys.log_every, "validate_every": keys.validate_every, "save_every": keys.save_every}
        return cls(total_steps=total_steps, **{**given, **kw})


class Trainer(Protocol):
    """What every trainer has, under the same names (DESIGN.md, "The shape of a trainer").

    Position: `step`, `epoch`, `batch_in_epoch`. Parts the loop checks and reports: `optimizers` and
    `guards` by the same names (one `NonFiniteGuard` per optimizer object), `divergence`, `writer`,
    `printer` (lines on rank 0), `info` (its rank). Methods: `batches()` (the current epoch's batches from
    the run's position; the sampler skips what was trained), `train_step(batch) -> logs`, `validate() ->
    dict` (the held-out metrics, {} where nothing was measured), `log(logs, progress) -> dict` (one log
    point; returns what the progress bar shows), and `state()` / `load_state(ckpt)` (its own part of a
    checkpoint, for `RunCheckpoints`)."""

    step: int
    epoch: int
    batch_in_epoch: int
    optimizers: Mapping[str, torch.optim.Optimizer]
    guards: Mapping[str, NonFiniteGuard]
    divergence: DivergenceGuard
    writer: RunLogger
    printer: Printer

    def batches(self) -> Iterable[Any]: ...

    def train_step(self, batch: Any) -> dict: ...

    def validate(self) -> dict: ...

    def log(self, logs: dict, progress: Progress) -> dict: ...

    def state(self) -> dict: ...

    def load_state(self, ckpt: dict) -> None: ...


@dataclass
class RunResult:
    """What every run returns (and what its trainer may write as summary.json): where it stopped and why
    (`stopped`: None when the plan ran out, else `common.stopping`'s reason), every validation
    (`{"step", **metrics}`), the skipped steps per optimizer, the data-wait share, the checkpoints."""

    step: int
    stopped: str | None
    validations: list[dict] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    data_wait_fraction: float = 0.0
    last_good: str | None = None
    best: float | None = None
    wall_s: float = 0.0
    planned: int = 0  # the plan's steps (`Cadence.total_steps`): `step` < `planned` when the run stopped early

    def to_dict(self) -> dict:
        return asdict(self)

    def save(self, path: str | Path) -> None:
        """As `summary.json` in a run folder: a demo reads the steps trained against those planned from it."""
        write_text(Path(path), json.dumps(self.to_dict(), indent=1))


def check_guards(optimizers: Mapping[str, Any], guards: Mapping[str, NonFiniteGuard],
                 divergence: DivergenceGuard | None) -> None:
    """One non-finite guard per optimizer object, under the optimizer's name, and a divergence guard. Why: an
    optimizer without its own guard would let a NaN streak go unnoticed, or be judged by another network's
    steps (one guard shared by two optimizers passes a check by names only), and its bad state reach a
    checkpoint."""
    if set(optimizers) != set(guards):
        missing, extra = sorted(set(optimizers) - set(guards)), sorted(set(guards) - set(optimizers))
        raise ValueError(f"optimizer(s) {missing} have no non-finite guard, guard(s) {extra} no optimizer: every "
                         "optimizer steps through its own NonFiniteGuard (common.training.step_optimizer)")
    if len({id(g) for g in guards.values()}) != len(guards):
        raise ValueError(f"one NonFiniteGuard is shared by optimizers {sorted(guards)}: give each its own")
    if divergence is None:
        raise ValueError("no divergence guard: every run watches its loss for divergence (DivergenceGuard)")


def health(trainer: Trainer, progress: Progress) -> dict[str, float]:
    """The scalars every trainer logs under the same names (module docstring)."""
    one = len(trainer.optimizers) == 1
    out: dict[str, float] = {}
    for name, opt in trainer.optimizers.items():
        out["lr" if one else f"lr_{name}"] = float(opt.param_groups[0]["lr"])
    for name, guard in trainer.guards.items():
        guard.settle()  # the log point is where the device's skip counters are read and a streak judged
        out["skipped_steps" if one else f"skipped_{name}"] = guard.skipped_total
    out["data_wait_fraction"] = progress.data_wait_fraction
    out["samples_per_s"] = progress.samples_per_second() or 0.0
    return out


def fit(trainer: Trainer, cadence: Cadence, stop: RunStop, checkpoints: Any, *, best_by: str | None = None,
        samples_per_step: int = 1, show_progress: bool = True, desc: str = "train",
        after_step: Callable[[], None] | None = None, epoch_end: Callable[[int], None] | None = None,
        run_end: Callable[[str | None], None] | None = None) -> RunResult:
    """Train from the trainer's position to the end of its plan or an early stop. Leaves through `RunStop`,
    so a non-finite stop re-raises with the last good checkpoint and an out-of-memory error with the
    settings to try. `checkpoints` (`common.checkpoint.RunCheckpoints`) saves, with the validation's
    `best_by` metric for best.pt.

    A step that fetches its own micro-batches lazily (so data loading keeps its order with the forward
    passes) reports its wait as `logs["data_wait_s"]`; one whose batches vary in size (a frame budget)
    reports what the step held, over all ranks, as `logs["samples"]` for the bar's samples/s. Hooks, where
    a trainer truly differs: `after_step()` after each step's log (sample images on their own cadence),
    `epoch_end(epochs_done)` after an epoch ends, past that step's saves (per-epoch checkpoints),
    `run_end(stopped)` after the loop, before the trackers close (a final export).
    """
    check_guards(trainer.optimizers, trainer.guards, trainer.divergence)
    is_main = trainer.info.is_main
    for notice in getattr(trainer.writer, "notices", ()):  # said once among ~90 start-up lines: again, last
        trainer.printer(f"NOTE {notice}")
    progress = Progress(cadence.total_steps, initial=trainer.step, samples_per_step=samples_per_step,
                        enabled=is_main and show_progress, desc=desc)
    trainer.printer.bar = progress
    validations: list[dict] = []
    t0 = time.perf_counter()
    try:
        try:
            reason = _run(trainer, cadence, stop, checkpoints, progress, best_by, validations, after_step, epoch_end)
        finally:
            trainer.printer.bar = None
            progress.close()
        if run_end is not None:
            run_end(reason)
    finally:
        trainer.writer.close()
    one = len(trainer.guards) == 1
    result = RunResult(trainer.step, reason, validations,
                       {("steps" if one else name): g.skipped_total for name, g in trainer.guards.items()},
                       progress.data_wait_fraction, str(checkpoints.last_good) if checkpoints.last_good else None,
                       checkpoints.store.best_metric, time.perf_counter() - t0, cadence.total_steps)
    trainer.printer(closing_line(result, cadence.total_steps, stop, getattr(checkpoints.store, "best_path", None),
                                 getattr(checkpoints.store, "by", best_by or "metric")))
    return result


def closing_line(result: RunResult, total_steps: int, stop: RunStop, best: Path | None, by: str) -> str:
    """The run's last line, the same in all four trainers: the steps done, why it ended, how long it took, the
    latest checkpoint and best.pt (with its value), and for an early stop how to continue. Why all in one line:
    it is what a user reads after a night's run (or greps in its log) to know what they have and what is next.

    e.g. "done at step 5000 of 5000 in 2 h 03 min; latest checkpoint runs/v/checkpoints/model_00005000.pt; best
    runs/v/checkpoints/best.pt (mrstft 0.8123)", or "stopped by SIGINT at step 120 of 5000 in 4 min 10 s; ...;
    best none yet; continue with --resume auto"."""
    why = "done" if result.stopped is None else f"stopped by {stop.why}"
    latest = result.last_good or "none saved"
    best_text = "none yet" if best is None else str(best) + (
        f" ({by} {result.best:.4g})" if result.best is not None else "")
    tail = "" if result.stopped is None else f"; continue with {stop.resume_hint}"
    return (f"{why} at step {result.step} of {total_steps} in {duration_text(result.wall_s)}; latest checkpoint "
            f"{latest}; best {best_text}{tail}")


def duration_text(seconds: float) -> str:
    """"42 s", "3 min 05 s", "2 h 03 min": a wall time as a person reads it."""
    s = int(round(seconds))
    if s < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _run(trainer: Trainer, c: Cadence, stop: RunStop, checkpoints: Any, progress: Progress, best_by: str | None,
         validations: list[dict], after_step: Callable[[], None] | None,
         epoch_end: Callable[[int], None] | None) -> str | None:
    """The loop itself (module docstring, 1-6); returns the stop reason (None when the plan ran out)."""
    all_guards = (*trainer.guards.values(), trainer.divergence)
    with stop:
        ending = trainer.step >= c.total_steps
        while not ending:
            batches = iter(trainer.batches())
            epoch_done, fresh_epoch = False, trainer.batch_in_epoch == 0
            while not (epoch_done or ending):
                t0 = time.perf_counter()
                batch = next(batches, _END)
                if batch is _END:  # the batches ran out
                    if fresh_epoch and trainer.batch_in_epoch == 0:  # else the next epoch would be empty too
                        raise RuntimeError("an epoch from its start gave no batch: the data is smaller than one step")
                    trainer.epoch, trainer.batch_in_epoch, epoch_done = trainer.epoch + 1, 0, True
                    break
                t1 = time.perf_counter()
                logs = trainer.train_step(batch)
                t2 = time.perf_counter()
                trainer.step += 1
                trainer.batch_in_epoch += c.batches_per_step
                step, epoch = trainer.step, trainer.epoch
                if c.steps_per_epoch and trainer.batch_in_epoch >= c.steps_per_epoch * c.batches_per_step:
                    trainer.epoch, trainer.batch_in_epoch, epoch_done = epoch + 1, 0, True
                reason = stop.check(step)
                ending = reason is not None or step >= c.total_steps
                if ending:  # inside a non-finite/diverging streak: exit 3, nothing to save
                    check_run_ended_good(*all_guards)
                data_s, samples = logs.pop("data_wait_s", None), logs.pop("samples", None)
                step_s = t2 - t1 - (data_s or 0.0)
                logging = step == 1 or ending or (c.log_every and step % c.log_every == 0)
                shown = trainer.log({**logs, **health(trainer, progress)}, progress) if logging else {}
                progress.update(step, t1 - t0 if data_s is None else data_s, step_s, samples, **(shown or {}))
                if after_step is not None:
                    after_step()
                validating = (c.validate_every and step % c.validate_every == 0 and epoch >= c.validate_from_epoch) \
                    or (ending and reason not in (SIGNAL, STOP_AT_STEP) and c.validate_at_end)
                if validating:
                    metrics = trainer.validate()
                    if metrics:
                        validations.append({"step": step, **_numbers(metrics)})
                    checkpoints.save(best_value(metrics, best_by) if best_by else None)
                elif ending or (c.save_every and step % c.save_every == 0):
                    checkpoints.save()
            if epoch_done and epoch_end is not None:
                epoch_end(trainer.epoch)
    return stop.reason


def _numbers(metrics: Mapping) -> dict[str, float]:
    """The metrics that are numbers (a 0-d tensor read once), as floats: what a RunResult keeps and summary.json
    writes (a trainer's validation may carry pictures' tensors beside them)."""
    out = {}
    for k, v in metrics.items():
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            v = v.item()
        if isinstance(v, int | float) and not isinstance(v, bool):
            out[k] = float(v)
    return out


_END = object()  # what `next` returns when an epoch's batches run out
