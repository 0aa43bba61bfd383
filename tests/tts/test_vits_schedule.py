"""The shipped VITS recipes over their whole length: the LR decays once per EPOCH, as
jaywalnut310/vits (ExponentialLR stepped after each epoch) and Coqui (scheduler_after_epoch) do.
No model is built: the trainer's own schedule construction is evaluated on a one-parameter optimizer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from common.config import load_config
from common.data import BucketBatchSampler
from common.schedulers import build_scheduler, lr_curve, schedule_preview
from tests.common.schedule_checks import lrs_through, one_param_optimizer
from tts.vits.config import TrainConfig
from tts.vits.train import schedule_kwargs

CONFIGS = Path(__file__).resolve().parents[2] / "tts" / "vits" / "configs"
VITS_RECIPES = ["uzbek_vits.yaml", "uzbek_vits_rtx5090.yaml", "demo.yaml"]
STEPS_PER_EPOCH = 150  # the guide's run: batch 64, ~150 steps per epoch


def _build(cfg: TrainConfig, steps_per_epoch: int):
    return lambda opt: build_scheduler(opt, "exponential", **schedule_kwargs(cfg, steps_per_epoch))


def _reference_lrs(lr: float, gamma: float, epochs: int, steps_per_epoch: int) -> list[float]:
    """jaywalnut310's loop: ExponentialLR(gamma), one scheduler.step() after each epoch."""
    opt = one_param_optimizer(lr)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=gamma)
    out = []
    for _ in range(epochs):
        out += [opt.param_groups[0]["lr"]] * steps_per_epoch
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize("name", VITS_RECIPES)
def test_recipe_decays_per_epoch_like_the_reference(name):
    cfg = load_config(CONFIGS / name, TrainConfig)
    assert cfg.lr_scheduler_per == "epoch"
    assert cfg.weight_decay == 0.01 and cfg.clip_grad_norm == 1.0  # references' AdamW decay; the guide's clip
    total = cfg.epochs * STEPS_PER_EPOCH if cfg.max_steps is None else min(cfg.max_steps, cfg.epochs * STEPS_PER_EPOCH)
    epochs = -(-total // STEPS_PER_EPOCH)
    curve = lr_curve(_build(cfg, STEPS_PER_EPOCH)(one_param_optimizer(cfg.lr)))
    ours = [curve(s) for s in range(total)]
    ref = _reference_lrs(cfg.lr, cfg.lr_gamma, epochs, STEPS_PER_EPOCH)[:total]
    assert ours == pytest.approx(ref, rel=1e-9)
    assert ours[0] == cfg.lr  # no warmup (neither reference has one)


def test_guide_run_ends_at_098x_not_005x():
    cfg = load_config(CONFIGS / "uzbek_vits.yaml", TrainConfig)
    total = cfg.epochs * STEPS_PER_EPOCH  # 200 epochs x 150 = 30000 updates
    curve = lr_curve(_build(cfg, STEPS_PER_EPOCH)(one_param_optimizer(cfg.lr)))
    assert curve(total - 1) / cfg.lr == pytest.approx(0.9999 ** 199)  # 0.980
    assert curve(total // 2) / cfg.lr == pytest.approx(0.9999 ** 100)
    assert len(schedule_preview(curve, total, "k")) == 1  # no collapse warning
    # the old per-step setting: 0.0498x at the end, and a 300k-step plan collapses before half-way
    cfg.lr_scheduler_per = "step"
    step_curve = lr_curve(_build(cfg, STEPS_PER_EPOCH)(one_param_optimizer(cfg.lr)))
    assert step_curve(total - 1) / cfg.lr == pytest.approx(0.0498, abs=1e-4)
    assert schedule_preview(step_curve, 300_000, "lr_gamma")[-1].startswith("warning")


def test_resume_mid_epoch_keeps_the_curve_exact():
    cfg = load_config(CONFIGS / "uzbek_vits.yaml", TrainConfig)
    build = _build(cfg, STEPS_PER_EPOCH)
    n, cut = 4 * STEPS_PER_EPOCH, 2 * STEPS_PER_EPOCH + 37
    assert lrs_through(build, cfg.lr, n, resume_at=cut) == lrs_through(build, cfg.lr, n)


def test_steps_per_epoch_is_per_rank_under_ddp():
    """The trainer passes len(its batch sampler): sharded by rank, so the schedule still decays
    once per epoch of each rank's optimizer steps."""
    lengths = list(range(100, 1100))
    one = BucketBatchSampler(lengths, 10, 4, shuffle=True, seed=0, drop_last=True, num_replicas=1, rank=0)
    two = BucketBatchSampler(lengths, 10, 4, shuffle=True, seed=0, drop_last=True, num_replicas=2, rank=1)
    assert (len(one), len(two)) == (100, 50)
