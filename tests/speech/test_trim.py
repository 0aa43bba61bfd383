"""speech/trim.py through both prepares: Silero VAD trims 0.8 s of silence each side of espeak-ng speech to
speech + margins, a silent file is skipped with its reason, --no_trim keeps the length, loudness to -23 LUFS."""

from __future__ import annotations

import json

import numpy as np
import pytest

from speech.audio import load_audio, save_wav
from speech.demo_speech import espeak_available, speak
from speech.trim import DEFAULT_MARGIN, loudness, speech_span

SR = 22050
PAD = 0.8
pytestmark = pytest.mark.skipif(not espeak_available(), reason="espeak-ng not installed")


@pytest.fixture(scope="module")
def padded(tmp_path_factory):
    """(wav, speech seconds): 0.8 s silence + about 1 s of espeak-ng Uzbek + 0.8 s silence, at 22050 Hz."""
    d = tmp_path_factory.mktemp("speech")
    speech, sr = load_audio(speak("Bugun havo juda yaxshi.", d / "s.wav", sample_rate=SR))
    assert sr == SR
    idx = np.flatnonzero(np.abs(speech) > 1e-3)  # espeak's own edges off: the speech itself
    speech = speech[idx[0]:idx[-1] + 1]
    pad = np.zeros(int(PAD * SR), np.float32)
    return np.concatenate([pad, speech, pad]), len(speech) / SR


def test_speech_span_keeps_speech_and_margins(padded):
    wav, speech_s = padded
    start, end = speech_span(wav, SR)
    kept = (end - start) / SR
    # the VAD's 32 ms chunks and its onset/offset judgement: within 0.15 s of speech + both margins
    assert abs(kept - (speech_s + 2 * DEFAULT_MARGIN)) < 0.15, (kept, speech_s)
    assert abs(start / SR - (PAD - DEFAULT_MARGIN)) < 0.1
    assert speech_span(np.zeros(SR, np.float32), SR) == (0, 0)


def test_loudness_is_bs1770_and_the_target_is_reached():
    """EBU Tech 3341's reference: a 997 Hz sine at -23 dBFS peak in both stereo channels reads -23.0 LUFS, so
    in one channel 3.01 dB less; scaled to -30 LUFS it reads -30."""
    from speech.trim import normalize_loudness

    sr = 48000
    sine = (10 ** (-23 / 20) * np.sin(2 * np.pi * 997 * np.arange(5 * sr) / sr)).astype(np.float32)
    assert loudness(sine, sr) == pytest.approx(-26.01, abs=0.1)
    scaled, before, gain = normalize_loudness(sine, sr, -30.0)
    assert loudness(scaled, sr) == pytest.approx(-30.0, abs=0.01) and gain == pytest.approx(-30.0 - before, abs=0.01)
    loud, _, _ = normalize_loudness(sine, sr, -1.0)  # would need a peak over full scale: held at 0.999
    assert np.max(np.abs(loud)) == pytest.approx(0.999, abs=1e-4)


def _tts_corpus(root, padded):
    audio = root / "audio"
    audio.mkdir(parents=True)
    save_wav(audio / "a.wav", padded[0], SR)
    save_wav(audio / "quiet.wav", np.full(2 * SR, 1e-4, np.float32) * np.sign(np.sin(np.arange(2 * SR))), SR)
    (root / "metadata.csv").write_text("a|Bugun havo juda yaxshi.\nquiet|Bugun havo juda yaxshi.\n")
    return root / "metadata.csv", audio


@pytest.mark.parametrize("no_trim", [False, True])
def test_tts_prepare_trims_by_default(tmp_path, padded, no_trim):
    from tts.prepare_data import main

    meta, audio = _tts_corpus(tmp_path, padded)
    out = tmp_path / "prep"
    argv = ["--metadata", str(meta), "--audio_dir", str(audio), "--output_dir", str(out), "--num_workers", "1",
            "--set", "data.silence_db=-100"]
    rc = main(argv + (["--no_trim"] if no_trim else []))
    assert rc == 0
    wav, _ = load_audio(out / "wavs" / "a.wav")
    report = json.loads((out / "report.json").read_text())
    text = (out / "report.txt").read_text()
    state = json.loads((out / "prepare_state.json").read_text())
    if no_trim:
        assert len(wav) == len(padded[0])
        assert report["trimmed_seconds"] == 0
        assert "trim" not in state  # as a folder prepared before trimming existed: still reused
    else:
        assert abs(len(wav) / SR - (padded[1] + 2 * DEFAULT_MARGIN)) < 0.15
        assert report["trimmed_seconds"] > 0.8
        assert "no speech found by Silero VAD" in text  # the near-silent file: skipped with its reason
        assert "TRIMMED 1." in text and ": a\n" in text and "in total from 2 file(s)" in text
        assert state["trim"] == {"trim_silence": True, "trim_margin": DEFAULT_MARGIN}
        assert main(argv) == 0  # the same command again: a.wav reused, its entry kept in both reports
        assert json.loads((out / "report.json").read_text())["levels"]["a"] == report["levels"]["a"]
        assert (out / "report.txt").read_text() == text
        (out / "report.json").unlink()  # as after an interrupted run: the entry made again from the kept wav
        assert main(argv) == 0
        again = json.loads((out / "report.json").read_text())["levels"]["a"]
        assert again["trimmed_seconds"] == pytest.approx(report["levels"]["a"]["trimmed_seconds"], abs=2e-3)
        assert again["lufs"] == pytest.approx(report["levels"]["a"]["lufs"], abs=0.05)
        from common.run_dir import OutputPathError
        from tts.prepare_data import prepare
        from tts.vits.config import TrainConfig

        cfg = TrainConfig()
        cfg.data.trim_silence = False
        with pytest.raises(OutputPathError, match="trim_silence"):  # other trim settings: detected
            prepare(meta, audio, out, cfg, quiet=True)


def test_vocoder_prepare_trim_and_loudness(tmp_path, padded):
    from vocoder.config import VocoderConfig
    from vocoder.prepare_data import prepare

    src = tmp_path / "in"
    src.mkdir()
    save_wav(src / "a.wav", padded[0], SR)
    save_wav(src / "b.wav", 0.5 * padded[0], SR)
    save_wav(src / "silent.wav", np.zeros(2 * SR, np.float32), SR)
    cfg = VocoderConfig()
    assert cfg.binarization_args.trim_silence is False and cfg.binarization_args.loudness_lufs is None
    cfg.binarization_args.trim_silence = True
    cfg.binarization_args.loudness_lufs = -23.0
    cfg.audio_sample_rate = SR
    manifest = prepare(cfg, [src], tmp_path / "out", num_workers=1, log=lambda *_: None)
    assert manifest["settings"]["trim_silence"] is True and manifest["settings"]["loudness_lufs"] == -23.0
    for item in manifest["items"]:
        audio = np.load(tmp_path / "out" / "items" / item / "audio.npy")
        assert abs(len(audio) / cfg.audio.sample_rate - (padded[1] + 2 * DEFAULT_MARGIN)) < 0.15
        assert abs(loudness(audio, cfg.audio.sample_rate) + 23.0) < 0.5
    text = (tmp_path / "out" / "report.txt").read_text()
    assert "SKIPPED" in text and "silent.wav" in text
    assert "in total from 2 file(s)" in text and "LUFS" in text


def test_a_file_20_db_below_the_corpus_median_is_flagged_quiet():
    from speech.trim import QUIET_DB, quiet_files, report_lines

    levels = {"a.wav": {"lufs": -23.0}, "b.wav": {"lufs": -24.0}, "c.wav": {"lufs": -22.5},
              "soft.wav": {"lufs": -23.0 - QUIET_DB - 1}, "near.wav": {"lufs": -23.0 - QUIET_DB + 1}, "x.wav": {}}
    assert [name for name, _, _ in quiet_files(levels)] == ["soft.wav"]
    quiet = [line for line in report_lines(levels) if line.startswith("QUIET")]
    assert len(quiet) == 1 and quiet[0].startswith("QUIET soft.wav: level -44.00 LUFS, 20.0 dB below the corpus median")  # median -24
