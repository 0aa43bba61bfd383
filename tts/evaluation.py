"""Evaluation that tells the truth about a GAN-trained TTS model, on held-out recordings:

- **MCD** (dB): mel-cepstral distortion between the synthesised utterance (text only, predicted
  durations) and the recording, time-aligned by DTW (``common.plausibility.mcd_dtw``, shared with the demos). Cepstra are
  the cepstrum of the natural-log amplitude mel spectrum (the model's own mel filterbank):
  c_n = (1/N) Σ_k log m_k cos(π n (k + ½) / N), i.e. the orthonormal DCT-II divided by
  sqrt(2N), coefficients 1..24 (energy c0 excluded); MCD = 10/ln10 · sqrt(2) · mean over the
  DTW path of the Euclidean cepstral distance. Lower is better.
- **align_sharpness** (0..1), the alignment's diagonal sharpness: on the recording
  (teacher-forced) the soft monotonic alignment γ[token, frame] is computed by forward-backward
  over the prior log-likelihoods log N(z_p | token) (tts.alignment.alignment_posterior, the soft
  counterpart of MAS). Per frame: its peak max_i γ (sharp: the model is sure which token the
  frame belongs to) counted only where that token lies near the diagonal (within 10 % of the
  tokens, at least 2, of the straight line from the first to the last token). Averaged over
  frames. Untrained models are either unsure (flat γ) or sure of degenerate paths that park
  seconds of audio on one token (off the diagonal); both score low. A learnt alignment → 1.
- **dur_mae** (frames per token) and **dur_err** (relative error of the total length) of the
  duration predictor (its deterministic setting: noise 0) against the MAS durations.

``best.pt`` is chosen by ``score = mcd + 10·(1 − align_sharpness) + 10·dur_err`` (lower is
better): 1 dB of MCD weighs as much as 0.1 of sharpness or 10 % of total-duration error.
"""

from __future__ import annotations

import numpy as np
import torch

from common.audio import MelSpectrogram
from common.plausibility import mcd_dtw
from tts.alignment import alignment_posterior


def alignment_sharpness(log_lik: torch.Tensor, band: float = 0.1) -> float:
    """[T_text, T_frames] log-likelihoods of one item (unpadded) → diagonal sharpness 0..1."""
    soft = alignment_posterior(log_lik).float()
    t_text, t_frames = soft.shape
    peak, token = soft.max(0)
    diagonal = torch.arange(t_frames, dtype=torch.float32) * (t_text - 1) / max(1, t_frames - 1)
    near = (token.float() - diagonal).abs() <= max(2.0, band * t_text)
    return float((peak * near).mean())


def duration_errors(pred: torch.Tensor, true: torch.Tensor) -> tuple[float, float]:
    """Per-token durations [T_text] → (mean absolute error in frames, relative total-length error)."""
    pred, true = pred.float(), true.float()
    return float((pred - true).abs().mean()), float((pred.sum() - true.sum()).abs() / true.sum().clamp_min(1))


def combined_score(m: dict) -> float:
    """The rule that picks best.pt (lower is better); see the module docstring."""
    return m["mcd"] + 10.0 * (1.0 - m["align_sharpness"]) + 10.0 * m["dur_err"]


@torch.no_grad()
def evaluate(model, dataset, mel: MelSpectrogram, device: torch.device, max_items: int = 32,
             noise_scale: float = 0.667, seed: int = 1234) -> dict:
    """Mean metrics over the first ``max_items`` items of ``dataset`` (a VitsDataset split).

    Runs under its own RNG (``fork_rng`` + fixed seed): repeatable, and the training RNG (hence
    exact resume) is untouched."""
    was_training = model.training
    model.eval()
    mel = mel.to(device)
    rows = []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        for i in range(min(max_items, len(dataset))):
            it = dataset[i]
            x = it["ids"][None].to(device)
            x_len = torch.tensor([x.size(1)], device=device)
            spec = it["spec"][None].to(device)
            y_len = torch.tensor([spec.size(2)], device=device)
            sid = torch.tensor([it["sid"]], device=device)
            log_lik, path, _, _ = model.align(x, x_len, spec, y_len, sid)
            sharp = alignment_sharpness(log_lik[0].cpu())
            true_dur = path[0].sum(-1)
            h, _, _, x_mask = model.enc_p(x, x_len)
            g = model.speaker_cond(sid)
            pred_dur = model.predict_durations(h, x_mask, g, noise_scale_w=0.0)[0, 0]
            dur_mae, dur_err = duration_errors(pred_dur, true_dur)
            wav, _, _ = model.infer(x, x_len, sid, noise_scale=noise_scale, noise_scale_w=0.0,
                                    max_frames=4 * spec.size(2))
            ref = mel(it["wav"][None].to(device))[0].cpu().numpy()
            syn = mel(wav[0].float())[0].cpu().numpy() if wav.size(-1) > mel.n_fft else ref[:, :0]
            rows.append({"mcd": mcd_dtw(ref, syn), "align_sharpness": sharp, "dur_mae": dur_mae,
                         "dur_err": dur_err})
    model.train(was_training)
    if not rows:
        return {}
    out = {k: float(np.nanmean([r[k] for r in rows])) for k in rows[0]}
    out["score"] = combined_score(out)
    out["items"] = len(rows)
    return out
