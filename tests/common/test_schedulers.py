"""Schedules: values at the steps that define them, and exact resume through LambdaLR."""

import math

import pytest
import torch

from common.schedulers import build_scheduler, lr_lambda


def test_constant_and_warmup():
    f = lr_lambda("constant", warmup_steps=10)
    assert f(0) == 0.0
    assert f(5) == pytest.approx(0.5)
    assert f(10) == 1.0 and f(1000) == 1.0
    assert lr_lambda("constant")(0) == 1.0
    g = lr_lambda("warmup", warmup_steps=4)
    assert [g(s) for s in range(6)] == pytest.approx([0, 0.25, 0.5, 0.75, 1, 1])


def test_cosine_with_warmup():
    f = lr_lambda("cosine_with_warmup", warmup_steps=100, total_steps=1100, min_ratio=0.1)
    assert f(0) == 0.0
    assert f(50) == pytest.approx(0.5)
    assert f(100) == pytest.approx(1.0)
    assert f(600) == pytest.approx(0.1 + 0.9 * 0.5)  # half way through the decay
    assert f(1100) == pytest.approx(0.1)
    assert f(5000) == pytest.approx(0.1)
    values = [f(s) for s in range(100, 1101)]
    assert all(a >= b for a, b in zip(values, values[1:]))


def test_exponential_per_step_and_per_epoch():
    f = lr_lambda("exponential", gamma=0.5)
    assert [f(s) for s in range(4)] == pytest.approx([1, 0.5, 0.25, 0.125])
    e = lr_lambda("exponential", gamma=0.9, per="epoch", steps_per_epoch=7)
    assert {e(s) for s in range(7)} == {1.0}  # constant within an epoch
    assert [e(s) for s in range(7, 14)] == pytest.approx([0.9] * 7)
    assert e(7 * 5 + 3) == pytest.approx(0.9**5)
    w = lr_lambda("exponential", gamma=0.5, warmup_steps=2)
    assert [w(s) for s in range(5)] == pytest.approx([0, 0.5, 1, 0.5, 0.25])


def test_noam_peaks_at_one_at_warmup():
    f = lr_lambda("noam", warmup_steps=400, d_model=192)
    assert f(0) == 0.0
    assert f(400) == pytest.approx(1.0)
    assert max(f(s) for s in range(1, 5000)) == pytest.approx(1.0)
    assert f(200) == pytest.approx(0.5)
    assert f(1600) == pytest.approx(0.5)  # sqrt(400 / 1600)
    # same shape as the textbook formula, scaled by its peak
    raw = lambda s: 192**-0.5 * min(s**-0.5, s * 400**-1.5)  # noqa: E731
    assert f(3000) == pytest.approx(raw(3000) / raw(400))


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(name="linear"), "valid schedules are"),
        (dict(name="cosine_with_warmup", warmup_steps=10), "total_steps"),
        (dict(name="exponential"), "gamma"),
        (dict(name="exponential", gamma=0.9, per="epoch"), "steps_per_epoch"),
        (dict(name="noam"), "warmup_steps"),
        (dict(name="constant", per="epoch"), "per='epoch'"),
        (dict(name="constant", warmup_steps=-1), "warmup_steps"),
    ],
)
def test_bad_arguments(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        lr_lambda(**kwargs)


def _run(opt, sched, steps):
    lrs = []
    for _ in range(steps):
        opt.step()
        sched.step()
        lrs.append([g["lr"] for g in opt.param_groups])
    return lrs


def _make(kw):
    p1, p2 = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([{"params": [p1], "lr": 0.1}, {"params": [p2], "lr": 0.02}], lr=0.1)
    return opt, build_scheduler(opt, **kw)


@pytest.mark.parametrize("kw", [
    dict(name="cosine_with_warmup", warmup_steps=5, total_steps=30, min_ratio=0.05),
    dict(name="exponential", gamma=0.8, per="epoch", steps_per_epoch=4, warmup_steps=3),
    dict(name="noam", warmup_steps=6),
])
def test_resume_gives_the_same_lr_sequence(kw, tmp_path):
    opt, sched = _make(kw)
    straight = _run(opt, sched, 40)

    opt, sched = _make(kw)
    first = _run(opt, sched, 17)
    torch.save({"opt": opt.state_dict(), "sched": sched.state_dict()}, tmp_path / "s.pt")
    state = torch.load(tmp_path / "s.pt", weights_only=True)
    opt, sched = _make(kw)
    opt.load_state_dict(state["opt"])
    sched.load_state_dict(state["sched"])
    resumed = first + _run(opt, sched, 23)
    assert resumed == straight  # bit-exact
    # both param groups share one multiplier
    assert all(math.isclose(a / 0.1, b / 0.02) for a, b in straight)
