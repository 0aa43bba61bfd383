"""speech.pitch_metrics against known values: a pure tone against itself, a semitone up, and silence."""

import math

import numpy as np
import pytest
import torch

from speech.pitch_metrics import (
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
    assert m == {"f0_rmse": 0.0, "vuv_error": 0.0, "periodicity": 0.0}


def test_a_semitone_up_is_100_cents():
    m = pitch_errors(tone(220.0 * 2 ** (1 / 12)), tone(220.0), SR, HOP)
    assert m["f0_rmse"] == pytest.approx(100.0, abs=2.0)
    assert m["vuv_error"] == 0.0
    assert m["periodicity"] < 0.05  # both are perfectly periodic


def test_a_tone_against_silence_differs_in_voicing_on_every_voiced_frame():
    ref = tone(220.0)
    f_ref = f0_track(ref, SR, HOP)
    voiced = f_ref > 0
    assert voiced.mean() > 0.9
    f_out = f0_track(np.zeros_like(ref), SR, HOP)
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
