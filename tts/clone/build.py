"""The cloning trainer's builders from the resolved options: its device, its plan of optimizer steps, its
optimizer and LR schedule (what `tts/clone/train.py` and the tests of the schedule share)."""

from __future__ import annotations

import torch
from torch.optim.lr_scheduler import LambdaLR

from common.muon import build_optimizer
from common.schedulers import build_scheduler
from tts.clone.config import CloneConfig, SchedulerConfig, TrainConfig
from tts.clone.options import UsageError


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"train.device {name} requested but no CUDA device is available")
    return dev


def planned_steps(t: TrainConfig, batches_per_epoch: int, n_items: int) -> tuple[int, int]:
    """(optimizer steps per epoch, planned optimizer steps of the run) from this rank's batches per
    epoch: one step is grad_accum batches; the plan is max_updates, or epochs x steps per epoch."""
    steps_per_epoch = batches_per_epoch // t.grad_accum
    if steps_per_epoch < 1:
        raise UsageError(f"{n_items} training utterances give {batches_per_epoch} full batches of "
                         f"{t.batch_size} per epoch (per rank), fewer than --grad-accum {t.grad_accum}: "
                         "lower --batch-size or --grad-accum, or add data")
    return steps_per_epoch, t.max_updates or t.epochs * steps_per_epoch


def build_clone_scheduler(optimizer: torch.optim.Optimizer, s: SchedulerConfig, total_steps: int) -> LambdaLR:
    """The run's LR schedule, stepped once per optimizer update (after `grad_accum` micro-batches):
    cosine_with_warmup warms up linearly over warmup_steps and follows a half cosine to
    min_ratio x lr at `total_steps`, the planned updates of the whole run (max_updates, or epochs x
    optimizer steps per epoch); exponential multiplies by gamma every update after the warmup."""
    sched_kw: dict = {"warmup_steps": 0 if s.name == "constant" else s.warmup_steps}
    if s.name == "cosine_with_warmup":
        if total_steps <= s.warmup_steps:
            raise UsageError(f"the run has {total_steps} optimizer steps but the warmup is {s.warmup_steps}: "
                             "lower --warmup-steps or train longer (--epochs / train.max_updates)")
        sched_kw.update(total_steps=total_steps, min_ratio=s.min_ratio)
    elif s.name == "exponential":
        sched_kw.update(gamma=s.gamma)
    return build_scheduler(optimizer, s.name, **sched_kw)


def build_clone_optimizer(cfg: CloneConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    o = cfg.optim
    return build_optimizer({"adamw": "AdamW", "muon_adamw": "MuonAdamW"}[o.optimizer], model, lr=o.lr,
                           betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay, fused=o.fused,
                           batched_ns=o.batched_ns, prefix="optim.", key="optim.optimizer")
