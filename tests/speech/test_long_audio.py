"""Nothing bounded one file's length (issue 38 #15): a prepare now refuses a file longer than its `max_seconds`
from the header, before decoding it (a skip with its reason in the report), and reads and resamples the rest in
blocks, the mel in chunks of frames, so a worker's memory follows `max_seconds`, with the same output as before."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf
import soxr
import torch

import speech.audio as audio
from speech.audio import AudioError, MelSpectrogram, load_audio


def _tone(seconds: float, sr: int, channels: int = 1, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sr)) / sr
    x = 0.3 * np.sin(2 * np.pi * 150 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 2 * t)) + 0.01 * rng.standard_normal(len(t))
    return np.stack([x, 0.5 * x], 1).astype(np.float32) if channels == 2 else x.astype(np.float32)


@pytest.fixture()
def two_minutes(tmp_path):
    path = tmp_path / "long.wav"
    sf.write(path, np.zeros(120 * 8000, np.int16), 8000, subtype="PCM_16")  # 2 min of silence at 8 kHz
    return path


def test_a_file_longer_than_max_seconds_is_refused_from_its_header(two_minutes, monkeypatch):
    def no_decoding(*a, **k):
        raise AssertionError("decoded a file its header already refused")

    monkeypatch.setattr(audio, "_read_mono", no_decoding)
    monkeypatch.setattr(sf, "read", no_decoding)
    with pytest.raises(AudioError) as info:
        load_audio(two_minutes, sr=22050, max_seconds=60)
    assert info.value.reason == "too long (120.00 s > 60 s)"
    with pytest.raises(AudioError, match="too long"):
        load_audio(two_minutes, mono=False, max_seconds=60)


@pytest.mark.parametrize("sr_in, sr_out, channels", [(44100, 22050, 2), (8000, 22050, 1), (22050, None, 2),
                                                     (16000, 16000, 1)])
def test_the_block_read_gives_the_same_samples_as_one_read(tmp_path, monkeypatch, sr_in, sr_out, channels):
    """Before: the whole file, its channels' mean, one soxr.resample call. Now block by block (small blocks
    here, so a 3 s file is many): the same bytes."""
    path = tmp_path / "x.wav"
    sf.write(path, _tone(3.0, sr_in, channels), sr_in, subtype="PCM_24")
    data, _ = sf.read(str(path), dtype="float32", always_2d=True)
    before = data.mean(axis=1, keepdims=True)
    if sr_out is not None and sr_out != sr_in:
        before = soxr.resample(before, sr_in, sr_out, quality="HQ")
    before = np.ascontiguousarray(before[:, 0], dtype=np.float32)
    monkeypatch.setattr(audio, "BLOCK_FRAMES", 1000)
    wav, sr = load_audio(path, sr=sr_out, max_seconds=10)
    assert sr == (sr_out or sr_in) and wav.dtype == np.float32
    assert wav.tobytes() == before.tobytes()


def test_the_mel_in_chunks_is_the_whole_files_mel():
    mel_fn = MelSpectrogram(22050, 1024, 1024, 256, 80, 0.0, 8000.0)
    wav = torch.from_numpy(_tone(4.0, 22050))
    whole = mel_fn(wav[None])[0]
    chunked = mel_fn.mel_in_chunks(wav, chunk_frames=50)
    assert chunked.shape == whole.shape
    torch.testing.assert_close(chunked, whole, rtol=0, atol=1e-5)  # bit-identical on this CPU; a tolerance elsewhere


def test_vocoder_prepare_skips_a_long_file_and_prepares_the_others_as_before(tmp_path, two_minutes):
    from tests.vocoder.conftest import tiny_config, write_tones
    from vocoder.prepare_data import PrepareError, prepare

    src = tmp_path / "w"
    write_tones(src, 2, 44100, seconds=1.0)  # resampled to demo.yaml's 22.05 kHz
    two_minutes.rename(src / "long.wav")
    cfg = tiny_config("binarization_args.max_seconds=60")
    prepare(cfg, [src], tmp_path / "bin", num_workers=0, log=lambda *a: None)
    report = json.loads((tmp_path / "bin" / "report.json").read_text())
    assert report["skipped"] == [{"file": str(src / "long.wav"), "reason": "too long (120.00 s > 60 s)"}]
    # a normal file: the audio as the old whole-file read made it (bytes), the mel as the whole file's
    item = next(p for p in (tmp_path / "bin" / "items").iterdir() if p.name.startswith("tone_0"))
    data, _ = sf.read(str(src / "tone_0.wav"), dtype="float32", always_2d=True)
    old = soxr.resample(data.mean(axis=1, keepdims=True)[:, 0], 44100, 22050, quality="HQ").astype(np.float32)
    got = np.load(item / "audio.npy")
    assert got.tobytes() == old[: len(got)].tobytes()
    mel_fn = MelSpectrogram(**cfg.audio.mel_kwargs)
    torch.testing.assert_close(torch.from_numpy(np.load(item / "mel.npy")),
                               mel_fn(torch.from_numpy(got)[None])[0].T, rtol=0, atol=1e-5)
    # another max_seconds is no other content: the folder continues, an item now too long is left out
    with pytest.raises(PrepareError, match="no usable audio"):
        prepare(tiny_config("binarization_args.max_seconds=0.5"), [src], tmp_path / "bin", num_workers=0,
                log=lambda *a: None)
    reasons = {s["reason"] for s in json.loads((tmp_path / "bin" / "report.json").read_text())["skipped"]}
    assert reasons == {"too long (120.00 s > 0.5 s)", "too long (1.00 s > 0.5 s)"}


def test_tts_prepare_drops_a_long_file_from_its_header(tmp_path, two_minutes, monkeypatch):
    from tts.prepare_data import prepare
    from tts.vits.config import TrainConfig

    audio_dir = tmp_path / "a"
    audio_dir.mkdir()
    for i in range(3):
        sf.write(audio_dir / f"ok{i}.wav", _tone(2.0, 22050, seed=i), 22050, subtype="PCM_16")
    two_minutes.rename(audio_dir / "long.wav")
    (tmp_path / "m.csv").write_text("".join(f"{n}|Bugun havo juda yaxshi edi.\n" for n in ["ok0", "ok1", "ok2", "long"]))
    cfg = TrainConfig()
    cfg.data.max_audio_len = 60.0
    cfg.data.trim_silence = False  # tones: no speech for the Silero VAD to keep
    decoded = []
    real = audio._read_mono
    monkeypatch.setattr(audio, "_read_mono", lambda path, sr: decoded.append(path.name) or real(path, sr))
    report = prepare(tmp_path / "m.csv", audio_dir, tmp_path / "out", cfg, num_workers=1, quiet=True)
    assert [d["reason"] for d in report["dropped"]] == ["audio too long (120.00 s > 60 s)"]
    assert report["kept"] == 3 and "long.wav" not in decoded
