"""Validation of a vocoder (rank 0): the held-out MR-STFT distance and mel L1 on whole files, the pitch
errors of the copy-synthesis against the recording (F0 RMSE, median and gross error in cents, V/UV error,
periodicity error: `speech.pitch_metrics`, tracked with the recipe's own extractor and range), the
copy-synthesis's hop comb (a buzz at the frame rate, `speech.buzz`: logged, never ranked), PESQ when asked (wide
band, slow on a CPU), and the audio and mel plots of the first
few files for TensorBoard.

Functions of explicit arguments (generator, files, precision, losses → metrics), so the trainer
reads as builders -> one step -> the loop, and a benchmark can measure any generator the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from common.log import RunLogger
from common.precision import Precision
from speech.audio import MelSpectrogram
from speech.buzz import hop_comb_db
from speech.pitch_metrics import nanmean, pitch_errors
from speech.plots import plot_spectrogram
from vocoder.losses import MultiResolutionSTFTLoss


@dataclass
class Plot:
    """One validation file's generated and real audio, and its real and generated mel."""

    name: str
    wav: torch.Tensor
    real: torch.Tensor
    mel: torch.Tensor
    pred: torch.Tensor


class PitchSettings(NamedTuple):
    """How the validation tracks f0 in both the recording and the copy-synthesis: the recipe's own extractor
    (`pe`, `pe_ckpt`) and range, so a speech recipe's reference track comes from the speech extractor and a
    singing recipe's keeps the singing range."""

    sample_rate: int
    hop_length: int
    f0_min: float
    f0_max: float
    method: str
    weights: str | None = None


PESQ_RATE = 16000  # wide-band PESQ (ITU-T P.862.2) is defined at 16 kHz


def pesq_wb(wav, ref, sample_rate: int) -> float:
    """Wide-band PESQ of `wav` against the recording `ref` (mono, any rate: resampled to 16 kHz with soxr),
    1.04 .. 4.64 (higher is better); NaN when the package finds no speech in `ref` (silence). The `pesq`
    package runs the ITU reference C code, about 0.3 s per second of audio on one CPU core: `valid_pesq`."""
    import soxr
    from pesq import PesqError, pesq

    def at_16k(x) -> np.ndarray:
        x = x.detach().float().cpu().numpy() if hasattr(x, "detach") else np.asarray(x, dtype=np.float32)
        x = x.reshape(-1).astype(np.float32)
        return x if sample_rate == PESQ_RATE else soxr.resample(x, sample_rate, PESQ_RATE, quality="HQ")

    deg, clean = at_16k(wav), at_16k(ref)
    n = min(len(deg), len(clean))
    with np.errstate(invalid="ignore", divide="ignore"):  # all-silent input: the package divides 0 by 0
        score = pesq(PESQ_RATE, clean[:n], deg[:n], "wb", on_error=PesqError.RETURN_VALUES)
    return float(score) if score > 0 else math.nan  # -1 / -2: no utterance found, or a buffer too short


@torch.no_grad()
def validate(generator: nn.Module, valid_set, precision: Precision, stft: MultiResolutionSTFTLoss,
             input_mel: MelSpectrogram, seed: int, limit: int | None = None,
             num_plots: int = 0, pitch: PitchSettings | None = None,
             pesq: bool = False) -> tuple[dict, list[Plot]]:
    """({"mrstft", "mel_l1"[, *speech.pitch_metrics.PITCH_METRICS, "hop_comb_db"][, "pesq"]} means over the first
    `limit` files of `valid_set` (all when None), the first `num_plots` files' `Plot`s). `pitch` adds the pitch
    errors of each file's copy-synthesis against its recording (files with no frame voiced in both are left out of
    the f0 figures' means) and its hop comb (`speech.buzz.hop_comb_db`, dB; recordings score ~0-5, a frame-rate
    buzz 15 and more); `pesq` adds
    wide-band PESQ (`pesq_wb`, needs `pitch` for the sample rate). Runs under a forked RNG seeded with
    `seed`: the metric is repeatable and training randomness is untouched (a resumed run that skips a
    validation stays bit-exact)."""
    device = next(generator.parameters()).device
    generator.eval()
    n = len(valid_set) if limit is None else min(limit, len(valid_set))
    dists, mels, plots = [], [], []
    extra: dict[str, list[float]] = {}
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
            if pitch is not None:
                out_np, real_np = wav[0].cpu().numpy(), real[0].float().cpu().numpy()
                for k, v in pitch_errors(out_np, real_np, *pitch).items():
                    extra.setdefault(k, []).append(v)
                extra.setdefault("hop_comb_db", []).append(hop_comb_db(out_np, pitch.sample_rate, pitch.hop_length))
                if pesq:
                    extra.setdefault("pesq", []).append(pesq_wb(out_np, real_np, pitch.sample_rate))
            if i < num_plots:
                plots.append(Plot(item["name"], wav[0], real[0], mel[0], pred_mel[0]))
    generator.train()
    result = {"mrstft": sum(dists) / len(dists), "mel_l1": sum(mels) / len(mels)}
    return result | {k: nanmean(v) for k, v in extra.items()}, plots


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
