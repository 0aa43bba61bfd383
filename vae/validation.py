"""Validation and sample grids of a VAE run (rank 0): the fixed held-out batches and sample images of
a run, and the reconstruction grid of a model. The held-out metrics themselves are `vae.metrics.evaluate`.

Functions of explicit arguments (files, model, precision → batches, grid), so the trainer reads as
builders -> one step -> the loop.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from common.precision import Precision
from vae.config import VAEConfig
from vae.data import ImageDataset, TrainData, eval_loader
from vae.metrics import grid_image


def eval_batch_size(cfg: VAEConfig) -> int:
    """Never above the training batch (no OOM), at most 4."""
    return max(1, min(4, int(cfg.batch_size)))


def validation_batches(cfg: VAEConfig, data: TrainData, is_main: bool) -> list[torch.Tensor]:
    """The fixed held-out batches (centre crops, read once per run; rank 0 alone validates)."""
    if not (data.val_files and is_main):
        return []
    return list(eval_loader(data.val_files, cfg.image_size, cfg.max_pixels, cfg.seed, batch_size=eval_batch_size(cfg)))


def sample_images(cfg: VAEConfig, data: TrainData) -> torch.Tensor:
    """The images whose reconstructions are saved as samples (validation images, else training ones)."""
    files = data.val_files or data.train_files
    ds = ImageDataset(files, cfg.image_size, train=False, max_pixels=cfg.max_pixels)
    return torch.stack([ds[i] for i in range(min(cfg.num_sample_images, len(files)))])


@torch.no_grad()
def sample_grid(model: nn.Module, images: torch.Tensor, batch_size: int, precision: Precision,
                device: torch.device) -> np.ndarray:
    """Inputs over their reconstructions (the posterior's mode), as one image."""
    with precision.autocast():
        rec = torch.cat([model.decode(model.encode(x.to(device)).mode()).float().cpu()
                         for x in images.split(batch_size)])
    return grid_image(images, rec)


def describe(m: dict) -> str:
    return (f"val PSNR {m['psnr']:.2f} dB, SSIM {m['ssim']:.3f}" + (f", LPIPS {m['lpips']:.3f}" if "lpips" in m else "")
            + (f", rFID {m['rfid']:.2f}" if "rfid" in m else ""))
