"""How a training run stops, written once for every trainer.

A run stops at the end of its plan, or early: on SIGINT/SIGTERM, at a time limit, at `stop_at_step`
(tests, benchmarks), after too many non-finite or diverging steps in a row, or when CUDA runs out of
memory. `common.loop.fit` wraps the loop in one `RunStop` and asks `stop.check(step)` after each optimizer step:

    with RunStop(time_limit_minutes, stop_at_step, last_good=lambda: checkpoints.last_good, lr_hint=...,
                 oom=("the training step", batch_size, hints)) as stop:   # or RunStop.of(cfg, cfg, "...")
        while ...:
            ...train one step, log, validate, checkpoint...
            if stop.check(self.step):
                ...save, then leave the loop...
        ...the final save, still inside the block...

The final save belongs inside the block: while it is active a second signal is ignored with one line,
so nothing can interrupt the stop save (outside it, SIGINT would raise KeyboardInterrupt mid-save).

Why one place: under torchrun a signal or a clock that reached one rank must stop every rank at the
same step (or the others hang in the next collective), the exit codes must mean the same thing for
every trainer (`common.exit_codes`), and a non-finite or out-of-memory stop must say how to go on.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import distributed, exit_codes
from common.distributed import any_rank
from common.guards import NonFiniteError, nonfinite_stop_message
from common.hardware import OutOfMemory, is_oom, oom_message
from common.presets import get_key

SIGNAL, TIME_LIMIT, STOP_AT_STEP = "signal", "time limit", "stop_at_step"
# Under torchrun the ranks agree on a stop (an all-reduce, and on NCCL a host sync) every AGREE_EVERY steps, and at
# `stop_at_step`, not after every step: a signal or the time limit then stops every rank at the same step at most
# AGREE_EVERY - 1 steps later (seconds, inside any scheduler's grace period), and the steps between run without a
# collective of their own. One process decides after every step (no collective at all).
AGREE_EVERY = 8


class GracefulExit:
    """While active, SIGINT/SIGTERM set `.requested` instead of killing the process, so the loop
    can finish the step, save a checkpoint and exit. A second signal is ignored, with one line: it
    used to raise KeyboardInterrupt in the middle of the stop save (a traceback, and no checkpoint);
    the save takes seconds, and `kill -9` still stops at once for whoever really means it."""

    def __init__(self) -> None:
        self.requested = False
        self.signal_name = ""
        self._old: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:  # noqa: ARG002
        name = signal.Signals(signum).name
        if self.requested:
            print(f"\n{name} received again: ignored while the checkpoint is saved; exiting after it", flush=True)
            return
        self.requested = True
        self.signal_name = name
        print(f"\n{name} received: saving a checkpoint after this step, then exiting "
              "(a second signal is ignored until it is saved)", flush=True)

    def __enter__(self) -> GracefulExit:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._handler)
            except ValueError:  # not the main thread: signals cannot be caught here
                pass
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()


class RunStop:
    """The stop decision and the failure advice of one training loop (see the module docstring).

    `check(step)` returns why the run stops after this step (`SIGNAL`, `TIME_LIMIT`, `STOP_AT_STEP`)
    or None, the same answer on every rank. Leaving the `with` block on `NonFiniteError` re-raises it
    with the last good checkpoint and the way back (`lr_hint`, `resume_hint`); on a CUDA out-of-memory
    error (when `oom` = (what, batch size, `oom_message` hints) is given) raises `OutOfMemory` with the
    settings to try. `common.exit_codes.run_main` prints either and returns its exit code.
    """

    def __init__(self, time_limit_minutes: float | None = None, stop_at_step: int | None = None, *,
                 last_good: Callable[[], str | Path | None] = lambda: None, lr_hint: str = "a lower learning rate",
                 resume_hint: str = "--resume auto", oom: tuple[str, int, dict] | None = None) -> None:
        self.time_limit_minutes = time_limit_minutes
        self.stop_at_step = stop_at_step
        self.last_good, self.lr_hint, self.resume_hint, self.oom = last_good, lr_hint, resume_hint, oom
        self.signals = GracefulExit()
        self.reason: str | None = None
        self.t_start = time.perf_counter()

    @classmethod
    def of(cls, keys: Any, cfg: Any, what: str, **kw: Any) -> RunStop:
        """The stop of a run whose config section `keys` holds the cadence keys `max_minutes` and `stop_at_step`
        (0: off), with the out-of-memory advice for `what` derived from `cfg`'s schema (`oom_hints`)."""
        batch_key, hints = oom_hints(cfg)
        return cls(keys.max_minutes or None, keys.stop_at_step or None,
                   oom=(what, int(get_key(cfg, batch_key)), hints), **kw)

    def __enter__(self) -> RunStop:
        self.signals.__enter__()
        self.t_start = time.perf_counter()
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: Any) -> None:
        self.signals.__exit__(exc_type, exc, tb)
        if isinstance(exc, NonFiniteError):
            hint = nonfinite_stop_message(self.last_good(), self.lr_hint, self.resume_hint)
            raise NonFiniteError(f"{exc}\n{hint}") from None
        if self.oom is not None and isinstance(exc, RuntimeError) and not isinstance(exc, OutOfMemory) and is_oom(exc):
            raise OutOfMemory(oom_message(*self.oom, cause=exc)) from exc

    @property
    def signal_name(self) -> str:
        return self.signals.signal_name or "signal"

    def check(self, step: int) -> str | None:
        """Why the run stops after optimizer step `step`, or None; on every rank alike (`any_rank`, every
        `AGREE_EVERY` steps under torchrun)."""
        at_step = self.stop_at_step is not None and step >= self.stop_at_step
        if distributed.is_enabled() and step % AGREE_EVERY and not at_step:
            self.reason = None
            return None
        signalled = any_rank(self.signals.requested)
        limit = self.time_limit_minutes
        # the same limit on every rank: without one, no collective is needed
        timed_out = bool(limit) and any_rank(time.perf_counter() - self.t_start > 60.0 * limit)
        self.reason = SIGNAL if signalled else TIME_LIMIT if timed_out else STOP_AT_STEP if at_step else None
        return self.reason

    @property
    def why(self) -> str | None:
        """What stopped the run, as a line says it: the signal's name, or the reason (None: not stopped)."""
        return self.signal_name if self.reason == SIGNAL else self.reason

    def message(self, step: int, where: str = "") -> str:
        """The line a trainer prints when it stopped early and saved."""
        why = self.why
        return (f"stopped by {why} at step {step}; checkpoint saved{f' in {where}' if where else ''} "
                f"(continue with {self.resume_hint})")


def oom_hints(cfg: Any) -> tuple[str, dict]:
    """(batch-size key, `oom_message`'s hints) from the keys a trainer's schema names: `PRESET_KEYS` (what a
    card preset sets: batch size, precision, crop) and `OOM_KEYS` (what else relieves memory: `accumulation`,
    `checkpointing`, or a `batch_size` / `crop` the presets leave alone). Why from the schema: the advice
    names the keys the user can set, and a renamed key can never leave it stale."""
    schema = type(cfg)
    keys = {**getattr(schema, "PRESET_KEYS", {}), **getattr(schema, "OOM_KEYS", {})}
    hints: dict[str, Any] = {"batch_key": keys.get("batch_size", "batch_size"), "accum_key": keys.get("accumulation"),
                             "precision_key": keys.get("precision", "precision"), "resume": "--resume auto"}
    if "precision" in keys:
        hints["precision"] = get_key(cfg, keys["precision"])
    if "accumulation" in keys:
        hints["accumulation"] = get_key(cfg, keys["accumulation"])
    if "checkpointing" in keys:
        hints["checkpointing_key"] = keys["checkpointing"]
    crop = get_key(cfg, keys["crop"]) if "crop" in keys else None  # None: a free model_args mapping lacks it
    if crop is not None:
        hints["crop_key"], hints["crop"] = keys["crop"], crop
    return hints["batch_key"], hints


def exit_code(reason: str | None) -> int:
    """A run that stopped on a signal exits with INTERRUPTED; a finished, time-boxed or stop_at_step run with OK."""
    return exit_codes.INTERRUPTED if reason == SIGNAL else exit_codes.OK
