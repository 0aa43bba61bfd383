"""The shipped vocoder recipes over their whole length. SingingVocoders' GAN tasks never build the
scheduler their configs describe (configure_optimizers returns the bare optimizers), so its LR is
constant from the first to the last update; ours is the same constant after a linear warmup of
warmup_steps updates. No model is built: the trainer's own scheduler on a one-parameter optimizer."""

from __future__ import annotations

import pytest

from common.config import load_config
from common.schedulers import lr_curve, schedule_preview
from tests.common.schedule_checks import lrs_through, one_param_optimizer
from vocoder.config import VocoderConfig
from vocoder.train import build_lr_scheduler

from .conftest import DEMO_YAML, GPU_YAML, RTX_YAML


@pytest.mark.parametrize("path", [GPU_YAML, RTX_YAML, DEMO_YAML], ids=lambda p: p.name)
def test_recipe_is_warmup_then_the_references_constant(path):
    cfg = load_config(path, VocoderConfig)
    assert cfg.lr_scheduler_args.name == "warmup"
    for args in (cfg.generator_optimizer_args, cfg.discriminator_optimizer_args):
        lr, w, total = args.lr, cfg.lr_scheduler_args.warmup_steps, cfg.max_updates
        curve = lr_curve(build_lr_scheduler(one_param_optimizer(lr), cfg, lr))
        assert [curve(s) for s in range(w)] == pytest.approx([lr * (s + 1) / w for s in range(w)])
        assert all(curve(s) == lr for s in range(w - 1, total, 997))  # per step, constant to the end
        assert curve(total - 1) == lr  # final multiplier 1.0, as the reference's
        assert w <= 0.1 * total
        assert len(schedule_preview(curve, total, "k")) == 1  # no collapse warning


def test_resume_mid_warmup_and_after_keeps_the_curve_exact():
    cfg = load_config(DEMO_YAML, VocoderConfig)
    lr = cfg.generator_optimizer_args.lr
    build = lambda opt: build_lr_scheduler(opt, cfg, lr)  # noqa: E731
    straight = lrs_through(build, lr, 60)
    assert lrs_through(build, lr, 60, resume_at=7) == straight
    assert lrs_through(build, lr, 60, resume_at=33) == straight
