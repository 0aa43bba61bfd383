"""The pieces of a training step every trainer shares: a safe optimizer step (through its
`common.guards.NonFiniteGuard`), critic calls, resumed optimizer overrides and an exponential moving
average of the weights. The guards themselves live in common/guards.py."""

from __future__ import annotations

import contextlib
import copy
import math
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch
from torch import nn
from torch.nn.utils import parametrize

from common.config import explicit_keys
from common.distributed import unwrap as _unwrap
from common.guards import NonFiniteGuard
from common.muon import step_kept_where


class BufferSnapshot:
    """Module buffers (BatchNorm running statistics) change in the forward pass, before anyone knows
    whether the step will be skipped: take() before the step, restore() when it was skipped, so a
    non-finite step leaves no trace (a NaN running mean would poison every later step and checkpoint)."""

    def __init__(self, *modules: nn.Module | None) -> None:
        self.buffers = [b for m in modules if m is not None for b in _unwrap(m).buffers()]
        self.saved: list[torch.Tensor] = []

    def take(self) -> None:
        self.saved = [b.detach().clone() for b in self.buffers]

    @torch.no_grad()
    def restore(self) -> None:
        for buf, saved in zip(self.buffers, self.saved):
            buf.copy_(saved)

    @torch.no_grad()
    def keep_where(self, kept: torch.Tensor) -> None:
        """`restore()` where the 0-d bool `kept` is false, decided on the device (no host sync)."""
        for buf, saved in zip(self.buffers, self.saved):
            buf.copy_(torch.where(kept.to(buf.device), buf, saved))


# Hyper-parameters an optimizer keeps in its param groups (and so in a checkpoint).
# muon_weight_decay: the weight decay of MuonAdamW's Muon groups only (after weight_decay, which sets all)
OPTIMIZER_HPARAMS = ("lr", "betas", "eps", "weight_decay", "momentum", "muon_weight_decay")


def optimizer_overrides(cfg: Any, spec: dict[str, dict[str, tuple[tuple[str, ...], Any]]]) -> dict[str, dict[str, Any]]:
    """Which optimizer hyper-parameters the user set explicitly for this run.

    `spec`: optimizer name → hyper-parameter → (the config keys that decide it, its value now), e.g.
    `{"generator": {"lr": (("learning_rate",), 1e-5), "betas": (("adam_beta1", "adam_beta2"), (0.5, 0.9))}}`.
    Returns only the entries whose keys appear in `common.config.explicit_keys(cfg)`."""
    explicit = explicit_keys(cfg)

    def given(key: str) -> bool:  # the key itself, or a whole mapping above it (`--set optim={lr: 1e-5}`)
        return any(key == e or key.startswith(e + ".") for e in explicit)

    return {name: {hp: value for hp, (keys, value) in hps.items() if any(given(k) for k in keys)}
            for name, hps in spec.items()}


def apply_optimizer_overrides(
    optimizers: dict[str, torch.optim.Optimizer | None],
    schedulers: dict[str, Any] | None,
    overrides: dict[str, dict[str, Any]],
) -> str | None:
    """After `restore_state`: the hyper-parameters given now replace the checkpoint's in every param
    group (a group without that key, e.g. Muon's betas, is left alone). A new `lr` becomes the
    scheduler's base LR too, and the current LR is the new base times the schedule's multiplier at the
    restored step. Also says when this run's LR schedule gives another LR at the restored step than
    the checkpoint ran with (its planned length changed: max_updates, epochs, data size or GPU count):
    the run follows the new plan from here, with a jump a user should know of. Returns the log line(s)
    saying what changed, or None (then nothing was touched and the resume stays bitwise)."""
    schedule = _schedule_changes(optimizers, schedulers or {})  # before an lr given now moves the base
    changes = []
    for name, values in overrides.items():
        opt = optimizers.get(name)
        if opt is None or not values:
            continue
        sched = (schedulers or {}).get(name)
        for key, value in values.items():
            if key not in OPTIMIZER_HPARAMS:
                raise ValueError(f"unknown optimizer hyper-parameter '{key}' (known: {', '.join(OPTIMIZER_HPARAMS)})")
            old = []
            for i, group in enumerate(opt.param_groups):
                if key == "muon_weight_decay":
                    if group.get("use_muon"):
                        old.append(group["weight_decay"])
                        group["weight_decay"] = value
                    continue
                if key not in group:
                    continue
                if key == "lr":
                    old.append(group.get("initial_lr", group["lr"]))
                    _set_base_lr(group, i, float(value), sched)
                else:
                    old.append(group[key])
                    group[key] = tuple(value) if key == "betas" else value
            if old:
                shown = old[0] if all(o == old[0] for o in old) else old
                changes.append(f"{name} {key} {_fmt(shown)} -> {_fmt(value)}")
        if sched is not None:
            sched._last_lr = [g["lr"] for g in opt.param_groups]
    lines = (["resume: given on the command line, replacing the checkpoint's values: " + "; ".join(changes)]
             if changes else []) + [f"resume: {change}" for change in schedule]
    return "\n".join(lines) or None


def _schedule_changes(optimizers: dict[str, torch.optim.Optimizer | None], schedulers: dict[str, Any]) -> list[str]:
    """'<name> lr at step N: X (checkpoint) -> Y (this run's schedule)' where a LambdaLR's restored step
    gives another multiplier now (its function is code, not in the checkpoint)."""
    changes = []
    for name, sched in schedulers.items():
        opt = optimizers.get(name)
        if opt is None or not hasattr(sched, "lr_lambdas"):
            continue
        had = opt.param_groups[0]["lr"]
        now = sched.base_lrs[0] * sched.lr_lambdas[0](sched.last_epoch)
        if not math.isclose(had, now, rel_tol=1e-6, abs_tol=1e-12):
            changes.append(f"{name} lr at step {sched.last_epoch} {_fmt(had)} -> {_fmt(now)} (this run's LR schedule: "
                           "its planned length differs from the checkpoint's run; it applies from the next step)")
    return changes


def _set_base_lr(group: dict, index: int, lr: float, sched: Any) -> None:
    old_base = group.get("initial_lr", group["lr"])
    group["initial_lr"] = lr
    if sched is None:
        group["lr"] = lr
        return
    if hasattr(sched, "lr_lambdas"):  # LambdaLR: the multiplier the next step would use, exactly
        factor = sched.lr_lambdas[index](sched.last_epoch)
    else:
        factor = group["lr"] / old_base if old_base else 1.0
    sched.base_lrs[index] = lr
    group["lr"] = lr * factor


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(_fmt(v) for v in value) + ")"
    return str(value)


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
    also: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward (unless `loss` is None: gradients already accumulated), unscale, clip, step.

    Returns (grad norm before clipping, whether the optimizer stepped: a 0-d bool tensor on the device).
    A non-finite gradient norm skips the step entirely: no weight, moment or step count changes, and the
    gradients are zeroed. The skip is decided on the device, never by the host (`step_if_finite`), and
    `guard.record` counts it there too, so the step makes no host sync (test_training's dispatch check;
    tests/cuda/test_no_sync.py on a GPU). The caller calls `scaler.update()` once per iteration (after
    all its optimizers). `also` (a 0-d bool on the device): step only where it is true too, e.g. a critic
    whose generator's step was skipped; the guard then records nothing for this step (the skip is not
    this optimizer's), and the returned flag is false.
    """
    params = [p for p in parameters if p.requires_grad]
    if loss is not None:
        backward(loss, scaler)
    use_scaler = scaler is not None and scaler.is_enabled()
    if use_scaler:
        scaler.unscale_(optimizer)  # records its found_inf for scaler.update(); the norm below covers it
    grads = [p for p in params if p.grad is not None]
    max_norm = float(clip_grad_norm) if clip_grad_norm else float("inf")
    norm = torch.nn.utils.clip_grad_norm_(grads, max_norm) if grads else torch.zeros(())
    finite = torch.isfinite(norm)
    if guard is not None:
        guard.record(finite, scaler if use_scaler else None, where=also)
    stepped = finite if also is None else finite & also.to(finite.device)
    step_if_finite(optimizer, stepped)
    optimizer.zero_grad(set_to_none=True)
    return norm.detach(), stepped


@torch.no_grad()
def step_if_finite(optimizer: torch.optim.Optimizer, finite: torch.Tensor) -> None:
    """`optimizer.step()`, kept only where the 0-d bool `finite` is true, decided on the device.

    An optimizer that skips by itself (`_step_supports_amp_scaling`: torch's fused Adam/AdamW/SGD, our
    Muon and MuonAdamW) gets `found_inf` as `GradScaler.step` would hand it over (the gradients are
    already unscaled, so no `grad_scale`). Any other (torch's per-tensor and foreach AdamW) steps and
    then keeps the old weights and state where `finite` is false (`common.muon.step_kept_where`: bitwise
    the plain step when finite). Its first step, which creates the state, is decided on the host once:
    there is no state to keep yet."""
    if getattr(optimizer, "_step_supports_amp_scaling", False):
        optimizer.found_inf, optimizer.grad_scale = (~finite).float(), None
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf, optimizer.grad_scale
        return
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if any(not optimizer.state.get(p) for p in params):
        if bool(finite):  # the optimizer's first step: one host sync
            optimizer.step()
        return
    state = [v for p in params for v in optimizer.state[p].values() if isinstance(v, torch.Tensor)]
    step_kept_where(finite, [*params, *state], optimizer.step)


Out = TypeVar("Out")


def critic_outputs_for_generator(critic: Callable[[torch.Tensor], Out], real: torch.Tensor,
                         fake: torch.Tensor) -> tuple[Out, Out]:
    """A frozen critic's outputs for the generator update: (on ``real``, without grad), (on ``fake``,
    with grad). Feature matching uses the real features only as constants, so one call on
    cat([real, fake]) would backpropagate through the real half for nothing (~35 % more critic
    backward). ``parametrize.cached`` computes each normed weight, and a spectral norm's power
    iteration, once for both calls, exactly as a single call would."""
    with parametrize.cached():
        out_fake = critic(fake)
        with torch.no_grad():
            out_real = critic(real)
    return out_real, out_fake


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
    """Exponential moving average of a model's floating-point state (fp32 shadow copy).

    `only`: state-dict name prefixes to average (default: everything). A model part that never trains
    (the frozen encoder of a decoder-only fine-tune) is left out: averaging it would only copy it,
    and the checkpoint then says plainly which part the EMA holds."""

    def __init__(self, model: nn.Module, decay: float = 0.999, only: tuple[str, ...] = ()) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.num_updates = 0
        self.only = tuple(only)
        self.shadow = {k: v.detach().float().clone() for k, v in _unwrap(model).state_dict().items()
                       if not self.only or k.startswith(self.only)}
        if not self.shadow:
            raise ValueError(f"EMA: no state-dict entry of the model starts with {self.only}")
        self._model: nn.Module | None = None
        self._applied: torch.Tensor | None = None  # updates kept on the device since `updates` was read

    @torch.no_grad()
    def update(self, model: nn.Module, where: torch.Tensor | None = None) -> None:
        """One EMA step towards `model`; with `where` (a 0-d bool on the device), kept only where it is true,
        decided on the device: a trainer whose step was skipped leaves the average as it was, with no host
        sync (`common.muon.step_kept_where`: bitwise the plain update when true)."""
        current = _unwrap(model).state_dict()
        floats = [k for k, v in self.shadow.items() if current[k].dtype.is_floating_point]

        def step() -> None:
            torch._foreach_lerp_([self.shadow[k] for k in floats], [current[k].detach().float() for k in floats],
                                 1.0 - self.decay)
            for k, v in self.shadow.items():
                if not current[k].dtype.is_floating_point:
                    v.copy_(current[k])

        if where is None:
            self.num_updates += 1
            step()
            return
        step_kept_where(where, list(self.shadow.values()), step)
        applied = where.to(torch.int64)
        self._applied = applied if self._applied is None else self._applied + applied

    @property
    def updates(self) -> int:
        """How many updates the average holds (reads the device's count of kept ones: at save time only)."""
        if self._applied is not None:
            self.num_updates += int(self._applied)
            self._applied = None
        return self.num_updates

    @torch.no_grad()
    def copy_to(self, model: nn.Module) -> None:
        """Writes the averaged entries into `model` (with `only`, the other entries stay as they are)."""
        target = _unwrap(model)
        own = target.state_dict()
        target.load_state_dict({k: v.to(own[k].dtype) for k, v in self.shadow.items()}, strict=not self.only)

    def model(self, like: nn.Module) -> nn.Module:
        """The averaged weights as a model: a frozen copy of `like` in the default memory layout (made at
        the first call), refreshed from the shadow at every call. With `only`, the other entries are
        `like`'s at that first call: leave out only parts that never change."""
        if self._model is None:
            self._model = copy.deepcopy(_unwrap(like)).to(memory_format=torch.contiguous_format)
            self._model.requires_grad_(False)
        self.copy_to(self._model)
        return self._model

    def state_dict(self) -> dict:
        return {"decay": self.decay, "num_updates": self.updates, "shadow": self.shadow}

    def load_state_dict(self, state: dict) -> None:
        """A saved EMA of other entries (a decoder-only run's into a full one, or the reverse) is a
        ValueError naming the difference: loading it would leave entries averaged from nothing."""
        if state["shadow"].keys() != self.shadow.keys():
            extra = sorted(set(state["shadow"]) - set(self.shadow))
            missing = sorted(set(self.shadow) - set(state["shadow"]))
            raise ValueError(f"the saved EMA holds other entries than this model's EMA ({len(missing)} missing, "
                             f"e.g. {missing[:2]}; {len(extra)} extra, e.g. {extra[:2]})")
        self.decay = state["decay"]
        self.num_updates, self._applied = state["num_updates"], None
        self.shadow = {k: v.float().clone() for k, v in state["shadow"].items()}


def count_parameters(module: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameter elements (all, or only those with requires_grad); one counter for every
    trainer's start-up line and the model-size tests."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)


@contextlib.contextmanager
def frozen(module: nn.Module) -> Iterator[None]:
    """No parameter gradients for `module` inside (the critics during a GAN's generator update); every
    parameter's own flag comes back on the way out, exceptions included (a frozen layer stays frozen, and an
    OOM or NaN stop inside cannot leave the critic untrainable for the rest of the run)."""
    flags = [(p, p.requires_grad) for p in module.parameters()]
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def step_schedules(*schedulers: Any) -> None:
    """One LR-schedule step per training step (None entries skipped). An fp16 GradScaler skips a step now and
    then while it calibrates its scale, and the schedule still counts that iteration by design (one step = one
    iteration); torch then warns "lr_scheduler.step() before optimizer.step()". That warning is noise here,
    so it is silenced for this call alone, never with a process-wide filter."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
        for scheduler in schedulers:
            if scheduler is not None:
                scheduler.step()
