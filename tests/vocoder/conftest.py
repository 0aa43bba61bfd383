"""Shared fixtures for the vocoder tests: synthetic voiced audio, a prepared tiny dataset and a
tiny config (a few thousand parameters, 8-frame crops) so a training step takes milliseconds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from common.config import load_config
from vocoder.config import VocoderConfig
from vocoder.prepare_data import prepare

REPO = Path(__file__).resolve().parents[2]
DEMO_YAML = REPO / "vocoder" / "configs" / "demo.yaml"
GPU_YAML = REPO / "vocoder" / "configs" / "base_hifi_gpu.yaml"
RTX_YAML = REPO / "vocoder" / "configs" / "base_hifi_rtx5090_optimized.yaml"

# A model small enough for CPU unit tests; the audio front end is demo.yaml's (22.05 kHz, hop 256).
TINY = [
    "model_args.upsample_initial_channel=32",
    "model_args.resblock=2",
    "model_args.resblock_kernel_sizes=[3]",
    "model_args.resblock_dilation_sizes=[[1]]",
    "model_args.discriminators=[fast_mpd]",
    "model_args.discriminator_periods=[2,3]",
    "model_args.fast_mpd_init_channel=2",
    "crop_mel_frames=8",
    "batch_size=2",
    "ds_workers=0",
    "precision=32-true",
    "loss_fft_sizes=[256,512]",
    "loss_hop_sizes=[64,128]",
    "loss_win_lengths=[256,512]",
    "lr_scheduler_args.warmup_steps=0",
    "num_sanity_val_steps=0",
    "num_valid_plots=1",
    "valid_max_seconds=0.5",
    "val_check_interval=1000",
    "log_interval=1",
    "volume_aug=false",
    "val_num=1",
    "binarization_args.num_workers=0",
    "discriminator_train_start_steps=0",  # the loop with its critics from step 0 (demo.yaml warms up 1500)
]


def tiny_config(*overrides: str) -> VocoderConfig:
    return load_config(DEMO_YAML, VocoderConfig, [*TINY, *overrides])


def voiced_tone(seconds: float, sr: int, f0: float = 180.0, seed: int = 0, amp: float = 0.3) -> np.ndarray:
    """A harmonic tone with slow vibrato and a little noise: clearly voiced for Praat."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sr)) / sr
    f = f0 * (1 + 0.03 * np.sin(2 * np.pi * 3 * t))
    phase = 2 * np.pi * np.cumsum(f) / sr
    wav = sum(np.sin(k * phase) / k for k in range(1, 8))
    wav = wav / np.abs(wav).max() * amp + 0.002 * rng.standard_normal(len(t))
    return wav.astype(np.float32)


def write_tones(folder: Path, n: int, sr: int, seconds: float = 1.0) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        p = folder / f"tone_{i}.wav"
        sf.write(p, voiced_tone(seconds, sr, f0=120 + 40 * i, seed=i), sr, subtype="PCM_16")
        paths.append(p)
    return paths


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """Five 1-second tones at 22.05 kHz prepared with demo.yaml's audio settings (4 train, 1 valid)."""
    root = tmp_path_factory.mktemp("vocoder_tiny")
    write_tones(root / "wavs", 5, 22050)
    prepare(tiny_config(), [root / "wavs"], root / "bin", num_workers=0, log=lambda *a: None)
    return root / "bin"
