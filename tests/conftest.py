"""Settings for the whole test session.

`make test` runs the suite on every core with pytest-xdist (`-n auto`). Each worker then computes with one torch
thread, and so does every process a test starts (they inherit `OMP_NUM_THREADS`): two workers with two threads
each on two cores spent their time in the kernel, spinning OpenMP pools against each other (the suite took
7.5 minutes that way, as long as one process with two threads). A test that needs more threads sets them itself.
"""

from __future__ import annotations

import os

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)


# The slowest tests (`pytest --durations=40`, 2026-11-28: 15-65 s each, most of them several processes), run
# first: the workers pick them up at once, and the short tests fill the gaps around them instead of one long
# test running alone at the end.
SLOW_FIRST = (
    "tests/test_spawn_workers.py", "tests/common/test_resume_ddp.py", "tests/bench/test_gpu_check.py",
    "tests/tts/test_vits_train.py::test_two_processes", "tests/vocoder/test_scripts.py", "tests/test_run_contract.py",
    "tests/tts/test_vits_train.py::test_train_rtx5090", "tests/vae/test_vae_train.py::test_train_rtx5090",
    "tests/vae/test_vae_tools.py", "tests/vocoder/test_prepare.py", "tests/test_imports_without_posix.py",
    "tests/shell/test_train_rtx5090.py", "tests/vae/test_vae_hostile_inputs.py",
)


def pytest_collection_modifyitems(config, items) -> None:
    def rank(item) -> int:
        return next((i for i, prefix in enumerate(SLOW_FIRST) if item.nodeid.startswith(prefix)), len(SLOW_FIRST))

    items.sort(key=rank)  # stable: the rest keep their order


@pytest.fixture
def one_torch_thread():
    """One torch thread for the test, the count before restored after it (exact float bytes: one thread)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
