"""The one training loop: every trainer supplies its step, validation and checkpoint, this file the rest.

Why one loop: epochs, the resume skip, the log/validate/save cadence, both guards on every optimizer,
signals, the time limit, all ranks stopping at the same step and the final save used to be written four
times, each a little differently (a time-limit stop that validated in one trainer and not in another,
a final save that one trainer forgot after a signal). Here they are written once, and a trainer states
only its `Cadence` (from its config keys) and what it does in one step.

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
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from common.log import Progress
from common.stopping import SIGNAL, STOP_AT_STEP, RunStop
from common.training import DivergenceGuard, NonFiniteGuard, check_run_ended_good


@dataclass(frozen=True)
class Cadence:
    """When the loop logs, validates and saves, in optimizer steps; 0 means never (see the module docstring).
    Each trainer builds it from its own config keys, so the rule is shared and only the numbers differ."""

    total_steps: int  # the plan: the run ends after this optimizer step
    log_every: int
    validate_every: int = 0
    save_every: int = 0
    validate_from_epoch: int = 0  # no cadence validation before this epoch (a warm-up with nothing to measure)
    validate_at_end: bool = True  # validate where the run ends normally
    steps_per_epoch: int = 0  # 0: an epoch ends when its batches run out
    batches_per_step: int = 1  # what `batch_in_epoch` advances by per step (micro-batches per optimizer step)


class Trainer(Protocol):
    """What the loop needs of a trainer: its position and its three methods."""

    step: int
    epoch: int
    batch_in_epoch: int

    def train_step(self, batch: Any) -> dict: ...

    def validate(self) -> Any: ...

    def save(self, metric: float | None = None) -> Any: ...


def check_guards(optimizers: Mapping[str, Any], guards: Mapping[str, NonFiniteGuard],
                 divergence: DivergenceGuard | None) -> None:
    """Every optimizer has its non-finite guard and the run has a divergence guard. Why: an optimizer
    without one would let a NaN streak or a blow-up go unnoticed, and its bad state reach a checkpoint."""
    missing = sorted(set(optimizers) - set(guards))
    if missing:
        raise ValueError(f"optimizer(s) {missing} have no non-finite guard: every optimizer steps through "
                         "its own NonFiniteGuard (common.training.step_optimizer)")
    if divergence is None:
        raise ValueError("no divergence guard: every run watches its loss for divergence (DivergenceGuard)")


def run(trainer: Trainer, cadence: Cadence, stop: RunStop, progress: Progress, *,
        epoch_batches: Callable[[], Iterable[Any]],
        optimizers: Mapping[str, Any], guards: Mapping[str, NonFiniteGuard], divergence: DivergenceGuard,
        log: Callable[[dict, Progress], dict],
        metric: Callable[[Any], float | None] = lambda result: result,
        after_step: Callable[[], None] | None = None,
        epoch_end: Callable[[int], None] | None = None) -> str | None:
    """Train from the trainer's position to the end of its plan or an early stop; returns the stop reason
    (None when the plan ran out), as `RunStop.reason`. Leaves through `RunStop`, so a non-finite stop
    re-raises with the last good checkpoint and an out-of-memory error with the settings to try.

    `epoch_batches()` gives the current epoch's batches from the trainer's position (the resume skip is
    the trainer's sampler's); the loop advances `step`, `batch_in_epoch` and `epoch`. `log(logs, progress)`
    writes one log point and returns the values the progress bar shows; `metric(validate())` is what
    `save` ranks best.pt by. A step that fetches its own micro-batches lazily (so data loading keeps its
    order with the forward passes) reports its wait as `logs["data_wait_s"]`; one whose batches vary in size (a
    frame budget) reports what the step held, over all ranks, as `logs["samples"]` for the bar's samples/s. Hooks, where a trainer truly
    differs: `after_step()` runs after each step's log (e.g. sample images on their own cadence), and
    `epoch_end(epochs_done)` after an epoch ends, past that step's saves (e.g. per-epoch checkpoints).
    """
    check_guards(optimizers, guards, divergence)
    all_guards = (*guards.values(), divergence)
    c = cadence
    with stop:
        ending = trainer.step >= c.total_steps
        while not ending:
            batches = iter(epoch_batches())
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
                shown = log(logs, progress) if logging else {}
                progress.update(step, t1 - t0 if data_s is None else data_s, step_s, samples, **shown)
                if after_step is not None:
                    after_step()
                validating = (c.validate_every and step % c.validate_every == 0 and epoch >= c.validate_from_epoch) \
                    or (ending and reason not in (SIGNAL, STOP_AT_STEP) and c.validate_at_end)
                if validating:
                    trainer.save(metric(trainer.validate()))
                elif ending or (c.save_every and step % c.save_every == 0):
                    trainer.save()
            if epoch_done and epoch_end is not None:
                epoch_end(trainer.epoch)
    return stop.reason


_END = object()  # what `next` returns when an epoch's batches run out
