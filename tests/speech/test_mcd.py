"""speech.mcd judges what a listener hears first (level, spectral envelope) as common.demo figures."""

import numpy as np
import pytest
import torch

from common.demo import report
from speech.audio import MelSpectrogram
from speech.mcd import compare_mels, compare_speech, mcd_dtw, rms_db, speech_figures

SR = 16000
MEL = MelSpectrogram(SR, 512, 512, 128, 40, 0.0, 8000.0)


def vowel(f0: float, formants: tuple[float, ...], seconds: float = 1.0, amp: float = 0.1) -> np.ndarray:
    """A harmonic source shaped by formant peaks: speech-like envelope, no learned model needed."""
    t = np.arange(int(SR * seconds)) / SR
    out = np.zeros_like(t)
    for k in range(1, int(7000 / f0)):
        f = k * f0
        gain = sum(np.exp(-((f - fm) / 120.0) ** 2) for fm in formants) + 0.02
        out += gain * np.sin(2 * np.pi * f * t)
    return (amp * out / np.sqrt(np.mean(out**2))).astype(np.float32)


def test_rms_db_is_the_level_in_db():
    assert rms_db(np.full(100, 0.1)) == pytest.approx(-20.0, abs=1e-6)
    assert rms_db(torch.full((100,), 1.0)) == pytest.approx(0.0, abs=1e-6)


def test_speech_check_passes_a_close_copy_and_fails_quiet_flat_buzz():
    gt = vowel(150, (700, 1200, 2600))
    close = vowel(150, (720, 1180, 2600), amp=0.08)  # -1.9 dB, nearly the same envelope
    flat = vowel(150, (), amp=0.015)  # the broken demo: all harmonics equal, -16.5 dB
    good, bad = compare_speech("close", close, gt, MEL), compare_speech("flat", flat, gt, MEL)
    assert good.level_db == pytest.approx(20 * np.log10(0.8), abs=0.05)
    assert bad.level_db == pytest.approx(20 * np.log10(0.15), abs=0.05)
    assert good.mcd < 1.0 < 3.0 < bad.mcd
    assert report(speech_figures([good], max_mcd=2.0), "good", log=lambda m: None)
    lines: list[str] = []
    assert not report(speech_figures([good, bad], max_mcd=2.0), "mixed", log=lines.append)
    assert any("FAIL" in x and "flat" in x for x in lines)  # the quiet file fails its level


def test_compare_mels_tracks_the_waveform_level():
    gt, quiet = vowel(200, (500, 1500)), vowel(200, (500, 1500), amp=0.025)  # -12 dB
    mel = lambda w: MEL(torch.from_numpy(w)[None])[0].numpy()  # noqa: E731
    pair = compare_mels("q", mel(quiet), mel(gt))
    assert pair.level_db == pytest.approx(-12.04, abs=0.3)
    assert pair.mcd < 1.5  # same envelope: only the bins at the log floor (1e-5) differ (c0 is excluded)


def test_mcd_dtw_is_zero_for_identical_and_time_warp_tolerant():
    m = np.log(np.random.default_rng(0).uniform(0.01, 1.0, (40, 60)))
    assert mcd_dtw(m, m) == pytest.approx(0.0, abs=1e-9)
    assert mcd_dtw(m, np.repeat(m, 2, axis=1)) == pytest.approx(0.0, abs=1e-9)
    assert np.isnan(mcd_dtw(m, m[:, :0]))
