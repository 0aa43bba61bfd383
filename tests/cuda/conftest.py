"""The CUDA-only tests (marker `cuda`, all in this folder): skipped without a CUDA GPU, run by `make
gpu-check` (`pytest -m cuda tests/cuda`) on one. They build tiny trainings the way the dry run of
bench/gpu/check.py does (bench/gpu/trainers.py: the tests' tiny sizes over each trainer's base config)."""

from __future__ import annotations

import os

# Deterministic cuBLAS needs this before the first CUDA matmul of the process (the resume test).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import pytest  # noqa: E402
import torch  # noqa: E402

NO_CUDA = "needs a CUDA GPU: `make gpu-check` runs these on one (they skip on a CPU-only machine)"
# Every test module here starts with `pytestmark = CUDA_ONLY`.
CUDA_ONLY = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)]


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """tiny_data(trainer) -> that trainer's synthetic data at the dry run's size, made once per session."""
    from bench.gpu.trainers import TRAINERS

    made: dict = {}

    def get(name: str):
        if name not in made:
            made[name] = TRAINERS[name].make_data(tmp_path_factory.mktemp(f"data_{name}"), dry=True)
        return made[name]

    return get
