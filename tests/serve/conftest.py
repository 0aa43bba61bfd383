"""The tiny checkpoints (tests/serve/tiny.py), made once per session, and the models loaded from them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from .tiny import SERVED_ORDER, make_tiny_checkpoints


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory) -> dict[str, Path]:
    return make_tiny_checkpoints(tmp_path_factory.mktemp("serve_models"))


@pytest.fixture(scope="session")
def served(tiny_checkpoints):
    """The tiny models loaded as the server loads them: {id: Served}."""
    from serve.models import load_models

    return load_models([str(tiny_checkpoints[k]) for k in SERVED_ORDER], torch.device("cpu"))
