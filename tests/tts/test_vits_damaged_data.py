"""A VITS prepared file damaged after preparation (a spec or wav deleted, garbage, cut short, a NaN in a spec,
a garbage speakers.json): tts/train.py stops with one line naming the file and the prepare command (exit 2),
also from loader workers, never a traceback or a divergence (exit 3); running tts/prepare_data.py again
makes the damaged files again and keeps their utterances."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import soundfile as sf

from tests.damage import damage
from tests.tts.test_vits_train import _args, _corpus
from tts.prepare_data import main as prepare_main
from tts.vits import train as train_mod
from tts.vits.config import AudioConfig
from tts.vits.data import VitsDataset

COMMAND = "`python tts/prepare_data.py --metadata <metadata> --audio_dir <audio folder> --output_dir"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    return _corpus(tmp_path_factory.mktemp("damaged"), ["anna"])


@pytest.fixture
def data(prepared, tmp_path) -> Path:
    """A copy of the prepared corpus, to damage."""
    return shutil.copytree(prepared, tmp_path / "prepared")


def _train_rows(data: Path) -> list[dict]:
    return [json.loads(line) for line in (data / "train.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("key,how,workers", [("spec", "delete", 0), ("spec", "garbage", 0), ("spec", "truncate", 0),
                                             ("spec", "nan", 0), ("wav", "delete", 0), ("wav", "garbage", 0),
                                             ("wav", "truncate", 0), ("spec", "truncate", 2)])
def test_a_damaged_spec_or_wav_stops_training_with_one_line_naming_it(data, tmp_path, capsys, key, how, workers):
    rows = _train_rows(data)
    for row in rows:  # every training item: the first batch meets one
        damage(data / row[key], how)
    rc = train_mod.main(_args(data, tmp_path / "run", f"num_workers={workers}", "persistent_workers=false", steps=2))
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err and "learning rate" not in err, err
    assert any(err.startswith(f"error: prepared file {data / row[key]} ") for row in rows), err
    assert COMMAND in err
    expected = {"delete": "is missing", "nan": "holds NaN or infinite values", "garbage": "is damaged",
                "truncate": "is damaged" if key == "spec" else "samples, its manifest line says"}[how]
    assert expected in err


def test_a_damaged_speakers_json_is_one_line(data, tmp_path, capsys):
    damage(data / "speakers.json", "garbage")
    assert train_mod.main(_args(data, tmp_path / "run", steps=2)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: prepared file {data / 'speakers.json'} is damaged (not UTF-8 JSON")
    assert err.count("\n") == 1 and COMMAND in err


def test_prepare_again_makes_damaged_files_again_and_keeps_their_utterances(prepared, data, capsys):
    root = prepared.parent  # the corpus: metadata.csv and audio/
    rows = _train_rows(data)
    damage(data / rows[0]["wav"], "garbage")
    damage(data / rows[1]["spec"], "truncate")
    damage(data / rows[2]["spec"], "delete")
    damage(data / rows[3]["spec"], "nan")
    kept = (data / rows[4]["spec"]).stat().st_mtime_ns
    capsys.readouterr()
    assert prepare_main(["--metadata", str(root / "metadata.csv"), "--audio_dir", str(root / "audio"),
                         "--output_dir", str(data), "--speaker_from_path", "--num_workers", "1",
                         "--set", "data.eval_split_size=1", "--no_trim"]) == 0
    printed = capsys.readouterr().out
    for why in (f"{data / rows[0]['wav']} is damaged", f"{data / rows[1]['spec']} is damaged",
                f"{data / rows[2]['spec']} is missing", f"{data / rows[3]['spec']} holds NaN or infinite values"):
        assert f"damaged prepared file made again from its source: {why}" in printed
    assert [r["id"] for r in _train_rows(data)] == [r["id"] for r in rows]  # no utterance dropped
    assert (data / rows[4]["spec"]).stat().st_mtime_ns == kept  # an intact file is kept
    dataset = VitsDataset(data, "train", AudioConfig())
    for i in range(len(dataset)):
        item = dataset[i]
        assert item["wav"].numel() == rows[i]["num_samples"] // 256 * 256
    assert sf.info(data / rows[0]["wav"]).frames == rows[0]["num_samples"]
