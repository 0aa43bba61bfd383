"""Public inference API + export round trip: export -> load_vocoder -> the same audio as the
training checkpoint; the DiffSinger/OpenUtau layout; the OpenUtau dependency package (.oudep); the infer CLI."""

import errno
import json
import re
import zipfile

import numpy as np
import pytest
import soundfile as sf
import torch
import yaml

from common.checkpoint import load_checkpoint
from speech.audio import MelSpectrogram
from vocoder.export import export
from vocoder.export import main as export_main
from vocoder.infer import VocoderInference, load_vocoder
from vocoder.infer import main as infer_main
from vocoder.train import VocoderTrainer

from .conftest import tiny_config, voiced_tone


@pytest.fixture(scope="module")
def trained(tiny_data, tmp_path_factory):
    run = tmp_path_factory.mktemp("infer_run")
    tr = VocoderTrainer(tiny_config("max_updates=2", "model_args.mini_nsf=false"), tiny_data, run,
                        device="cpu", log=lambda *a, **k: None)
    tr.fit()
    return run / "checkpoints" / "model_00000002.pt"


def test_export_round_trip_gives_the_same_audio(trained, tmp_path):
    out = export(trained, tmp_path / "export")
    assert (out / "model.ckpt").is_file() and (out / "config.json").is_file()
    info = json.loads((out / "config.json").read_text())
    for key in ("sampling_rate", "num_mels", "hop_size", "n_fft", "win_size", "fmin", "fmax", "upsample_rates",
                "upsample_kernel_sizes", "upsample_initial_channel", "resblock", "resblock_kernel_sizes",
                "resblock_dilation_sizes", "mini_nsf", "noise_sigma", "pc_aug"):
        assert key in info, key
    assert (info["sampling_rate"], info["hop_size"], info["num_mels"]) == (22050, 256, 80)
    sd = load_checkpoint(out / "model.ckpt")["generator"]
    assert "conv_pre.weight_g" in sd and "conv_pre.weight_v" in sd  # DiffSinger's weight-norm names
    assert not any("parametrizations" in k for k in sd)

    mel = torch.randn(2, 80, 12) - 5
    f0 = torch.linspace(120, 240, 12).repeat(2, 1)
    outs = []
    for path in (trained, out, out / "model.ckpt"):
        voc = load_vocoder(path)
        torch.manual_seed(0)  # the full NSF source draws noise and phases
        outs.append(voc(mel, f0))
    assert outs[0].shape == (2, 12 * 256)
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(outs[2], outs[1], atol=0, rtol=0)


def test_inference_api_contract(trained):
    voc = load_vocoder(trained, device="cpu")
    assert isinstance(voc, VocoderInference)
    assert (voc.sample_rate, voc.hop_length, voc.n_fft, voc.win_length, voc.n_mels) == (22050, 256, 1024, 1024, 80)
    assert (voc.fmin, voc.fmax) == (40.0, 8000.0)
    wav = voiced_tone(0.6, 22050)
    mel = voc.mel(torch.from_numpy(wav)[None])
    ref = MelSpectrogram(**voc.mel_kwargs)(torch.from_numpy(wav)[None])
    torch.testing.assert_close(mel, ref)
    f0 = voc.f0(wav)
    assert f0.shape == (mel.shape[-1],) == (len(wav) // 256,)
    assert np.median(f0) == pytest.approx(180, rel=0.05)
    out = voc(mel, torch.from_numpy(f0)[None])
    assert out.shape == (1, mel.shape[-1] * 256) and not out.requires_grad
    assert not any(hasattr(m, "parametrizations") for m in voc.generator.modules())
    with pytest.raises(ValueError, match="bins"):
        voc(torch.zeros(1, 79, 5), torch.zeros(1, 5))


def test_infer_and_export_cli(trained, tmp_path, capsys):
    assert export_main(["--ckpt", str(trained), "--out", str(tmp_path / "exp"), "--onnx"]) == 0
    assert (tmp_path / "exp" / "model.onnx").is_file() and (tmp_path / "exp" / "vocoder.yaml").is_file()
    card = (tmp_path / "exp" / "README.md").read_text(encoding="utf-8")  # prepare -> checkpoint -> card
    assert "trainer: `vocoder`" in card and f"steps trained: {load_checkpoint(trained)['counters']['step']}" in card
    assert "data licence: CC0 (tones made by the tests)" in card and "code: MIT" in card
    wavs = tmp_path / "in"
    wavs.mkdir()
    sf.write(wavs / "a.wav", voiced_tone(0.5, 44100), 44100)  # resampled to the model's 22.05 kHz
    np.savez(wavs / "b.npz", mel=np.random.randn(80, 10).astype(np.float32) - 5, f0=np.full(10, 150, np.float32))
    assert infer_main(["--model", str(tmp_path / "exp"), "--input", str(wavs), "--output", str(tmp_path / "out"),
                       "--device", "cpu"]) == 0
    assert "RTF" in capsys.readouterr().out
    a, sr = sf.read(tmp_path / "out" / "a.wav")
    b, _ = sf.read(tmp_path / "out" / "b.wav")
    assert sr == 22050 and len(a) == (22050 // 2) // 256 * 256 and len(b) == 10 * 256
    assert infer_main(["--model", str(tmp_path / "nope"), "--input", str(wavs), "--output", str(tmp_path / "o")]) == 2


def test_onnx_matches_torch_for_mini_nsf(tiny_data, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    tr = VocoderTrainer(tiny_config("max_updates=1"), tiny_data, tmp_path / "run", device="cpu",
                        log=lambda *a, **k: None)
    tr.fit()
    out = export(tmp_path / "run" / "checkpoints" / "model_00000001.pt", tmp_path / "exp", onnx=True)
    mel = np.random.randn(1, 16, 80).astype(np.float32) - 5
    f0 = np.full((1, 16), 200, np.float32)
    y = ort.InferenceSession(str(out / "model.onnx")).run(None, {"mel": mel, "f0": f0})[0]
    ref = load_vocoder(out)(torch.from_numpy(mel).transpose(1, 2), torch.from_numpy(f0)).numpy()
    np.testing.assert_allclose(y, ref, atol=1e-5)


# the keys OpenUtau reads: OudepMetadata (OpenUtau.Core/PackageManager.cs), DsVocoderConfig
# (OpenUtau.Core/DiffSinger/DiffSingerVocoder.cs)
OUDEP_KEYS = {"id", "name", "version", "description"}
VOCODER_YAML_KEYS = {"name", "model", "sample_rate", "hop_size", "win_size", "fft_size", "num_mel_bins",
                     "mel_fmin", "mel_fmax", "mel_base", "mel_scale", "pitch_controllable"}


def test_oudep_package(trained, tmp_path, capsys):
    ort = pytest.importorskip("onnxruntime")
    assert export_main(["--ckpt", str(trained), "--out", str(tmp_path / "My Vocoder"), "--oudep"]) == 0
    assert "My Vocoder.oudep" in capsys.readouterr().out
    package = tmp_path / "My Vocoder.oudep"  # beside the export folder, which is complete as with --onnx
    for name in ("model.ckpt", "config.json", "model.onnx", "vocoder.yaml"):
        assert (tmp_path / "My Vocoder" / name).is_file(), name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["My Vocoder", "My Vocoder.oudep"]  # no temp left

    with zipfile.ZipFile(package) as z:
        assert sorted(z.namelist()) == ["model.onnx", "oudep.yaml", "vocoder.yaml"]
        meta = yaml.safe_load(z.read("oudep.yaml"))
        voc = yaml.safe_load(z.read("vocoder.yaml"))
        onnx_bytes = z.read("model.onnx")
    assert OUDEP_KEYS <= set(meta) and meta["id"] == meta["name"] == "my-vocoder"
    assert re.fullmatch(r"[a-z0-9.-]+", meta["id"]) and isinstance(meta["version"], str)
    assert VOCODER_YAML_KEYS <= set(voc) and voc["name"] == meta["id"] and voc["model"] == "model.onnx"
    info = json.loads((tmp_path / "My Vocoder" / "config.json").read_text())
    assert (voc["sample_rate"], voc["hop_size"], voc["win_size"], voc["fft_size"], voc["num_mel_bins"]) == (
        info["sampling_rate"], info["hop_size"], info["win_size"], info["n_fft"], info["num_mels"]) == (
        22050, 256, 1024, 1024, 80)
    assert (voc["mel_fmin"], voc["mel_fmax"], voc["mel_base"], voc["mel_scale"]) == (40, 8000, "e", "slaney")
    assert voc["pitch_controllable"] is False
    assert onnx_bytes == (tmp_path / "My Vocoder" / "model.onnx").read_bytes()

    session = ort.InferenceSession(onnx_bytes)  # the model inside the package runs as OpenUtau feeds it
    mel = np.random.randn(1, 10, 80).astype(np.float32) - 5
    wav = session.run(None, {"mel": mel, "f0": np.full((1, 10), 200, np.float32)})[0]
    assert wav.shape == (1, 10 * 256) and np.isfinite(wav).all() and np.abs(wav).max() > 0


def test_oudep_refuses_a_checkpoint_without_mel_settings(trained, tmp_path, capsys):
    ckpt = load_checkpoint(trained)
    for key in ("fmin", "fmax", "n_fft"):
        del ckpt["extra"]["export"][key]
    torch.save(ckpt, tmp_path / "old.pt")
    out = tmp_path / "exp"
    assert export_main(["--ckpt", str(tmp_path / "old.pt"), "--out", str(out), "--oudep"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "old.pt" in err and "n_fft, fmin, fmax" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.pt"]  # nothing written


def test_oudep_full_disk_leaves_no_partial_package(trained, tmp_path, monkeypatch, capsys):
    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(zipfile.ZipFile, "write", disk_full)
    assert export_main(["--ckpt", str(trained), "--out", str(tmp_path / "exp"), "--oudep"]) == 2
    assert "disk full while writing" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp"]  # no .oudep, no temp file beside it


def test_an_rmvpe_model_whose_weights_are_elsewhere_is_one_line_before_any_file(trained, tmp_path, capsys):
    """An export records pe=rmvpe's weights by path; on another machine that path is gone: inference of audio says
    so once, before any file, and --pe_ckpt gives the weights (mel + f0 .npz inputs need none)."""
    from tests.speech.test_rmvpe import stand_in

    assert export_main(["--ckpt", str(trained), "--out", str(tmp_path / "exp")]) == 0
    info = json.loads((tmp_path / "exp" / "config.json").read_text())
    (tmp_path / "exp" / "config.json").write_text(json.dumps({**info, "pe": "rmvpe", "pe_ckpt": "/gone/rmvpe.onnx"}))
    wavs = tmp_path / "in"
    wavs.mkdir()
    sf.write(wavs / "a.wav", voiced_tone(0.5, 22050), 22050)
    args = ["--model", str(tmp_path / "exp"), "--input", str(wavs), "--device", "cpu"]
    capsys.readouterr()
    assert infer_main([*args, "--output", str(tmp_path / "o1")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "/gone/rmvpe.onnx" in err and "--pe_ckpt" in err, err
    assert not (tmp_path / "o1" / "a.wav").exists()
    assert infer_main([*args, "--output", str(tmp_path / "o2"), "--pe_ckpt", str(stand_in(tmp_path / "r.onnx"))]) == 0
    assert (tmp_path / "o2" / "a.wav").is_file()
