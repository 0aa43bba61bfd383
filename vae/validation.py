"""Validation and sample grids of a VAE run (rank 0): held-out PSNR / SSIM / LPIPS of the EMA weights
(`vae.metrics.evaluate`) into TensorBoard and `metrics.jsonl`, and reconstruction grids into
`samples/`. Kept out of `train_vae.py` so the trainer reads as builders -> one step -> the loop.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import torch
from PIL import Image

from vae.data import ImageDataset, TrainData, eval_loader
from vae.metrics import evaluate, grid_image

if TYPE_CHECKING:
    from vae.train_vae import VAETrainer


def prepare(tr: VAETrainer, data: TrainData) -> None:
    """The fixed validation batches (rank 0) and sample images, read once per run."""
    cfg = tr.cfg
    tr.eval_batch = max(1, min(4, int(cfg.batch_size)))  # never above the training batch: no OOM
    tr.val_batches = list(eval_loader(data.val_files, cfg.image_size, cfg.max_pixels, cfg.seed,
                                      batch_size=tr.eval_batch)) if (data.val_files and tr.info.is_main) else []
    sample_src = data.val_files or data.train_files
    sample_ds = ImageDataset(sample_src, cfg.image_size, train=False, max_pixels=cfg.max_pixels)
    tr.sample_x = torch.stack([sample_ds[i] for i in range(min(cfg.num_sample_images, len(sample_src)))])


def save_samples(tr: VAETrainer) -> None:
    """Inputs over their reconstructions, as `samples/step_N.png` and in TensorBoard."""
    model = tr.eval_model()
    with torch.no_grad(), tr.precision.autocast():
        rec = torch.cat([model.decode(model.encode(x.to(tr.device)).mode()).float().cpu()
                         for x in tr.sample_x.split(tr.eval_batch)])
    grid = grid_image(tr.sample_x, rec)
    Image.fromarray(grid).save(tr.out_dir / "samples" / f"step_{tr.global_step:07d}.png")
    tr.logger.image("samples/reconstruction (top: input)", grid, tr.global_step)


def validate(tr: VAETrainer) -> dict:
    """The held-out metrics at this step (measured once per step), logged; updates the best PSNR."""
    if tr.last_val[0] == tr.global_step:
        return tr.last_val[1]  # already measured at this step (val_freq hit the last step)
    m = evaluate(tr.eval_model(), tr.val_batches, tr.device, tr.precision.autocast, tr.perceptual)
    if m:
        tr.logger.scalars(m, tr.global_step, "val")
        tr.last_psnr = m["psnr"]
        tr.best_psnr = m["psnr"] if tr.best_psnr is None else max(tr.best_psnr, m["psnr"])
        with open(tr.out_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": tr.global_step, "image_size": tr.cfg.image_size, **m}) + "\n")
    tr.last_val = (tr.global_step, m)
    return m


def describe(m: dict) -> str:
    return f"val PSNR {m['psnr']:.2f} dB, SSIM {m['ssim']:.3f}" + (f", LPIPS {m['lpips']:.3f}" if "lpips" in m else "")
