"""Model files a config names are data (issue "Never lose a run, round 4", item 5; `common.model_files`):
a file whose pickle would run code (it writes a marker file here) given as the speaker encoder, the rFID
weights or the rmvpe weights never runs it and is one line naming the file; a TorchScript module or a `.pt2`
program loads only with TRUST_CODE_FILES=1; what a user's encoder returns is checked (raising, a wrong shape,
too many values, not floating) in one line naming the file; an fp64 state dict is converted."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from common.errors import UserError
from common.model_files import (
    TRUST_CODE_ENV,
    ModelFileError,
    check_output,
    code_kind,
    float32_weights,
    load_weights,
)
from speech import rmvpe
from speech import speaker_similarity as ss


class Payload:
    """Unpickling this writes `marker`: what a hostile model file does instead of writing a file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').write('ran')",)


@pytest.fixture
def hostile(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """(folder of files whose loading would run code, the marker it would write). The opt-in is unset."""
    monkeypatch.delenv(TRUST_CODE_ENV, raising=False)
    marker = tmp_path / "marker"
    folder = tmp_path / "files"
    folder.mkdir()
    state = {"lstm.weight_ih_l0": torch.zeros(2), "payload": Payload(marker)}
    for name in ("encoder.pt", "pt_inception.pth", "rmvpe.pt"):
        torch.save(state, folder / name)
    (folder / "rmvpe.onnx").write_bytes((folder / "rmvpe.pt").read_bytes())  # a pickle under an ONNX name
    _pt2_with_pickled_weight(folder / "encoder.pt2", folder / "encoder.pt")
    with zipfile.ZipFile(folder / "script.pt", "w") as z:  # TorchScript's layout, under a plain .pt name
        z.writestr("m/code/__torch__.py", "def forward(self, x): return x\n")
        z.writestr("m/constants.pkl", b"")
        z.writestr("m/data.pkl", (folder / "encoder.pt").read_bytes())
    return folder, marker


def _pt2_with_pickled_weight(path: Path, pickled: Path) -> None:
    """The records of a torch.export program whose weight is marked `use_pickle` and holds `pickled`'s bytes.
    `torch.export.load` reads such a weight with `torch.load(weights_only=False)`: with a real program around
    it (its models/model.json; torch.export costs ~5 s, too slow for this suite) the loader before this change
    ran the payload (the marker appeared), then gave a traceback. Now nothing of a .pt2 is read without the opt-in."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("enc/archive_format", "pt2")
        z.writestr("enc/archive_version", "0")
        z.writestr("enc/data/weights/model_weights_config.json",
                   json.dumps({"config": {"w": {"path_name": "weight_0", "is_param": True, "use_pickle": True}}}))
        z.writestr("enc/data/weights/weight_0", pickled.read_bytes())


def _one_line(text: str, path: Path) -> None:
    assert "\n" not in text and str(path) in text, text


def test_a_pickled_payload_as_speaker_encoder_never_runs(hostile):
    folder, marker = hostile
    for name in ("encoder.pt", "encoder.pt2", "script.pt"):
        lines = []
        assert ss.load_speaker_encoder(str(folder / name), say=lines.append) is None
        assert len(lines) == 1 and lines[0].startswith("speaker similarity off: "), lines
        _one_line(lines[0], folder / name)
        if name != "encoder.pt":  # code-carrying: the message names the opt-in and the safe alternative
            assert f"{TRUST_CODE_ENV}=1" in lines[0] and "state dict" in lines[0], lines
        else:
            assert "pickled code" in lines[0], lines
    assert not marker.exists()


def test_a_pickled_payload_as_rfid_weights_never_runs(hostile):
    from vae import rfid  # the file is refused before pytorch-fid is imported

    folder, marker = hostile
    for name in ("pt_inception.pth", "encoder.pt2", "script.pt"):
        lines = []
        assert rfid.load_inception(str(folder / name), say=lines.append) is None
        assert len(lines) == 1 and lines[0].startswith("rFID off: "), lines
        _one_line(lines[0], folder / name)
        with pytest.raises(ModelFileError) as info:  # best_by rfid: the same refusal stops the run (exit 2)
            rfid.load_inception(str(folder / name), say=pytest.fail, required=True)
        _one_line(str(info.value), folder / name)
    assert not marker.exists()


def test_a_pickled_payload_as_rmvpe_weights_never_runs(hostile):
    folder, marker = hostile
    for name in ("rmvpe.pt", "rmvpe.onnx"):
        with pytest.raises(rmvpe.F0WeightsError) as info:
            rmvpe.load_session(folder / name)
        _one_line(str(info.value), folder / name)
    assert not marker.exists()


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="FIFOs need POSIX")
def test_a_fifo_or_folder_named_as_a_model_file_is_one_line_and_never_blocks(tmp_path):
    import os

    os.mkfifo(tmp_path / "encoder.pt")
    (tmp_path / "rmvpe.onnx").mkdir()
    lines = []
    assert ss.load_speaker_encoder(str(tmp_path / "encoder.pt"), say=lines.append) is None
    assert len(lines) == 1 and "is a FIFO" in lines[0], lines
    with pytest.raises(rmvpe.F0WeightsError, match="is a folder"):
        rmvpe.load_session(tmp_path / "rmvpe.onnx")
    os.mkfifo(tmp_path / "weights.pth")
    with pytest.raises(ModelFileError, match="is a FIFO"):
        load_weights(tmp_path / "weights.pth", "weights")


def test_code_files_are_recognised_by_suffix_and_by_their_records(tmp_path, hostile):
    folder, _ = hostile
    assert code_kind(folder / "encoder.pt2") == "a torch.export program (.pt2)"
    assert code_kind(folder / "script.pt") == "a TorchScript module"
    assert code_kind(folder / "encoder.pt") is None  # a torch.save file (its payload refused by weights_only)


class Encoder(torch.nn.Module):
    """A user's encoder returning `out(wav)`."""

    def __init__(self, out) -> None:
        super().__init__()
        self.out = out

    def forward(self, wav):
        return self.out(wav)


def _boom(wav):
    raise RuntimeError("shape mismatch\nsecond line")


@pytest.mark.parametrize("out, words", [
    (_boom, "failed on a waveform of 16000 samples (RuntimeError: shape mismatch)"),
    (lambda wav: torch.zeros(2, 8), "returned shape [2, 8] for one waveform"),
    (lambda wav: torch.zeros(1, 2, 3), "returned a tensor of shape [1, 2, 3]"),
    (lambda wav: torch.zeros(1, ss.MAX_EMBEDDING + 1), f"with 1 to {ss.MAX_EMBEDDING} values"),
    (lambda wav: torch.zeros(1, 8, dtype=torch.int64), "dtype torch.int64, not floating point"),
    (lambda wav: [1.0, 2.0], "returned list, not a tensor"),
])
def test_what_a_users_encoder_returns_is_checked_in_one_line(out, words):
    enc = ss.SpeakerEncoder("/models/enc.pt2", wav_net=Encoder(out))
    with pytest.raises(ModelFileError) as info:
        enc.embed(np.zeros(16000, np.float32), ss.SAMPLE_RATE)
    assert isinstance(info.value, UserError) and words in str(info.value)
    _one_line(str(info.value), Path("/models/enc.pt2"))


def test_a_good_users_encoder_gives_a_unit_embedding():
    enc = ss.SpeakerEncoder("enc.pt2", wav_net=Encoder(lambda wav: torch.tensor([[3.0, 4.0]])))
    assert np.allclose(enc.embed(np.zeros(1600, np.float32), ss.SAMPLE_RATE), [0.6, 0.8])


def test_a_float64_speaker_state_dict_is_converted(tmp_path):
    with torch.random.fork_rng():
        torch.manual_seed(0)
        state = ss.VoiceEncoderNet().double().state_dict()
    torch.save({"model_state": state}, tmp_path / "fine_tuned.pt")
    enc = ss.load_speaker_encoder(str(tmp_path / "fine_tuned.pt"), say=pytest.fail)
    assert {p.dtype for p in enc.mel_net.parameters()} == {torch.float32}


def test_float32_weights_converts_and_refuses_nan_naming_the_tensor():
    state = {"a": torch.ones(2, dtype=torch.float16), "b": {"c": torch.ones(2, dtype=torch.float64)},
             "n": torch.arange(3)}
    out = float32_weights(state, "w.pth", "weights")
    assert out["a"].dtype == out["b"]["c"].dtype == torch.float32 and out["n"].dtype == torch.int64
    with pytest.raises(ModelFileError, match=r"weights w.pth: tensor 'x' holds NaN"):
        float32_weights({"x": torch.tensor([1.0, float("nan")])}, "w.pth", "weights")


def test_check_output_accepts_what_is_asked():
    assert check_output(torch.zeros(1, 4), "f", "encoder", (1, 2), 8).shape == (1, 4)
