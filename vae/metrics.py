"""Held-out quality (PSNR / SSIM / LPIPS, rFID with `vae.rfid`), reconstruction grids and latent statistics.

Shared by the trainer (validation, samples, the end-of-run scaling factor), the demo and
`reconstruct.py`, so every number the project reports is computed one way.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch

from common.atomic_write import save_png
from vae.data import tensor_to_uint8
from vae.rfid import frechet_distance


def psnr(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-image PSNR in dB of images in [-1, 1] (measured on the [0, 1] scale) → shape [B]."""
    a = (x.float().clamp(-1, 1) + 1) / 2
    b = (y.float().clamp(-1, 1) + 1) / 2
    mse = (a - b).pow(2).flatten(1).mean(1).clamp_min(1e-10)
    return 10.0 * torch.log10(1.0 / mse)


def ssim(x: torch.Tensor, y: torch.Tensor) -> list[float]:
    """Per-image SSIM (scikit-image, Gaussian window as in Wang et al.) of [-1, 1] images."""
    from skimage.metrics import structural_similarity  # here: scikit-image costs every VAE start-up ~0.5 s

    out = []
    for a, b in zip(x, y):
        ia, ib = tensor_to_uint8(a), tensor_to_uint8(b)
        out.append(float(structural_similarity(ia, ib, channel_axis=2, data_range=255,
                                               gaussian_weights=True, sigma=1.5, use_sample_covariance=False)))
    return out


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: Iterable[torch.Tensor], device: torch.device, autocast=None,
             lpips: torch.nn.Module | None = None, fid=None) -> dict[str, float]:
    """Mean PSNR/SSIM/L1 (and LPIPS when given) of deterministic reconstructions (posterior mode); with `fid`
    (a `vae.rfid.InceptionFeatures`) also `rfid`, the Fréchet distance of the reconstructions to the inputs."""
    was_training = model.training
    model.eval()
    psnrs, ssims, l1s, lp, feats_x, feats_r = [], [], [], [], [], []
    for x in batches:
        x = x.to(device)
        if autocast is not None:
            with autocast():
                rec = model.decode(model.encode(x).mode())
        else:
            rec = model.decode(model.encode(x).mode())
        rec = rec.float().clamp(-1, 1)
        psnrs += psnr(x, rec).tolist()
        ssims += ssim(x.cpu(), rec.cpu())
        l1s += (x - rec).abs().flatten(1).mean(1).tolist()
        if lpips is not None:
            lp += lpips(rec, x).flatten().float().tolist()
        if fid is not None:
            feats_x.append(fid(x))
            feats_r.append(fid(rec))
    model.train(was_training)
    if not psnrs:
        return {}
    out = {"psnr": float(np.mean(psnrs)), "ssim": float(np.mean(ssims)), "l1": float(np.mean(l1s))}
    if lp:
        out["lpips"] = float(np.mean(lp))
    if sum(len(f) for f in feats_x) >= 2:  # a covariance needs two images
        out["rfid"] = frechet_distance(np.concatenate(feats_x), np.concatenate(feats_r))
    return out


def grid_image(inputs: torch.Tensor, recons: torch.Tensor) -> np.ndarray:
    """Inputs on the top row, reconstructions below: HWC uint8."""
    from torchvision.utils import (
        make_grid,  # here, not at import: torchvision costs every VAE start-up ~1.5 s
    )

    both = torch.cat([inputs.float().cpu(), recons.float().cpu()]).clamp(-1, 1)
    grid = make_grid((both + 1) / 2, nrow=inputs.shape[0], padding=2, pad_value=1.0)
    return (grid.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)


def save_grid(inputs: torch.Tensor, recons: torch.Tensor, path: str | Path) -> Path:
    return save_png(grid_image(inputs, recons), path)


@torch.no_grad()
def latent_statistics(model: torch.nn.Module, batches: Iterable[torch.Tensor], device: torch.device,
                      autocast=None, seed: int = 0) -> dict:
    """Mean/std of sampled latents, overall and per channel, and the scaling factor a diffusion model
    needs (latent-diffusion: scale = 1 / std(z), so scaled latents have unit variance; FLUX-style
    pipelines also subtract `shift_factor` = mean(z) first)."""
    model.eval()
    gen = torch.Generator(device=device).manual_seed(seed)
    count, s1, s2 = 0, None, None
    for x in batches:
        x = x.to(device)
        if autocast is not None:
            with autocast():
                post = model.encode(x)
        else:
            post = model.encode(x)
        z = post.sample(gen).double()  # [B, C, h, w]
        c = z.shape[1]
        flat = z.transpose(0, 1).reshape(c, -1)
        s1 = flat.sum(1) if s1 is None else s1 + flat.sum(1)
        s2 = flat.pow(2).sum(1) if s2 is None else s2 + flat.pow(2).sum(1)
        count += flat.shape[1]
    if not count:
        return {}
    mean_c = s1 / count
    var_c = (s2 / count - mean_c.pow(2)).clamp_min(0)
    mean = float(s1.sum() / (count * len(s1)))
    var = float(s2.sum() / (count * len(s2)) - mean**2)
    std = max(var, 1e-12) ** 0.5
    return {
        "num_latent_values": int(count * len(s1)),
        "mean": mean, "std": std,
        "scaling_factor": 1.0 / std,
        "shift_factor": mean,
        "per_channel_mean": [float(v) for v in mean_c],
        "per_channel_std": [float(v) for v in var_c.sqrt()],
    }
