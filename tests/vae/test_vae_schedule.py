"""The shipped VAE profiles over their whole length: a linear warmup, then either latent-diffusion's
constant LR (the 5090 profiles: the GAN phase must join at the full LR, see vae/configs/base.yaml) or
a half cosine from the peak to min_lr_ratio x peak at the planned last optimizer step (max_steps, or
num_epochs x steps per epoch of batch x accumulation_steps images). No model is built: the
trainer's own `build_lr_schedules` runs on a one-parameter optimizer."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from common.config import load_config
from common.schedulers import lr_curve, schedule_preview
from tests.common.schedule_checks import lrs_through, one_param_optimizer
from vae.config import VAEConfig
from vae.train_vae import build_lr_schedules

PROFILES = sorted((Path(__file__).resolve().parents[2] / "vae" / "configs").glob("*.yaml"))
IMAGES = 10_000  # per rank


def _plan(cfg: VAEConfig, opt, total: int):
    return build_lr_schedules(cfg, {"vae": opt}, total)["vae"]


def _total(cfg: VAEConfig) -> int:
    batch = cfg.batch_size if isinstance(cfg.batch_size, int) else 4
    return cfg.max_steps or cfg.num_epochs * ((IMAGES // batch) // cfg.accumulation_steps)


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.name)
def test_profile_lr_over_the_planned_steps(path):
    cfg = load_config(path, VAEConfig)
    assert cfg.lr_scheduler in ("constant", "cosine_with_warmup")
    lr, w, total, floor = cfg.learning_rate, cfg.warmup_steps, _total(cfg), cfg.min_lr_ratio
    curve = lr_curve(_plan(cfg, one_param_optimizer(lr), total))
    w = min(w, total - 1)
    assert curve(0) == 0 and curve(w // 2) == pytest.approx(lr * (w // 2) / w)
    assert curve(w) == pytest.approx(lr)  # the peak at the end of the warmup
    mid = w + (total - w) // 2
    if cfg.lr_scheduler == "constant":  # latent-diffusion: no decay after the warmup
        assert curve(mid) == pytest.approx(lr) and curve(total) == pytest.approx(lr)
        assert len(schedule_preview(curve, total, "k")) == 1
        return
    expected_mid = floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * (mid - w) / (total - w)))
    assert curve(mid) == pytest.approx(lr * expected_mid)
    assert curve(total) == pytest.approx(lr * floor)  # the floor exactly at the planned end
    assert len(schedule_preview(curve, total, "k")) == 1  # no collapse warning


def test_resume_mid_epoch_keeps_the_curve_exact():
    cfg = load_config(PROFILES[0], VAEConfig)
    cfg.warmup_steps = 20
    build = lambda opt: _plan(cfg, opt, 100)  # noqa: E731
    assert lrs_through(build, cfg.learning_rate, 100, resume_at=13) == lrs_through(build, cfg.learning_rate, 100)
