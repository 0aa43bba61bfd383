"""The start-of-run LR plan: preview lines at 0/25/50/75/100 %, the collapse warning, the PNG."""

from __future__ import annotations

import pytest

from common.log import RunLogger, report_lr_plan
from common.schedulers import (
    build_scheduler,
    collapse_step,
    lr_curve,
    lr_lambda,
    preview_steps,
    schedule_preview,
)
from tests.common.schedule_checks import lrs_through, one_param_optimizer


def test_preview_steps_are_the_quarters_of_the_plan():
    assert preview_steps(401) == [0, 100, 200, 300, 400]
    assert preview_steps(1) == [0, 0, 0, 0, 0]


def test_lr_curve_is_the_lr_each_update_uses():
    build = lambda o: build_scheduler(o, "cosine_with_warmup", warmup_steps=10, total_steps=100, min_ratio=0.1)  # noqa: E731
    curve = lr_curve(build(one_param_optimizer(3e-4)))
    assert [curve(i) for i in range(100)] == pytest.approx(lrs_through(build, 3e-4, 100))


def test_preview_line_values_and_no_warning_for_a_healthy_plan():
    fn = lr_lambda("exponential", gamma=0.9999, per="epoch", steps_per_epoch=150)
    lines = schedule_preview(lambda s: 2e-4 * fn(s), 200 * 150, "lr_gamma")
    assert len(lines) == 1
    line = lines[0]
    assert line.startswith("lr plan over 30000 updates (peak 0.0002): 0% 0.0002 (1x) | 25% ")
    assert "100% 0.000196 (0.98x)" in line  # 0.9999 ** 199


def test_warning_when_lr_collapses_before_half_the_plan():
    # the old VITS recipe (0.9999 per optimizer step) on a 300k-step plan: below 1 % from step 46052
    fn = lr_lambda("exponential", gamma=0.9999)
    lines = schedule_preview(lambda s: 2e-4 * fn(s), 300_000, "lr_gamma / lr_scheduler_per", name="lr_g")
    assert len(lines) == 2
    assert "25% 1.11e-07 (0.000553x)" in lines[0]  # 0.9999 ** 75000
    assert lines[1].startswith("warning: lr_g falls below 1% of its peak at update 46")
    assert lines[1].endswith("change lr_gamma / lr_scheduler_per")
    # the same gamma over 200 epochs x 150 steps ends at 0.05x: low, but not collapsed by half-way
    short = schedule_preview(lambda s: 2e-4 * fn(s), 30_000, "k")
    assert len(short) == 1 and "50% 4.46e-05 (0.223x)" in short[0] and "100% 9.96e-06 (0.0498x)" in short[0]


def test_collapse_threshold_is_half_the_plan():
    fn = lr_lambda("exponential", gamma=0.9999)  # 0.9999 ** k < 0.01 from k = 46050 on
    assert fn(46049) >= 0.01 > fn(46050)
    assert collapse_step(fn, 200_000) == 46050
    assert any(line.startswith("warning") for line in schedule_preview(fn, 2 * 46050 + 1, "k"))
    assert not any(line.startswith("warning") for line in schedule_preview(fn, 2 * 46050, "k"))
    assert collapse_step(fn, 46050) is None


def test_warmup_below_one_percent_is_not_a_collapse():
    fn = lr_lambda("cosine_with_warmup", warmup_steps=1000, total_steps=10_000, min_ratio=0.0)
    lines = schedule_preview(fn, 10_000, "k")
    assert lines[0].split(": ", 1)[1].startswith("0% 0 (0x) | 25% ")
    assert len(lines) == 1  # 0 at step 0 (warmup) and at the end (after half the plan): no warning


def test_report_writes_png_and_tensorboard(tmp_path):
    opt = one_param_optimizer(1e-3)
    sched = build_scheduler(opt, "warmup", warmup_steps=50)
    said: list[str] = []
    with RunLogger(tmp_path / "tb") as logger:
        lines = report_lr_plan({"lr_g": lr_curve(sched), "lr_d": lambda s: 0.5e-3}, 500, "keys", tmp_path,
                               logger, said.append)
    assert said == lines and len(lines) == 2
    png = (tmp_path / "lr_schedule.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 2000
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


def test_identical_curves_share_one_line(tmp_path):
    lines = report_lr_plan({"lr_g": lambda s: 1e-3, "lr_d": lambda s: 1e-3}, 10, "k", None, None, lambda m: None)
    assert len(lines) == 1 and lines[0].startswith("lr_g = lr_d plan over 10 updates")


def test_preview_rejects_an_empty_plan():
    with pytest.raises(ValueError, match="at least 1"):
        schedule_preview(lambda s: 1.0, 0, "k")


def test_scheduler_state_round_trip_is_exact_mid_epoch():
    build = lambda o: build_scheduler(o, "exponential", gamma=0.9, per="epoch", steps_per_epoch=7)  # noqa: E731
    assert lrs_through(build, 1.0, 40, resume_at=17) == lrs_through(build, 1.0, 40)
    lrs = lrs_through(build, 1.0, 40)
    assert lrs[6:8] == pytest.approx([1.0, 0.9]) and lrs[13:15] == pytest.approx([0.9, 0.81])
