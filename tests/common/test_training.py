"""common.training: clipping, the non-finite and divergence guards, EMA, clip statistics, parameter
counts, the generator's critic call on real and fake apart (critic_outputs_for_generator)."""

import pytest
import torch
from torch import nn

from common.guards import (
    DivergenceGuard,
    NonFiniteError,
    NonFiniteGuard,
    check_run_ended_good,
    saving_blocked,
)
from common.training import EMA, ClipStats, count_parameters, critic_outputs_for_generator, step_optimizer
from tts.vits.discriminator import MultiPeriodDiscriminator
from tts.vits.losses import feature_loss, generator_loss


def test_clip_really_clips_and_guard_stops():
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    loss = model(torch.full((2, 4), 100.0)).sum()
    w0 = model.weight.detach().clone()
    norm, stepped = step_optimizer(loss, opt, model.parameters(), clip_grad_norm=0.5)
    assert stepped and norm > 0.5
    assert (model.weight.detach() - w0).norm() <= 0.5 + 1e-5  # SGD lr 1: the update is the clipped grad
    guard = NonFiniteGuard(max_consecutive=3)
    assert guard.check(True)
    assert not guard.check(torch.tensor(float("nan")))
    assert not guard.check(False)
    with pytest.raises(NonFiniteError, match="consecutive"):
        guard.check(False)
    assert guard.skipped_total == 3


def test_ema_tracks_and_round_trips():
    model = nn.Linear(3, 3)
    ema = EMA(model, decay=0.5)
    with torch.no_grad():
        model.weight.add_(1.0)
    ema.update(model)
    target = nn.Linear(3, 3)
    ema2 = EMA(target, decay=0.9)
    ema2.load_state_dict(ema.state_dict())
    ema2.copy_to(target)
    expected = model.weight.detach() - 0.5
    assert torch.allclose(target.weight, expected, atol=1e-6)


def test_guard_does_not_count_fp16_scale_backoff_as_divergence():
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    guard = NonFiniteGuard(max_consecutive=2)
    assert not guard.check_step(False, scaler)  # scale 4 > 1: the scaler can still back off
    assert not guard.check_step(False, scaler)
    assert guard.consecutive == 0 and guard.skipped_total == 2
    exhausted = torch.amp.GradScaler("cpu", init_scale=1.0)
    assert not guard.check_step(False, exhausted)
    with pytest.raises(NonFiniteError):
        guard.check_step(False, exhausted)


def test_divergence_guard_counts_a_finite_blow_up_like_a_nonfinite_step():
    model = nn.Linear(8, 8)
    guard = DivergenceGuard(model.parameters(), max_consecutive=2)
    for loss in (1.0, 0.9, 1.2, float("nan"), 0.8):  # normal steps (a NaN loss is NonFiniteGuard's business)
        guard.observe(torch.tensor(loss))
        assert not saving_blocked(guard)
    check_run_ended_good(guard)
    state = guard.state_dict()
    assert state["consecutive"] == 0 and len(state["recent"]["weight norm"]) == 5
    assert state["recent"]["loss"] == pytest.approx([1.0, 0.9, 1.2, 0.8])

    with torch.no_grad():
        model.weight.mul_(1e29)  # what one step at lr 1e30 does: finite, ruined
    assert saving_blocked(guard)  # the weights as they are now, before the next step judged them
    with pytest.raises(NonFiniteError, match=r"after the last update the weight norm overflowed"):
        check_run_ended_good(guard)
    guard.observe(torch.tensor(1.0))  # the same ruined weights made this step's loss
    guard.observe(torch.tensor(1.0))  # judges the step before: diverging (1 of 2)
    assert guard.consecutive == 1
    with pytest.raises(NonFiniteError, match=r"2 consecutive steps diverged while staying finite \(the weight norm"):
        guard.observe(torch.tensor(1.0))

    fresh = DivergenceGuard(nn.Linear(8, 8).parameters(), max_consecutive=5)
    fresh.load_state_dict(state)
    for _ in range(2):
        fresh.observe(torch.tensor(5e3))  # a loss 5000x its median: diverging too
    assert fresh.consecutive == 1 and "the loss rose to 5e+03" in fresh.reason
    fresh.load_state_dict(None)  # a checkpoint from before the guard: its state is simply not there
    assert fresh.consecutive == 1


def test_divergence_guard_in_streak_is_a_plain_read_that_never_raises(monkeypatch):
    """`in_streak` (e.g. `if guard.in_streak` in logging code) reads the last judgement: no device work,
    no judging of the pending step, no NonFiniteError; `saving_blocked` is where the device is read."""
    model = nn.Linear(8, 8)
    guard = DivergenceGuard(model.parameters(), max_consecutive=2)
    for loss in (1.0, 0.9, 1.2):
        guard.observe(torch.tensor(loss))
    with torch.no_grad():
        model.weight.mul_(1e29)  # ruined, finite
    guard.observe(torch.tensor(1.0))  # records the ruined weights
    guard.observe(torch.tensor(1.0))  # judges them: diverging, 1 of 2; this step is pending (diverging too)
    assert guard.consecutive == 1 and guard.pending is not None

    def device_work(*args, **kwargs):
        raise AssertionError("in_streak read the device")
    with monkeypatch.context() as m:
        m.setattr(guard, "weight_norm", device_work)
        m.setattr(guard, "_judge_pending", device_work)
        assert guard.in_streak and guard.in_streak  # judging the pending step now would raise NonFiniteError
    assert guard.consecutive == 1 and guard.pending is not None  # reading it changed nothing
    with pytest.raises(NonFiniteError, match="2 consecutive steps diverged"):
        saving_blocked(guard)

    fresh = DivergenceGuard(model.parameters(), max_consecutive=5)
    with torch.no_grad():
        model.weight.div_(1e29)
    for loss in (1.0, 0.9, 1.2):
        fresh.observe(torch.tensor(loss))
    with torch.no_grad():
        model.weight.mul_(1e29)
    assert not fresh.in_streak  # nothing judged the ruined weights yet
    assert saving_blocked(fresh) and fresh.in_streak  # settled: the weights after the last update
    with torch.no_grad():
        model.weight.div_(1e29)  # back in range (as a reloaded state would be)
    fresh.observe(torch.tensor(1.0))
    assert fresh.in_streak  # still the last judgement
    fresh.observe(torch.tensor(1.0))  # judges the step before: its weights were in range
    assert not fresh.in_streak and not saving_blocked(fresh)


def test_clip_stats_counts_clipped_steps_per_window():
    stats = ClipStats(1.0)
    for g, d in ((150.0, 0.5), (0.9, 2.0), (320.0, 0.1), (1.0, 0.2)):  # a norm equal to the limit is not clipped
        stats.update("g", torch.tensor(g))
        stats.update("d", torch.tensor(d))
    assert stats.pop() == {"clipped_g": 0.5, "clipped_d": 0.25}
    assert stats.pop() == {}  # a new window
    off = ClipStats(None)  # no clipping: nothing to report
    off.update("g", torch.tensor(5.0))
    assert off.pop() == {}


def test_count_parameters():
    m = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))  # 16 + 10
    assert count_parameters(m) == 26
    m[0].requires_grad_(False)
    assert count_parameters(m) == 26 and count_parameters(m, trainable_only=True) == 10


# critic_outputs_for_generator, on VITS' discriminator: the G update calls the frozen critic on real (no grad)
# and fake (with grad) apart; the generator's gradient equals a single call on cat([real, fake]), with
# spectral norm too, and the power iteration runs once.
@pytest.mark.parametrize("spectral", [False, True])
def test_split_call_gives_the_concatenated_calls_gradient(spectral):
    torch.manual_seed(0)
    disc = MultiPeriodDiscriminator((2, 3), channel_scale=0.125, use_spectral_norm=spectral)
    disc.requires_grad_(False)
    y = torch.randn(2, 1, 1024) * 0.3
    y_hat = (torch.randn(2, 1, 1024) * 0.3).requires_grad_(True)
    state = {k: v.clone() for k, v in disc.state_dict().items()}

    _, y_d_g, fmap_r, fmap_g = disc(y, y_hat)
    (old,) = torch.autograd.grad(generator_loss(y_d_g) + feature_loss(fmap_r, fmap_g), y_hat)
    after_old = {k: v.clone() for k, v in disc.state_dict().items()}

    disc.load_state_dict(state)
    (_, fmap_r), (y_d_g, fmap_g) = critic_outputs_for_generator(disc.score, y, y_hat)
    assert all(not f.requires_grad for fm in fmap_r for f in fm)  # the real half kept no graph
    (new,) = torch.autograd.grad(generator_loss(y_d_g) + feature_loss(fmap_r, fmap_g), y_hat)

    torch.testing.assert_close(new, old, rtol=1e-4, atol=1e-5 * old.abs().max().item())
    for k, v in disc.state_dict().items():
        torch.testing.assert_close(v, after_old[k])


def test_frozen_gives_every_flag_back_even_when_the_step_fails():
    """The critics are frozen for the generator's update; an OOM or a NaN stop inside must not leave them
    untrainable, and a layer frozen by the config must stay frozen."""
    from torch import nn

    from common.training import frozen

    critic = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    critic[0].weight.requires_grad_(False)
    before = [p.requires_grad for p in critic.parameters()]
    with pytest.raises(RuntimeError, match="out of memory"):
        with frozen(critic):
            assert not any(p.requires_grad for p in critic.parameters())
            raise RuntimeError("CUDA out of memory")
    assert [p.requires_grad for p in critic.parameters()] == before == [False, True, True, True]
