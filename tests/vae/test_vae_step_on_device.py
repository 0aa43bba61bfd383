"""The VAE's whole training step makes no host sync (item 3 of "Fast on the card, round 1"): whether the
critic, the BatchNorm statistics and the EMA follow a step is decided on the device. Checked on the CPU at
the dispatcher (tests/common/test_step_on_device.py's `no_host_reads`), in the GAN phase, with a clean step
and a skipped one; a skipped generator step leaves the critic, its optimizer, its guard, the BatchNorm
statistics and the EMA bitwise as they were."""

from __future__ import annotations

import pytest
import torch

from tests.common.test_step_on_device import no_host_reads
from tests.vae.helpers import tiny_cfg
from vae.step import VAEStep


def _host_steps(step: VAEStep) -> list[torch.Tensor]:
    """torch's non-fused AdamW keeps its step counts on the host: reading them is no device sync."""
    return [s["step"] for opt in step.optimizers.values() for s in opt.state.values() if "step" in s]


def _critic_state(step: VAEStep) -> list[torch.Tensor]:
    out = [t.detach().clone() for t in step.disc.state_dict().values()]  # weights and BatchNorm statistics
    out += [v.clone() for s in step.d_opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return out + [v.clone() for v in step.ema.shadow.values()] + [step.d_guard._counts.clone()]


@pytest.mark.parametrize("precision", ["32-true", "16-mixed"])
def test_a_gan_step_reads_nothing_on_the_host_and_a_skipped_one_leaves_critic_and_ema_as_they_were(precision):
    torch.manual_seed(0)
    cfg = tiny_cfg(disc_start=0, precision=precision, warmup_steps=0, lr_scheduler="constant")
    step = VAEStep(cfg, torch.device("cpu"), total_steps=8)
    assert step.disc is not None and step.ema is not None and step.buffers.buffers  # BatchNorm in the critic
    x = torch.rand(2, 3, 32, 32) * 2 - 1
    for s in range(2):  # the optimizers' state is made here (a non-fused AdamW's first step reads once)
        step.train_step([x], s)
    # the divergence guard reads a step's values one step later, from a copy long done (common.guards): judged here
    step.divergence.settle()
    with no_host_reads(allowed=_host_steps(step)):
        logs = step.train_step([x], 2)
    assert bool(logs["stepped"]) and "disc_grad_norm" in logs
    assert step.ema.updates == 3 and step.guard.settle() and step.d_guard.settle()

    before = _critic_state(step)
    bad = x.clone()
    bad[0, 0, 0, 0] = float("nan")
    step.divergence.settle()
    with no_host_reads(allowed=_host_steps(step)):
        logs = step.train_step([bad], 3)
    assert not bool(logs["stepped"])
    after = _critic_state(step)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert step.ema.updates == 3  # the skipped step is not in the average
    step.guard.settle()
    assert step.guard.skipped_total == 1 and step.d_guard.skipped_total == 0  # the generator's skip, not the critic's
