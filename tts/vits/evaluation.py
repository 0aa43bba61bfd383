"""Evaluation that tells the truth about a GAN-trained TTS model, on held-out recordings:

- **MCD** (dB): mel-cepstral distortion between the synthesised utterance (text only, predicted
  durations) and the recording, time-aligned by DTW (``speech.mcd.mcd_dtw``, shared with the demos). Cepstra are
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
- **f0_rmse**, **f0_median_error** (cents, on frames voiced in both: the RMSE and the median
  |difference|, which a few octave jumps cannot swing), **f0_gross_error** (the share of those frames
  more than 50 cents apart), **vuv_error** (fraction of frames whose voicing differs) and
  **periodicity** (RMSE of the voicing-confidence tracks) of the synthesised utterance against the
  recording, frame pairs taken along the MCD's DTW path (``speech.mcd.aligned_pitch_errors``, from
  ``speech.pitch_metrics``; f0 tracked by the speech default extractor in the speech range: VITS
  has no f0 settings of its own). Lower is better.
- **hop_comb_db** (dB) of the synthesised utterance alone (``speech.buzz``): its power on the harmonics of
  sr / hop over the power between them. Recordings score about 0-5 dB; a young decoder's buzz at the frame rate,
  which Praat tracks as an f0 of exactly sr / hop and MCD barely sees, 15 dB and more. Logged, not ranked.
- **speaker_sim** (cosine, -1..1, higher is better): the speaker embeddings of the synthesised
  utterance and of the recording (``speech.speaker_similarity``; the ``speaker_encoder`` key), only
  when an encoder is given.

``best.pt`` is chosen by ``score = mcd + 10·(1 − align_sharpness) + 10·dur_err`` (lower is
better): 1 dB of MCD weighs as much as 0.1 of sharpness or 10 % of total-duration error.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from common.atomic_write import append_text
from common.data import make_loader
from common.log import RunLogger
from speech.audio import MelSpectrogram, save_wav
from speech.buzz import hop_comb_db
from speech.mcd import aligned_pitch_errors, mcd_dtw_path
from speech.plots import plot_alignment, plot_spectrogram
from tts.alignment import alignment_posterior
from tts.text import normalize
from tts.vits.config import TrainConfig
from tts.vits.data import collate


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


def eval_batches(lengths: list[int], max_items: int, batch_size: int) -> list[list[int]]:
    """The first ``max_items`` items, sorted by length and cut into batches (least padding)."""
    chosen = sorted(range(min(max_items, len(lengths))), key=lambda i: lengths[i])
    return [chosen[i : i + batch_size] for i in range(0, len(chosen), batch_size)]


@torch.no_grad()
def evaluate(model, dataset, mel: MelSpectrogram, device: torch.device, max_items: int = 32,
             noise_scale: float = 0.667, seed: int = 1234, batch_size: int = 1, num_workers: int = 0,
             speaker_encoder=None) -> dict:
    """Mean metrics over the first ``max_items`` items of ``dataset`` (a VitsDataset split), run in
    padded batches of ``batch_size`` (``eval_batch_size``) loaded by ``num_workers``
    (``num_eval_loader_workers``) processes. ``speaker_encoder`` (a ``speech.speaker_similarity.SpeakerEncoder``)
    adds ``speaker_sim``.

    Every item gets the same result in any batch (tests/tts/test_vits_eval.py): masks cover the
    padding (the decoder's too), each item's sampling noise is its own draw (seed, item index),
    MAS, sharpness, durations and MCD are computed on each item's unpadded part. The global RNG
    (hence exact resume of training) is untouched."""
    if batch_size < 1:
        raise ValueError(f"eval_batch_size must be >= 1, got {batch_size}")
    was_training = model.training
    model.eval()
    mel = mel.to(device)
    batches = eval_batches(dataset.lengths, max_items, batch_size)
    loader = make_loader(dataset, batch_sampler=batches, num_workers=num_workers, collate_fn=collate, seed=seed)
    rows = []
    # align()'s posterior sample and the SDP's zero-scaled noise draw from the global RNG: fork it
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        for idx, b in zip(batches, loader):
            x, x_len = b["ids"].to(device), b["ids_len"].to(device)
            spec, y_len = b["spec"].to(device), b["spec_len"].to(device)
            sid = b["sid"].to(device)
            log_lik, path, _, _ = model.align(x, x_len, spec, y_len, sid)
            h, _, _, x_mask = model.enc_p(x, x_len)
            pred_dur = model.predict_durations(h, x_mask, model.speaker_cond(sid), noise_scale_w=0.0)[:, 0]
            cap = 4 * y_len
            noise = torch.zeros(len(idx), model.args.inter_channels, int(cap.max()))
            for j, i in enumerate(idx):
                gen = torch.Generator().manual_seed(seed * 100003 + i)
                noise[j, :, : int(cap[j])] = torch.randn(model.args.inter_channels, int(cap[j]), generator=gen)
            wav, _, y_mask = model.infer(x, x_len, sid, noise_scale=noise_scale, noise_scale_w=0.0, max_frames=cap,
                                         noise=noise.to(device), mask_decoder=True)
            out_len = y_mask.sum((1, 2)).long() * model.hop_length
            for j in range(len(idx)):
                n, t = int(x_len[j]), int(y_len[j])
                sharp = alignment_sharpness(log_lik[j, :n, :t].cpu())
                dur_mae, dur_err = duration_errors(pred_dur[j, :n], path[j, :n, :t].sum(-1))
                ref_wav = b["wav"][j : j + 1, : t * model.hop_length]
                ref = mel(ref_wav.to(device))[0].cpu().numpy()
                syn_wav = wav[j : j + 1, 0, : int(out_len[j])].float()
                syn = mel(syn_wav)[0].cpu().numpy() if syn_wav.size(-1) > mel.n_fft else ref[:, :0]
                mcd, dtw_path = mcd_dtw_path(ref, syn)
                syn_np, ref_np = syn_wav[0].cpu().numpy(), ref_wav[0].float().numpy()
                row = {"mcd": mcd, "align_sharpness": sharp, "dur_mae": dur_mae, "dur_err": dur_err,
                       **aligned_pitch_errors(syn_np, ref_np, mel.sample_rate, model.hop_length, dtw_path),
                       "hop_comb_db": hop_comb_db(syn_np, mel.sample_rate, model.hop_length)}
                if speaker_encoder is not None:
                    row["speaker_sim"] = (speaker_encoder.similarity(syn_np, ref_np, mel.sample_rate)
                                          if len(dtw_path) else float("nan"))
                rows.append(row)
    model.train(was_training)
    if not rows:
        return {}
    out = {k: float(np.nanmean([r[k] for r in rows])) for k in rows[0]}
    out["score"] = combined_score(out)
    out["items"] = len(rows)
    return out


def record_metrics(metrics: dict, step: int, log: RunLogger, run_dir: Path, say: Callable[[str], None]) -> None:
    """Held-out metrics → TensorBoard ``eval/``, one line of ``run_dir/metrics.jsonl`` (the run's
    record that outlives TensorBoard) and the console."""
    log.scalars(metrics, step, prefix="eval")
    append_text(run_dir / "metrics.jsonl", json.dumps({"step": step, **metrics}) + "\n")
    say(f"eval @ step {step}: " + ", ".join(f"{k} {v:.3f}" for k, v in metrics.items()))


@torch.no_grad()
def speak_test_sentences(gen, cfg: TrainConfig, speakers: dict[str, int], tokens: Callable[[str], torch.Tensor],
                         mel: MelSpectrogram, log: RunLogger, run_dir: Path, step: int) -> None:
    """``test_sentences`` (normalised, then ``tokens``) → TensorBoard (audio, alignment and mel
    plots) and ``run_dir/samples/test_<i>.wav``. Its noise comes from a forked RNG seeded with
    ``seed``: the same sentence sounds the same at every evaluation, and training's RNG is untouched."""
    if not cfg.test_sentences:
        return
    device = next(gen.parameters()).device
    was = gen.training
    gen.eval()
    sid_name = cfg.test_speaker or next(iter(speakers))
    sid = torch.tensor([speakers[sid_name]], device=device)  # the trainer checked test_speaker at start
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(cfg.seed)
        for i, sentence in enumerate(cfg.test_sentences):
            ids = tokens(normalize(sentence))[None].to(device)
            wav, attn, _ = gen.infer(ids, torch.tensor([ids.size(1)], device=device), sid,
                                     cfg.noise_scale, cfg.length_scale, cfg.noise_scale_w, max_frames=2000)
            wav = wav[0, 0].float().cpu()
            log.audio(f"test/{i}", wav, cfg.audio.sample_rate, step)
            log.figure(f"test_alignment/{i}", plot_alignment(attn[0].cpu()), step)
            if wav.numel() > cfg.audio.n_fft:
                log.figure(f"test_mel/{i}", plot_spectrogram(mel(wav.to(device))[0].cpu()), step)
            save_wav(run_dir / "samples" / f"test_{i}.wav", wav, cfg.audio.sample_rate)
    gen.train(was)
