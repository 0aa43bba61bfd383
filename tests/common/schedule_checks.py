"""Helpers for the recipe-schedule tests: schedules are checked without building any model, by
evaluating the trainers' own scheduler construction on a one-parameter optimizer."""

from __future__ import annotations

import io
from collections.abc import Callable

import torch
from torch.optim.lr_scheduler import LambdaLR

from common.checkpoint import make_state, restore_state


def one_param_optimizer(lr: float) -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def lrs_through(build: Callable[[torch.optim.Optimizer], LambdaLR], lr: float, n: int,
                resume_at: int | None = None) -> list[float]:
    """The lr of each of `n` updates (read before the update, as the optimizer uses it).

    With `resume_at`, the run is cut after that many updates: its optimizer and scheduler go
    through `make_state` / `restore_state` (the trainers' checkpoint path) into a freshly built
    pair, which carries on. An exact resume gives the same list as the uninterrupted run.
    """
    model = torch.nn.Linear(1, 1)
    opt = one_param_optimizer(lr)
    sched = build(opt)
    out = []
    for i in range(n):
        if i == resume_at:
            buf = io.BytesIO()
            torch.save(make_state({"m": model}, {"o": opt}, {"s": sched}, counters={"step": i}), buf)
            buf.seek(0)
            state = torch.load(buf, weights_only=True)  # as the trainers load checkpoints
            opt = one_param_optimizer(lr)
            sched = build(opt)
            restore_state(state, {"m": model}, {"o": opt}, {"s": sched})
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out
