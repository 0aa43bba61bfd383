"""Fixtures for the VAE tests: one thread (tiny convs gain nothing from two, and a shared CPU makes
OpenMP barriers stall) and small procedural datasets."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from helpers import write_images  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="session")
def image_dir(tmp_path_factory) -> Path:
    """10 textured 48 px PNGs: 8 train + 2 held out with the tiny config."""
    folder = tmp_path_factory.mktemp("vae_images")
    write_images(folder, 10, size=48)
    return folder
