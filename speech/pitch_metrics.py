"""Pitch accuracy of generated speech against its recording: F0 RMSE in cents, V/UV error, periodicity error.

Why these three: a mel distance barely moves when a generated voice sings a semitone flat, buzzes
on a fricative or whispers a vowel, and those are what a listener hears first. The three numbers are the
ones CARGAN (Morrison et al., ICLR 2022) and most papers on waveform generation report:

- **F0 RMSE (cents)** on the frames voiced in both tracks: 100 cents = one semitone, whatever the voice's
  register (an error in Hz would weigh a soprano's 10 Hz like a bass's).
- **V/UV error**: the fraction of frames whose voicing differs (voiced in one, unvoiced in the other).
- **Periodicity error**: the RMSE between the two tracks' periodicity (voicing confidence, 0..1) on all
  frames. CARGAN takes torchcrepe's confidence; here the equivalent from the same Praat tracker that gives
  the f0: per frame the largest normalised autocorrelation peak among its voiced pitch candidates (0 where
  there is none), so no second tracker (and no network weights) is needed.

The tracker is `speech.f0.extract_f0` (Praat's autocorrelation through praat-parselmouth, the one the
data preparation uses), on the mel-frame grid: frame i at (i + 0.5) * hop / sr. Functions take numpy
arrays or torch tensors (mono waveforms [T] or f0 tracks [frames]) and return Python floats.
"""

from __future__ import annotations

import math

import numpy as np

from speech.f0 import extract_f0

F0_MIN = 40.0  # extract_f0's defaults: the whole range of speech and singing
F0_MAX = 1100.0
VOICING_THRESHOLD = 0.6  # Praat's, as extract_f0 uses (openvpi's recipes)
PITCH_METRICS = ("f0_rmse", "vuv_error", "periodicity")  # the keys of `pitch_errors`


def _array(x) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor, on any device, in any dtype
        x = x.detach().float().cpu().numpy()
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim == 2 and 1 in arr.shape:
        arr = arr.reshape(-1)
    if arr.ndim != 1:
        raise ValueError(f"expected a 1-D track or mono waveform, got shape {tuple(arr.shape)}")
    return arr


def _pair(a, b) -> tuple[np.ndarray, np.ndarray]:
    """Both tracks cut to the shorter one: a generated waveform may be a few samples longer or shorter."""
    a, b = _array(a), _array(b)
    n = min(len(a), len(b))
    return a[:n], b[:n]


def f0_track(wav, sr: int, hop_length: int, n_frames: int | None = None, f0_min: float = F0_MIN,
             f0_max: float = F0_MAX) -> np.ndarray:
    """f0 in Hz per frame, 0 where unvoiced (`extract_f0` fills those by interpolation for the NSF source;
    a metric needs to know which frames are voiced). `n_frames` defaults to len(wav) // hop_length."""
    x = _array(wav)
    n = len(x) // hop_length if n_frames is None else n_frames
    f0, voiced = extract_f0(x.astype(np.float32), sr, hop_length, n, f0_min=f0_min, f0_max=f0_max)
    return np.where(voiced, f0, 0.0).astype(np.float64)


def periodicity_track(wav, sr: int, hop_length: int, n_frames: int | None = None, f0_min: float = F0_MIN,
                      f0_max: float = F0_MAX) -> np.ndarray:
    """Voicing confidence per frame, 0..1: the strongest normalised autocorrelation peak among Praat's voiced
    pitch candidates (the tracker and settings of `extract_f0`), 0 where there is none, linearly interpolated
    onto the mel-frame grid (frames beyond the tracker's first/last frame by more than half a hop get 0)."""
    import parselmouth

    x = _array(wav)
    n = len(x) // hop_length if n_frames is None else n_frames
    step = hop_length / sr
    out = np.zeros(n, dtype=np.float64)
    if n == 0 or not np.isfinite(x).all():
        return out
    try:
        pitch = parselmouth.Sound(x, sampling_frequency=sr).to_pitch_ac(
            time_step=step, voicing_threshold=VOICING_THRESHOLD, pitch_floor=f0_min, pitch_ceiling=f0_max)
    except parselmouth.PraatError:  # shorter than one analysis window (3 / f0_min seconds)
        return out
    cands = pitch.to_array()  # [candidates, frames] of (frequency, strength); frequency 0 = the unvoiced one
    strength = np.where(cands["frequency"] > 0, cands["strength"], 0.0).max(axis=0).clip(0.0, 1.0)
    times = np.asarray(pitch.xs(), dtype=np.float64)
    targets = (np.arange(n) + 0.5) * step
    out = np.interp(targets, times, strength)
    out[(targets < times[0] - 0.5 * step) | (targets > times[-1] + 0.5 * step)] = 0.0
    return out


def f0_rmse_cents(f0_out, f0_ref) -> float:
    """RMSE in cents (1200·log2 of the ratio) over the frames voiced (> 0) in both tracks; NaN when no frame
    is (nothing to compare: a mean over files should skip it, see `nanmean`)."""
    a, b = _pair(f0_out, f0_ref)
    both = (a > 0) & (b > 0)
    if not both.any():
        return math.nan
    cents = 1200.0 * np.log2(a[both] / b[both])
    return float(np.sqrt(np.mean(cents**2)))


def f0_agreement(f0_out, f0_ref, gross_cents: float = 50.0) -> dict[str, float]:
    """How far one tracker agrees with another on the frames both call voiced: `gross` (the gross pitch error
    rate: the share of them more than `gross_cents` apart; 50 cents = a quarter tone, octave jumps and
    misses, not jitter) and `median_cents` (the median |difference|); NaN for both when no frame is."""
    a, b = _pair(f0_out, f0_ref)
    both = (a > 0) & (b > 0)
    if not both.any():
        return {"gross": math.nan, "median_cents": math.nan}
    cents = np.abs(1200.0 * np.log2(a[both] / b[both]))
    return {"gross": float(np.mean(cents > gross_cents)), "median_cents": float(np.median(cents))}


def vuv_error(f0_out, f0_ref) -> float:
    """The fraction of frames voiced in one track and unvoiced (0) in the other; NaN for empty tracks."""
    a, b = _pair(f0_out, f0_ref)
    if len(a) == 0:
        return math.nan
    return float(np.mean((a > 0) != (b > 0)))


def periodicity_error(p_out, p_ref) -> float:
    """RMSE between two periodicity tracks (`periodicity_track`), over all frames: CARGAN's definition
    (voiced or not, a buzzing consonant or a breathy vowel shows here); NaN for empty tracks."""
    a, b = _pair(p_out, p_ref)
    if len(a) == 0:
        return math.nan
    return float(np.sqrt(np.mean((a - b) ** 2)))


def pitch_errors(wav_out, wav_ref, sr: int, hop_length: int, f0_min: float = F0_MIN,
                 f0_max: float = F0_MAX) -> dict[str, float]:
    """{"f0_rmse" (cents), "vuv_error", "periodicity"} of a generated waveform against its recording, both
    tracked the same way on the same frame grid (the shorter waveform's frames)."""
    out, ref = _array(wav_out), _array(wav_ref)
    n = min(len(out), len(ref)) // hop_length
    f_out = f0_track(out, sr, hop_length, n, f0_min, f0_max)
    f_ref = f0_track(ref, sr, hop_length, n, f0_min, f0_max)
    p_out = periodicity_track(out, sr, hop_length, n, f0_min, f0_max)
    p_ref = periodicity_track(ref, sr, hop_length, n, f0_min, f0_max)
    return {"f0_rmse": f0_rmse_cents(f_out, f_ref), "vuv_error": vuv_error(f_out, f_ref),
            "periodicity": periodicity_error(p_out, p_ref)}


def nanmean(values) -> float:
    """Mean of the finite values (a file with no frame voiced in both has no F0 RMSE); NaN when none is."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan
