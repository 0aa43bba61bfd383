"""The one step-timing rule every benchmark uses: warm up, synchronise, time, synchronise."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def seconds_per_step(step: Callable[[], None], steps: int, device: torch.device, warmup: int = 1) -> float:
    """Mean wall time of `step` after `warmup` untimed calls; CUDA work is waited for, so the
    figure is the device's time, not the launch time."""
    for _ in range(warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / steps
