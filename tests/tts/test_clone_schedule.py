"""The voice-cloning recipes over their whole length: linear warmup, then a half cosine from the peak
to min_ratio x peak exactly at the planned last update (max_updates, or epochs x optimizer steps per
epoch, where one step is grad_accum micro-batches). No model is built: the trainer's own scheduler
on a one-parameter optimizer."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from common.schedulers import lr_curve, schedule_preview
from tests.common.schedule_checks import lrs_through, one_param_optimizer
from tts.clone.options import UsageError, build_parser, resolve_config
from tts.clone.train import build_clone_scheduler, planned_steps

CONFIGS = Path(__file__).resolve().parents[2] / "tts" / "clone" / "configs"
UTTERANCES = 20_000  # per rank: a mid-size corpus


def _resolved(*argv: str):
    return resolve_config(build_parser().parse_args(list(argv))).cfg


def _planned(cfg) -> int:
    """The trainer's plan for UTTERANCES training items on this rank (full batches only)."""
    return planned_steps(cfg.train, UTTERANCES // cfg.train.batch_size, UTTERANCES)[1]


def _cosine_with_warmup(s: int, w: int, total: int, floor: float) -> float:
    if s < w:
        return s / w
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, (s - w) / (total - w))))


@pytest.mark.parametrize("argv", [["--config", str(CONFIGS / "clone_base.yaml")],
                                  ["--config", str(CONFIGS / "clone_demo.yaml")],
                                  ["--config", str(CONFIGS / "clone_base.yaml"), "--fast-convergence"],
                                  ["--aggressive-lr"]], ids=["base", "demo", "fast-convergence", "aggressive-lr"])
def test_recipe_is_cosine_with_warmup_over_the_planned_updates(argv):
    cfg = _resolved(*argv)
    s, lr, total = cfg.scheduler, cfg.optim.lr, _planned(cfg)
    assert s.name == "cosine_with_warmup"
    curve = lr_curve(build_clone_scheduler(one_param_optimizer(lr), s, total))
    for step in sorted({0, 1, s.warmup_steps // 2, s.warmup_steps, total // 2, total - 1, total}):
        assert curve(step) == pytest.approx(lr * _cosine_with_warmup(step, s.warmup_steps, total, s.min_ratio))
    assert curve(s.warmup_steps) == pytest.approx(lr)  # the peak, exactly at the end of the warmup
    assert curve(total) == pytest.approx(s.min_ratio * lr)  # the floor at the planned end
    assert len(schedule_preview(curve, total, "k")) == 1  # no collapse warning


def test_the_plan_counts_optimizer_steps_of_grad_accum_batches():
    t = _resolved("--epochs", "10", "--grad-accum", "4").train
    assert planned_steps(t, 625, 20_000) == (156, 1560)  # 625 batches -> 156 steps of 4 per epoch
    t.max_updates = 900
    assert planned_steps(t, 625, 20_000) == (156, 900)
    with pytest.raises(UsageError, match="fewer than --grad-accum 4"):
        planned_steps(t, 3, 12)


def test_resume_mid_epoch_keeps_the_curve_exact():
    cfg = _resolved("--config", str(CONFIGS / "clone_demo.yaml"))
    build = lambda opt: build_clone_scheduler(opt, cfg.scheduler, 120)  # noqa: E731
    straight = lrs_through(build, cfg.optim.lr, 120)
    assert lrs_through(build, cfg.optim.lr, 120, resume_at=31) == straight
    assert lrs_through(build, cfg.optim.lr, 120, resume_at=77) == straight
