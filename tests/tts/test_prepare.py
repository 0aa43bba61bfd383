"""prepare_data.py: every robustness case is reported with file/line/reason, the rest prepared."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf

from tts.prepare_data import PrepareError, check_item, main, prepare
from tts.vits.config import DataConfig, TrainConfig

SR = 22050


def _speechlike(seconds: float, sr: int = SR, seed: int = 0, channels: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sr)) / sr
    env = 0.5 + 0.5 * np.sin(2 * np.pi * 3 * t)  # syllable-like amplitude modulation
    x = 0.3 * env * np.sin(2 * np.pi * (120 + 30 * np.sin(2 * np.pi * t)) * t) + 0.01 * rng.standard_normal(len(t))
    x = x.astype(np.float32)
    return np.stack([x, 0.5 * x], 1) if channels == 2 else x


@pytest.fixture()
def corpus(tmp_path):
    audio = tmp_path / "audio"
    audio.mkdir()
    good_text = "Bugun havo juda yaxshi, biz bogʻda sayr qildik."
    for i in range(5):
        sf.write(audio / f"good{i}.wav", _speechlike(3.0, seed=i), SR, subtype="PCM_16")
    sf.write(audio / "cyr.wav", _speechlike(3.0, seed=9), SR, subtype="PCM_16")
    sf.write(audio / "sr44.wav", _speechlike(3.0, sr=44100), 44100, subtype="PCM_16")
    sf.write(audio / "stereo.wav", _speechlike(3.0, channels=2), SR, subtype="PCM_16")
    sf.write(audio / "long.wav", _speechlike(40.0), SR, subtype="PCM_16")
    sf.write(audio / "short.wav", _speechlike(0.1), SR, subtype="PCM_16")
    sf.write(audio / "empty.wav", _speechlike(3.0), SR, subtype="PCM_16")
    sf.write(audio / "ws.wav", _speechlike(3.0), SR, subtype="PCM_16")
    sf.write(audio / "unk.wav", _speechlike(3.0), SR, subtype="PCM_16")
    (audio / "broken.wav").write_bytes(b"RIFF....not audio at all")
    lines = [f"good{i}|{good_text}" for i in range(5)] + [
        "cyr|Бугун ҳаво жуда яхши, биз боғда сайр қилдик.",
        f"sr44|{good_text}",
        f"stereo|{good_text}",
        f"long|{good_text}",
        f"short|{good_text}",
        "empty|",
        "ws|   \t ",
        "unk|你好世界",
        f"missing|{good_text}",
        f"broken|{good_text}",
        "a|b|c|d",  # wrong column count
    ]
    meta = tmp_path / "metadata.csv"
    data = ("\n".join(lines) + "\n").encode("utf-8")
    data += "badenc|Бугун ҳаво\n".encode("cp1251", errors="replace")  # a line in the wrong encoding
    meta.write_bytes(data)
    return meta, audio, tmp_path / "out"


def _line_of(meta, key):
    for n, line in enumerate(meta.read_bytes().split(b"\n"), 1):
        if line.startswith(key.encode()):
            return n
    raise KeyError(key)


def test_prepare_robustness(corpus, capsys):
    meta, audio, out = corpus
    before = {p.name: p.read_bytes() for p in audio.iterdir()}
    cfg = TrainConfig()
    cfg.data.eval_split_size = 2
    cfg.data.trim_silence = False  # synthetic tones: no speech for the Silero VAD to keep (tests/speech/test_trim.py)
    report = prepare(meta, audio, out, cfg, num_workers=1)
    printed = capsys.readouterr().out
    dropped = {(d["line"], d["reason"].split(" (")[0].split(":")[0]) for d in report["dropped"]}
    expect = {
        "long": "audio too long", "short": "audio too short", "empty": "empty text", "ws": "empty text",
        "unk": "only unknown characters", "missing": "audio file not found", "broken": "audio not readable as audio",
        "a|b": "expected 2 or 3 '|'-separated fields",
    }
    for key, reason in expect.items():
        assert (_line_of(meta, key), reason) in dropped, (key, report["dropped"])
        assert f"{meta}:{_line_of(meta, key)}" in printed  # every dropped line is printed with file:line
    bad_line = len(meta.read_bytes().split(b"\n")) - 1
    assert any(d["line"] == bad_line and "not valid UTF-8" in d["reason"] for d in report["dropped"])
    assert len(report["dropped"]) == len(expect) + 1
    # converted, not dropped: other sample rate and stereo
    notes = {(n["id"], n["reason"]) for n in report["notes"]}
    assert ("sr44", "resampled 44100 Hz -> 22050 Hz") in notes
    assert ("stereo", "downmixed 2 channels to mono") in notes

    train = [json.loads(x) for x in (out / "train.jsonl").read_text(encoding="utf-8").splitlines()]
    evals = [json.loads(x) for x in (out / "eval.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(train) == 6 and len(evals) == 2 and report["kept"] == 8
    recs = {r["id"]: r for r in train + evals}
    assert set(recs) == {"good0", "good1", "good2", "good3", "good4", "cyr", "sr44", "stereo"}
    assert recs["cyr"]["text"] == recs["good0"]["text"] == "bugun havo juda yaxshi, biz bogʻda sayr qildik."
    for r in recs.values():
        for key in ("id", "wav", "text", "raw_text", "speaker", "speaker_id", "duration", "num_samples"):
            assert key in r
        info = sf.info(out / r["wav"])
        assert (info.samplerate, info.channels, info.subtype) == (SR, 1, "PCM_16")
        assert info.frames == r["num_samples"] and abs(r["duration"] - 3.0) < 0.01
        spec = np.load(out / r["spec"])
        assert spec.shape == (513, r["num_samples"] // 256)
    assert json.loads((out / "speakers.json").read_text()) == {"speaker": 0}
    assert json.loads((out / "report.json").read_text())["kept"] == 8
    assert {p.name: p.read_bytes() for p in audio.iterdir()} == before  # input untouched

    # a second run reuses the outputs and gives the same manifest
    first = (out / "train.jsonl").read_text(encoding="utf-8")
    prepare(meta, audio, out, cfg, num_workers=2, quiet=True)
    assert (out / "train.jsonl").read_text(encoding="utf-8") == first


def test_nothing_usable_is_an_error(tmp_path, capsys):
    audio = tmp_path / "a"
    audio.mkdir()
    meta = tmp_path / "m.csv"
    meta.write_text("x|salom\ny|\n", encoding="utf-8")
    with pytest.raises(PrepareError, match="nothing usable"):
        prepare(meta, audio, tmp_path / "o", quiet=True)
    assert main(["--metadata", str(meta), "--audio_dir", str(audio), "--output_dir", str(tmp_path / "o")]) == 2
    assert "nothing usable" in capsys.readouterr().err



@pytest.mark.parametrize("where, module, pip, workers", [
    ("load_audio", "soxr", "pip install soxr", 1),
    ("load_audio", "soxr", "pip install soxr", 2),  # raised in a worker process, re-raised by the pool
    ("normalize", "parselmouth", "pip install praat-parselmouth", 1),  # inside check_item's own catch-all
])
def test_a_missing_module_stops_the_run_instead_of_dropping_every_line(tmp_path, monkeypatch, capsys, where,
                                                                      module, pip, workers):
    """A module that is not installed is no line's fault: one error naming it and what to install (exit 2),
    not "nothing usable" with every line dropped as unreadable audio or unnormalisable text."""
    import multiprocessing

    import tts.prepare_data as prep

    if workers > 1 and multiprocessing.get_start_method() != "fork":
        pytest.skip("the monkeypatch reaches pool workers only when they are forked")

    def missing(*args, **kwargs):
        raise ModuleNotFoundError(f"No module named '{module}'")

    monkeypatch.setattr(prep, where, missing)
    audio = tmp_path / "audio"
    audio.mkdir()
    for i in range(5):
        sf.write(audio / f"u{i}.wav", _speechlike(3.0, seed=i), SR, subtype="PCM_16")
    meta = tmp_path / "metadata.csv"
    meta.write_text("".join(f"u{i}|Bugun havo juda yaxshi, biz bogʻda sayr qildik.\n" for i in range(5)),
                    encoding="utf-8")
    rc = main(["--metadata", str(meta), "--audio_dir", str(audio), "--output_dir", str(tmp_path / "o"),
               "--num_workers", str(workers), "--no_trim"])
    captured = capsys.readouterr()
    assert rc == 2, captured.err
    assert f"'{module}' is not installed" in captured.err and pip in captured.err
    assert "nothing usable" not in captured.err + captured.out and "dropped" not in captured.out


def test_common_voice_tsv(tmp_path):
    clips = tmp_path / "cv" / "clips"
    clips.mkdir(parents=True)
    rows = ["client_id\tpath\tsentence\tup_votes\tdown_votes"]
    for i, spk in enumerate(["alice", "alice", "bob", "bob"]):
        sf.write(clips / f"c{i}.flac", _speechlike(6.0, sr=48000, seed=i), 48000)
        rows.append(f"{spk}\tc{i}.flac\tOʻzbekiston 2024-yil {i + 1}-oktabr\t2\t0")
    rows.append("carol\tc9.flac\ttoo\tfew")  # wrong field count
    meta = tmp_path / "cv" / "validated.tsv"
    meta.write_text("\n".join(rows) + "\n", encoding="utf-8")
    cfg = TrainConfig()
    cfg.data.trim_silence = False  # synthetic tones
    report = prepare(meta, tmp_path / "cv", tmp_path / "out", cfg, quiet=True)
    assert report["format"] == "commonvoice" and report["kept"] == 4 and report["speakers"] == 2
    assert report["dropped"][0]["line"] == 6 and "expected 5 tab-separated" in report["dropped"][0]["reason"]
    spk = json.loads((tmp_path / "out" / "speakers.json").read_text())
    assert spk == {"alice": 0, "bob": 1}
    recs = [json.loads(x) for x in (tmp_path / "out" / "train.jsonl").read_text(encoding="utf-8").splitlines()]
    recs += [json.loads(x) for x in (tmp_path / "out" / "eval.jsonl").read_text(encoding="utf-8").splitlines()]
    assert all(r["speaker_id"] == spk[r["speaker"]] for r in recs)
    assert any(r["text"] == "oʻzbekiston ikki ming yigirma toʻrtinchi yil birinchi oktabr" for r in recs)


def test_check_item_reasons():
    cfg = DataConfig()
    wav = _speechlike(3.0)
    assert check_item("Salom, dunyo! Bu sinov gapi.", wav, SR, cfg).ok
    assert check_item("   ", wav, SR, cfg).reason == "empty text"
    assert "U+4F60" in check_item("你好", wav, SR, cfg).reason
    assert check_item("salom ☃ dunyo", wav, SR, cfg).reason.startswith("unknown characters: '☃'")
    assert "too slow" in check_item("ha", _speechlike(12.0), SR, cfg).reason
    assert "too fast" in check_item("salom dunyo " * 20, _speechlike(1.0), SR, cfg).reason
    assert "silent" in check_item("Salom, dunyo! Bu sinov.", np.zeros(SR * 3, np.float32), SR, cfg).reason
    assert check_item("salom dunyo", None, None, cfg).ok  # text-only check
