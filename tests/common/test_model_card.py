"""Every export writes a model card (common/model_card.py): the trainer, the steps, the held-out figures, the data's
sources and licence as prepare recorded them, and the code's licence. Exports of the tiny checkpoints in
tests/data/checkpoints_5caa793/ (cloning: a tiny one made here), the ONNX graphs stubbed (the export tests'
subject)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

import tts.clone.export_onnx as clone_export
import tts.vits.export_onnx as vits_export
from common.config import config_to_dict
from common.model_card import DATA_SOURCE, card_path, data_source, read_data_source
from tts.clone.config import CloneConfig
from tts.clone.model import VoiceCloneTTS
from tts.text import SYMBOLS
from vocoder.export import export as vocoder_export

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "checkpoints_5caa793"
SOURCE = {"inputs": ["/data/corpus"], "data_licence": "CC-BY 4.0 (a test corpus)", "licence_files": {}}


def clone_checkpoint() -> dict:
    """A tiny cloning checkpoint of today's model (the fixture's predates a change of the tiny size)."""
    cfg = CloneConfig()
    cfg.model.size = "tiny"
    model = VoiceCloneTTS(cfg.model, len(SYMBOLS), cfg.audio.n_mels)
    return {"trainer": "clone", "models": {"model": model.state_dict()}, "config": config_to_dict(cfg),
            "counters": {"step": 3}}


def with_source(name: str, folder: Path) -> Path:
    """The fixture checkpoint `name` with `SOURCE` in its `extra` (as a trainer writes it after a prepare that
    recorded one) and a best.json beside it, as a run's checkpoints folder holds."""
    ckpt = (clone_checkpoint() if name == "clone" else
            torch.load(FIXTURES / f"{name}.pt", weights_only=True, map_location="cpu"))
    ckpt.setdefault("extra", {})[DATA_SOURCE] = SOURCE
    folder.mkdir(parents=True)
    torch.save(ckpt, folder / "best.pt")
    (folder / "best.json").write_text(json.dumps({"metric": 1.25, "step": 3, "mode": "min", "by": "mel_l1"}))
    return folder / "best.pt"


def assert_card(card: Path, trainer: str) -> None:
    text = card.read_text(encoding="utf-8")
    assert f"trainer: `{trainer}`" in text and "steps trained: 3" in text
    assert "data licence: CC-BY 4.0 (a test corpus)" in text and "code: MIT" in text
    assert "best.pt: mel_l1 1.25 at step 3" in text and "```yaml" in text


def test_prepare_records_inputs_licence_flag_and_licence_files(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "COPYING").write_text("\nGNU GENERAL PUBLIC LICENSE Version 2\n...")
    record = data_source([corpus, None], "GPL-2 (the test's)")
    assert record == {"inputs": [str(corpus.resolve())], "data_licence": "GPL-2 (the test's)",
                      "licence_files": {str(corpus.resolve() / "COPYING"): "GNU GENERAL PUBLIC LICENSE Version 2"}}
    prepared = tmp_path / "prepared"
    prepared.mkdir()
    assert read_data_source(prepared) is None  # prepared before it was recorded: the card says so
    (prepared / "report.json").write_text(json.dumps({DATA_SOURCE: record}))
    assert read_data_source(prepared / "train.jsonl") == record  # a file in the folder names it too


def test_vocoder_export_card(tmp_path):
    out = vocoder_export(with_source("vocoder", tmp_path / "run" / "checkpoints"), tmp_path / "export")
    assert_card(out / "README.md", "vocoder")
    assert "last validation (step 3): mrstft" in (out / "README.md").read_text(encoding="utf-8")


def test_vits_and_clone_onnx_exports_write_a_card_beside_the_model(tmp_path, monkeypatch):
    def stub(model, out, opset=17):
        Path(out).write_bytes(b"onnx")
        return Path(out)

    for module, name in ((vits_export, "vits"), (clone_export, "clone")):
        monkeypatch.setattr(module, "export", stub)
        ckpt = with_source(name, tmp_path / name / "checkpoints")
        out = tmp_path / name / "model.onnx"
        assert module.main(["--checkpoint", str(ckpt), "--out", str(out), "--no_check"]) == 0
        assert card_path(out) == out.with_name("model.onnx.README.md")
        assert_card(card_path(out), name)
        shutil.rmtree(tmp_path / name / "checkpoints")
