"""The one path every trainer takes for precision, parameter counts, stop flags, OOM messages and the
TensorBoard folder (issue 11): each trainer's own spelling goes straight into `common`."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from torch import nn

from common.distributed import any_rank
from common.hardware import oom_message
from common.log import RunLogger
from common.precision import Precision, normalize_precision
from common.run_dir import tensorboard_dir
from common.training import count_parameters

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


@pytest.mark.parametrize("mixed, dtype, expected", [
    (False, "bf16", "32-true"), (True, "bf16", "bf16-mixed"), (True, "fp16", "16-mixed"),  # VITS keys
    (False, "fp16", "32-true"), ("true", "fp16", "16-mixed"),
])
def test_a_switch_with_its_dtype(mixed, dtype, expected):
    """VITS' `mixed_precision` + `amp_dtype` and the VAE's `--mixed_precision` (+ `--use_bf16`)."""
    assert normalize_precision(mixed, CPU, amp_dtype=dtype) == expected
    p = Precision(mixed, "cpu", amp_dtype=dtype)
    assert p.precision == expected and p.scaler.is_enabled() == (expected == "16-mixed")


def test_count_parameters():
    m = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))  # 16 + 10
    assert count_parameters(m) == 26
    m[0].requires_grad_(False)
    assert count_parameters(m) == 26 and count_parameters(m, trainable_only=True) == 10


def test_any_rank_single_process():
    assert any_rank(True) is True and any_rank(False) is False


def test_oom_message_without_accumulation_and_with_switch_keys():
    msg = oom_message("VITS training", 32, {"accum_key": None, "precision": "32-true",
                                            "precision_set": "mixed_precision=true --set amp_dtype=bf16",
                                            "crop_key": "model_args.segment_frames", "crop": 32,
                                            "resume": "--resume auto"})
    assert "--set batch_size=16   (half the batch)" in msg and "accumulate" not in msg
    assert "--set mixed_precision=true --set amp_dtype=bf16" in msg and "model_args.segment_frames=16" in msg
    assert msg.endswith("Then --resume auto continues from the last checkpoint.")


@pytest.mark.parametrize("old", ["tb", "tensorboard"])
def test_old_tensorboard_folders_continue_in_logs(tmp_path, old):
    """The vocoder wrote tb/, VITS tensorboard/: a resumed old run continues in logs/ with its history."""
    with RunLogger(tmp_path / old) as logger:
        logger.scalar("train/x", 1.0, 1)
    logs = tensorboard_dir(tmp_path)
    assert logs == tmp_path / "logs" and not (tmp_path / old).exists()
    assert list(logs.glob("events.out.tfevents.*"))
