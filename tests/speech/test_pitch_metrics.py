"""speech.pitch_metrics against known values: a pure tone against itself, a semitone up, silence, and a track with
octave jumps (the RMSE swings, the median and the gross share do not)."""

import math

import numpy as np
import pytest
import torch

from speech.pitch_metrics import (
    PITCH_METRICS,
    f0_errors,
    f0_rmse_cents,
    f0_track,
    nanmean,
    periodicity_error,
    periodicity_track,
    pitch_errors,
    vuv_error,
)

SR, HOP = 22050, 256


def tone(hz: float, seconds: float = 1.0) -> np.ndarray:
    t = np.arange(int(SR * seconds)) / SR
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def test_a_tone_against_itself_has_no_error():
    m = pitch_errors(tone(220.0), torch.from_numpy(tone(220.0)), SR, HOP)
    assert m == dict.fromkeys(PITCH_METRICS, 0.0)
    assert set(m) == {"f0_rmse", "f0_median_error", "f0_gross_error", "vuv_error", "periodicity"}


def test_ten_percent_octave_jumps_swing_the_rmse_not_the_median_or_the_gross_share():
    """A 120 Hz track with 1 frame in 10 an octave up (what Praat in the singing range does on a low voice):
    the RMSE is ~380 cents, the median error 0 and the gross share exactly the jumped share."""
    ref = np.full(200, 120.0)
    out = ref.copy()
    out[::10] = 240.0
    e = f0_errors(out, ref)
    assert e["f0_rmse"] == pytest.approx(1200 * math.sqrt(0.1)) and e["f0_rmse"] > 300
    assert e["f0_median_error"] == 0.0 and e["f0_gross_error"] == pytest.approx(0.1)
    out[1::10] *= 2 ** (30 / 1200)  # 30 cents of jitter elsewhere: not gross
    assert f0_errors(out, ref)["f0_gross_error"] == pytest.approx(0.1)
    assert all(math.isnan(v) for v in f0_errors([0.0, 0.0], [100.0, 0.0]).values())  # nothing voiced in both


def test_a_semitone_up_is_100_cents():
    m = pitch_errors(tone(220.0 * 2 ** (1 / 12)), tone(220.0), SR, HOP)
    assert m["f0_rmse"] == pytest.approx(100.0, abs=2.0)
    assert m["vuv_error"] == 0.0
    assert m["periodicity"] < 0.05  # both are perfectly periodic


def test_a_tone_against_silence_differs_in_voicing_on_every_voiced_frame():
    ref = tone(220.0)
    f_ref = f0_track(ref, SR, HOP, method="parselmouth")  # the frames Praat's periodicity calls voiced
    voiced = f_ref > 0
    assert voiced.mean() > 0.9
    f_out = f0_track(np.zeros_like(ref), SR, HOP, method="parselmouth")
    assert vuv_error(f_out[voiced], f_ref[voiced]) == 1.0
    assert math.isnan(f0_rmse_cents(f_out, f_ref))  # no frame voiced in both
    p_ref, p_out = periodicity_track(ref, SR, HOP), periodicity_track(np.zeros_like(ref), SR, HOP)
    assert p_ref[voiced].min() > 0.9 and p_out.max() == 0.0
    assert periodicity_error(p_out[voiced], p_ref[voiced]) > 0.9


def test_track_arithmetic():
    assert f0_rmse_cents([440.0, 0.0, 100.0], [220.0, 200.0, 100.0]) == pytest.approx(math.sqrt(1200**2 / 2))
    assert vuv_error([1.0, 0.0, 0.0, 5.0], [1.0, 1.0, 0.0, 0.0]) == 0.5
    assert periodicity_error([1.0, 0.0], [0.0, 0.0]) == pytest.approx(math.sqrt(0.5))
    assert nanmean([1.0, math.nan, 3.0]) == 2.0 and math.isnan(nanmean([math.nan]))
