"""Tiny checkpoints of the four trainers in a second or two (random weights: the server's job is to load, run,
limit and report them, not to sound good), and the inputs a user uploads. A plain module, not a conftest: the
CUDA tests (tests/cuda/test_serve_cuda.py) build the same ones."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
from PIL import Image

from common.config import config_to_dict, load_config

REPO = Path(__file__).resolve().parents[2]


def tone(seconds: float = 1.5, sr: int = 22050, f0: float = 160.0) -> np.ndarray:
    """A voiced harmonic tone with a little noise: audio every loader and the reference check accept."""
    t = np.arange(int(seconds * sr)) / sr
    wav = sum(np.sin(2 * np.pi * k * f0 * t) / k for k in range(1, 6))
    wav = 0.3 * wav / np.abs(wav).max() + 0.003 * np.random.default_rng(0).standard_normal(len(t))
    return wav.astype(np.float32)


def wav_file_bytes(seconds: float = 1.5, sr: int = 22050) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, tone(seconds, sr), sr, subtype="PCM_16", format="WAV")
    return buf.getvalue()


def png_bytes(width: int = 40, height: int = 24) -> bytes:
    yy, xx = np.mgrid[0:height, 0:width]
    img = np.stack([xx * 255 // max(width - 1, 1), yy * 255 // max(height - 1, 1), (xx + yy) % 256], -1)
    buf = io.BytesIO()
    Image.fromarray(img.astype(np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def _vocoder(root: Path):
    from vocoder.build import build_generator
    from vocoder.config import VocoderConfig
    from vocoder.export import export
    from vocoder.layouts import export_info

    cfg = load_config(REPO / "vocoder" / "configs" / "tiny.yaml", VocoderConfig)
    ckpt = root / "vocoder.pt"
    torch.save({"trainer": "vocoder", "models": {"generator": build_generator(cfg).state_dict()},
                "extra": {"export": export_info(cfg)}}, ckpt)
    return ckpt, export(ckpt, root / "vocoder_export"), export_info(cfg)


def _vits(root: Path) -> Path:
    from tts.vits.build import build_models
    from tts.vits.config import TrainConfig

    cfg = TrainConfig(model="tiny", model_args={"upsample_initial_channel": 32})
    gen, _ = build_models(cfg, n_speakers=2)
    path = root / "vits.pt"
    torch.save({"trainer": "vits", "models": {"generator": gen.state_dict()}, "config": config_to_dict(cfg),
                "extra": {"speakers": {"anna": 0, "bobur": 1}}}, path)
    return path


def _clone(root: Path, vocoder_dir: Path, info: dict) -> Path:
    from tts.clone.config import CloneConfig
    from tts.clone.model import VoiceCloneTTS
    from tts.text import SYMBOLS

    cfg = CloneConfig()
    cfg.model.size, cfg.model.dropout = "tiny", 0.0
    a = cfg.audio
    a.sample_rate, a.n_fft, a.win_length, a.hop_length = (info["sampling_rate"], info["n_fft"], info["win_size"],
                                                          info["hop_size"])
    a.n_mels, a.fmin, a.fmax = info["num_mels"], info["fmin"], info["fmax"]
    cfg.vocoder.path = str(vocoder_dir)
    model = VoiceCloneTTS(cfg.model, len(SYMBOLS), a.n_mels)
    with torch.no_grad():
        model.duration_predictor.out.bias.fill_(1.5)  # ~3 frames a symbol: audible length
        model.set_stats(torch.randn(a.n_mels) - 5, torch.rand(a.n_mels) + 0.5, 5.0, 0.3)
    path = root / "clone.pt"
    torch.save({"trainer": "clone", "models": {"model": model.state_dict()}, "config": config_to_dict(cfg)}, path)
    return path


def _vae(root: Path) -> Path:
    from vae.model import AutoencoderKL

    model = AutoencoderKL(channels=[8, 16], z_channels=4, layers_per_block=1, norm_num_groups=8)
    path = root / "vae.pt"
    torch.save({"trainer": "vae", "state_dict": model.state_dict(), "arch": model.arch()}, path)
    return path


def make_tiny_checkpoints(root: Path) -> dict[str, Path]:
    """{"vits", "clone", "vocoder" (an export folder), "vocoder_ckpt", "vae"} under `root`: random tiny models."""
    torch.manual_seed(0)
    voc_ckpt, voc_dir, info = _vocoder(root)
    return {"vits": _vits(root), "clone": _clone(root, voc_dir, info), "vocoder": voc_dir,
            "vocoder_ckpt": voc_ckpt, "vae": _vae(root)}


SERVED_ORDER = ("vits", "clone", "vocoder", "vocoder_ckpt", "vae")


def local_client(app, **kwargs):
    """Starlette's test client as the page calls the server: at 127.0.0.1 (the Host the server answers to) and
    with the header every POST needs (serve.guard); use it as a context manager."""
    from starlette.testclient import TestClient

    from serve.guard import CLIENT_HEADER

    return TestClient(app, base_url="http://127.0.0.1:8000", headers={CLIENT_HEADER: "tests"}, **kwargs)
