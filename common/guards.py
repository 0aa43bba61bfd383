"""The guards every trainer's steps pass through: a non-finite guard per optimizer and a divergence guard.

Why guards instead of "hope": one NaN gradient that reaches an Adam or Muon moment buffer poisons every
later step, and a run that keeps producing NaNs should stop while its last good checkpoint is still the
newest one. A run can also diverge without a single NaN (a learning rate of 1e30 leaves weights near 1e29
and saturated outputs with a flat loss): the divergence guard treats such steps the same way. The step
that consults them is common/training.py; the loop that ends a run by them is common/loop.py.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from common.distributed import all_reduce_mean


class NonFiniteError(RuntimeError):
    """Raised after too many consecutive non-finite steps: the run is diverging."""


class NonFiniteGuard:
    """Counts the non-finite (skipped) steps of one optimizer and stops a run whose steps stay non-finite.

    Why on the device: deciding a skip and counting it on the host costs every step a host sync (the GPU
    drains its queue, and CUDA graphs and overlap become impossible). `record(finite)` takes the step's
    0-d bool tensor and updates device counters with torch ops only: the consecutive count, the total,
    and the longest streak since the last judgement. The host reads them only when someone asks:
    `settle()` (at every log point, through `common.loop.health`, and at every save and run end, through
    `saving_blocked` / `check_run_ended_good`) copies them once, and raises `NonFiniteError` when a
    streak reached `max_consecutive` since the last judgement. So a streak is judged up to `log_every`
    steps (or `save_every`, whichever comes first) after it reached the limit, not at that very step, as
    `DivergenceGuard` judges a step late; the steps in between are skipped too (no weight or optimizer
    moment changes; the LR schedule counts them, as it counts every skip), and no checkpoint is written
    meanwhile, because a save reads the counters first. `check` / `check_step` are the immediate host forms (record, then settle).
    """

    def __init__(self, max_consecutive: int = 20) -> None:
        self.max_consecutive = max_consecutive
        self._host = (0, 0)  # (consecutive, skipped_total) as last read; the device counters start from it
        self._counts: torch.Tensor | None = None  # int64 [consecutive, total, longest streak since judged]

    def _device_counts(self, device: torch.device) -> torch.Tensor:
        if self._counts is None or self._counts.device != device:
            consecutive, total = self._read() if self._counts is not None else self._host
            counts = torch.zeros(3, dtype=torch.long, device=device)
            for i, value in enumerate((consecutive, total, consecutive)):
                if value:
                    counts[i].fill_(value)  # a scalar kernel argument: no host-to-device copy to wait for
            self._counts = counts
        return self._counts

    @torch.no_grad()
    def record(self, finite: torch.Tensor, scaler: torch.amp.GradScaler | None = None,
               where: torch.Tensor | None = None) -> None:
        """Records one step from its 0-d bool `finite`, with device ops only (no host sync). With an
        enabled fp16 `scaler` whose scale is still above 1, a non-finite step is the scaler backing off
        (it lowers its scale and retries): counted as skipped, not towards the streak (nor resetting it).
        `where` (a 0-d bool): the step counts only where it is true (a critic whose step was called off
        because the generator's was skipped: that skip is not the critic's, and changes nothing here)."""
        counts = self._device_counts(finite.device)
        bad = (~finite).long()
        counted = bad
        if scaler is not None and scaler.is_enabled():
            # compared now, in stream order: scaler.update() changes the scale tensor in place later
            scale = scaler._get_scale_async()  # None until the scaler's first scale(): then its init_scale
            backoff = (scale.to(finite.device) > 1.0 if scale is not None
                       else torch.tensor(scaler.get_scale() > 1.0, device=finite.device))
            counted = bad * (~backoff).long()
        consecutive = torch.where(finite, 0, counts[0] + counted)
        new = torch.stack([consecutive, counts[1] + bad, torch.maximum(counts[2], consecutive)])
        counts.copy_(new if where is None else torch.where(where.to(counts.device), new, counts))

    def _read(self) -> tuple[int, int]:
        """(consecutive, skipped_total) now: one host read of the device counters (a sync)."""
        if self._counts is not None:
            consecutive, total, _ = self._counts.tolist()
            self._host = (consecutive, total)
        return self._host

    def settle(self) -> bool:
        """Judges what was recorded since the last judgement (one host sync: at a log point, a save, the
        end of a run). Raises `NonFiniteError` when a streak reached `max_consecutive`; returns whether
        the newest step was finite (no streak now)."""
        if self._counts is not None:
            consecutive, total, longest = self._counts.tolist()
            self._host = (consecutive, total)
        else:
            (consecutive, total), longest = self._host, self._host[0]
        if longest >= self.max_consecutive:  # kept: reading again raises again
            raise NonFiniteError(
                f"{longest} consecutive steps had non-finite losses/gradients "
                f"({total} skipped in total); stopping. Likely fixes: a lower learning rate, "
                "fp32/bf16 instead of fp16, or gradient clipping."
            )
        if self._counts is not None:
            self._counts[2].copy_(self._counts[0])  # a new window: the longest streak since this judgement
        return consecutive == 0

    def check(self, finite: bool | torch.Tensor) -> bool:
        """Records one step and judges it at once (a host sync): returns whether it was finite; raises
        NonFiniteError at `max_consecutive` non-finite steps in a row."""
        return self.check_step(finite)

    def check_step(self, finite: bool | torch.Tensor, scaler: torch.amp.GradScaler | None = None) -> bool:
        """`record` (with the fp16 scaler's back-off rule) and `settle` at once (a host sync)."""
        if isinstance(finite, torch.Tensor):
            finite = torch.isfinite(finite).all()
        else:
            device = self._counts.device if self._counts is not None else "cpu"
            finite = torch.tensor(bool(finite), device=device)
        self.record(finite, scaler)
        self.settle()
        return bool(finite)

    @property
    def consecutive(self) -> int:
        """The current streak of counted non-finite steps (reads the device: a sync; never raises)."""
        return self._read()[0]

    @property
    def skipped_total(self) -> int:
        """Every skipped step so far, fp16 back-offs included (reads the device: a sync; never raises)."""
        return self._read()[1]

    @property
    def in_streak(self) -> bool:
        """True while the newest step(s) were non-finite: the state is not known to be good (reads the
        device counters: a sync, as a save may take; never raises)."""
        return self.consecutive > 0

    def state_dict(self) -> dict:
        consecutive, total = self._read()
        return {"consecutive": consecutive, "skipped_total": total}

    def load_state_dict(self, state: dict) -> None:
        self._host = (int(state["consecutive"]), int(state["skipped_total"]))
        self._counts = None  # made again from these at the next record, on that step's device


# Finite divergence: a step whose weight norm or loss is more than GROWTH_FACTOR x the median of the last
# GROWTH_WINDOW good steps counts as a bad step. Measured on normal runs, the largest ratio of a step's value
# to that median: the tiny CPU configs of the four trainers' tests, 60 steps each at their test learning rate
# (and at 10x it): weight norm at most 1.004 (1.051), loss at most 1.17 (1.27); the three speech demo runs'
# logged losses (2700 / 800 / 550 steps): at most 1.54 (per trainer: docs/conventions.md, "Divergence").
# 1e3 ("orders of magnitude") leaves a margin of 650x over the largest (1.54); a learning rate of
# 1e30 gives the weight norm an overflow or a ratio near 1e28 at the first step after it.
GROWTH_FACTOR = 1e3
GROWTH_WINDOW = 32


class DivergenceGuard:
    """Finite divergence: the norm of the trained weights, or the loss, suddenly orders of magnitude
    above its recent median. Such a step counts like a non-finite one: no checkpoint while it lasts
    (`saving_blocked`), `max_consecutive` in a row raise `NonFiniteError` (exit 3, naming the last
    good checkpoint), and a run that ends inside the streak fails (`check_run_ended_good`).

    `observe(loss)` once per optimizer step, just before the update: it records the norm of the
    weights that produced `loss`, and the loss, and copies them to the host behind the step's work.
    They are judged at the next `observe`, when that copy is long done (so the check adds no host
    sync to the step), or at `settle()`, which every save runs through `saving_blocked` and which also
    judges the weights as they are after the last update. `in_streak` only reads what was last judged
    (no device work, never raises); `settle()` is the call that reads the device.
    A non-finite loss is left to `NonFiniteGuard` (that step is skipped); a non-finite weight norm is
    divergence (finite weights near 1e20 already overflow a float32 norm). `loss` must be positive (a
    reconstruction loss, or a sum of positive terms), so that "1000x its median" means a blow-up.
    """

    def __init__(self, parameters: Iterable[nn.Parameter], max_consecutive: int = 20,
                 factor: float = GROWTH_FACTOR, window: int = GROWTH_WINDOW, across_ranks: bool = True) -> None:
        self.parameters = [p for p in parameters if p.requires_grad]
        self.max_consecutive, self.factor, self.window = max_consecutive, factor, window
        self.across_ranks = across_ranks  # False: a step run on one rank alone (a batch-size probe)
        self.consecutive = 0
        self.recent: dict[str, list[float]] = {"weight norm": [], "loss": []}
        self.pending: tuple[torch.Tensor, torch.cuda.Event | None] | None = None  # (values on the host, copy done)
        self.reason = ""
        self.weights_bad = False  # the last settle() found the weights after the last update out of range

    @torch.no_grad()
    def weight_norm(self) -> torch.Tensor:
        return torch.nn.utils.get_total_norm([p.detach() for p in self.parameters]).float()

    def observe(self, loss: torch.Tensor) -> None:
        """Records this step (before its update); judges the previous one. Raises `NonFiniteError` at
        `max_consecutive` diverging steps in a row."""
        # every rank judges the same numbers (the weights are equal, the loss is the mean over ranks), so
        # every rank stops at the same step; with NCCL the all-reduce is queued on the device, no host sync
        values = torch.stack([self.weight_norm(), loss.detach().float().reshape(())])
        values = all_reduce_mean(values) if self.across_ranks else values
        event = None
        if values.is_cuda:  # copied to pinned host memory behind the step's work; read once the copy is done
            values = torch.empty(values.shape, dtype=values.dtype, pin_memory=True).copy_(values, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        self._judge_pending()
        self.pending = values, event

    def settle(self) -> bool:
        """Judges the pending step and the weights as they are now (one host sync: before a save or at
        the end of a run). Returns whether the state is good: no diverging streak, weights in range."""
        self._judge_pending()
        if self.consecutive:
            return False
        why = self._why_bad("weight norm", float(self.weight_norm()))
        if why is not None:
            self.reason = f"after the last update {why}"
        self.weights_bad = why is not None
        return why is None

    @property
    def in_streak(self) -> bool:
        """The state as last judged (by `observe` or `settle`): a diverging streak, or weights out of range.
        A plain read: no device sync, never raises; a step still pending counts once judged, so whoever
        needs the state now (a save, the end of a run) calls `settle()` first, as `saving_blocked` does."""
        return self.consecutive > 0 or self.weights_bad

    def _why_bad(self, name: str, value: float) -> str | None:
        history = self.recent[name]
        if not history:
            return None
        median = statistics.median(history)
        if name == "weight norm" and not math.isfinite(value):
            return f"the weight norm overflowed (finite weights beyond float32 range; median before {median:.3g})"
        if math.isfinite(value) and median > 0 and value > self.factor * median:
            return f"the {name} rose to {value:.3g}, {value / median:.3g} x its median over the last {len(history)} steps ({median:.3g})"
        return None

    def _judge_pending(self) -> None:
        if self.pending is None:
            return
        (values, event), self.pending = self.pending, None
        if event is not None:
            event.synchronize()  # long done by now: it waits for that copy, not for the step queued since
        values = values.tolist()
        reasons = [r for name, v in zip(self.recent, values) if (r := self._why_bad(name, v))]
        if reasons:
            self.consecutive += 1
            self.reason = "; ".join(reasons)
            if self.consecutive >= self.max_consecutive:
                raise NonFiniteError(
                    f"{self.consecutive} consecutive steps diverged while staying finite ({self.reason}); stopping. "
                    "Likely fixes: a lower learning rate, a longer warmup, or gradient clipping.")
            return
        self.consecutive = 0
        self.weights_bad = False  # a later step's weights were judged in range
        for name, v in zip(self.recent, values):
            if math.isfinite(v):
                history = self.recent[name]
                history.append(v)
                del history[:-self.window]

    def state_dict(self) -> dict:
        self._judge_pending()
        return {"consecutive": self.consecutive, "recent": {k: list(v) for k, v in self.recent.items()}}

    def load_state_dict(self, state: dict | None) -> None:
        """A checkpoint from before this guard has no state: the windows then fill again from here."""
        if state:
            self.consecutive = int(state["consecutive"])
            self.recent = {k: list(state["recent"].get(k, [])) for k in self.recent}


def saving_blocked(*guards: NonFiniteGuard | DivergenceGuard | None) -> bool:
    """The one rule for every trainer: no checkpoint is written while any guard counts a non-finite
    or diverging streak, so the newest checkpoint on disk is always a good state (rotation can never
    push the pre-streak checkpoints out, and a non-finite stop leaves the last good one newest)."""
    return any(g is not None and _judged_in_streak(g) for g in guards)


def _judged_in_streak(g: NonFiniteGuard | DivergenceGuard) -> bool:
    """`g.in_streak` as of now: the guard first settles (its one host sync; at `max_consecutive` it
    raises `NonFiniteError`)."""
    g.settle()
    return g.in_streak


def check_run_ended_good(*guards: NonFiniteGuard | DivergenceGuard | None) -> None:
    """Called where a run ends (its plan done, a time limit, stop_at_step, a signal), before the final
    save. A run that ends inside a non-finite or diverging streak shorter than `max_consecutive` has no
    good state to save: it fails like a non-finite stop (`NonFiniteError`: exit 3, and `RunStop` names
    the last good checkpoint), never as a success that saved nothing."""
    for g in guards:
        if g is not None and _judged_in_streak(g):
            what = f"diverging step(s) ({g.reason})" if isinstance(g, DivergenceGuard) else "non-finite step(s)"
            raise NonFiniteError(f"the run ended inside a streak of {max(1, g.consecutive)} {what}, "
                                 "so its final state is not good and was not saved")


def nonfinite_stop_message(last_good: str | Path | None, lr_hint: str, resume_hint: str = "--resume auto") -> str:
    """The line a trainer prints after a non-finite stop: the real last good file, or that there is none."""
    if last_good is None:
        return ("no checkpoint was written before the streak, so there is nothing good to resume: "
                f"start again with a lower learning rate ({lr_hint}), fp32/bf16 instead of fp16, or gradient clipping")
    return (f"last good checkpoint: {last_good} (nothing was written during the streak). Continue from "
            f"it with a lower learning rate: {lr_hint} {resume_hint} (a value given on resume replaces the "
            "checkpoint's)")
