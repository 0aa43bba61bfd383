"""The pieces of a training step every trainer shares: a safe optimizer step, a non-finite
guard and an exponential moving average of the weights.

Why a guard instead of "hope": one NaN gradient that reaches an Adam or Muon moment buffer
poisons every later step, and a run that keeps producing NaNs should stop while its last good
checkpoint is still the newest one.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from common.distributed import unwrap as _unwrap


class NonFiniteError(RuntimeError):
    """Raised after too many consecutive non-finite steps: the run is diverging."""


class NonFiniteGuard:
    def __init__(self, max_consecutive: int = 20) -> None:
        self.max_consecutive = max_consecutive
        self.consecutive = 0
        self.skipped_total = 0

    def check(self, finite: bool | torch.Tensor) -> bool:
        """Records one step; returns whether it was finite. Raises NonFiniteError after
        `max_consecutive` non-finite steps in a row."""
        if isinstance(finite, torch.Tensor):
            finite = bool(torch.isfinite(finite).all())
        if finite:
            self.consecutive = 0
            return True
        self.consecutive += 1
        self.skipped_total += 1
        if self.consecutive >= self.max_consecutive:
            raise NonFiniteError(
                f"{self.consecutive} consecutive steps had non-finite losses/gradients "
                f"({self.skipped_total} skipped in total); stopping. The newest checkpoint is the last "
                "good one: resume from it with a lower learning rate, fp32/bf16 instead of fp16, or "
                "gradient clipping."
            )
        return False

    def check_step(self, finite: bool, scaler: torch.amp.GradScaler | None = None) -> bool:
        """Like `check`, but an fp16 loss-scale back-off (the scaler can still lower its scale
        and retry) is counted as a skip without counting towards divergence."""
        if not finite and scaler is not None and scaler.is_enabled() and scaler.get_scale() > 1.0:
            self.skipped_total += 1
            return False
        return self.check(finite)

    def state_dict(self) -> dict:
        return {"consecutive": self.consecutive, "skipped_total": self.skipped_total}

    def load_state_dict(self, state: dict) -> None:
        self.consecutive = state["consecutive"]
        self.skipped_total = state["skipped_total"]


def backward(loss: torch.Tensor, scaler: torch.amp.GradScaler | None = None) -> None:
    if scaler is not None and scaler.is_enabled():
        scaler.scale(loss).backward()
    else:
        loss.backward()


def step_optimizer(
    loss: torch.Tensor | None,
    optimizer: torch.optim.Optimizer,
    parameters: Iterable[nn.Parameter],
    scaler: torch.amp.GradScaler | None = None,
    clip_grad_norm: float | None = None,
    guard: NonFiniteGuard | None = None,
) -> tuple[torch.Tensor, bool]:
    """Backward (unless `loss` is None: gradients already accumulated), unscale, clip, step.

    Returns (grad norm before clipping, whether the optimizer stepped). A non-finite gradient
    norm skips the step entirely: gradients are zeroed and no optimizer state is touched. The
    caller calls `scaler.update()` once per iteration (after all its optimizers).
    """
    params = [p for p in parameters if p.requires_grad]
    if loss is not None:
        backward(loss, scaler)
    use_scaler = scaler is not None and scaler.is_enabled()
    if use_scaler:
        scaler.unscale_(optimizer)
    grads = [p for p in params if p.grad is not None]
    max_norm = float(clip_grad_norm) if clip_grad_norm else float("inf")
    norm = torch.nn.utils.clip_grad_norm_(grads, max_norm) if grads else torch.zeros(())
    finite = bool(torch.isfinite(norm))  # the step's one host sync
    if guard is not None:
        guard.check_step(finite, scaler)
    if use_scaler:
        scaler.step(optimizer)  # skips by itself when unscale_ found inf/NaN
    elif finite:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm.detach(), finite


class ClipStats:
    """How often gradient clipping actually clipped, per network, over a logging window.

    `update(name, pre_clip_norm)` once per optimizer step adds on the device (no host sync);
    `pop()` returns {f"clipped_{name}": fraction of this window's steps whose pre-clip norm
    exceeded `max_norm`} and starts a new window. A fraction near 1 means the clip, not the
    learning rate, sets every step's size.
    """

    def __init__(self, max_norm: float | None) -> None:
        self.max_norm = float(max_norm) if max_norm else None
        self._clipped: dict[str, torch.Tensor] = {}
        self._steps: dict[str, int] = {}

    def update(self, name: str, norm: torch.Tensor) -> None:
        if self.max_norm is None:
            return
        hit = (norm.detach() > self.max_norm).float()
        self._clipped[name] = self._clipped[name] + hit if name in self._clipped else hit
        self._steps[name] = self._steps.get(name, 0) + 1

    def pop(self) -> dict[str, float]:
        out = {f"clipped_{k}": float(v) / self._steps[k] for k, v in self._clipped.items()}
        self._clipped, self._steps = {}, {}
        return out


class EMA:
    """Exponential moving average of a model's floating-point state (fp32 shadow copy)."""

    def __init__(self, model: nn.Module, decay: float = 0.999) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.num_updates = 0
        self.shadow = {k: v.detach().float().clone() for k, v in _unwrap(model).state_dict().items()}

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        self.num_updates += 1
        current = _unwrap(model).state_dict()
        floats = [k for k, v in self.shadow.items() if current[k].dtype.is_floating_point]
        torch._foreach_lerp_([self.shadow[k] for k in floats], [current[k].detach().float() for k in floats], 1.0 - self.decay)
        for k, v in self.shadow.items():
            if not current[k].dtype.is_floating_point:
                v.copy_(current[k])

    @torch.no_grad()
    def copy_to(self, model: nn.Module) -> None:
        target = _unwrap(model)
        own = target.state_dict()
        target.load_state_dict({k: v.to(own[k].dtype) for k, v in self.shadow.items()})

    def state_dict(self) -> dict:
        return {"decay": self.decay, "num_updates": self.num_updates, "shadow": self.shadow}

    def load_state_dict(self, state: dict) -> None:
        self.decay = state["decay"]
        self.num_updates = state["num_updates"]
        self.shadow = {k: v.float().clone() for k, v in state["shadow"].items()}
