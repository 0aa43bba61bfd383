"""train_vae.py: the guide's flags and config paths, the profiles' batch sizes and the start-up fit
check, precision/layout flags (fp16 + loss scaling for --mixed_precision alone), TensorBoard under
<output_dir>/logs, accumulation, clipping, non-finite handling, exact resume with rotation,
multi-resolution stages, the RTX 5090 script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest
import torch
import yaml
from helpers import REPO, TINY_CONFIG, tiny_cfg

import vae.memory as memory
import vae.train_vae as tv
from common.checkpoint import load_checkpoint
from common.config import load_config
from common.hardware import fit_batch_size
from common.log import RunLogger
from tests.common.test_hardware import fake_trainer
from vae.config import VAEConfig
from vae.diffusers_io import export_final, load_diffusers
from vae.flags import resolve_config
from vae.losses import VAELoss

GUIDE_BATCH = {"max_2048": 4, "high_1536": 8, "standard_1024": 16, "fast_768": 24, "large_channel_z32": 12}


def run(data, out, *args) -> int:
    return tv.main(["--config", str(TINY_CONFIG), "--data_path", str(data), "--output_dir", str(out), *args])


def weights(path) -> dict:
    return load_checkpoint(path)["models"]


def same_state(a: dict, b: dict) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


# ----------------------------------------------------------------------------- config paths


def test_guide_flags_override_config_and_resolved_config_is_saved(image_dir, tmp_path):
    out = tmp_path / "run"
    rc = run(image_dir, out, "--image_size", "40", "--batch_size", "2", "--num_epochs", "1", "--learning_rate", "3e-4",
             "--z_channels", "8", "--kl_weight", "1e-5", "--perceptual_weight", "0", "--no-mixed_precision",
             "--no-use_torch_compile", "--no-enable_tf32", "--no-channels_last",
             "--no-persistent_workers", "--gradient_clip", "0.5", "--num_workers", "0", "--checkpoint_freq", "1",
             "--save_samples_freq", "2", "--accumulation_steps", "2", "--disc_start", "0", "--disc_weight", "0.25",
             "--set", "ema_decay=0.5")
    assert rc == 0
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["image_size"] == 40 and saved["z_channels"] == 8 and saved["kl_weight"] == 1e-5
    assert saved["accumulation_steps"] == 2 and saved["ema_decay"] == 0.5 and saved["disc_weight"] == 0.25
    assert saved["channels"] == [16, 32]  # from the YAML
    assert saved["clip_grad_norm"] == 0.5 and "gradient_clip" not in saved  # the guide's flag, saved canonically
    assert (out / "checkpoint_epoch_1.pt").is_file() and (out / "vae_final.pt").is_file()
    assert (out / "lr_schedule.png").is_file()
    assert sorted(p.name for p in (out / "samples").iterdir())[-1] == "step_0000002.png"
    diff_cfg = json.loads((out / "diffusers" / "config.json").read_text())
    card = (out / "diffusers" / "README.md").read_text(encoding="utf-8")  # the model card (common.model_card)
    assert "trainer: `vae`" in card and "steps trained: " in card and "code: MIT" in card and "z_channels`: 8" in card
    assert diff_cfg["latent_channels"] == 8 and diff_cfg["block_out_channels"] == [16, 32]
    stats = json.loads((out / "latent_stats.json").read_text())
    assert len(stats["per_channel_std"]) == 8 and stats["scaling_factor"] == pytest.approx(1 / stats["std"])


def test_guide_json_config(image_dir, tmp_path):
    cfg = tmp_path / "guide.json"
    cfg.write_text(json.dumps({"channels": [8, 16], "z_channels": 4, "image_size": 32, "batch_size": 4}))
    out = tmp_path / "run"
    rc = tv.main(["--config", str(cfg), "--data_path", str(image_dir), "--output_dir", str(out), "--batch_size", "2",
                  "--max_steps", "1", "--perceptual_weight", "0", "--num_workers", "0", "--set", "norm_num_groups=4",
                  "--set", "num_val_images=2", "--no-export_diffusers"])
    assert rc == 0
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["channels"] == [8, 16] and saved["batch_size"] == 2  # the flag beats the JSON


def test_bad_config_key_is_named(tmp_path, capsys):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("kl_weigth: 1.0e-6\n")
    assert tv.main(["--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "kl_weigth" in err and "kl_weight" in err
    assert tv.main(["--config", str(TINY_CONFIG), "--image_size", "30"]) == 2
    assert "multiple of 8" in capsys.readouterr().err


def test_batch_size_auto_on_cpu_degrades_with_a_message(image_dir, tmp_path, capsys):
    assert run(image_dir, tmp_path / "run", "--batch_size", "auto", "--max_steps", "1", "--no-export_diffusers") == 0
    printed = capsys.readouterr().out
    assert "--batch_size auto: no CUDA device" in printed
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["batch_size"] == 2


def test_missing_lpips_backbone_is_a_clear_error(image_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "empty_hub"))
    assert run(image_dir, tmp_path / "run", "--perceptual_weight", "1.0") == 2
    assert "--perceptual_weights" in capsys.readouterr().err


@pytest.mark.parametrize("profile", sorted(GUIDE_BATCH))
def test_profiles_have_the_guides_batch_sizes(profile):
    cfg = load_config(str(REPO / "vae" / "configs" / f"{profile}.yaml"), VAEConfig)
    assert (cfg.batch_size, cfg.accumulation_steps, cfg.fit_batch_size) == (GUIDE_BATCH[profile], 1, True)
    # disc_start scaled with the images per step: the GAN joins after the same ~400k images as 50001 x 8.
    assert abs(cfg.disc_start * cfg.batch_size - 50001 * 8) <= 16

def test_trainer_prints_the_fitted_batch_and_trains_with_it(image_dir, tmp_path, monkeypatch, capsys):
    assert run(image_dir, tmp_path / "cpu", "--max_steps", "1", "--no-export_diffusers") == 0
    assert "batch finder: batch_size 2 kept as configured: no CUDA device, so GPU memory cannot be measured" \
        in capsys.readouterr().out
    # The same start-up path as on a GPU whose memory takes only batch 1 (the step itself is simulated).
    real = fit_batch_size
    monkeypatch.setattr(memory, "fit_batch_size", lambda try_batch, b, a, cuda_available: real(
        fake_trainer(1, []), b, a, cuda_available=True))
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

def test_tensorboard_files_under_output_dir_logs(image_dir, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    assert run(image_dir, out, "--max_steps", "2", "--no-export_diffusers") == 0
    assert not (out / "tensorboard").exists()
    assert len(EventAccumulator(str(out / "logs")).Reload().Scalars("train/total")) == 2


# ----------------------------------------------------------------------------- the step


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_and_channels_last_steps(precision):
    cfg = tiny_cfg(precision={"bf16": "bf16-mixed", "fp16": "16-mixed"}[precision], channels_last=True)
    t = tv.VAEStep(cfg, torch.device("cpu"), total_steps=4)
    assert t.precision.amp_dtype == (torch.bfloat16 if precision == "bf16" else torch.float16)
    assert t.precision.scaler.is_enabled() == (precision == "fp16")
    assert t.vae.encoder.conv_in.weight.is_contiguous(memory_format=torch.channels_last)
    seen = {}

    def record(module, inputs, output):
        seen["dtype"] = output.dtype

    hook = t.vae.decoder.conv_out.register_forward_hook(record)
    before = t.vae.decoder.conv_out.weight.detach().clone()
    x = torch.rand(2, 3, 32, 32) * 2 - 1
    for s in range(3):
        logs = t.train_step([x], s)  # train_step returns its logs (common.loop); logs['stepped'] says it stepped
    hook.remove()
    assert seen["dtype"] == t.precision.amp_dtype  # autocast really ran
    assert torch.isfinite(logs["total"]) and "d_loss" in logs  # GAN on (disc_start 1)
    assert not torch.equal(before, t.vae.decoder.conv_out.weight)


def _grads_of_one_step(cfg, micro, monkeypatch):
    monkeypatch.setattr("vae.model.DiagonalGaussian.sample", lambda self, generator=None: self.mean)
    torch.manual_seed(0)
    t = tv.VAEStep(cfg, torch.device("cpu"), total_steps=4)
    captured = {}

    def spy(optimizer, args, kwargs):  # runs inside optimizer.step(): after clipping, before the update
        captured["g"] = torch.cat([p.grad.flatten() for p in t.g_params if p.grad is not None]).clone()

    t.g_opt.register_step_pre_hook(spy)
    logs = t.train_step(micro, 0)  # train_step returns its logs (common.loop)
    return captured["g"], logs


def test_accumulation_divides_the_loss(monkeypatch):
    cfg = tiny_cfg(disc_weight=0.0, ema_decay=0.0, clip_grad_norm=0.0)
    torch.manual_seed(1)
    x = torch.rand(4, 3, 32, 32) * 2 - 1
    whole, logs_whole = _grads_of_one_step(cfg, [x], monkeypatch)
    accum, logs_accum = _grads_of_one_step(cfg, [x[:2], x[2:]], monkeypatch)
    assert torch.allclose(whole, accum, rtol=1e-4, atol=1e-7)  # mean over the effective batch, not a sum
    assert logs_whole["total"].item() == pytest.approx(logs_accum["total"].item(), rel=1e-5)


def test_gradient_clip_really_clips(monkeypatch):
    x = torch.rand(2, 3, 32, 32) * 2 - 1
    clipped, logs = _grads_of_one_step(tiny_cfg(disc_weight=0.0, clip_grad_norm=1e-3), [x], monkeypatch)
    assert logs["grad_norm"].item() > 1e-2  # the reported norm is the one before clipping
    assert clipped.norm().item() == pytest.approx(1e-3, rel=1e-3)
    free, _ = _grads_of_one_step(tiny_cfg(disc_weight=0.0, clip_grad_norm=0.0), [x], monkeypatch)
    assert free.norm().item() == pytest.approx(logs["grad_norm"].item(), rel=1e-4)


def test_fp16_step_on_cpu_really_scales_the_loss():
    """--mixed_precision alone: fp16 autocast + GradScaler("cpu"): backward sees gradients x scale,
    the optimizer sees them unscaled, and a non-finite step is skipped with the scale halved."""
    cfg = tiny_cfg(precision="16-mixed", disc_weight=0.0, clip_grad_norm=0.0, warmup_steps=0, lr_scheduler="constant")
    t = tv.VAEStep(cfg, torch.device("cpu"), total_steps=4)
    assert t.precision.amp_dtype == torch.float16 and t.precision.scaler.is_enabled()
    w = t.vae.decoder.conv_out.bias
    seen = {}
    w.register_hook(lambda g: seen.__setitem__("backward", g.detach().clone()))
    t.g_opt.register_step_pre_hook(lambda opt, a, k: seen.__setitem__("step", w.grad.detach().clone()))
    scale = t.precision.scaler.get_scale()
    x = torch.rand(2, 3, 32, 32) * 2 - 1
    before = w.detach().clone()
    stepped = t.train_step([x], 0)["stepped"]  # train_step returns its logs (common.loop)
    assert stepped and not torch.equal(before, w)
    torch.testing.assert_close(seen["backward"], seen["step"] * scale, rtol=1e-3, atol=1e-6)
    x_bad = x.clone()
    x_bad[0, 0, 0, 0] = float("inf")
    before = w.detach().clone()
    stepped = t.train_step([x_bad], 1)["stepped"]
    assert not stepped and torch.equal(before, w) and t.precision.scaler.get_scale() == scale / 2


# ----------------------------------------------------------------------------- non-finite losses


def _nan_after(step_from: int, step_to: int = 10**9):
    real = VAELoss.generator_loss

    def fake(self, x, x_rec, posterior, step, *a, **k):
        loss, logs = real(self, x, x_rec, posterior, step, *a, **k)
        if step_from <= step < step_to:
            loss = loss * float("nan")
        return loss, logs
    return fake


def test_single_nonfinite_step_is_skipped(image_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(VAELoss, "generator_loss", _nan_after(2, 3))
    out = tmp_path / "run"
    assert run(image_dir, out, "--num_epochs", "1", "--no-export_diffusers") == 0
    ckpt = load_checkpoint(out / "checkpoint_last.pt")
    assert ckpt["guards"]["vae"]["skipped_total"] == 1
    assert all(torch.isfinite(v).all() for v in ckpt["models"]["vae"].values())


def test_repeated_nonfinite_stops_with_last_good_checkpoint(image_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(VAELoss, "generator_loss", _nan_after(5))  # epoch 1 = steps 0-3 is clean
    out = tmp_path / "run"
    rc = run(image_dir, out, "--num_epochs", "3", "--set", "max_nonfinite=3")
    assert rc == 3  # exit code 3: stopped on non-finite values (common/exit_codes.py)
    assert "consecutive" in capsys.readouterr().err
    assert sorted(p.name for p in out.glob("checkpoint_*.pt")) == ["checkpoint_epoch_1.pt"]
    ckpt = load_checkpoint(out / "checkpoint_epoch_1.pt")
    assert ckpt["counters"]["step"] == 4
    assert all(torch.isfinite(v).all() for v in ckpt["models"]["vae"].values())


# ----------------------------------------------------------------------------- resume


def test_exact_resume_is_bitwise_with_rotation(image_dir, tmp_path):
    straight, resumed, split = tmp_path / "straight", tmp_path / "resumed", tmp_path / "split"
    assert run(image_dir, straight, "--num_epochs", "3", "--set", "save_n_checkpoints=2") == 0
    # Rotation: epochs 1..3 were written, the newest 2 kept.
    assert sorted(p.name for p in straight.glob("checkpoint_epoch_*.pt")) == ["checkpoint_epoch_2.pt",
                                                                             "checkpoint_epoch_3.pt"]
    # 2 epochs + resume for the 3rd (from an epoch checkpoint) == 3 epochs straight.
    assert run(image_dir, resumed, "--num_epochs", "3", "--stop_at_step", "8") == 0
    assert run(image_dir, resumed, "--num_epochs", "3", "--resume_from", str(resumed / "checkpoint_epoch_2.pt")) == 0
    # Mid-epoch: stop after 2 steps (half an epoch), resume with --resume_from auto, with a worker.
    assert run(image_dir, split, "--num_epochs", "3", "--stop_at_step", "2", "--num_workers", "1") == 0
    assert load_checkpoint(split / "checkpoint_last.pt")["counters"]["batch_in_epoch"] == 2
    assert run(image_dir, split, "--num_epochs", "3", "--resume_from", "auto", "--num_workers", "1") == 0
    a = load_checkpoint(straight / "checkpoint_last.pt")
    for other in (resumed, split):
        b = load_checkpoint(other / "checkpoint_last.pt")
        assert b["counters"]["step"] == a["counters"]["step"] == 12
        for key in ("models", "optimizers", "schedulers", "ema"):
            assert same_state(a[key], b[key]), f"{other.name}: {key} differs"


def test_multi_resolution_resume_replans(image_dir, tmp_path, capsys):
    low, high = tmp_path / "low", tmp_path / "high"
    assert run(image_dir, low, "--num_epochs", "1", "--image_size", "32") == 0
    capsys.readouterr()
    # 48 px (the test images' size, not 64: below the crop, prepare_data.py's size filter skips them)
    rc = run(image_dir, high, "--num_epochs", "2", "--image_size", "48", "--learning_rate", "0", "--set",
             "ema_decay=0", "--resume_from", str(low / "checkpoint_epoch_1.pt"), "--set", "disc_weight=0")
    assert rc == 0
    printed = capsys.readouterr().out
    assert "trained at 32 px, now 48 px" in printed and "re-planned" in printed
    ckpt = load_checkpoint(high / "checkpoint_last.pt")
    c = ckpt["counters"]
    assert (c["stage"], c["steps_before_stage"], c["step"], c["image_size"]) == (2, 4, 8, 48)
    assert ckpt["schedulers"]["vae"]["last_epoch"] == 8  # a fresh schedule for this run's 8 steps
    # learning_rate 0: the weights are exactly the 32 px run's, so they were carried over, not re-initialised.
    assert same_state(ckpt["models"]["vae"], load_checkpoint(low / "checkpoint_epoch_1.pt")["models"]["vae"])


# ----------------------------------------------------------------------------- scripts


def test_train_rtx5090_sh_runs_tiny(image_dir, tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run(["bash", str(REPO / "vae" / "train_rtx5090.sh"), "--data_path", str(image_dir),
                        "--output_dir", str(out), "--channels", "16", "32", "--set", "norm_num_groups=8",
                        "--image_size", "32", "--batch_size", "2", "--max_steps", "2", "--perceptual_weight", "0",
                        "--num_workers", "0", "--accumulation_steps", "1", "--set", "num_val_images=2",
                        "--no-gradient_checkpointing", "--no-export_diffusers"],
                       capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["precision"] == "bf16-mixed" and saved["enable_tf32"] and saved["channels_last"]  # the RTX 5090 profile
    assert load_checkpoint(out / "checkpoint_last.pt")["counters"]["step"] == 2


def test_profile_memory_on_cpu_says_it_needs_cuda(tmp_path, capsys):
    assert tv.main(["--config", str(TINY_CONFIG), "--output_dir", str(tmp_path), "--profile_memory"]) == 0
    assert "needs a CUDA GPU" in capsys.readouterr().out
    assert sys.modules["vae.train_vae"] is tv
    # its grid flags without it would change nothing: refused before anything runs
    assert tv.main(["--config", str(TINY_CONFIG), "--output_dir", str(tmp_path / "r"), "--profile_batches", "2"]) == 2
    assert "--profile_batches only shape --profile_memory" in capsys.readouterr().err


@pytest.mark.parametrize("channels, z, shifted", [([8, 16, 16, 16], 16, True),   # f8c16: SD3 / FLUX
                                                  ([8, 16, 16, 16], 4, False),   # f8c4: SD 1.x / SDXL
                                                  ([8, 16, 16], 16, False)])     # f4c16: no pipeline
def test_export_carries_shift_factor_for_f8c16(image_dir, tmp_path, channels, z, shifted):
    cfg = tiny_cfg(channels=channels, z_channels=z, disc_weight=0.0, ema_decay=0.0, output_dir=str(tmp_path))
    trainer = tv.VAEStep(cfg, torch.device("cpu"))
    files = sorted(image_dir.glob("*.png"))[:4]
    export_final(cfg, trainer.eval_model, trainer.precision, files, tmp_path, RunLogger(tmp_path, enabled=False), 0, {})
    stats = json.loads((tmp_path / "latent_stats.json").read_text())
    folder_cfg = json.loads((tmp_path / "diffusers" / "config.json").read_text())
    assert folder_cfg["scaling_factor"] == pytest.approx(stats["scaling_factor"])
    if shifted:  # pipelines compute z / scaling_factor + shift_factor: both must be the measured ones
        assert stats["shift_factor"] != 0 and folder_cfg["shift_factor"] == pytest.approx(stats["shift_factor"])
        assert load_diffusers(tmp_path / "diffusers")[1]["shift_factor"] == pytest.approx(stats["shift_factor"])
    else:
        assert folder_cfg["shift_factor"] is None


# ----------------------------------------------------------------------------- stages and unusable images


def test_resolution_stages_continue_counters_and_keep_every_stage_file(image_dir, tmp_path, capsys):
    out = tmp_path / "run"  # one output_dir for both stages, as in the guide
    assert run(image_dir, out, "--num_epochs", "2", "--image_size", "32", "--no-export_diffusers") == 0
    stage1 = load_checkpoint(out / "checkpoint_last.pt")
    best = json.loads((out / "checkpoints" / "best.json").read_text())  # every trainer's best: <run>/checkpoints/
    (out / "checkpoints" / "best.json").write_text(json.dumps({**best, "metric": 99.0}))  # a stage-1 best no stage-2 PSNR beats
    capsys.readouterr()
    assert run(image_dir, out, "--num_epochs", "2", "--image_size", "40", "--no-export_diffusers",
               "--resume_from", str(out / "checkpoint_epoch_2.pt")) == 0
    printed = capsys.readouterr().out
    assert "now 40 px -> stage 2" in printed and "epochs continue at 3" in printed
    # Epoch numbers continue (3, 4), so stage 2 overwrote nothing of stage 1 and rotation (keep 2) kept
    # the newest, not stage 1's higher numbers; stage 1's last and best checkpoints are kept under stage
    # names (best.pt is per stage: PSNR at another crop size is not comparable).
    assert sorted(p.name for p in out.glob("*.pt")) == ["checkpoint_epoch_3.pt", "checkpoint_epoch_4.pt",
                                                        "checkpoint_last.pt", "stage1_32px_best.pt",
                                                        "stage1_32px_last.pt", "vae_final.pt"]
    assert load_checkpoint(out / "checkpoints" / "best.pt")["counters"]["image_size"] == 40
    assert same_state(load_checkpoint(out / "stage1_32px_last.pt")["models"], stage1["models"])
    c = load_checkpoint(out / "checkpoint_last.pt")
    assert (c["counters"]["epoch"], c["counters"]["global_step"], c["counters"]["stage"]) == (4, 16, 2)
    assert [(s["stage"], s["image_size"], s["first_step"], s["first_epoch"]) for s in c["extra"]["stages"]] == [
        (1, 32, 0, 0), (2, 40, 8, 2)]
    assert load_checkpoint(out / "checkpoint_epoch_3.pt")["counters"]["image_size"] == 40
    # the log: TensorBoard has the resolution of each stage at its first global step
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "logs")).Reload().Scalars("train/image_size")
    assert sorted((e.step, e.value) for e in events) == [(0, 32.0), (8, 40.0)]


def test_folder_of_only_unusable_images_is_one_line_exit_2(tmp_path, capsys):
    from helpers import textured
    from PIL import Image

    bad = tmp_path / "bad"
    bad.mkdir()
    Image.fromarray(textured(64, 1)).save(bad / "good.jpg")
    data = (bad / "good.jpg").read_bytes()
    (bad / "good.jpg").write_bytes(data[: len(data) // 2])  # truncated
    (bad / "notes.jpg").write_text("not a JPEG")
    Image.fromarray(textured(8, 2)).save(bad / "eight.png")
    Image.fromarray(textured(1, 3)).save(bad / "one.png")
    for batch in ("2", "16"):  # was a traceback with a small batch, "4 training images" with a large one
        assert run(bad, tmp_path / "out", "--batch_size", batch) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert f"no usable image in {bad} (4 files skipped: 1 corrupt, 1 not image, 2 too small" in err


def test_training_skips_what_prepare_skips_instead_of_upscaling(image_dir, tmp_path, capsys):
    import shutil

    from helpers import textured
    from PIL import Image

    mixed = tmp_path / "mixed"
    shutil.copytree(image_dir, mixed)
    Image.fromarray(textured(8, 2)).save(mixed / "eight.png")
    Image.fromarray(textured(1, 3)).save(mixed / "one.png")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reported as lines, as prepare_data.py reports them: no UserWarning
        assert run(mixed, tmp_path / "out", "--max_steps", "1", "--no-export_diffusers") == 0
    out = capsys.readouterr().out
    assert "8 training / 2 validation images" in out  # the 10 good ones only
    assert f"{mixed}: 10 of 12 images usable, 2 skipped (2 too small)" in out
    for name, side in (("eight.png", 8), ("one.png", 1)):  # each file named with its reason
        assert f"\n  skipped {mixed / name}: too small: {side}x{side}, shorter side < --min_size 32\n" in out, out


def test_a_critic_that_stays_nonfinite_stops_the_run(image_dir, tmp_path, monkeypatch, capsys):
    """The discriminator's step has its own guard: NaN critic gradients, step after step, stop the run
    (exit 3, no checkpoint of the bad state) instead of a run whose critic silently never learns again."""
    real = VAELoss.discriminator_loss

    def nan_critic(self, disc, x, x_rec, step, *a, **k):
        loss, logs = real(self, disc, x, x_rec, step, *a, **k)
        return (loss * float("nan") if step >= 5 else loss), logs

    monkeypatch.setattr(VAELoss, "discriminator_loss", nan_critic)
    out = tmp_path / "run"
    rc = run(image_dir, out, "--num_epochs", "3", "--no-export_diffusers", "--set", "max_nonfinite=3",
             "--set", "disc_start=0")
    assert rc == 3 and "consecutive" in capsys.readouterr().err
    assert sorted(p.name for p in out.glob("checkpoint_*.pt")) == ["checkpoint_epoch_1.pt"]
    ckpt = load_checkpoint(out / "checkpoint_epoch_1.pt")
    assert ckpt["guards"]["disc"]["skipped_total"] == 0 and ckpt["counters"]["step"] == 4


# ----------------------------------------------------------------------------- the data folder changes under a run


def test_a_data_folder_prepared_again_at_another_size_stops_the_run(image_dir, tmp_path, monkeypatch, capsys):
    """Re-preparing the folder a run reads (`--overwrite` at another --target_size) between two steps stops the
    run with one line naming the folder and the change (exit 2); it used to train on, mixing the two."""
    from vae.prepare_data import main as prepare_main

    data = tmp_path / "prepared"
    prepare = ["--mode", "preprocess", "--input_dir", str(image_dir), "--output_dir", str(data), "--min_size", "16",
               "--num_workers", "1"]
    assert prepare_main([*prepare, "--target_size", "32"]) == 0
    steps = []

    def after_step(self):  # the other terminal: the same folder prepared again, at 40 px, after step 2
        steps.append(self.step)
        if self.step == 2:
            assert prepare_main([*prepare, "--target_size", "40", "--overwrite"]) == 0

    monkeypatch.setattr(tv.VAETrainer, "_samples_on_cadence", after_step)
    capsys.readouterr()
    assert run(data, tmp_path / "run", "--num_epochs", "2", "--no-export_diffusers") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: --data_path {data} changed while this run trained on it: prepared again with "
                              "other settings (target_size 32 -> 40)")
    assert "--resume_from auto" in err[-1]
    assert steps == [1, 2]  # stopped before the next step
    # prepared again with the same settings (a resumed prepare) is the same images: the run goes on
    steps.clear()
    monkeypatch.setattr(tv.VAETrainer, "_samples_on_cadence", lambda self: steps.append(self.step) if self.step != 2
                        else prepare_main([*prepare, "--target_size", "40"]))
    assert run(data, tmp_path / "run2", "--num_epochs", "1", "--no-export_diffusers") == 0


def test_optimizer_fused_and_batched_ns_reach_the_vae_and_critic_optimizers():
    on = tv.VAEStep(tiny_cfg(optimizer_fused=True), torch.device("cpu"))
    assert on.g_opt.defaults["fused"] is True and on.d_opt.defaults["fused"] is True
    muon = tv.VAEStep(tiny_cfg(optimizer_cls="MuonAdamW", optimizer_batched_ns=True), torch.device("cpu"))
    assert muon.g_opt.batched_ns and muon.d_opt.batched_ns
    off = tv.VAEStep(tiny_cfg(), torch.device("cpu"))
    assert not off.g_opt.defaults["fused"] and not off.d_opt.defaults["fused"]  # the CPU default
