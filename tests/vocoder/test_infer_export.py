"""Public inference API + export round trip: export -> load_vocoder -> the same audio as the
training checkpoint; the DiffSinger/OpenUtau layout; the infer CLI."""

import json

import numpy as np
import pytest
import soundfile as sf
import torch

from common.audio import MelSpectrogram
from common.checkpoint import load_checkpoint
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
