"""On a CUDA GPU: `common.training.step_optimizer` makes no host sync in any trainer's step (item 3 of
"Fast on the card, round 1"). Each trainer is built at the tests' tiny size (bench/gpu/trainers.py, as
the other CUDA tests), trains two steps to create its optimizer state, and then every `step_optimizer`
call of two more steps runs under `torch.cuda.set_sync_debug_mode("error")`, so a `.item()`, `bool()`
or blocking copy inside it raises. The VAE's whole step (its critic, BatchNorm and EMA gating decided on
the device too) runs under the same mode below, as tests/vae/test_vae_step_on_device.py checks it on the
CPU; bench/gpu counts syncs per step of the others."""

from __future__ import annotations

import functools
import importlib

import pytest
import torch

from bench.gpu.trainers import TRAINERS, build
from tests.cuda.conftest import CUDA_ONLY

pytestmark = CUDA_ONLY
CUDA = torch.device("cuda")
# where each trainer's step calls step_optimizer (imported by name)
STEP_MODULES = {"vocoder": "vocoder.train", "vits": "tts.vits.train", "clone": "tts.clone.train", "vae": "vae.step"}
PRECISION_KEY = {"vocoder": "precision", "vits": "precision", "clone": "train.precision", "vae": "precision"}


def _sync_checked(step_optimizer, calls: list[int]):
    @functools.wraps(step_optimizer)
    def checked(*args, **kwargs):
        if not calls:  # armed
            return step_optimizer(*args, **kwargs)
        calls[0] += 1
        torch.cuda.set_sync_debug_mode("error")
        try:
            return step_optimizer(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return checked


@pytest.mark.parametrize("precision", ["32-true", "16-mixed"])
@pytest.mark.parametrize("trainer", list(TRAINERS))
def test_step_optimizer_makes_no_host_sync(trainer, precision, tiny_data, tmp_path, monkeypatch):
    module = importlib.import_module(STEP_MODULES[trainer])
    calls: list[int] = []
    monkeypatch.setattr(module, "step_optimizer", _sync_checked(module.step_optimizer, calls))
    st = build(TRAINERS[trainer], "base", [f"{PRECISION_KEY[trainer]}={precision}"], tiny_data(trainer),
               tmp_path / "run", CUDA, dry=True)
    batches = st.batches()
    for _ in range(2):  # the optimizers' state is made here
        st.step(next(batches))
    calls.append(0)
    for _ in range(2):
        st.step(next(batches))
    torch.cuda.synchronize()
    assert calls[0] >= 2, "no optimizer step was checked"


@pytest.mark.parametrize("precision", ["32-true", "16-mixed"])
def test_the_vae_gan_step_makes_no_host_sync(precision):
    from tests.vae.helpers import tiny_cfg
    from vae.step import VAEStep

    step = VAEStep(tiny_cfg(disc_start=0, precision=precision), CUDA, total_steps=8)
    x = torch.rand(2, 3, 32, 32, device=CUDA) * 2 - 1
    for s in range(2):  # the optimizers' state is made here
        step.train_step([x], s)
    for s in (2, 3):
        step.divergence.settle()  # its one-step-late read of a copy long done (common.guards), outside the check
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            logs = step.train_step([x], s)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert bool(logs["stepped"])
