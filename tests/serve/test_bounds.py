"""Every request is bounded, and valid input is never a 500: a reconstruction is sized before it runs (tiled to
fit the memory budget, or 413), a stalled body is dropped (408), a full queue is 503 with Retry-After while the
page and /models still answer, a client that leaves or a cancel stops queued and running work at the next
sentence or tile, SIGTERM stops the server in seconds, and odd but valid uploads get a result or one 400 line."""

from __future__ import annotations

import io
import os
import secrets
import signal
import socket
import struct
import threading
import time
import zlib
from urllib.parse import urlsplit

import anyio
import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from serve.app import create_app
from serve.models import Cancelled, Job, Limits

from .tiny import local_client, png_bytes

SR = 22050


def _wav(x: np.ndarray, subtype: str = "PCM_16") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, x.astype(np.float32), SR, subtype=subtype, format="WAV")
    return buf.getvalue()


def _png_with_chunk(kind: bytes) -> bytes:
    """A valid 8x8 PNG carrying a zTXt or iCCP chunk that inflates to 50 MB (a decompression bomb in 50 KB)."""
    png, bomb = png_bytes(8, 8), zlib.compress(b"\0" * (50 * 2**20), 9)
    body = kind + (b"k\0\0" if kind == b"zTXt" else b"p\0\0") + bomb
    chunk = struct.pack(">I", len(body) - 4) + body + struct.pack(">I", zlib.crc32(body))
    return png[:33] + chunk + png[33:]  # after IHDR


def _wait_until(condition, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.fixture(scope="module")
def client(served):
    with local_client(create_app(served, Limits(max_pixels=4096 * 4096, max_text_chars=400))) as c:
        yield c


@pytest.mark.parametrize("path,field,upload,form", [
    ("/vocode", "audio", _wav(np.zeros(SR // 3)), {}),  # silence
    ("/vocode", "audio", _wav(np.full(SR // 3, 0.99997)), {}),  # full-scale DC
    ("/vocode", "audio", _wav(3 * np.sin(np.arange(SR // 3) / 8), "FLOAT"), {}),  # float samples beyond ±1
    ("/vocode", "audio", _wav(1e-6 * np.random.default_rng(0).standard_normal(SR // 3), "FLOAT"), {}),  # a whisper
    ("/reconstruct", "image", png_bytes(1, 1), {}),
    ("/reconstruct", "image", _png_with_chunk(b"zTXt"), {}),
    ("/reconstruct", "image", _png_with_chunk(b"iCCP"), {}),
    ("/speak", None, None, {"seed": str(10**30)}),
    ("/speak", None, None, {"seed": "-1"}),
    ("/speak", None, None, {"noise_scale": "nan"}),
    ("/speak", None, None, {"length_scale": "inf"}),
], ids=["silent-wav", "dc-wav", "float-wav-beyond-1", "tiny-noise-wav", "1x1-png", "ztxt-bomb-png", "iccp-bomb-png",
        "huge-seed", "negative-seed", "nan-scale", "inf-scale"])
def test_valid_but_odd_input_gets_a_result_or_one_line_never_a_500(client, path, field, upload, form):
    model = {"/vocode": "vocoder-1", "/reconstruct": "vae-1", "/speak": "vits-1"}[path]
    data = {"model": model, **({"text": "salom"} if path == "/speak" else {}), **form}
    r = client.post(path, data=data, files={field: ("f", upload, "application/octet-stream")} if field else None)
    assert r.status_code in (200, 400), r.text
    if r.status_code == 400:
        assert "\n" not in r.json()["error"] and "Traceback" not in r.json()["error"]
    elif path == "/vocode":
        assert all(v is None or np.isfinite(v) for v in r.json()["metrics"].values())  # no figure: null, never NaN
    assert client.post("/speak", data={"model": "vits-1", "text": "salom"}).status_code == 200


def test_a_reconstruction_is_sized_before_it_runs(served):
    """tile_size=0 on a 4096x4096 image is refused (413) before decoding when it cannot fit the memory budget even
    tiled; one that fits only tiled is tiled to fit; the server goes on serving."""
    from vae.reconstruct import reconstruct_memory

    vae = served["vae-1"].model
    budget = (reconstruct_memory(vae, 96, 128, 64) + reconstruct_memory(vae, 96, 128, 0)) // 2
    huge = io.BytesIO()
    Image.new("1", (4096, 4096)).save(huge, format="PNG")  # 2 KB on the wire
    with local_client(create_app(served, Limits(max_pixels=4096 * 4096, memory_bytes=budget))) as c:
        t0 = time.perf_counter()
        r = c.post("/reconstruct", data={"model": "vae-1", "tile_size": "0"}, files={"image": ("x.png", huge.getvalue())})
        assert r.status_code == 413 and "--max_memory_gb" in r.json()["error"] and time.perf_counter() - t0 < 2
        r = c.post("/reconstruct", data={"model": "vae-1", "tile_size": "0"}, files={"image": ("x.png", png_bytes(128, 96))})
        assert r.status_code == 200 and r.headers["x-tiled"] == "yes" and r.headers["x-tile-size"] == "64", r.text
        assert Image.open(io.BytesIO(r.content)).size == (128, 96)
        r = c.post("/reconstruct", data={"model": "vae-1"}, files={"image": ("x.png", png_bytes(40, 24))})
        assert r.status_code == 200 and r.headers["x-tiled"] == "no"


def test_a_full_queue_is_503_and_the_page_answers_while_every_model_and_thread_is_busy(served):
    locks = {id(m.lock): m.lock for m in served.values()}.values()
    with local_client(create_app(served, Limits(queue_per_model=1))) as c:
        c.portal.call(lambda: setattr(anyio.to_thread.current_default_thread_limiter(), "total_tokens", 1))
        answer: dict = {}
        for lock in locks:
            lock.acquire()
        try:
            worker = threading.Thread(target=lambda: answer.update(r=c.post("/speak", data={"model": "vits-1",
                                                                                            "text": "salom"})))
            worker.start()
            _wait_until(lambda: c.app.state.jobs)  # waiting for the model, in the only worker thread
            full = c.post("/speak", data={"model": "vits-1", "text": "salom"})
            assert full.status_code == 503 and full.headers["retry-after"].isdigit() and "--queue" in full.json()["error"]
            t0 = time.perf_counter()
            assert c.get("/").status_code == 200 and c.get("/models").status_code == 200
            assert time.perf_counter() - t0 < 1.0
        finally:
            for lock in locks:
                lock.release()
        worker.join(10)
        c.portal.call(lambda: setattr(anyio.to_thread.current_default_thread_limiter(), "total_tokens", 40))
    assert answer["r"].status_code == 200


def _raw_request(url: str, body: bytes, length: int | None = None) -> socket.socket:
    """A POST /speak sent by hand on a socket (what a stalled or vanishing client does), the socket left open."""
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=5)
    sock.sendall(b"POST /speak HTTP/1.1\r\nHost: %s\r\nX-Requested-By: t\r\nContent-Type: "
                 b"application/x-www-form-urlencoded\r\nContent-Length: %d\r\n\r\n%s"
                 % (parts.netloc.encode(), len(body) if length is None else length, body))
    return sock


def test_a_stalled_body_is_dropped(live_server):
    url, _ = live_server  # body_timeout_s=1
    t0 = time.perf_counter()
    with _raw_request(url, b"model=vits-1&te", length=200) as sock:
        answer = b""
        while chunk := sock.recv(4096):  # the server answers, then closes the connection
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408") and b"stalled" in answer and time.perf_counter() - t0 < 4


def test_a_client_that_leaves_cancels_its_queued_work(live_server, served):
    url, app = live_server
    rid = secrets.token_hex(16)
    with served["vits-1"].lock:  # the model is busy: the request waits
        sock = _raw_request(url, f"model=vits-1&text=salom&request_id={rid}".encode())
        _wait_until(lambda: rid in app.state.jobs)
        sock.close()
        _wait_until(lambda: rid not in app.state.jobs, 3)  # cancelled while it waited, not after the model is free


def test_a_cancel_stops_a_reconstruction_at_the_next_tile(served):
    vae, job, tiles = served["vae-1"], Job(), []

    def first_tile_then_cancel(*_):
        tiles.append(1)
        job.cancelled.set()

    hook = vae.model.encoder.register_forward_hook(first_tile_then_cancel)
    try:
        with pytest.raises(Cancelled):
            vae.reconstruct(png_bytes(200, 200), job, Limits(), tile_size=64)
    finally:
        hook.remove()
    assert tiles == [1]


@pytest.mark.skipif(os.name == "nt", reason="SIGTERM is not a signal a process can send itself on Windows")
def test_sigterm_stops_the_server_within_seconds_cancelling_work_in_flight(served):
    """`python -m serve`'s own server loop (serve.__main__.run_server) in this thread, a request waiting for a busy
    model, then a real SIGTERM: the request is cancelled (409) and the server returns in a few seconds."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach only the main thread")
    from serve.__main__ import bind, run_server

    app = create_app(served, Limits())
    sock = bind("127.0.0.1", 0)
    url, answer, signals = f"http://127.0.0.1:{sock.getsockname()[1]}", {}, []

    def client() -> None:
        with _raw_request(url, f"model=vits-1&text=salom&request_id={secrets.token_hex(16)}".encode()) as s:
            answer["head"] = s.recv(4096)

    def stop_when_waiting() -> None:
        _wait_until(lambda: app.state.jobs)
        os.kill(os.getpid(), signal.SIGTERM)

    old = signal.signal(signal.SIGTERM, lambda sig, frame: signals.append(sig))  # uvicorn raises it again at exit
    lock = served["vits-1"].lock
    lock.acquire()
    try:
        threading.Thread(target=client, daemon=True).start()
        threading.Thread(target=stop_when_waiting, daemon=True).start()
        t0 = time.perf_counter()
        run_server(app, sock)
        elapsed = time.perf_counter() - t0
    finally:
        lock.release()
        signal.signal(signal.SIGTERM, old)
    assert elapsed < 5 and signals == [signal.SIGTERM]
    _wait_until(lambda: "head" in answer)
    assert answer["head"].startswith(b"HTTP/1.1 409")
