"""prepare_data.py --mel_dir (an acoustic model's GTA mels): a folder that fits is prepared with its
mels, a single misfit file is skipped with its reason, a folder that does not fit stops with exit 2
before anything is written, and training crops keep mel, audio and f0 on one frame grid."""

import json

import numpy as np
import pytest
import soundfile as sf

from common.config import load_config
from speech.mel_files import MEL_SETTINGS_FILE, write_mel_settings
from vocoder.config import VocoderConfig
from vocoder.data import DatasetError, VocoderDataset, load_manifest
from vocoder.prepare_data import main as prepare_main

from .conftest import DEMO_YAML, tiny_config, voiced_tone

SR, HOP, N_MELS = 22050, 256, 80
NAMES = ("a", "b", "c", "d")


def frame_feature(audio: np.ndarray, frames: int) -> np.ndarray:
    """A 'GTA mel' that is a known function of the audio: frame i's log-RMS, plus a per-bin offset."""
    rms = np.sqrt((audio[: frames * HOP].reshape(frames, HOP) ** 2).mean(1) + 1e-9)
    return (np.log(rms)[None, :] + 0.01 * np.arange(N_MELS)[:, None]).astype(np.float32)


def make_folder(root, frames_delta=None):
    """Audio in root/wavs, its mels in root/mels (frames_delta: name -> frames added to that mel)."""
    wavs, mels = root / "wavs", root / "mels"
    wavs.mkdir(parents=True)
    mels.mkdir()
    for i, name in enumerate(NAMES):
        audio = voiced_tone(0.7 + 0.1 * i, SR, seed=i)
        sf.write(wavs / f"{name}.wav", audio, SR, subtype="FLOAT")
        frames = len(audio) // HOP
        mel = frame_feature(audio, frames)
        delta = (frames_delta or {}).get(name, 0)
        mel = np.concatenate([mel, mel[:, -1:]], 1) if delta == 1 else mel[:, : frames + delta]
        np.save(mels / f"{name}.npy", mel)
    write_mel_settings(mels, load_config(DEMO_YAML, VocoderConfig).audio)
    return wavs, mels


def run_prepare(wavs, mels, out, *extra):
    return prepare_main(["--config", str(DEMO_YAML), "--input", str(wavs), "--output", str(out), "--mel_dir",
                         str(mels), "--num_workers", "0", "--set", "val_num=1", *extra])


def test_good_folder_with_one_bad_file(tmp_path, capsys):
    wavs, mels = make_folder(tmp_path, {"a": 1, "b": -1, "c": -5})  # ±1 trimmed, 5 frames off skipped
    out = tmp_path / "bin"
    assert run_prepare(wavs, mels, out) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["settings"]["mel_dir"] == str(mels.resolve())
    assert len(manifest["items"]) == 3
    report = (out / "report.txt").read_text()
    assert "1 skipped" in report and "c.wav: mel c.npy has" in report and "frames" in report
    for iid, item in manifest["items"].items():
        d = out / "items" / iid
        audio, mel = np.load(d / "audio.npy"), np.load(d / "mel.npy")
        frames = item["frames"]
        assert mel.shape == (frames, N_MELS) and len(audio) == frames * HOP and len(np.load(d / "f0.npy")) == frames
        source = sf.read(item["source"], dtype="float32")[0]
        assert frames == min(len(source) // HOP, len(source) // HOP + {"a": 1, "b": -1, "d": 0}[iid[0]])
        np.testing.assert_allclose(mel.T, frame_feature(source, frames), rtol=1e-5)  # the given mel, not a computed one


@pytest.mark.parametrize("case, words", [
    ("missing", ["1 audio file(s) have no mel", "b.npy"]),
    ("extra", ["1 mel(s) have no audio file", "zz.npy"]),
    ("misaligned", ["3 of 4 mels are misaligned", "hop"]),
    ("settings", ["hop_length: mels 512 vs config 256"]),
    ("no_settings", [MEL_SETTINGS_FILE]),
    ("shared", ["1 mel(s) would serve two audio files", "a.npy", "its own --mel_dir"]),
])
def test_folder_that_does_not_fit_stops_before_writing(tmp_path, capsys, case, words):
    wavs, mels = make_folder(tmp_path, {"a": -30, "b": -30, "c": -30} if case == "misaligned" else None)
    if case == "missing":
        (mels / "b.npy").unlink()
    elif case == "extra":
        np.save(mels / "zz.npy", np.zeros((N_MELS, 10), np.float32))
    elif case == "settings":
        settings = json.loads((mels / MEL_SETTINGS_FILE).read_text())
        (mels / MEL_SETTINGS_FILE).write_text(json.dumps({**settings, "hop_length": 512}))
    elif case == "no_settings":
        (mels / MEL_SETTINGS_FILE).unlink()
    extra = []
    if case == "shared":  # a second --input folder with a file named like one of the first's
        (tmp_path / "more").mkdir()
        (tmp_path / "more" / "a.wav").write_bytes((wavs / "a.wav").read_bytes())
        extra = ["--input", str(wavs), str(tmp_path / "more")]
    out = tmp_path / "bin"
    assert run_prepare(wavs, mels, out, *extra) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--mel_dir {mels}" in err
    for w in words:
        assert w in err
    assert not out.exists()  # nothing written


def test_training_crops_keep_mel_audio_f0_aligned(tmp_path):
    wavs, mels = make_folder(tmp_path)
    out = tmp_path / "bin"
    # tiny_config's f0 settings (Praat, the singing range), not the demo's speech ones: the manifest must match
    assert run_prepare(wavs, mels, out, "--set", "pe=parselmouth", "--set", "f0_min=65", "--set", "f0_max=1100") == 0
    cfg = tiny_config("crop_mel_frames=16", "volume_aug=false")
    manifest = load_manifest(out, cfg)
    data = VocoderDataset(out, manifest["train"], cfg, train=True)
    starts = set()
    for key in range(12):
        sample = data[(key, 0, 0)]
        item = out / "items" / sample["name"]
        full_mel, full_f0 = np.load(item / "mel.npy").T, np.load(item / "f0.npy")
        mel, audio = sample["mel"].numpy(), sample["audio"].numpy()
        assert mel.shape == (N_MELS, 16) and audio.shape == (16 * HOP,)
        np.testing.assert_allclose(mel, frame_feature(audio, 16), rtol=1e-5)  # the crop's mel is its audio's
        start = [s for s in range(full_mel.shape[1] - 15) if np.array_equal(full_mel[:, s:s + 16], mel)]
        assert len(start) == 1
        np.testing.assert_array_equal(sample["f0"].numpy(), full_f0[start[0]:start[0] + 16])
        starts.add(start[0])
    assert len(starts) > 3  # really random crops, not always the first window
    with pytest.raises(DatasetError, match="key_aug=false"):
        load_manifest(out, tiny_config("key_aug=true"))


def test_a_dataset_prepared_with_other_f0_settings_is_refused(tiny_data):
    """Training reads the stored f0 and the export tells inference to extract it with the config's pe /
    f0 range: a config that differs from the data's would export a claim the model was not trained on."""
    load_manifest(tiny_data, tiny_config())  # the settings it was prepared with
    with pytest.raises(DatasetError, match=r"other audio or f0 settings \(pe: data parselmouth vs config pyin; "
                                           r"f0_max: data \S+ vs config 500"):
        load_manifest(tiny_data, tiny_config("pe=pyin", "f0_max=500"))
