"""Validation of the voice-cloning trainer: teacher-forced losses on the eval set, what TensorBoard
shows of them (alignment, mels, the fixed sentences spoken in a fixed reference voice, through the
vocoder or Griffin-Lim), and the plateau notice that reads the validation history.

`synthesis_metrics` adds what the teacher-forced losses cannot see: the first `val.synth_items` eval
utterances spoken free-running (predicted durations and f0) in the voice of another clip of their
speaker, through the vocoder (Griffin-Lim without one: then the figures judge the mel through a rough
inversion), against the recording: `mcd` (dB, DTW-aligned), `f0_rmse`, `f0_median_error` (cents), `f0_gross_error`
(share > 50 cents), `vuv_error`, `periodicity` along the same DTW path (`speech.mcd`; f0 tracked with
`audio.f0_method` in `audio.f0_min`-`f0_max`, as the features were), `hop_comb_db` (the output's buzz at the frame
rate, `speech.buzz`: logged, not ranked) and `speaker_sim` (cosine of speaker embeddings,
`speech.speaker_similarity`, the `val.speaker_encoder` key)."""

from __future__ import annotations

import math

import numpy as np
import torch

from common.log import RunLogger
from common.precision import Precision
from speech.audio import MelSpectrogram, load_audio
from speech.buzz import hop_comb_db
from speech.mcd import aligned_pitch_errors, mcd_dtw_path
from speech.pitch_metrics import PITCH_METRICS
from speech.plots import plot_alignment, plot_spectrogram
from tts.clone.config import CloneConfig
from tts.clone.data import load_item, reference_frames
from tts.clone.decoder import durations_to_path
from tts.clone.infer import synthesize
from tts.clone.model import VoiceCloneTTS


class PlateauDetector:
    """Says when the validation loss stopped improving, and what that suggests.

    A plateau = `patience` validations in a row without a relative improvement of `min_delta`
    over the best value. The suggestion depends on why: an LR already decayed to its floor, a
    training loss that still falls (over-fitting), or both flat (under-fitting / LR too low).
    """

    def __init__(self, patience: int, min_delta: float) -> None:
        self.patience, self.min_delta = patience, min_delta
        self.best = math.inf
        self.best_step = 0
        self.bad = 0
        self.reported = False

    def update(self, metric: float, step: int, lr_ratio: float, train_trend: float | None) -> str | None:
        if metric < self.best * (1.0 - self.min_delta):
            self.best, self.best_step, self.bad, self.reported = metric, step, 0, False
            return None
        self.bad += 1
        if self.bad < self.patience or self.reported:
            return None
        self.reported = True
        head = (f"plateau: validation mel loss has not improved by {self.min_delta:.1%} for {self.bad} validations "
                f"(best {self.best:.4f} at step {self.best_step}).")
        if lr_ratio < 0.2:
            hint = ("The LR schedule is near its floor, so more steps at this LR will not help: stop here, or "
                    "restart the schedule from this checkpoint with more data or a larger --model-size.")
        elif train_trend is not None and train_trend < -0.02:
            hint = ("The training loss still falls while validation does not: over-fitting. Add data "
                    "(more speakers), raise model.dropout, or use a smaller --model-size.")
        else:
            hint = ("Training loss is flat too: the LR may be too low or the batch too noisy. Try --aggressive-lr, "
                    "or a larger effective batch (--grad-accum); check the data-wait fraction and the alignment "
                    "plots in TensorBoard (a broken alignment means bad transcripts).")
        return f"{head} {hint}"

    def state_dict(self) -> dict:
        return {"best": self.best, "best_step": self.best_step, "bad": self.bad, "reported": self.reported}

    def load_state_dict(self, d: dict) -> None:
        self.best, self.best_step, self.bad, self.reported = d["best"], d["best_step"], d["bad"], d["reported"]


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}


@torch.no_grad()
def evaluate(model: VoiceCloneTTS, loader, cfg: CloneConfig, precision: Precision, device: torch.device) -> dict:
    """Teacher-forced reconstruction losses on the eval set. `mel_l1` is in log-mel units (post-net
    output, MAS durations): comparable across runs with the same audio settings."""
    was_training = model.training
    model.eval()
    sums: dict[str, float] = {}
    weight = 0.0
    first = None
    for i, batch in enumerate(loader):
        if cfg.val.max_batches and i >= cfg.val.max_batches:
            break
        batch = to_device(batch, device)
        with precision.autocast():
            out = model(batch["text"], batch["text_mask"], batch["mel"], batch["mel_mask"], batch["ref_mel"],
                        batch["ref_mask"])
        losses = model.losses(out, batch, cfg.loss)
        m = batch["mel_mask"].unsqueeze(1)
        recon = model.denorm_mel(out["post_mel"].float())
        n = float(m.sum()) * recon.shape[1]
        losses["mel_l1"] = ((recon - batch["mel"]).abs() * m).sum() / max(n, 1.0)
        for k, v in losses.items():
            sums[k] = sums.get(k, 0.0) + float(v) * n
        weight += n
        if first is None:
            nt, nf = int(batch["text_mask"][0].sum()), int(batch["mel_mask"][0].sum())
            first = {"path": out["path"][0, :nt, :nf].cpu(), "mel": batch["mel"][0, :, :nf].cpu(),
                     "recon": recon[0, :, :nf].cpu()}
    model.train(was_training)
    metrics = {k: v / max(weight, 1.0) for k, v in sums.items()}
    metrics["_first"] = first
    return metrics


SYNTH_METRICS = ("mcd", *PITCH_METRICS, "speaker_sim")


@torch.no_grad()
def synthesis_metrics(model: VoiceCloneTTS, items: list[dict], cfg: CloneConfig, vocoder, device: torch.device,
                      speaker_encoder=None) -> dict:
    """Free-running synthesis of the first `val.synth_items` eval items against their recordings (see the
    module docstring); `speaker_sim` only with a `speaker_encoder`. Means over the items (NaN-skipping);
    {} when there are none. Torch's and numpy's global RNG are left as they were (the vocoder's noise and
    Griffin-Lim's start draw from them), so validating never changes training."""
    chosen = items[: cfg.val.synth_items]
    if not chosen:
        return {}
    a = cfg.audio
    mel_fn = MelSpectrogram(**a.mel_kwargs).to(device)
    ref_frames = reference_frames(cfg)
    was_training = model.training
    model.eval()
    rows = []
    np_state = np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            for i, item in enumerate(chosen):
                # the reference: another utterance of the speaker (the item itself when it has none), its start
                other = next((o for o in items if o["speaker"] == item["speaker"] and o is not item), item)
                feats = load_item(item)
                ref = torch.from_numpy(load_item(other)["mel"][:, :ref_frames]).float()[None].to(device)
                ids = torch.from_numpy(feats["ids"]).long()[None].to(device)
                torch.manual_seed(cfg.train.seed + i)
                out = model.infer(ids, torch.ones_like(ids, dtype=torch.bool), ref,
                                  torch.ones(ref.shape[0], ref.shape[2], dtype=torch.bool, device=device))
                if vocoder is not None:
                    syn = vocoder(out["mel"], out["f0"])[0].float().cpu().numpy().reshape(-1)
                else:
                    syn = griffin_lim(out["mel"][0], cfg).astype(np.float32)
                rec, _ = load_audio(item["wav"], sr=a.sample_rate)
                rec_mel = mel_fn(torch.from_numpy(rec)[None].to(device))[0].float().cpu().numpy()
                syn_mel = (mel_fn(torch.from_numpy(syn)[None].to(device))[0].float().cpu().numpy()
                           if len(syn) > a.n_fft else rec_mel[:, :0])
                mcd, path = mcd_dtw_path(rec_mel, syn_mel)
                row = {"mcd": mcd, **aligned_pitch_errors(syn, rec, a.sample_rate, a.hop_length, path, a.f0_min,
                                                          a.f0_max, a.f0_method, a.f0_weights or None),
                       "hop_comb_db": hop_comb_db(syn, a.sample_rate, a.hop_length)}
                if speaker_encoder is not None:
                    row["speaker_sim"] = speaker_encoder.similarity(syn, rec, a.sample_rate) if len(path) else math.nan
                rows.append(row)
    finally:
        np.random.set_state(np_state)
        model.train(was_training)
    out = {}
    for k in rows[0]:
        finite = [r[k] for r in rows if math.isfinite(r[k])]
        out[k] = float(np.mean(finite)) if finite else math.nan
    return out


def griffin_lim(mel: torch.Tensor, cfg: CloneConfig) -> np.ndarray:
    """Monitoring audio when no vocoder is configured (librosa's mel inversion; not for quality)."""
    import librosa

    a = cfg.audio
    return librosa.feature.inverse.mel_to_audio(
        np.exp(mel.float().cpu().numpy()), sr=a.sample_rate, n_fft=a.n_fft, hop_length=a.hop_length,
        win_length=a.win_length, power=1.0, fmin=a.fmin, fmax=a.fmax, n_iter=16)


def log_validation(logger: RunLogger, model: VoiceCloneTTS, metrics: dict, cfg: CloneConfig, reference,
                   vocoder, step: int) -> None:
    """TensorBoard: losses, the MAS alignment + mel of an eval item, and the fixed sentences spoken
    in the fixed reference voice (audio + mel + duration alignment)."""
    logger.scalars({k: v for k, v in metrics.items() if not k.startswith("_")}, step, "val")
    first = metrics.get("_first")
    if first is not None:
        logger.figure("val/alignment_mas", plot_alignment(first["path"], "MAS path (eval item 0)"), step)
        logger.figure("val/mel_target", plot_spectrogram(first["mel"], "target"), step)
        logger.figure("val/mel_reconstructed", plot_spectrogram(first["recon"], "teacher-forced"), step)
    if reference is None:
        return
    was_training = model.training
    model.eval()
    for i, sentence in enumerate(cfg.val.sentences):
        res = synthesize(model, sentence, reference, vocoder)
        logger.figure(f"synth/{i}/mel", plot_spectrogram(res["mel"].cpu(), sentence[:60]), step)
        path = durations_to_path(res["durations"][None].cpu(), res["mel"].shape[-1])[0]
        logger.figure(f"synth/{i}/alignment", plot_alignment(path, "predicted durations"), step)
        wav = res["wav"] if res["wav"] is not None else griffin_lim(res["mel"], cfg)
        sr = vocoder.sample_rate if vocoder is not None else cfg.audio.sample_rate
        logger.audio(f"synth/{i}/audio" + ("" if vocoder is not None else "_griffinlim"), wav, sr, step)
    model.train(was_training)
