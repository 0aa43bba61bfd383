"""speech.speaker_similarity (Resemblyzer's encoder from its package's weights file, no download) and
speech.mcd's DTW-aligned pitch figures: the two speech figures TTS validation adds beside MCD.

Measured with espeak-ng's demo voices (speech.demo_speech.DEMO_SPEAKERS), two different sentences each,
2026-11-27: the same voice scores 0.90-0.95, another voice 0.53-0.88 (the closest pair: uz_f_low and
uz_f_mid, 0.875); the three voices below are the farthest apart (same 0.904-0.929, other <= 0.722)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from speech import speaker_similarity as ss
from speech.audio import MelSpectrogram, load_audio
from speech.demo_speech import DEMO_SPEAKERS, UZBEK_SENTENCES, espeak_available, speak
from speech.mcd import aligned_pitch_errors, mcd_dtw_path

VOICES = ("uz_m_low", "uz_m_klatt", "uz_f_high")
SR = 22050

needs_encoder = pytest.mark.skipif(ss.resemblyzer_weights() is None, reason=f"no speaker encoder: {ss.INSTALL_HINT}")


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[tuple[str, int], np.ndarray]:
    """Each of VOICES reading two different sentences."""
    if not espeak_available():
        pytest.skip("espeak-ng is not installed")
    folder = tmp_path_factory.mktemp("voices")
    by_name = {s["name"]: s for s in DEMO_SPEAKERS}
    out = {}
    for name in VOICES:
        s = by_name[name]
        for k in (0, 1):
            path = speak(UZBEK_SENTENCES[4 + k], folder / f"{name}_{k}.wav", s["voice"], s["speed"], s["pitch"])
            out[(name, k)] = load_audio(path)[0]
    return out


@needs_encoder
def test_one_voice_is_closer_to_itself_than_to_another_voice(clips):
    enc = ss.load_speaker_encoder("resemblyzer", say=pytest.fail)  # the config keys' default
    emb = {key: enc.embed(wav, SR) for key, wav in clips.items()}
    for name in VOICES:
        same = float(emb[(name, 0)] @ emb[(name, 1)])
        others = [float(emb[(name, 0)] @ emb[(o, 1)]) for o in VOICES if o != name]
        assert same > 0.85 and same > max(others) + 0.1, (name, same, others)
    wav = clips[(VOICES[0], 0)]
    assert enc.similarity(wav, wav.copy(), SR) == pytest.approx(1.0, abs=1e-6)  # a clip against itself


def test_no_encoder_is_one_line_and_the_metric_off(monkeypatch, tmp_path):
    lines = []
    monkeypatch.setattr(ss, "resemblyzer_weights", lambda: None)
    assert ss.load_speaker_encoder("", say=lines.append) is None
    assert ss.load_speaker_encoder(str(tmp_path / "missing.pt"), say=lines.append) is None
    (tmp_path / "junk.pt").write_bytes(b"not a model")
    assert ss.load_speaker_encoder(str(tmp_path / "junk.pt"), say=lines.append) is None
    assert len(lines) == 3 and all(line.startswith("speaker similarity off: ") for line in lines), lines
    assert ss.INSTALL_HINT in lines[0]


class WavEncoder(torch.nn.Module):
    """A user's encoder: 16 kHz waveform [1, T] -> [1, 2] (its level and its zero-crossing rate)."""

    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        zc = (wav[:, 1:] * wav[:, :-1] < 0).float().mean(1)
        return torch.stack([wav.abs().mean(1), zc], 1)


def test_a_user_file_exported_or_state_dict(tmp_path, monkeypatch):
    example = (torch.zeros(1, 16000),)
    program = torch.export.export(WavEncoder(), example, dynamic_shapes={"wav": {1: torch.export.Dim("t", min=3)}})
    torch.export.save(program, tmp_path / "enc.pt2")
    monkeypatch.setenv("TRUST_CODE_FILES", "1")  # a .pt2 runs its code: only with the opt-in (tests/test_model_files.py)
    lines = []
    enc = ss.load_speaker_encoder(str(tmp_path / "enc.pt2"), say=lines.append)
    assert lines == [f"speaker encoder: loading {tmp_path / 'enc.pt2'} (a torch.export program (.pt2)) with its "
                     "code, trusted by TRUST_CODE_FILES=1"]
    t = np.arange(SR) / SR
    low, high = np.sin(2 * np.pi * 100 * t), 0.1 * np.sin(2 * np.pi * 2000 * t)
    assert enc.wav_net is not None and enc.embed(low, SR).shape == (2,)
    assert enc.similarity(low, low, SR) == pytest.approx(1.0) and enc.similarity(low, high, SR) < 0.9
    with torch.random.fork_rng():
        torch.manual_seed(0)
        torch.save({"model_state": ss.VoiceEncoderNet().state_dict()}, tmp_path / "fine_tuned.pt")
    enc = ss.load_speaker_encoder(str(tmp_path / "fine_tuned.pt"), say=pytest.fail)
    assert enc.mel_net is not None and enc.embed(low, SR).shape == (256,)


def tone(hz: float, seconds: float, sr: int = SR) -> np.ndarray:
    t = np.arange(int(seconds * sr)) / sr
    return (0.4 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def test_pitch_figures_follow_the_dtw_path_of_unequal_lengths():
    """A semitone sharp and 30 % slower: the aligned F0 RMSE is the semitone (100 cents), no voicing error."""
    mel = MelSpectrogram(SR, 1024, 1024, 256, 80, 40.0, 8000.0)
    ref = np.concatenate([tone(150, 0.5), tone(220, 0.5)])
    up = 2 ** (1 / 12)
    syn = np.concatenate([tone(150 * up, 0.65), tone(220 * up, 0.65)])

    def log_mel(w):
        return mel(torch.from_numpy(w)[None])[0].numpy()

    _, path = mcd_dtw_path(log_mel(ref), log_mel(syn))
    assert path[0].tolist() == [0, 0] and path[-1].tolist() == [len(ref) // 256 - 1, len(syn) // 256 - 1]
    e = aligned_pitch_errors(syn, ref, SR, 256, path)
    assert e["f0_rmse"] == pytest.approx(100.0, abs=15.0) and e["vuv_error"] < 0.05
    same = aligned_pitch_errors(ref, ref, SR, 256, mcd_dtw_path(log_mel(ref), log_mel(ref))[1])
    assert same["f0_rmse"] < 1.0 and same["vuv_error"] == 0.0 and same["periodicity"] < 0.01
    assert all(np.isnan(v) for v in aligned_pitch_errors(syn, ref, SR, 256, np.zeros((0, 2), int)).values())
