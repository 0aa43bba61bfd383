"""A buzz at the frame rate: how much of a waveform's power sits on the harmonics of sr / hop.

Why: a young VITS decoder (and any upsampling generator early in training) can emit one pulse per mel frame,
a buzz at sr / hop (86.1 Hz at 22050 / 256) whatever the speaker's pitch. Praat then tracks every voiced frame
at exactly that f0. MCD and level barely see it (the envelope and the loudness are right), so it needs its own
figure: the **hop comb**, the mean power in narrow bands at m · sr / hop (m = 1, 2, ... up to `max_hz`) over
the mean power between those bands, in dB, on a long-window average (Welch) spectrum of the whole file.

Speech puts its harmonics wherever its own, moving f0 puts them, so over a file they land on the comb's teeth
as often as between them: recordings score about 0-5 dB. A frame-rate pulse train puts nearly all its power on
the teeth: 15 dB and more. `BUZZ_DB` sits between (measured values beside it).
"""

from __future__ import annotations

import math

import numpy as np

from common.demo import Figure

BUZZ_DB = 10.0  # a file above this hop comb is judged a frame-rate buzz. MEASURED: recordings 0.8-4.7 dB,
# buzzing VITS demo syntheses (every voiced frame tracked at 86.1 Hz) 17-55 dB (issue "Pitch you can trust")
MAX_HZ = 4000.0  # the comb's teeth up to here: the band where voiced speech has its harmonics
RESOLUTION_HZ = 2.0  # Welch segment length ~ sr / this: teeth ~2 Hz wide, many bins between two teeth


def hop_comb_db(audio, sr: int, hop: int, max_hz: float = MAX_HZ) -> float:
    """Mean power on the harmonics of sr / hop over the mean power between them, dB (higher: more buzz).

    Welch's average spectrum (Hann, segments of ~sr / RESOLUTION_HZ samples, half overlap); a tooth is the
    bins within 2 bins of m · sr / hop (the Hann main lobe), "between" the bins at least 4 bins away from
    every tooth, both from m = 1 (sr / hop) to `max_hz` (or Nyquist). NaN for silence, a non-finite input
    or a file too short to resolve the comb (under two periods of the fundamental's spacing per segment)."""
    from scipy.signal import welch  # here, not at import: scipy.signal costs a speech trainer's start-up

    x = np.asarray(audio.detach().float().cpu() if hasattr(audio, "detach") else audio, dtype=np.float64).reshape(-1)
    tooth_hz = sr / hop
    nperseg = min(len(x), 1 << int(math.ceil(math.log2(sr / RESOLUTION_HZ))))
    if not np.isfinite(x).all() or nperseg == 0 or nperseg * tooth_hz / sr < 8:  # < 8 bins between two teeth
        return math.nan
    freqs, power = welch(x - x.mean(), fs=sr, window="hann", nperseg=nperseg)
    bin_hz = freqs[1] - freqs[0]
    top = min(max_hz, sr / 2 - tooth_hz / 2)
    in_range = (freqs >= tooth_hz / 2) & (freqs <= top)
    m = np.round(freqs / tooth_hz)
    distance = np.abs(freqs - m * tooth_hz) / bin_hz  # bins to the nearest tooth
    teeth, between = in_range & (m >= 1) & (distance <= 2), in_range & (distance >= 4)
    on, off = power[teeth].mean() if teeth.any() else 0.0, power[between].mean() if between.any() else 0.0
    if on <= 0 or off <= 0:
        return math.nan
    return float(10.0 * np.log10(on / off))


def hop_comb_figure(values: list[float], limit: float = BUZZ_DB, not_judged: str = "") -> Figure:
    """The demos' figure: the mean hop comb over the files against `limit` (the mean, as for MCD: one short
    file's spectrum is a thin sample), with the worst file's value in its name so one buzzing file shows.
    `not_judged`: why a demo shows it without judging it (`common.demo.Figure`)."""
    finite = [v for v in values if math.isfinite(v)]
    mean = float(np.mean(finite)) if finite else math.nan
    worst = max(finite) if finite else math.nan
    return Figure(f"mean hop comb over {len(values)} files (worst {worst:.1f})", mean, limit, "lower", "dB",
                  not_judged=not_judged)
