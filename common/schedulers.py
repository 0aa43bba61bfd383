"""Learning-rate schedules as pure functions of the optimizer step.

Every schedule is `f(step) -> multiplier of the configured lr`, wrapped in one `LambdaLR`.
Because the multiplier depends on nothing but the step, resuming from a checkpoint (which
restores `last_epoch`) reproduces the exact lr sequence - there is no hidden state to lose.
`step` counts `scheduler.step()` calls, i.e. optimizer updates (call it once per update, even
for per-epoch decay: `per="epoch"` does the epoch arithmetic here).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

SCHEDULES = ("constant", "warmup", "exponential", "noam", "cosine_with_warmup")


def _linear_warmup(step: int, warmup_steps: int) -> float:
    """0 at step 0, rising linearly to 1 at `warmup_steps` (1 throughout if no warmup)."""
    return min(1.0, step / warmup_steps) if warmup_steps > 0 else 1.0


def lr_lambda(
    name: str,
    warmup_steps: int = 0,
    total_steps: int | None = None,
    gamma: float | None = None,
    per: str = "step",
    steps_per_epoch: int | None = None,
    d_model: int | None = None,
    min_ratio: float = 0.0,
) -> Callable[[int], float]:
    """Build the multiplier function of schedule `name`.

    - constant / warmup: linear warmup over `warmup_steps`, then 1.
    - exponential: warmup, then gamma ** k; k counts steps after warmup, or whole epochs of
      `steps_per_epoch` steps after warmup when per="epoch" (hifi-gan's ExponentialLR per epoch).
    - noam: d_model^-0.5 * min(s^-0.5, s * w^-1.5), divided by its value at s = w. So the
      configured lr IS the peak lr (reached at step = warmup_steps), then it decays as
      sqrt(w / s). d_model cancels in that normalisation; it is accepted for config compatibility.
    - cosine_with_warmup: linear warmup 0 -> 1, cosine from 1 to `min_ratio` at `total_steps`,
      flat at `min_ratio` after.
    """
    key = str(name).strip().lower().replace("-", "_")
    if key not in SCHEDULES:
        raise ValueError(f"unknown lr schedule '{name}': valid schedules are {', '.join(SCHEDULES)}")
    if int(warmup_steps) != warmup_steps or warmup_steps < 0:
        raise ValueError(f"lr schedule '{key}': warmup_steps must be an integer >= 0, got {warmup_steps}")
    warmup_steps = int(warmup_steps)
    if per not in ("step", "epoch"):
        raise ValueError(f"lr schedule '{key}': per must be 'step' or 'epoch', got '{per}'")
    if per == "epoch" and key != "exponential":
        raise ValueError(f"lr schedule '{key}': per='epoch' applies only to 'exponential'")
    if not 0.0 <= min_ratio <= 1.0:
        raise ValueError(f"lr schedule '{key}': min_ratio must be in [0, 1], got {min_ratio}")

    if key in ("constant", "warmup"):
        def constant(step: int) -> float:
            return _linear_warmup(step, warmup_steps)
        return constant

    if key == "exponential":
        if gamma is None or not 0.0 < gamma <= 1.0:
            raise ValueError(f"lr schedule 'exponential' needs gamma in (0, 1], got {gamma}")
        if per == "epoch" and (steps_per_epoch is None or steps_per_epoch < 1):
            raise ValueError("lr schedule 'exponential' with per='epoch' needs steps_per_epoch >= 1 "
                             f"(the number of optimizer steps in one epoch), got {steps_per_epoch}")
        div = steps_per_epoch if per == "epoch" else 1

        def exponential(step: int) -> float:
            if step < warmup_steps:
                return _linear_warmup(step, warmup_steps)
            return gamma ** ((step - warmup_steps) // div)
        return exponential

    if key == "noam":
        if warmup_steps < 1:
            raise ValueError("lr schedule 'noam' needs warmup_steps >= 1 (its peak is at warmup_steps)")
        w = float(warmup_steps)

        def noam(step: int) -> float:
            if step <= 0:
                return 0.0
            return min(math.sqrt(w / step), step / w)  # = min(s^-0.5, s*w^-1.5) / w^-0.5
        return noam

    # cosine_with_warmup
    if total_steps is None or total_steps <= warmup_steps:
        raise ValueError(f"lr schedule 'cosine_with_warmup' needs total_steps > warmup_steps "
                         f"({warmup_steps}), got total_steps={total_steps}")
    decay_steps = total_steps - warmup_steps

    def cosine_with_warmup(step: int) -> float:
        if step < warmup_steps:
            return _linear_warmup(step, warmup_steps)
        progress = min(1.0, (step - warmup_steps) / decay_steps)
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return cosine_with_warmup


def build_scheduler(optimizer: Optimizer, name: str, **kwargs) -> LambdaLR:
    """A LambdaLR applying `lr_lambda(name, **kwargs)` to every param group of `optimizer`.

    The configured lr of each group (e.g. Muon's and AdamW's in MuonAdamW) is scaled by the
    same multiplier. Note: LambdaLR sets lr = lr * f(0) immediately, which is 0 with warmup.
    """
    return LambdaLR(optimizer, lr_lambda(name, **kwargs))


# ----------------------------------------------------------------------------- the plan, before the run
PREVIEW_FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)
COLLAPSE_RATIO = 0.01  # "the LR has collapsed": below 1 % of its peak ...
COLLAPSE_BEFORE = 0.5  # ... before half of the planned run


def lr_curve(scheduler: LambdaLR, group: int = 0) -> Callable[[int], float]:
    """`step -> lr` that update number `step` (0-based) of a LambdaLR-driven run uses.

    After `step` calls of `scheduler.step()` the optimizer's lr is base_lr * lambda(step), and the
    next optimizer update uses it. Reads only the scheduler's lambda and base lr: no state changes.
    """
    base, fn = scheduler.base_lrs[group], scheduler.lr_lambdas[group]
    return lambda step: base * fn(step)


def preview_steps(total_steps: int) -> list[int]:
    """The update indices shown as 0/25/50/75/100 % of a run of `total_steps` updates
    (100 % is the last update, `total_steps - 1`)."""
    last = max(0, int(total_steps) - 1)
    return [min(last, round(f * last)) for f in PREVIEW_FRACTIONS]


def sample_curve(lr_fn: Callable[[int], float], total_steps: int, points: int = 2001) -> tuple[list[int], list[float]]:
    """The curve at up to `points` evenly spaced updates (every update of a shorter run), plus the
    preview steps, in order: cheap enough for a 1 M-step plan, fine enough for a plot."""
    last = max(0, int(total_steps) - 1)
    n = min(points, last + 1)
    steps = sorted({round(i * last / max(1, n - 1)) for i in range(n)} | set(preview_steps(total_steps)))
    return steps, [float(lr_fn(s)) for s in steps]


def collapse_step(lr_fn: Callable[[int], float], total_steps: int, ratio: float = COLLAPSE_RATIO) -> int | None:
    """The first update after the (sampled) peak whose lr is below `ratio` x the peak, or None.

    Found on the sampled curve, then bisected between the two samples around the crossing: exact
    for schedules that are monotone between samples (every schedule here is)."""
    steps, lrs = sample_curve(lr_fn, total_steps)
    peak = max(lrs)
    if peak <= 0:
        return None
    start = lrs.index(peak)
    i = next((i for i in range(start, len(steps)) if lrs[i] < ratio * peak), None)
    if i is None:
        return None
    lo, hi = steps[i - 1] if i > start else steps[i], steps[i]  # lr(lo) >= threshold > lr(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if lr_fn(mid) < ratio * peak else (mid, hi)
    return hi


def schedule_preview(lr_fn: Callable[[int], float], total_steps: int, keys: str, name: str = "lr") -> list[str]:
    """Lines that show a whole LR plan before any GPU time is spent.

    One line with the lr at 0 / 25 / 50 / 75 / 100 % of the `total_steps` planned updates (each
    also as a multiple of the curve's peak), and a warning line when the lr falls below 1 % of
    its peak before half of the plan: such a run stops learning long before it ends. `keys`
    names the config keys that shape the schedule (the warning tells the user to change them).
    """
    if total_steps < 1:
        raise ValueError(f"schedule_preview: the plan has {total_steps} updates; it needs at least 1")
    _, lrs = sample_curve(lr_fn, total_steps)
    peak = max(lrs)
    parts = []
    for frac, step in zip(PREVIEW_FRACTIONS, preview_steps(total_steps)):
        lr = float(lr_fn(step))
        rel = f" ({lr / peak:.3g}x)" if peak > 0 else ""
        parts.append(f"{frac:.0%} {lr:.3g}{rel}")
    lines = [f"{name} plan over {total_steps} updates (peak {peak:.3g}): " + " | ".join(parts)]
    hit = collapse_step(lr_fn, total_steps)
    if hit is not None and hit < COLLAPSE_BEFORE * total_steps:
        lines.append(f"warning: {name} falls below {COLLAPSE_RATIO:.0%} of its peak at update {hit} of "
                     f"{total_steps} ({hit / total_steps:.0%} of the plan), so the rest of the run barely "
                     f"learns: change {keys}")
    return lines


def step_schedulers(schedulers) -> None:
    """Step each LR schedule once per training step. A schedule is a pure function of the step count, so
    it steps even when its optimizer skipped the step (a non-finite skip, a critic before its start);
    LambdaLR's warning about exactly that is silenced here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)`")
        for sched in schedulers:
            sched.step()
