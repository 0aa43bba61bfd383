"""The tiny checkpoints (tests/serve/tiny.py), made once per session, the models loaded from them, and the app
served on a local port by uvicorn (for what only a real connection shows: a browser, a client that leaves or
stalls)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
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


@contextlib.contextmanager
def serving(app) -> Iterator[str]:
    """`app` served by uvicorn in a thread on a free port of 127.0.0.1 (bound as `python -m serve` binds); its URL."""
    import uvicorn

    from serve.__main__ import bind

    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.fixture(scope="session")
def live_server(served):
    """(URL, app): the tiny models on a local port, with a short body timeout (1 s) for the stalled-body test."""
    from serve.app import create_app
    from serve.models import Limits

    app = create_app(served, Limits(max_pixels=256 * 256, body_timeout_s=1.0))
    with serving(app) as url:
        yield url, app
