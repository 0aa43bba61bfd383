"""The one path every trainer takes for precision, parameter counts, stop flags and OOM messages:
each trainer's own spelling is read once into `common`'s."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from torch import nn

from common.config import ConfigError, explicit_keys, load_config
from common.distributed import any_rank
from common.hardware import oom_message
from common.precision import Precision, normalize_precision
from common.training import count_parameters
from tts.clone.config import CloneConfig
from tts.vits.config import TrainConfig
from vae.config import VAEConfig
from vocoder.config import VocoderConfig

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_auto_is_bf16_on_a_bf16_gpu_else_fp32():
    """`--precision auto` as tts/train_main.py's pick_precision had it: no fp16 (loss scaling) and
    no CPU bf16 unless asked for."""
    assert normalize_precision("auto", CPU) == "32-true"
    with mock.patch("torch.cuda.is_bf16_supported", return_value=True):
        assert normalize_precision("auto", CUDA) == "bf16-mixed"
    with mock.patch("torch.cuda.is_bf16_supported", return_value=False):
        assert normalize_precision("auto", CUDA) == "32-true"
    assert Precision("auto", "cpu").precision == "32-true"


@pytest.mark.parametrize("schema, typed, expected", [
    (TrainConfig, [], "bf16-mixed"), (TrainConfig, ["mixed_precision=false"], "32-true"),
    (TrainConfig, ["mixed_precision=true", "amp_dtype=fp16"], "16-mixed"),
    (TrainConfig, ["amp_dtype=fp16"], "16-mixed"),  # the dtype alone: the default is mixed
    (TrainConfig, ["amp_dtype=fp16", "mixed_precision=true"], "16-mixed"),  # the command line is one layer
    (TrainConfig, ["precision=fp16"], "16-mixed"),  # a value alias
    (VAEConfig, [], "32-true"), (VAEConfig, ["mixed_precision=true"], "16-mixed"),
    (VAEConfig, ["mixed_precision=yes", "use_bf16=true"], "bf16-mixed"),
    (VAEConfig, ["use_bf16=true"], "32-true"),  # the dtype alone leaves fp32 alone
    (VocoderConfig, ["pl_trainer_precision=16"], "16-mixed"), (CloneConfig, ["precision=bf16"], "bf16-mixed"),
])
def test_every_spelling_is_the_one_precision_field(schema, typed, expected):
    """VITS' `mixed_precision` + `amp_dtype`, the VAE's `--mixed_precision` (+ `--use_bf16`), the vocoder's
    `pl_trainer_precision`: read once at load into the one `precision` field, recorded as typed."""
    cfg = load_config(None, schema, typed)
    precision = cfg.train.precision if schema is CloneConfig else cfg.precision
    assert precision == expected
    assert not typed or set(explicit_keys(cfg)) == {"train.precision" if schema is CloneConfig else "precision"}
    p = Precision(precision, "cpu")
    assert p.precision == expected and p.scaler.is_enabled() == (expected == "16-mixed")


def test_a_switch_combines_with_the_layer_below(tmp_path):
    """A YAML layer's `mixed_precision: true` keeps the dtype its base chose; one spelling per layer."""
    (tmp_path / "base.yaml").write_text("mixed_precision: true\nuse_bf16: true\n")
    (tmp_path / "child.yaml").write_text("base_config: base.yaml\nmixed_precision: true\n")
    assert load_config(tmp_path / "child.yaml", VAEConfig).precision == "bf16-mixed"
    assert load_config(tmp_path / "child.yaml", VAEConfig, ["mixed_precision=false"]).precision == "32-true"
    (tmp_path / "both.yaml").write_text("mixed_precision: true\nprecision: bf16-mixed\n")
    with pytest.raises(ConfigError, match="keep one spelling"):
        load_config(tmp_path / "both.yaml", VAEConfig)
    with pytest.raises(ConfigError, match="keep one spelling"):
        load_config(None, TrainConfig, ["precision=32-true", "amp_dtype=fp16"])
    with pytest.raises(ConfigError, match="unknown precision 'fp8'"):
        load_config(None, VocoderConfig, ["precision=fp8"])


def test_count_parameters():
    m = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))  # 16 + 10
    assert count_parameters(m) == 26
    m[0].requires_grad_(False)
    assert count_parameters(m) == 26 and count_parameters(m, trainable_only=True) == 10


def test_any_rank_single_process():
    assert any_rank(True) is True and any_rank(False) is False


def test_oom_message_without_accumulation():
    msg = oom_message("VITS training", 32, {"accum_key": None, "precision": "32-true",
                                            "crop_key": "model_args.segment_frames", "crop": 32,
                                            "resume": "--resume auto"})
    assert "--set batch_size=16   (half the batch)" in msg and "accumulate" not in msg
    assert "--set precision=bf16-mixed" in msg and "model_args.segment_frames=16" in msg
    assert msg.endswith("Then --resume auto continues from the last checkpoint.")
