"""tts/vits/config.py: the guide's spelling gradient_clip_val is clip_grad_norm, and the shipped recipes
name their card and enable cudnn_benchmark."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.config import ConfigError, load_config
from tts.vits.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]


def test_gradient_clip_val_is_clip_grad_norm(tmp_path):
    assert load_config(None, TrainConfig, ["gradient_clip_val=0.5"]).clip_grad_norm == 0.5
    # --set items are layers: the later one wins whichever spelling it uses
    assert load_config(None, TrainConfig, ["gradient_clip_val=0.5", "grad_clip=1.0"]).clip_grad_norm == 1.0
    both = tmp_path / "both.yaml"
    both.write_text("gradient_clip_val: 0.5\ngrad_clip: 1.0\n")
    with pytest.raises(ConfigError, match="twice"):  # one file giving both spellings is ambiguous
        load_config(both, TrainConfig)


def test_recipes_name_their_card_and_enable_cudnn_benchmark():
    r4090 = load_config(ROOT / "tts/vits/configs/uzbek_vits.yaml", TrainConfig)
    r5090 = load_config(ROOT / "tts/vits/configs/uzbek_vits_rtx5090.yaml", TrainConfig)
    assert "rtx4090" in r4090.run_name and "rtx5090" in r5090.run_name
    assert r4090.cudnn_benchmark and r5090.cudnn_benchmark
