"""Validation of a vocoder run (rank 0): the held-out MR-STFT distance and mel L1 on whole files,
with audio and mel plots in TensorBoard, and the record of each result.

Kept out of ``train.py`` so the trainer reads as builders -> one step -> the loop; the loop calls
``validate`` every ``val_check_interval`` steps and ``record`` with its result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from common import distributed
from common.log import plot_spectrogram

if TYPE_CHECKING:
    from vocoder.train import VocoderTrainer


@torch.no_grad()
def validate(tr: VocoderTrainer, limit: int | None = None) -> dict | None:
    """Held-out MR-STFT distance and mel L1 on whole validation files (rank 0). Runs under a
    forked, fixed RNG: the metric is repeatable and training randomness is untouched (so a
    resumed run that skips a validation stays bit-exact)."""
    if not tr.is_main or tr.valid_set is None:
        distributed.barrier()
        return None
    g = tr.generator
    g.eval()
    n = len(tr.valid_set) if limit is None else min(limit, len(tr.valid_set))
    dists, mels = [], []
    devices = [tr.device] if tr.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(tr.cfg.seed)
        for i in range(n):
            item = tr.valid_set[i]
            mel = item["mel"][None].to(tr.device)
            real = item["audio"][None].to(tr.device)
            with tr.precision.autocast():
                wav = g(mel, item["f0"][None].to(tr.device)).float().squeeze(1)
            dists.append(tr.stft.distance(wav, real).item())
            pred_mel = tr.input_mel(wav)
            mels.append(F.l1_loss(pred_mel, mel).item())
            if i < tr.cfg.num_valid_plots:
                plot(tr, item["name"], wav[0], real[0], mel[0], pred_mel[0])
    g.train()
    distributed.barrier()
    return {"mrstft": sum(dists) / len(dists), "mel_l1": sum(mels) / len(mels)}


def plot(tr: VocoderTrainer, name: str, wav: torch.Tensor, real: torch.Tensor, mel: torch.Tensor,
         pred: torch.Tensor) -> None:
    """The generated audio (the ground truth once per file) and the mels side by side."""
    sr = tr.cfg.audio.sample_rate
    tr.logger.audio(f"valid/{name}/generated", wav, sr, tr.step)
    if name not in tr.logged_gt:
        tr.logger.audio(f"valid/{name}/ground_truth", real, sr, tr.step)
        tr.logged_gt.add(name)
    # ground truth, generated and |difference| stacked vertically, on one colour scale
    both = torch.cat([mel, pred, (pred - mel).abs() + tr.cfg.mel_vmin], dim=0).clamp(tr.cfg.mel_vmin, tr.cfg.mel_vmax)
    tr.logger.figure(f"valid/{name}/mel_gt_pred_diff", plot_spectrogram(both.cpu()), tr.step)


def record(tr: VocoderTrainer, result: dict | None) -> float | None:
    """Log a validation result and keep it in the run's history; returns the checkpoint metric."""
    if result is None:
        return None
    tr.logger.scalars(result, tr.step, prefix="valid")
    tr.history.setdefault("valid", []).append({"step": tr.step, **result})
    tr.log(f"step {tr.step}: valid MR-STFT distance {result['mrstft']:.4f}, mel L1 {result['mel_l1']:.4f}")
    return result["mrstft"]
