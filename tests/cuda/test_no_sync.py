"""On a CUDA GPU: `common.training.step_optimizer` makes no host sync in any trainer's step (item 3 of
"Fast on the card, round 1"). Each trainer is built at the tests' tiny size (bench/gpu/trainers.py, as
the other CUDA tests), trains two steps to create its optimizer state, and then every `step_optimizer`
call of two more steps runs under `torch.cuda.set_sync_debug_mode("error")`, so a `.item()`, `bool()`
or blocking copy inside it raises; then each trainer's whole step runs under the same mode (as
tests/test_whole_step_on_device.py checks it on the CPU); bench/gpu counts syncs per step."""

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
@pytest.mark.parametrize("trainer", list(TRAINERS))
def test_a_whole_training_step_makes_no_host_sync(trainer, precision, tiny_data, tmp_path):
    """The whole step under sync debug mode "error" (tests/test_whole_step_on_device.py checks the same on the
    CPU at the dispatcher): the VAE's critic, BatchNorm and EMA gating and VITS/cloning's alignment search
    (its device implementation on CUDA) included."""
    st = build(TRAINERS[trainer], "base", [f"{PRECISION_KEY[trainer]}={precision}"], tiny_data(trainer),
               tmp_path / "run", CUDA, dry=True)
    batches = st.batches()
    for _ in range(2):  # the optimizers' state is made here
        st.step(next(batches))
    for _ in range(2):
        batch = next(batches)
        st.trainer.divergence.settle()  # its one-step-late read of a copy long done (common.guards), outside the check
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            st.step(batch)
        finally:
            torch.cuda.set_sync_debug_mode("default")
