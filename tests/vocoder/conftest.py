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

TINY_YAML = REPO / "vocoder" / "configs" / "tiny.yaml"  # demo.yaml's audio, a model small enough for CPU unit tests


def tiny_config(*overrides: str) -> VocoderConfig:
    return load_config(TINY_YAML, VocoderConfig, overrides)


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
    prepare(tiny_config(), [root / "wavs"], root / "bin", num_workers=0, log=lambda *a: None,
            data_licence="CC0 (tones made by the tests)")  # carried to the exports' README.md
    return root / "bin"
