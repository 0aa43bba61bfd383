"""tts/export_clone_onnx.py: the voice-cloning acoustic model in ONNX gives PyTorch's mel and f0
(dynamic text, reference and frame lengths; a padded batch), and its metadata names the symbols."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from common.config import config_to_dict
from tts.clone.config import CloneConfig
from tts.clone.export_onnx import INPUTS, OnnxCloneAcoustic, main
from tts.clone.infer import text_ids
from tts.clone.model import VoiceCloneTTS
from tts.text import SYMBOLS

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed: the ONNX check needs it")


@pytest.fixture
def checkpoint(tmp_path):
    """A tiny model whose duration predictor gives ~3 frames per symbol, saved as train_main does."""
    torch.manual_seed(0)
    cfg = CloneConfig()
    cfg.model.size, cfg.model.dropout, cfg.audio.n_mels = "tiny", 0.0, 80
    model = VoiceCloneTTS(cfg.model, len(SYMBOLS), 80)
    with torch.no_grad():
        model.duration_predictor.out.bias.fill_(1.5)
        model.set_stats(torch.randn(80) - 5, torch.rand(80) + 0.5, 5.0, 0.3)
    path = tmp_path / "clone.pt"
    torch.save({"models": {"model": model.state_dict()}, "config": config_to_dict(cfg)}, path)
    return path, model.eval()


def test_onnx_export_matches_pytorch_with_dynamic_lengths_and_a_padded_batch(checkpoint, tmp_path, capsys):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        path, model = checkpoint
        out = tmp_path / "clone.onnx"
        assert main(["--checkpoint", str(path), "--out", str(out)]) == 0
        assert "onnxruntime matches PyTorch" in capsys.readouterr().out
        meta = json.loads((tmp_path / "clone.onnx.json").read_text(encoding="utf-8"))
        assert meta["symbols"] == list(SYMBOLS) and meta["audio"]["n_mels"] == 80 and meta["inputs"] == INPUTS

        # a batch of two texts and two references of different lengths, padded
        a, b = text_ids("Salom, dunyo!")[0], text_ids("Men o'zbek tilida gapirishni yaxshi ko'raman.")[0]
        text = torch.zeros(2, len(b), dtype=torch.long)
        text[0, :len(a)], text[1] = a, b
        ref = torch.randn(2, 80, 70) - 5
        args = (text, torch.tensor([len(a), len(b)]), ref, torch.tensor([45, 70]), torch.tensor([1.0]))
        with torch.no_grad():
            want = [t.numpy() for t in OnnxCloneAcoustic(model)(*args)]
        got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(
            None, {n: t.numpy() for n, t in zip(INPUTS, args, strict=True)})
        assert got[0].shape == want[0].shape and want[0].shape[2] > 2 * len(b)  # frames really expanded
        np.testing.assert_array_equal(got[2], want[2])
        assert got[2][0] < got[2][1]
        np.testing.assert_allclose(got[0], want[0], atol=1e-3)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-3)
    finally:
        torch.set_num_threads(before)


def test_bad_checkpoint_or_output_is_one_error_line_and_exit_2(checkpoint, tmp_path, capsys):
    path, _ = checkpoint
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    for argv, words in ((["--checkpoint", str(path), "--out", str(blocker / "sub.onnx")], "--out "),
                        (["--checkpoint", str(tmp_path / "missing.pt"), "--out", str(tmp_path / "m.onnx")],
                         "not found")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error:") and len(err.splitlines()) == 1 and words in err, err
