"""Validation of a vocoder (rank 0): the held-out MR-STFT distance and mel L1 on whole files, and
the audio and mel plots of the first few files for TensorBoard.

Functions of explicit arguments (generator, files, precision, losses → metrics), so the trainer
reads as builders -> one step -> the loop, and a benchmark can measure any generator the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from common.audio import MelSpectrogram
from common.log import RunLogger, plot_spectrogram
from common.precision import Precision
from vocoder.losses import MultiResolutionSTFTLoss


@dataclass
class Plot:
    """One validation file's generated and real audio, and its real and generated mel."""

    name: str
    wav: torch.Tensor
    real: torch.Tensor
    mel: torch.Tensor
    pred: torch.Tensor


@torch.no_grad()
def validate(generator: nn.Module, valid_set, precision: Precision, stft: MultiResolutionSTFTLoss,
             input_mel: MelSpectrogram, seed: int, limit: int | None = None,
             num_plots: int = 0) -> tuple[dict, list[Plot]]:
    """({"mrstft", "mel_l1"} means over the first `limit` files of `valid_set` (all when None), the
    first `num_plots` files' `Plot`s). Runs under a forked RNG seeded with `seed`: the metric is
    repeatable and training randomness is untouched (a resumed run that skips a validation stays
    bit-exact)."""
    device = next(generator.parameters()).device
    generator.eval()
    n = len(valid_set) if limit is None else min(limit, len(valid_set))
    dists, mels, plots = [], [], []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        for i in range(n):
            item = valid_set[i]
            mel = item["mel"][None].to(device)
            real = item["audio"][None].to(device)
            with precision.autocast():
                wav = generator(mel, item["f0"][None].to(device)).float().squeeze(1)
            dists.append(stft.distance(wav, real).item())
            pred_mel = input_mel(wav)
            mels.append(F.l1_loss(pred_mel, mel).item())
            if i < num_plots:
                plots.append(Plot(item["name"], wav[0], real[0], mel[0], pred_mel[0]))
    generator.train()
    return {"mrstft": sum(dists) / len(dists), "mel_l1": sum(mels) / len(mels)}, plots


def log_plot(writer: RunLogger, step: int, plot: Plot, sample_rate: int, mel_vmin: float, mel_vmax: float,
             logged_gt: set[str]) -> None:
    """The generated audio (the ground truth once per file: `logged_gt` holds the files already
    logged) and the mels side by side."""
    writer.audio(f"valid/{plot.name}/generated", plot.wav, sample_rate, step)
    if plot.name not in logged_gt:
        writer.audio(f"valid/{plot.name}/ground_truth", plot.real, sample_rate, step)
        logged_gt.add(plot.name)
    # ground truth, generated and |difference| stacked vertically, on one colour scale
    both = torch.cat([plot.mel, plot.pred, (plot.pred - plot.mel).abs() + mel_vmin], dim=0).clamp(mel_vmin, mel_vmax)
    writer.figure(f"valid/{plot.name}/mel_gt_pred_diff", plot_spectrogram(both.cpu()), step)
