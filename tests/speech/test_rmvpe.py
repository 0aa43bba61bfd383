"""rmvpe from a weights file: RVC's real rmvpe.onnx is not available offline, so a stand-in ONNX graph of the
same input and output ([1, 128, frames] log mel -> [1, frames, 360] salience) whose salience peaks at a known
bin wherever the mel holds sound checks the mel, the decoding onto the mel grid and the messages."""

from __future__ import annotations

import librosa
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from speech.f0 import check_f0_extractor, extract_f0, f0_extractor_id
from speech.rmvpe import CENTS_0, CENTS_STEP, N_BINS, F0WeightsError, decode, rmvpe_mel, weights_digest

SR, HOP = 22050, 256


def bin_of(f0: float) -> float:
    return (1200 * np.log2(f0 / 10) - CENTS_0) / CENTS_STEP


def stand_in(path, f0=220.0, bins=N_BINS, mels=128, scale=1.0):
    """salience[t, k] = 0.9 * exp(-(k - bin_of(f0))^2 / 2) * sigmoid(4 * (loudest log mel band of frame t + 6)):
    a peak at f0 where the frame has sound, ~0 in silence (log mel of silence is log(1e-5) = -11.5)."""
    k = np.arange(bins)
    pattern = (scale * 0.9 * np.exp(-0.5 * (k - bin_of(f0)) ** 2)).astype(np.float32).reshape(1, 1, bins)
    nodes = [
        helper.make_node("ReduceMax", ["mel", "axis1"], ["level"], keepdims=0),  # [1, T]
        helper.make_node("Add", ["level", "six"], ["shifted"]),
        helper.make_node("Mul", ["shifted", "four"], ["scaled"]),
        helper.make_node("Sigmoid", ["scaled"], ["gate"]),
        helper.make_node("Unsqueeze", ["gate", "axis2"], ["gate3"]),  # [1, T, 1]
        helper.make_node("Mul", ["gate3", "pattern"], ["salience"]),  # [1, T, bins]
    ]
    inits = [helper.make_tensor("axis1", TensorProto.INT64, [1], [1]),
             helper.make_tensor("axis2", TensorProto.INT64, [1], [2]),
             helper.make_tensor("six", TensorProto.FLOAT, [], [6.0]),
             helper.make_tensor("four", TensorProto.FLOAT, [], [4.0]),
             helper.make_tensor("pattern", TensorProto.FLOAT, pattern.shape, pattern.ravel())]
    graph = helper.make_graph(nodes, "rmvpe_stand_in",
                              [helper.make_tensor_value_info("mel", TensorProto.FLOAT, [1, mels, "T"])],
                              [helper.make_tensor_value_info("salience", TensorProto.FLOAT, [1, "T", bins])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_the_mel_is_librosas_and_the_decoding_recovers_a_bin_between_two():
    x = np.random.default_rng(0).standard_normal(16000).astype(np.float32) * 0.1
    ref = librosa.feature.melspectrogram(y=x, sr=16000, n_fft=1024, hop_length=160, power=1.0, n_mels=128, fmin=30,
                                         fmax=8000, htk=True, center=True, pad_mode="reflect")
    assert np.allclose(rmvpe_mel(x), np.log(np.maximum(ref, 1e-5)), atol=1e-4)
    sal = np.zeros((3, N_BINS))
    sal[0, 100:102] = 0.5  # two equal bins: halfway between them
    sal[1, 0] = 0.9  # the lowest bin (the window runs past the end): exactly its own value
    sal[2, 200] = 0.02  # under the threshold: unvoiced
    f0 = decode(sal)
    assert f0[0] == pytest.approx(10 * 2 ** ((CENTS_0 + 20 * 100.5) / 1200))
    assert f0[1] == pytest.approx(10 * 2 ** (CENTS_0 / 1200)) and f0[2] == 0


def test_rmvpe_gives_the_known_f0_on_the_mel_grid_and_is_identified_by_its_weights(tmp_path):
    weights = str(stand_in(tmp_path / "rmvpe.onnx", f0=220.0))
    check_f0_extractor("rmvpe", weights)
    t = np.arange(SR) / SR
    x = (0.3 * np.sin(2 * np.pi * 330 * t) * (t < 0.5)).astype(np.float32)  # sound, then silence
    n = len(x) // HOP
    f0, voiced = extract_f0(x, SR, HOP, n, 50.0, 1100.0, "rmvpe", weights)
    assert f0.shape == voiced.shape == (n,)
    centres = (np.arange(n) + 0.5) * HOP / SR
    assert voiced[(centres > 0.05) & (centres < 0.45)].all() and not voiced[centres > 0.56].any()
    assert np.abs(f0[voiced] - 220.0).max() < 0.05  # the stand-in's peak, decoded between bins
    # f0_max under the peak: unvoiced, as the other extractors never report beyond their bounds
    assert not extract_f0(x, SR, HOP, n, 50.0, 200.0, "rmvpe", weights)[1].any()
    ident = f0_extractor_id("rmvpe", weights)
    assert ident == {"f0_extractor": "rmvpe", "f0_weights_sha256": weights_digest(weights)}
    other = stand_in(tmp_path / "other.onnx", f0=300.0)
    assert f0_extractor_id("rmvpe", other) != ident and f0_extractor_id("crepe") == {"f0_extractor": "crepe"}


def test_a_missing_unreadable_or_foreign_weights_file_is_one_message(tmp_path):
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    (tmp_path / "rmvpe.pt").write_bytes(b"\x80\x02")
    cases = {None: "needs its weights file", tmp_path / "none.onnx": "does not exist",
             tmp_path / "junk.onnx": "is not an ONNX model onnxruntime can load",
             tmp_path / "rmvpe.pt": "is a PyTorch checkpoint",
             stand_in(tmp_path / "bins.onnx", bins=100): "is not RVC's rmvpe graph",
             stand_in(tmp_path / "mels.onnx", mels=80): "is not RVC's rmvpe graph"}
    for path, words in cases.items():
        with pytest.raises(F0WeightsError, match=words) as e:
            check_f0_extractor("rmvpe", path)
        assert "\n" not in str(e.value) and (path is None or str(path) in str(e.value))
