"""prepare_data.py over odd and broken audio: good files processed, bad ones reported with a
reason, input untouched, resumable, f0 on the mel frame grid."""

import hashlib
import json
import os
import sys

import numpy as np
import pytest
import soundfile as sf

from vocoder.prepare_data import main as prepare_main
from vocoder.prepare_data import prepare

from .conftest import DEMO_YAML, TINY_YAML, tiny_config, voiced_tone

SR = 22050


def _digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def robustness_set(tmp_path_factory):
    d = tmp_path_factory.mktemp("odd_audio")
    sf.write(d / "good_16bit.wav", voiced_tone(1.0, SR), SR, subtype="PCM_16")
    sf.write(d / "pcm_8bit.wav", voiced_tone(1.0, SR, seed=1), SR, subtype="PCM_U8")
    sf.write(d / "pcm_24bit.wav", voiced_tone(1.0, SR, seed=2), SR, subtype="PCM_24")
    stereo = np.stack([voiced_tone(1.0, SR, seed=3), voiced_tone(1.0, SR, f0=250, seed=4)], axis=1)
    sf.write(d / "stereo.wav", stereo, SR, subtype="PCM_16")
    sf.write(d / "rate_8k.wav", voiced_tone(1.0, 8000, seed=5), 8000, subtype="PCM_16")
    sf.write(d / "rate_96k.flac", voiced_tone(1.0, 96000, seed=6), 96000, subtype="PCM_24")
    # "a 10-minute file": kept at 60 s here so the suite stays fast; nothing in the code depends on length.
    sf.write(d / "long_60s.flac", voiced_tone(60.0, SR, seed=7), SR, subtype="PCM_16")
    # bad ones
    sf.write(d / "silence.wav", np.zeros(SR, np.float32), SR, subtype="PCM_16")
    nan = voiced_tone(1.0, SR, seed=8)
    nan[100:200] = np.nan
    sf.write(d / "nan_samples.wav", nan, SR, subtype="FLOAT")
    (d / "zero_length.wav").write_bytes(b"")
    (d / "text_named.wav").write_text("this is not audio, just text in a .wav file\n")
    full = (d / "good_16bit.wav").read_bytes()
    (d / "truncated.wav").write_bytes(full[:30])  # cut inside the header
    sf.write(d / "too_short.wav", voiced_tone(0.1, SR), SR, subtype="PCM_16")
    return d


GOOD = {"good_16bit", "pcm_8bit", "pcm_24bit", "stereo", "rate_8k", "rate_96k", "long_60s"}
BAD = {"silence": "silent", "nan_samples": "non-finite", "zero_length": "empty", "text_named": "not readable",
       "truncated": "not readable", "too_short": "too short"}


def test_robustness_set(robustness_set, tmp_path):
    before = _digest(robustness_set)
    out = tmp_path / "bin"
    rc = prepare_main(["--config", str(TINY_YAML), "--input", str(robustness_set), "--output", str(out),
                       "--num_workers", "0", "--set", "val_num=1"])
    assert rc == 0
    manifest = json.loads((out / "manifest.json").read_text())
    sources = {os.path.basename(v["source"]).split(".")[0] for v in manifest["items"].values()}
    assert sources == GOOD
    report = json.loads((out / "report.json").read_text())
    reasons = {os.path.basename(s["file"]).split(".")[0]: s["reason"] for s in report["skipped"]}
    assert set(reasons) == set(BAD)
    for name, words in BAD.items():
        assert words in reasons[name], (name, reasons[name])
    text = (out / "report.txt").read_text()
    assert all(name in text for name in BAD)
    assert len(manifest["valid"]) == 1 and len(manifest["train"]) == len(GOOD) - 1
    # resampled to the training rate, downmixed, whole frames
    for iid, item in manifest["items"].items():
        audio = np.load(out / "items" / iid / "audio.npy")
        mel = np.load(out / "items" / iid / "mel.npy")
        f0 = np.load(out / "items" / iid / "f0.npy")
        assert audio.ndim == 1 and len(audio) == item["frames"] * 256
        assert mel.shape == (item["frames"], 80) and f0.shape == (item["frames"],)
        src = os.path.basename(item["source"]).split(".")[0]
        if src in ("rate_8k", "rate_96k", "good_16bit"):
            assert abs(len(audio) / SR - 1.0) < 0.02
        if src == "long_60s":
            assert abs(item["seconds"] - 60.0) < 0.02
    assert _digest(robustness_set) == before  # input never modified


def test_nothing_usable_is_a_clear_error(tmp_path, capsys):
    d = tmp_path / "bad"
    d.mkdir()
    (d / "a.wav").write_text("nope")
    sf.write(d / "b.wav", np.zeros(SR, np.float32), SR)
    rc = prepare_main(["--config", str(TINY_YAML), "--input", str(d), "--output", str(tmp_path / "o"),
                       "--num_workers", "0"])
    err = capsys.readouterr().err
    assert rc != 0 and "no usable audio" in err and "report.txt" in err
    (tmp_path / "empty").mkdir()
    rc = prepare_main(["--config", str(TINY_YAML), "--input", str(tmp_path / "empty"), "--output",
                       str(tmp_path / "o2"), "--num_workers", "0"])
    assert rc != 0 and "no audio files" in capsys.readouterr().err
    rc = prepare_main(["--config", str(TINY_YAML), "--input", str(tmp_path / "missing"), "--output",
                       str(tmp_path / "o3")])
    assert rc != 0 and "not found" in capsys.readouterr().err


def test_resumable_and_parallel(tmp_path):
    d = tmp_path / "wavs"
    d.mkdir()
    for i in range(3):
        sf.write(d / f"{i}.wav", voiced_tone(0.8, SR, seed=i), SR)
    cfg = tiny_config()
    logs = []
    prepare(cfg, [d], tmp_path / "bin", num_workers=2, log=logs.append)  # two spawned processes
    assert "3 to process" in logs[0]
    stamps = {p.parent.name: p.stat().st_mtime_ns for p in (tmp_path / "bin" / "items").glob("*/meta.json")}
    logs.clear()
    prepare(cfg, [d], tmp_path / "bin", num_workers=0, log=logs.append)
    assert "3 already done, 0 to process" in logs[0]
    sf.write(d / "1.wav", voiced_tone(0.9, SR, seed=9), SR)  # changed source -> only it is redone
    logs.clear()
    m = prepare(cfg, [d], tmp_path / "bin", num_workers=0, log=logs.append)
    assert "1 to process" in logs[0]
    after = {p.parent.name: p.stat().st_mtime_ns for p in (tmp_path / "bin" / "items").glob("*/meta.json")}
    assert sum(after[k] != stamps[k] for k in stamps) == 1
    assert len(m["items"]) == 3


def test_f0_is_frame_aligned_with_mel(tmp_path):
    """A tone at 150 Hz that jumps to 300 Hz at exactly 0.5 s: the f0 switch lands on the mel
    frame whose centre is at 0.5 s, and every array has the mel's frame count."""
    t = np.arange(SR) / SR
    f = np.where(t < 0.5, 150.0, 300.0)
    phase = 2 * np.pi * np.cumsum(f) / SR
    wav = (0.3 * sum(np.sin(k * phase) / k for k in range(1, 6))).astype(np.float32)
    (tmp_path / "w").mkdir()
    sf.write(tmp_path / "w" / "jump.wav", wav, SR, subtype="FLOAT")
    m = prepare(tiny_config(), [tmp_path / "w"], tmp_path / "bin", num_workers=0, log=lambda *a: None)
    (iid,) = m["items"]
    item = tmp_path / "bin" / "items" / iid
    f0, mel = np.load(item / "f0.npy"), np.load(item / "mel.npy")
    voiced = np.load(item / "voiced.npy")
    assert len(f0) == len(mel) == len(voiced) == SR // 256
    centres = (np.arange(len(f0)) + 0.5) * 256 / SR
    low, high = f0[(centres > 0.1) & (centres < 0.4)], f0[(centres > 0.6) & (centres < 0.9)]
    assert np.median(low) == pytest.approx(150, rel=0.03) and np.median(high) == pytest.approx(300, rel=0.03)
    switch = np.argmax(f0 > 225)
    assert abs(centres[switch] - 0.5) <= 2 * 256 / SR
    assert voiced[(centres > 0.1) & (centres < 0.9)].mean() > 0.9
    # the mel changes most at the same place (within its 1024-sample = 4-frame window)
    inner = np.where((centres > 0.1) & (centres < 0.9))[0][:-1]
    change = np.abs(np.diff(mel, axis=0)).sum(axis=1)[inner]
    assert abs(inner[np.argmax(change)] + 0.5 - switch) <= 4
    # the f0 report: what the extractor found, no bound flagged for a 150-300 Hz voice, and its picture
    report = (tmp_path / "bin" / "report.txt").read_text()
    assert "f0 (parselmouth, f0_min 65 Hz, f0_max 1100 Hz): " in report and "WARNING" not in report
    f0_found = json.loads((tmp_path / "bin" / "report.json").read_text())["f0"]
    assert f0_found["p1"] == pytest.approx(150, rel=0.05) and f0_found["p99"] == pytest.approx(300, rel=0.05)
    assert f0_found["voiced_fraction"] > 0.9 and f0_found["cut"] == []
    assert (tmp_path / "bin" / "f0_histogram.png").stat().st_size > 1000


def test_a_missing_f0_package_is_one_line_before_any_file(tmp_path, monkeypatch, capsys):
    """f0_extractor (alias of pe) names an optional extractor whose package is not installed: one line naming
    it and its pip install, exit 2, and no output folder."""
    monkeypatch.setitem(sys.modules, "torchfcpe", None)  # `import torchfcpe` raises ModuleNotFoundError
    (tmp_path / "w").mkdir()
    sf.write(tmp_path / "w" / "a.wav", voiced_tone(0.5, SR), SR)
    rc = prepare_main(["--config", str(TINY_YAML), "--input", str(tmp_path / "w"), "--output", str(tmp_path / "o"),
                       "--set", "f0_extractor=fcpe"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "'torchfcpe' is not installed" in err, err
    assert "pip install torchfcpe" in err and not (tmp_path / "o").exists()
    rc = prepare_main(["--config", str(TINY_YAML), "--input", str(tmp_path / "w"), "--output", str(tmp_path / "o"),
                       "--set", "pe=swipe"])
    err = capsys.readouterr().err
    assert rc == 2 and "unknown f0 extractor 'swipe'; valid: parselmouth, pyin, harvest, crepe, fcpe, rmvpe" in err


def test_rmvpe_runs_the_given_weights_and_they_are_the_prepared_folders_identity(tmp_path, capsys):
    """pe=rmvpe with pe_ckpt (alias f0_extractor_weights): the f0 is the stand-in model's, the manifest records the
    weights' digest (not their path), and training refuses other weights; a missing or needless pe_ckpt is one
    line naming the key, before any file."""
    from speech.rmvpe import weights_digest
    from tests.speech.test_rmvpe import stand_in
    from vocoder.data import DatasetError, load_manifest

    from .conftest import write_tones

    write_tones(tmp_path / "w", 2, SR, seconds=0.6)
    a, b = stand_in(tmp_path / "a.onnx", f0=180.0), stand_in(tmp_path / "b.onnx", f0=300.0)
    m = prepare(tiny_config("pe=rmvpe", f"f0_extractor_weights={a}"), [tmp_path / "w"], tmp_path / "bin",
                num_workers=0, log=lambda *x: None)
    assert m["settings"]["pe"] == "rmvpe" and m["settings"]["pe_ckpt_sha256"] == weights_digest(a)
    assert "pe_ckpt" not in m["settings"]
    f0, voiced = (np.load(tmp_path / "bin" / "items" / m["train"][0] / n) for n in ("f0.npy", "voiced.npy"))
    assert voiced.mean() > 0.8 and np.abs(f0[voiced] - 180).max() < 0.1
    assert "f0 (rmvpe, " in (tmp_path / "bin" / "report.txt").read_text()
    (tmp_path / "moved.onnx").write_bytes(a.read_bytes())  # the same weights elsewhere: the same extractor
    load_manifest(tmp_path / "bin", tiny_config("pe=rmvpe", f"pe_ckpt={tmp_path / 'moved.onnx'}"))
    with pytest.raises(DatasetError, match=f"pe_ckpt_sha256: data {weights_digest(a)} vs config {weights_digest(b)}"):
        load_manifest(tmp_path / "bin", tiny_config("pe=rmvpe", f"pe_ckpt={b}"))
    args = ["--config", str(DEMO_YAML), "--input", str(tmp_path / "w"), "--output", str(tmp_path / "o")]
    for sets, words in (([f"pe_ckpt={a}"], "pe_ckpt (f0_extractor_weights) is set but pe is 'pyin'"),
                        (["pe=rmvpe"], "pe_ckpt (f0_extractor_weights): the f0 extractor rmvpe needs its weights"),
                        (["pe=rmvpe", "pe_ckpt=no.onnx"], "pe_ckpt (f0_extractor_weights): rmvpe weights file no.onnx "
                                                          "does not exist")):
        assert prepare_main([*args, *(x for s in sets for x in ("--set", s))]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, err
    assert not (tmp_path / "o").exists()


MISSING_PARSELMOUTH = "No module named 'parselmouth'"


def _five_tones(folder):
    folder.mkdir()
    for i in range(5):
        sf.write(folder / f"{i}.wav", voiced_tone(0.8, SR, seed=i), SR)
    return folder


def test_a_missing_module_stops_the_run_instead_of_calling_every_file_bad(tmp_path, monkeypatch, capsys):
    """parselmouth not installed: the f0 extractor's ImportError is no file's fault. The run stops at the
    first file with one line naming the module and what to install, not "no usable audio among 5 file(s)"."""
    import speech.f0

    calls = []

    def no_parselmouth(*args, **kwargs):
        calls.append(1)
        raise ModuleNotFoundError(MISSING_PARSELMOUTH)

    monkeypatch.setattr(speech.f0, "extract_f0", no_parselmouth)
    d = _five_tones(tmp_path / "wavs")
    rc = prepare_main(["--config", str(TINY_YAML), "--input", str(d), "--output", str(tmp_path / "o"),
                       "--num_workers", "0"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "parselmouth" in err and "pip install praat-parselmouth" in err and "requirements.txt" in err
    assert "no usable audio" not in err and "corrupt" not in err
    assert len(calls) == 1  # stopped at once, not tried on every file


def test_a_module_missing_in_a_worker_process_stops_the_run_too(tmp_path, monkeypatch, capsys):
    """The same with spawned workers, where the import really fails: a `parselmouth` that cannot be
    imported shadows the real one on sys.path (which spawned workers inherit); the pool re-raises the
    worker's ModuleNotFoundError in the main process, which reports it as above."""
    fake = tmp_path / "fake_site"
    fake.mkdir()
    (fake / "parselmouth.py").write_text(f"raise ModuleNotFoundError({MISSING_PARSELMOUTH!r}, name='parselmouth')\n")
    monkeypatch.syspath_prepend(str(fake))
    monkeypatch.delitem(sys.modules, "parselmouth", raising=False)
    d = _five_tones(tmp_path / "wavs")
    rc = prepare_main(["--config", str(TINY_YAML), "--input", str(d), "--output", str(tmp_path / "o"),
                       "--num_workers", "2", "--set", "pe=parselmouth"])  # the demo's speech recipe tracks with pyin
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "'parselmouth' is not installed" in err and "pip install praat-parselmouth" in err
    assert "no usable audio" not in err
