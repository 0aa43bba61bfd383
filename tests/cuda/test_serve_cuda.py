"""The local server (serve/) on the GPU: the four trainers' tiny checkpoints loaded on CUDA answer /speak,
/vocode and /reconstruct as on the CPU, the VAE also under bf16 autocast (`--precision`, as vae/reconstruct.py)."""

from __future__ import annotations

import io

import pytest
import soundfile as sf
import torch

# a GPU image without the page's packages (shell/gpu_check.sh installs them from bench/gpu/wheels.txt) skips this
# module with the reason instead of stopping the collection of every CUDA test
pytest.importorskip("starlette.testclient", reason="starlette/httpx not installed")

from serve.app import create_app  # noqa: E402 - after the skip above
from serve.models import load_models  # noqa: E402
from tests.serve.tiny import SERVED_ORDER, local_client, make_tiny_checkpoints, png_bytes, wav_file_bytes  # noqa: E402

from .conftest import CUDA_ONLY  # noqa: E402

pytestmark = CUDA_ONLY


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_every_endpoint_answers_on_cuda(tmp_path, precision):
    paths = make_tiny_checkpoints(tmp_path)
    models = load_models([str(paths[k]) for k in SERVED_ORDER], torch.device("cuda"), precision)
    assert next(models["vits-1"].model.parameters()).is_cuda and models["vocoder-1"].model.device.type == "cuda"
    with local_client(create_app(models)) as client:
        r = client.post("/speak", data={"model": "vits-1", "text": "Salom, dunyo!"})
        assert r.status_code == 200, r.text
        assert len(sf.read(io.BytesIO(r.content))[0]) > 1000 and float(r.headers["x-real-time-factor"]) > 0
        r = client.post("/speak", data={"model": "clone-1", "text": "Salom!"},
                        files={"reference": ("r.wav", wav_file_bytes(1.5), "audio/wav")})
        assert r.status_code == 200, r.text
        r = client.post("/vocode", data={"model": "vocoder-1"}, files={"audio": ("a.wav", wav_file_bytes(1.0), "audio/wav")})
        assert r.status_code == 200 and r.json()["metrics"]["mcd_dtw_db"] > 0, r.text
        r = client.post("/reconstruct", data={"model": "vae-1", "tile_size": "64"},
                        files={"image": ("x.png", png_bytes(96, 80), "image/png")})
        assert r.status_code == 200 and r.headers["x-tiled"] == "yes" and float(r.headers["x-psnr-db"]) > 0, r.text
