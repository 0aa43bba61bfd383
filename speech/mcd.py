"""Is a speech demo's output plausible, not merely better than step 0? `speech_figures` compares each
generated file with its ground truth on the two things a listener hears first, as `common.demo.Figure`s
(a demo prints them with `common.demo.report` and exits non-zero when any fails):

- **level**: RMS in dB of the generated file minus that of the ground truth; a plausible output
  is within ±6 dB (a quiet buzz at −16 dB fails however good its other numbers are);
- **spectral envelope**: mel-cepstral distortion (MCD, dB) after DTW alignment, on the natural-log
  mel of the demo's own filterbank. Cepstra c1..c24 (energy c0 excluded, so the level is judged
  by the first check only): c_n = (1/N) Σ_k log m_k cos(π n (k + ½) / N), the orthonormal DCT-II
  divided by sqrt(2N); MCD = 10/ln10 · sqrt(2) · mean over the DTW path of the Euclidean distance.
  A flat harmonic stack or noise has the wrong envelope in every frame and scores high.

Each demo sets its own MCD limit beside a comment that states the measurement it comes from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import librosa
import numpy as np
import torch

from common.demo import Figure
from speech import pitch_metrics as pm
from speech.audio import MelSpectrogram

MCD_K = 10.0 / math.log(10.0) * math.sqrt(2.0)
N_CEPS = 24
LEVEL_TOLERANCE_DB = 6.0  # the "within 6 dB of the ground truth"


def rms_db(wav: np.ndarray | torch.Tensor) -> float:
    """RMS level in dB re full scale (−inf-safe: silence gives about −180 dB)."""
    x = np.asarray(wav.detach().cpu() if isinstance(wav, torch.Tensor) else wav, dtype=np.float64).reshape(-1)
    return float(20.0 * np.log10(np.sqrt(np.mean(x * x)) + 1e-9)) if x.size else float("-inf")


def mel_cepstrum(log_mel: np.ndarray, n_ceps: int = N_CEPS) -> np.ndarray:
    """[n_mels, T] natural-log mel → [T, n_ceps] cepstra c1..c_n."""
    import scipy.fft  # here, not at import: scipy.fft costs every speech trainer's start-up ~0.5 s

    log_mel = np.asarray(log_mel, dtype=np.float64)
    ceps = scipy.fft.dct(log_mel, type=2, norm="ortho", axis=0) / math.sqrt(2 * log_mel.shape[0])
    return ceps[1 : n_ceps + 1].T


def mcd_dtw(ref_log_mel: np.ndarray, syn_log_mel: np.ndarray, n_ceps: int = N_CEPS) -> float:
    """DTW-aligned mel-cepstral distortion in dB between two log-mel spectrograms."""
    return mcd_dtw_path(ref_log_mel, syn_log_mel, n_ceps)[0]


def mcd_dtw_path(ref_log_mel: np.ndarray, syn_log_mel: np.ndarray,
                 n_ceps: int = N_CEPS) -> tuple[float, np.ndarray]:
    """`mcd_dtw` and its DTW path: [steps, 2] int pairs (reference frame, synthesised frame), first to last
    frame of both ([0, 2] and NaN when either is empty). Other per-frame figures reuse the path
    (`aligned_pitch_errors`), so every figure of a pair is taken on the same alignment."""
    a, b = mel_cepstrum(ref_log_mel, n_ceps), mel_cepstrum(syn_log_mel, n_ceps)
    if len(a) == 0 or len(b) == 0:
        return float("nan"), np.zeros((0, 2), dtype=np.int64)
    _, wp = librosa.sequence.dtw(X=a.T, Y=b.T, metric="euclidean")
    dist = np.linalg.norm(a[wp[:, 0]] - b[wp[:, 1]], axis=1)
    return float(MCD_K * dist.mean()), np.ascontiguousarray(wp[::-1], dtype=np.int64)


def aligned_pitch_errors(syn_wav, ref_wav, sr: int, hop_length: int, path: np.ndarray,
                         f0_min: float | None = None, f0_max: float | None = None,
                         method: str | None = None, weights=None) -> dict[str, float]:
    """`speech.pitch_metrics.PITCH_METRICS` of a synthesised waveform against its recording, frame pairs taken
    along a DTW `path` of their mels (`mcd_dtw_path`; frame i of a waveform is its mel frame i, the grid
    `extract_f0` tracks on). A pair whose durations differ (free-running synthesis) is compared sound for sound,
    not second for second. The tracker: `method` in `f0_min`-`f0_max` Hz, the speech default (`pitch_metrics`'
    F0_METHOD, F0_MIN, F0_MAX) for what is None. NaN figures for an empty path; the f0 figures NaN when no pair
    is voiced in both."""
    if len(path) == 0:
        return dict.fromkeys(pm.PITCH_METRICS, float("nan"))
    lo = pm.F0_MIN if f0_min is None else f0_min
    hi = pm.F0_MAX if f0_max is None else f0_max
    how = pm.F0_METHOD if method is None else method
    n_ref, n_syn = int(path[:, 0].max()) + 1, int(path[:, 1].max()) + 1
    f_ref = pm.f0_track(ref_wav, sr, hop_length, n_ref, lo, hi, how, weights)
    f_syn = pm.f0_track(syn_wav, sr, hop_length, n_syn, lo, hi, how, weights)
    p_ref = pm.periodicity_track(ref_wav, sr, hop_length, n_ref, lo, hi)
    p_syn = pm.periodicity_track(syn_wav, sr, hop_length, n_syn, lo, hi)
    r, s = path[:, 0], path[:, 1]
    return {**pm.f0_errors(f_syn[s], f_ref[r]), "vuv_error": pm.vuv_error(f_syn[s], f_ref[r]),
            "periodicity": pm.periodicity_error(p_syn[s], p_ref[r])}


@dataclass
class SpeechPair:
    """One generated file against its ground truth, with the log-mels the picture shows."""

    name: str
    level_db: float  # generated minus ground truth
    mcd: float
    ref_mel: np.ndarray  # [n_mels, T] natural-log mel
    gen_mel: np.ndarray


@torch.no_grad()
def compare_speech(name: str, generated: np.ndarray, reference: np.ndarray, mel: MelSpectrogram) -> SpeechPair:
    """Level difference and MCD-DTW of one generated waveform against its ground truth."""
    def log_mel(w: np.ndarray) -> np.ndarray:
        x = torch.as_tensor(np.asarray(w, dtype=np.float32).reshape(1, -1), device=mel.mel_basis.device)
        return mel(x)[0].float().cpu().numpy()

    ref, gen = log_mel(reference), log_mel(generated)
    return SpeechPair(name, rms_db(generated) - rms_db(reference), mcd_dtw(ref, gen), ref, gen)


def compare_mels(name: str, generated: np.ndarray, reference: np.ndarray) -> SpeechPair:
    """The same figures from two natural-log mels of one filterbank (a model that outputs mels and
    has no waveform model yet): the level is the difference of their mean mel power, which tracks the RMS
    difference of the waveforms because both pass the same filterbank."""
    gen, ref = np.asarray(generated, dtype=np.float64), np.asarray(reference, dtype=np.float64)

    def power_db(m: np.ndarray) -> float:
        return float(10.0 * np.log10(np.mean(np.exp(2.0 * m)) + 1e-18))

    return SpeechPair(name, power_db(gen) - power_db(ref), mcd_dtw(ref, gen), ref, gen)


def speech_figures(pairs: list[SpeechPair], max_mcd: float,
                   level_tolerance_db: float = LEVEL_TOLERANCE_DB) -> list[Figure]:
    """Every file's level within the tolerance, and the mean MCD over the files below `max_mcd`
    (the mean: one short file's DTW path is too few frames to judge alone; each file's MCD is
    printed as well)."""
    if not pairs:
        raise ValueError("speech_figures: no generated files to judge")
    figs = [Figure(f"{p.name} (MCD {p.mcd:.2f}): level", p.level_db, level_tolerance_db, "within", "dB")
            for p in pairs]
    figs.append(Figure(f"mean MCD-DTW over {len(pairs)} files", float(np.mean([p.mcd for p in pairs])),
                       max_mcd, "lower", "dB"))
    return figs
