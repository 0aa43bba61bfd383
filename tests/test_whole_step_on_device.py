"""Each trainer's whole training step makes no host sync (item 3 of "Fast on the card, round 1"), checked on
the CPU at the dispatcher (`tests/common/test_step_on_device.no_host_reads`: `.item()`, `bool()`, `float()`,
`.tolist()`, `.numpy()`). Each is built at the tests' tiny size through bench/gpu/trainers.py (as the GPU
check and tests/cuda build them), trains two steps (the optimizers' state is made there), then one more step
is checked. The alignment search of VITS and cloning runs its device implementation, as on a GPU (on the
CPU numba, which copies to the host, is the faster and stays the default: bench/README.md, MAS)."""

from __future__ import annotations

import pytest
import torch

import tts.alignment as alignment
from bench.gpu.trainers import TRAINERS, build
from tests.common.test_step_on_device import no_host_reads


@pytest.mark.parametrize("name", list(TRAINERS))
def test_a_training_step_reads_nothing_on_the_host(name, tmp_path, monkeypatch):
    monkeypatch.setattr(alignment, "implementation_for", lambda device: alignment.maximum_path_torch)
    torch.manual_seed(0)
    spec = TRAINERS[name]
    st = build(spec, "base", [], spec.make_data(tmp_path / "data", dry=True), tmp_path / "run", torch.device("cpu"),
               dry=True)
    batches = st.batches()
    for _ in range(2):
        st.step(next(batches))
    # torch's non-fused AdamW keeps its step counts on the host (no device sync to read them); the divergence
    # guard reads a step's numbers one step late from a copy long done (common.guards): judged before the check
    host_steps = [s["step"] for opt in st.trainer.optimizers.values() for s in opt.state.values() if "step" in s]
    st.trainer.divergence.settle()
    batch = next(batches)
    with no_host_reads(allowed=host_steps):
        st.step(batch)
