"""Pitch accuracy of generated speech against its recording: F0 RMSE, median and gross error (cents), V/UV error,
periodicity error.

Why these: a mel distance barely moves when a generated voice sings a semitone flat, buzzes
on a fricative or whispers a vowel, and those are what a listener hears first. The three numbers are the
ones CARGAN (Morrison et al., ICLR 2022) and most papers on waveform generation report:

- **F0 RMSE (cents)** on the frames voiced in both tracks: 100 cents = one semitone, whatever the voice's
  register (an error in Hz would weigh a soprano's 10 Hz like a bass's).
- **F0 median error (cents)** and **F0 gross error** (the share of those frames more than 50 cents apart, a
  quarter tone: misses and octave jumps, not jitter), beside the RMSE because a few gross frames swing a
  squared mean: on a male reader a 64-sample delay or noise at -30 dB moved the RMSE by 48-125 cents through a
  handful of octave jumps. The median says how close the pitch is where it is right; the gross share says how
  often it is wrong; the RMSE mixes both.
- **V/UV error**: the fraction of frames whose voicing differs (voiced in one, unvoiced in the other).
- **Periodicity error**: the RMSE between the two tracks' periodicity (voicing confidence, 0..1) on all
  frames. CARGAN takes torchcrepe's confidence; here the equivalent from the same Praat tracker that gives
  the f0: per frame the largest normalised autocorrelation peak among its voiced pitch candidates (0 where
  there is none), so no second tracker (and no network weights) is needed.

The tracker is `speech.f0.extract_f0` with the extractor and range of the recipe (the vocoder's `pe`,
`f0_min`, `f0_max`; the cloning model's `audio.f0_*`); without one (VITS, which tracks no f0), the speech
default, `speech.f0.SPEECH_F0_METHOD` in `SPEECH_F0_MIN`-`SPEECH_F0_MAX` Hz, the extractor that measured best on
speech (bench/README.md, "f0 extractors"), so the reference track is not itself full of octave jumps. Frames are
on the mel-frame grid: frame i at (i + 0.5) * hop / sr. Functions take numpy arrays or torch tensors (mono
waveforms [T] or f0 tracks [frames]) and return Python floats.
"""

from __future__ import annotations

import math

import numpy as np

from speech.f0 import SPEECH_F0_MAX, SPEECH_F0_METHOD, SPEECH_F0_MIN, extract_f0

F0_MIN, F0_MAX, F0_METHOD = SPEECH_F0_MIN, SPEECH_F0_MAX, SPEECH_F0_METHOD  # for a caller without a recipe
VOICING_THRESHOLD = 0.6  # Praat's, as extract_f0 uses (openvpi's recipes)
GROSS_CENTS = 50.0  # a quarter tone: farther is a gross error (a miss or a jump), nearer is jitter
F0_METRICS = ("f0_rmse", "f0_median_error", "f0_gross_error")  # the keys of `f0_errors`
PITCH_METRICS = (*F0_METRICS, "vuv_error", "periodicity")  # the keys of `pitch_errors`


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
             f0_max: float = F0_MAX, method: str = F0_METHOD, weights=None) -> np.ndarray:
    """f0 in Hz per frame, 0 where unvoiced (`extract_f0` fills those by interpolation for the NSF source;
    a metric needs to know which frames are voiced). `n_frames` defaults to len(wav) // hop_length."""
    x = _array(wav)
    n = len(x) // hop_length if n_frames is None else n_frames
    f0, voiced = extract_f0(x.astype(np.float32), sr, hop_length, n, f0_min, f0_max, method, weights)
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


def _cents_apart(f0_out, f0_ref) -> np.ndarray:
    """|1200·log2(out / ref)| on the frames voiced (> 0) in both tracks (empty when none is)."""
    a, b = _pair(f0_out, f0_ref)
    both = (a > 0) & (b > 0)
    return np.abs(1200.0 * np.log2(a[both] / b[both]))


def f0_rmse_cents(f0_out, f0_ref) -> float:
    """RMSE in cents (1200·log2 of the ratio) over the frames voiced (> 0) in both tracks; NaN when no frame
    is (nothing to compare: a mean over files should skip it, see `nanmean`)."""
    cents = _cents_apart(f0_out, f0_ref)
    return float(np.sqrt(np.mean(cents**2))) if cents.size else math.nan


def f0_errors(f0_out, f0_ref, gross_cents: float = GROSS_CENTS) -> dict[str, float]:
    """On the frames voiced in both tracks: `f0_rmse` (cents), `f0_median_error` (the median |difference|, cents:
    a few octave jumps cannot move it) and `f0_gross_error` (the share more than `gross_cents` apart); NaN for
    all three when no frame is voiced in both."""
    cents = _cents_apart(f0_out, f0_ref)
    if not cents.size:
        return dict.fromkeys(F0_METRICS, math.nan)
    return {"f0_rmse": float(np.sqrt(np.mean(cents**2))), "f0_median_error": float(np.median(cents)),
            "f0_gross_error": float(np.mean(cents > gross_cents))}


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


def pitch_errors(wav_out, wav_ref, sr: int, hop_length: int, f0_min: float = F0_MIN, f0_max: float = F0_MAX,
                 method: str = F0_METHOD, weights=None) -> dict[str, float]:
    """`PITCH_METRICS` (`f0_errors`' three, "vuv_error", "periodicity") of a generated waveform against its
    recording, both tracked the same way (`method` in `f0_min`-`f0_max` Hz) on the same frame grid (the shorter
    waveform's frames)."""
    out, ref = _array(wav_out), _array(wav_ref)
    n = min(len(out), len(ref)) // hop_length
    f_out = f0_track(out, sr, hop_length, n, f0_min, f0_max, method, weights)
    f_ref = f0_track(ref, sr, hop_length, n, f0_min, f0_max, method, weights)
    p_out = periodicity_track(out, sr, hop_length, n, f0_min, f0_max)
    p_ref = periodicity_track(ref, sr, hop_length, n, f0_min, f0_max)
    return {**f0_errors(f_out, f_ref), "vuv_error": vuv_error(f_out, f_ref),
            "periodicity": periodicity_error(p_out, p_ref)}


def nanmean(values) -> float:
    """Mean of the finite values (a file with no frame voiced in both has no F0 RMSE); NaN when none is."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan
