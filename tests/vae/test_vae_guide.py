"""The RTX 5090 VAE guide, literally: its profile batch sizes with the start-up fit check, its precision
flags (fp16 + loss scaling for --mixed_precision alone), TensorBoard under <output_dir>/logs."""

from __future__ import annotations

import pytest
import torch
import yaml
from helpers import REPO, TINY_CONFIG

import vae.memory as memory
import vae.train_vae as tv
from common.config import load_config
from common.hardware import fit_batch_size
from vae.config import VAEConfig
from vae.flags import resolve_config

GUIDE_BATCH = {"max_2048": 4, "high_1536": 8, "standard_1024": 16, "fast_768": 24, "large_channel_z32": 12}


def run(data, out, *args) -> int:
    return tv.main(["--config", str(TINY_CONFIG), "--data_path", str(data), "--output_dir", str(out), *args])


@pytest.mark.parametrize("profile", sorted(GUIDE_BATCH))
def test_profiles_have_the_guides_batch_sizes(profile):
    cfg = load_config(str(REPO / "vae" / "configs" / f"{profile}.yaml"), VAEConfig)
    assert (cfg.batch_size, cfg.accumulation_steps, cfg.fit_batch_size) == (GUIDE_BATCH[profile], 1, True)
    # disc_start scaled with the images per step: the GAN joins after the same ~400k images as 50001 x 8.
    assert abs(cfg.disc_start * cfg.batch_size - 50001 * 8) <= 16


def _oom_above(limit: int, tried: list[int]):
    def try_batch(b: int) -> None:
        tried.append(b)
        if b > limit:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
    return try_batch


def test_fit_batch_size_keeps_a_fitting_batch_and_lowers_one_that_does_not():
    tried: list[int] = []
    assert fit_batch_size(_oom_above(64, tried), 24, 1, cuda_available=True)[:2] == (24, 1)
    assert tried == [24]  # one trial step when the profile's batch fits
    tried.clear()
    batch, accum, line = fit_batch_size(_oom_above(5, tried), 24, 1, cuda_available=True)
    assert (batch, accum) == (4, 6) and tried == [24, 12, 8, 6, 4]  # divisors, largest first
    assert "batch_size 24 does not fit: using batch_size 4 x accumulation_steps 6" in line and "24 images" in line
    with pytest.raises(RuntimeError, match="even batch size 1"):
        fit_batch_size(_oom_above(0, []), 4, 2, cuda_available=True)
    with pytest.raises(ValueError, match="not OOM"):
        fit_batch_size(lambda b: (_ for _ in ()).throw(ValueError("not OOM")), 4, cuda_available=True)
    tried.clear()
    batch, accum, line = fit_batch_size(_oom_above(0, tried), 16, 1, cuda_available=False)
    assert (batch, accum) == (16, 1) and tried == [] and "cannot be measured" in line


def test_trainer_prints_the_fitted_batch_and_trains_with_it(image_dir, tmp_path, monkeypatch, capsys):
    assert run(image_dir, tmp_path / "cpu", "--max_steps", "1", "--no-export_diffusers") == 0
    assert "batch finder: batch_size 2 kept as configured: no CUDA device, so GPU memory cannot be measured" \
        in capsys.readouterr().out
    # The same start-up path as on a GPU whose memory takes only batch 1 (the step itself is simulated).
    real = fit_batch_size
    monkeypatch.setattr(memory, "fit_batch_size", lambda try_batch, b, a, cuda_available: real(
        _oom_above(1, []), b, a, cuda_available=True))
    assert run(image_dir, tmp_path / "gpu", "--max_steps", "1", "--no-export_diffusers") == 0
    assert "batch_size 2 does not fit: using batch_size 1 x accumulation_steps 2" in capsys.readouterr().out
    saved = yaml.safe_load((tmp_path / "gpu" / "config.yaml").read_text())
    assert (saved["batch_size"], saved["accumulation_steps"]) == (1, 2)


@pytest.mark.parametrize("flags, expected", [
    ([], "32-true"),                                        # neither switch: fp32
    (["--mixed_precision"], "16-mixed"),                    # the guide: fp16 with loss scaling
    (["--mixed_precision", "--use_bf16"], "bf16-mixed"),    # the guide's command
])
def test_guide_precision_flags(flags, expected):
    cfg = resolve_config(tv.build_parser().parse_args(flags))
    assert cfg.precision == expected
    profile = resolve_config(tv.build_parser().parse_args(
        ["--config", str(REPO / "vae" / "configs" / "standard_1024.yaml")]))
    assert profile.precision == "bf16-mixed"  # both switches


def test_fp16_step_on_cpu_really_scales_the_loss():
    """--mixed_precision alone: fp16 autocast + GradScaler("cpu"): backward sees gradients x scale,
    the optimizer sees them unscaled, and a non-finite step is skipped with the scale halved."""
    base = yaml.safe_load(TINY_CONFIG.read_text())
    cfg = VAEConfig(**{**base, "precision": "16-mixed", "disc_weight": 0.0, "gradient_clip": 0.0,
                        "warmup_steps": 0, "lr_scheduler": "constant"})
    t = tv.VAETrainer(cfg, torch.device("cpu"), total_steps=4, quiet=True)
    assert t.precision.amp_dtype == torch.float16 and t.precision.scaler.is_enabled()
    w = t.vae.decoder.conv_out.bias
    seen = {}
    w.register_hook(lambda g: seen.__setitem__("backward", g.detach().clone()))
    t.g_opt.register_step_pre_hook(lambda opt, a, k: seen.__setitem__("step", w.grad.detach().clone()))
    scale = t.precision.scaler.get_scale()
    x = torch.rand(2, 3, 32, 32) * 2 - 1
    before = w.detach().clone()
    _, stepped = t.train_step([x], 0)
    assert stepped and not torch.equal(before, w)
    torch.testing.assert_close(seen["backward"], seen["step"] * scale, rtol=1e-3, atol=1e-6)
    x_bad = x.clone()
    x_bad[0, 0, 0, 0] = float("inf")
    before = w.detach().clone()
    _, stepped = t.train_step([x_bad], 1)
    assert not stepped and torch.equal(before, w) and t.precision.scaler.get_scale() == scale / 2


def test_tensorboard_files_under_output_dir_logs(image_dir, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    assert run(image_dir, out, "--max_steps", "2", "--no-export_diffusers") == 0
    assert not (out / "tensorboard").exists()
    assert len(EventAccumulator(str(out / "logs")).Reload().Scalars("train/total")) == 2
