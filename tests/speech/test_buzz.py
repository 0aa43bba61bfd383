"""speech.buzz: the hop comb is low for a voiced signal whose pitch moves freely and high for a signal periodic at
the frame rate sr / hop (a pulse train, or noise modulated at that rate), whatever its level."""

import math

import numpy as np
import torch

from speech.buzz import BUZZ_DB, hop_comb_db, hop_comb_figure

SR, HOP = 22050, 256


def speech_like(seconds: float = 3.0, seed: int = 0) -> np.ndarray:
    """A voiced signal as speech is: 20 harmonics on an f0 that glides 110 -> 180 -> 130 Hz with vibrato and
    jitter (never locked to sr / hop), syllable-rate loudness, a little breath noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(SR * seconds)) / SR
    f0 = np.interp(t, [0, seconds / 2, seconds], [110.0, 180.0, 130.0]) * (1 + 0.03 * np.sin(2 * np.pi * 5.5 * t))
    f0 *= 1 + 0.01 * np.cumsum(rng.standard_normal(len(t))) / np.sqrt(len(t))  # slow random wander
    phase = 2 * np.pi * np.cumsum(f0) / SR
    wav = sum(np.sin(k * phase) / k for k in range(1, 21))
    wav *= 0.5 + 0.5 * np.sin(2 * np.pi * 4.0 * t) ** 2  # syllables
    return (0.2 * wav + 0.01 * rng.standard_normal(len(t))).astype(np.float32)


def test_a_voiced_signal_with_a_moving_pitch_is_well_below_the_threshold():
    assert hop_comb_db(speech_like(), SR, HOP) < BUZZ_DB - 4


def test_a_pulse_train_at_the_frame_rate_is_far_above_it_at_any_level():
    pulses = np.zeros(3 * SR, dtype=np.float32)
    pulses[::HOP] = 1.0  # one pulse per mel frame: 86.1 Hz
    noisy = pulses + 0.02 * np.random.default_rng(1).standard_normal(len(pulses)).astype(np.float32)
    assert hop_comb_db(noisy, SR, HOP) > BUZZ_DB + 10
    assert math.isclose(hop_comb_db(0.01 * noisy, SR, HOP), hop_comb_db(noisy, SR, HOP), abs_tol=1e-6)
    assert hop_comb_db(torch.from_numpy(noisy), SR, HOP) == hop_comb_db(noisy, SR, HOP)  # a tensor too


def test_a_frame_rate_buzz_under_a_voice_is_above_it_and_modulated_noise_is_not():
    """What it measures is lines at m * sr / hop. A buzz as loud as the voice under it shows; noise bursts once per
    frame have a flat power spectrum (no lines), so they do not: the comb sees a periodic waveform, not a
    periodically modulated one (the young VITS decoder's buzz is the former: Praat tracks its f0). A pulse train's
    power spreads up to Nyquist, so at the voice's power only part of it falls on the comb's teeth below 4 kHz."""
    voice = speech_like()
    pulses = np.zeros(len(voice), dtype=np.float32)
    pulses[::HOP] = 1.0
    buzz = pulses * np.sqrt(np.mean(voice**2) / np.mean(pulses**2))
    assert hop_comb_db(voice + buzz, SR, HOP) > hop_comb_db(voice, SR, HOP) + 6
    t = np.arange(len(voice)) / SR
    bursts = np.random.default_rng(2).standard_normal(len(t)) * np.maximum(0.0, np.sin(2 * np.pi * SR / HOP * t)) ** 4
    assert hop_comb_db(bursts, SR, HOP) < BUZZ_DB - 4


def test_silence_and_a_clip_too_short_to_resolve_the_comb_are_nan():
    assert math.isnan(hop_comb_db(np.zeros(SR), SR, HOP))
    assert math.isnan(hop_comb_db(speech_like()[:1000], SR, HOP))


def test_the_demo_figure_judges_the_mean_names_the_worst_and_can_be_shown_unjudged():
    fig = hop_comb_figure([1.0, 3.0, 14.0])
    assert fig.value == 6.0 and "worst 14.0" in fig.name and fig.ok
    assert not hop_comb_figure([17.0, 18.0]).ok
    shown = hop_comb_figure([17.0, 18.0], not_judged="a buzz expected at this length")
    assert shown.ok and "not judged: a buzz expected at this length" in shown.line()
