"""The start-of-run report: when the GAN phase begins (steps, epochs, LR), or a warning that it never
does; the note on LR and GPU count; the shipped profiles' schedule against the guide's dataset sizes."""

from __future__ import annotations

import pytest
import torch
from helpers import REPO, TINY_CONFIG

import vae.train_vae as tv
from common.config import load_config
from common.schedulers import build_scheduler, lr_lambda
from vae.config import VAEConfig
from vae.losses import VAELoss
from vae.startup import gan_phase_report, scheduled_lr, world_size_note


def schedule(name: str = "cosine_with_warmup", total: int = 125_000, warmup: int = 1000, lr: float = 1e-4):
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    kw = {"total_steps": total, "min_ratio": 0.1} if name == "cosine_with_warmup" else {}
    return build_scheduler(opt, name, warmup_steps=warmup, **kw)


def loss(disc_start: int = 50001, disc_weight: float = 0.5) -> VAELoss:
    return VAELoss(perceptual_weight=0, disc_start=disc_start, disc_weight=disc_weight)


def test_gan_phase_begins_mid_run_with_step_epoch_and_lr():
    # 10k images at 8 images/step: 1250 steps per epoch, 100 epochs.
    lines = gan_phase_report(loss(50001), schedule(), 125_000, 1250)
    expected_lr = 1e-4 * lr_lambda("cosine_with_warmup", 1000, 125_000, min_ratio=0.1)(50001)
    assert lines[0].startswith("GAN phase: begins at global step 50001 = step 50001 of 125000")
    assert "epoch 41 of 100" in lines[0] and f"LR {expected_lr:.3g} " in lines[0]
    assert "74999 GAN steps (60% of the run)" in lines[0]
    assert len(lines) == 1  # 0.70x of the peak: no decay note
    assert scheduled_lr(schedule("constant"), 50001) == pytest.approx(1e-4)


def test_gan_phase_at_a_decayed_lr_gets_a_note():
    lines = gan_phase_report(loss(50001), schedule(total=62_500), 62_500, 625)  # e.g. 2 GPUs
    assert "(0.19x the peak" in lines[0]
    assert lines[1].startswith("note: the LR schedule has decayed") and "lr_scheduler=constant" in lines[1]


def test_gan_phase_never_begins_is_a_warning_with_a_fix():
    lines = gan_phase_report(loss(50001), schedule(total=12_500), 12_500, 125)  # 1k images
    assert len(lines) == 1 and lines[0].startswith("warning: the GAN phase never begins")
    assert "disc_start 50001" in lines[0] and "0..12499" in lines[0] and "--disc_start 6250" in lines[0]
    # exactly one step short: disc_start == total_steps never trains the GAN either
    assert gan_phase_report(loss(100), schedule(total=100, warmup=10), 100, 10)[0].startswith("warning")
    assert gan_phase_report(loss(99), schedule(total=100, warmup=10), 100, 10)[0].startswith("GAN phase: begins")


def test_gan_phase_of_a_later_stage_or_resumed_run_and_off():
    # A 1536 px stage resumed from a 1024 px run that trained 60k steps: the GAN is on from the start.
    lines = gan_phase_report(loss(50001), schedule("constant"), 20_000, 1250, steps_before_stage=60_000)
    assert "on from this run's first step (global step 60000 >= disc_start 50001)" in lines[0]
    assert "at LR 0 (0.00x the peak 0.0001, rising: in the warmup)" in lines[0]  # step 0 of the warmup
    assert len(lines) == 1  # a warmup is not a decayed LR: no note
    resumed = gan_phase_report(loss(50001), schedule("constant"), 125_000, 1250, first_step=70_000)
    assert "global step 70000" in resumed[0] and "55000 GAN steps" in resumed[0]
    assert gan_phase_report(loss(disc_weight=0), schedule(), 125_000, 1250)[0].startswith("GAN phase: off")


def test_world_size_note():
    assert world_size_note(1e-4, 8, 1) == []
    (line,) = world_size_note(1e-4, 16, 2)
    assert "not scaled with the 2 GPUs" in line and "16 images per step" in line and "More GPUs" in line


def test_trainer_prints_the_gan_phase_at_start(image_dir, tmp_path, capsys):
    rc = tv.main(["--config", str(TINY_CONFIG), "--data_path", str(image_dir), "--output_dir", str(tmp_path / "r"),
                  "--disc_start", "1000", "--max_steps", "1", "--no-export_diffusers"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "warning: the GAN phase never begins: disc_start 1000" in out


@pytest.mark.parametrize("profile", ["fast_768", "standard_1024", "high_1536", "max_2048", "large_channel_z32"])
def test_profiles_train_the_gan_at_full_lr_on_the_guides_dataset(profile):
    """The reasoning written in vae/configs/base.yaml, checked: on a 10k-image folder at 100 epochs on
    one GPU the GAN phase begins inside the run, at the peak LR, with at least a third of the run left."""
    cfg = load_config(str(REPO / "vae" / "configs" / f"{profile}.yaml"), VAEConfig)
    steps_per_epoch = 10_000 // (int(cfg.batch_size) * cfg.accumulation_steps)
    total = cfg.num_epochs * steps_per_epoch
    sched = schedule(cfg.lr_scheduler, total, cfg.warmup_steps, cfg.learning_rate)
    line = gan_phase_report(loss(cfg.disc_start, cfg.disc_weight), sched, total, steps_per_epoch)[0]
    assert line.startswith("GAN phase: begins") and "(1.00x the peak" in line
    assert (total - cfg.disc_start) / total >= 1 / 3
