"""A prepared item or manifest damaged after preparation (cut short, garbage, deleted, a NaN written into a
mel): training stops with one line naming the file and the prepare command (exit 2), also from loader
workers and on resume, never a traceback or a divergence (exit 3); running the prepare again makes the
damaged item again and keeps its utterance."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tests.damage import damage
from vocoder.prepare_data import main as prepare_main
from vocoder.train import main as train_main

from .conftest import TINY_YAML


def _args(data, run, *extra: str) -> list[str]:
    return ["--config", str(TINY_YAML), "--data_dir", str(data), "--run_dir", str(run), "--device", "cpu",
            "--set", "max_updates=2", *extra]


def _one_line(err: str, path) -> None:
    """stderr holds one error line (besides the progress bar), naming `path` and the prepare command."""
    lines = [line for line in err.replace("\r", "\n").split("\n") if line.strip() and not line.startswith("vocoder:")]
    assert len(lines) == 1 and lines[0].startswith(f"error: prepared file {path} "), err
    assert "Traceback" not in err and "learning rate" not in err
    assert "`python vocoder/prepare_data.py --config <this run's config> --input <audio folders> --output" in err


@pytest.fixture
def data(tiny_data, tmp_path):
    """A copy of the prepared tiny set, to damage."""
    return shutil.copytree(tiny_data, tmp_path / "bin")


@pytest.mark.parametrize("key,how,workers", [("mel", "truncate", 0), ("mel", "garbage", 0), ("audio", "truncate", 0),
                                             ("f0", "delete", 0), ("mel", "nan", 0), ("mel", "nan", 2),
                                             ("audio", "garbage", 2)])
def test_a_damaged_item_stops_training_with_one_line_naming_it(data, tmp_path, capsys, key, how, workers):
    train = json.loads((data / "manifest.json").read_text())["train"]
    for name in train:  # every training item: the first batch meets one
        damage(data / "items" / name / f"{key}.npy", how)
    rc = train_main(_args(data, tmp_path / "run", "--set", f"num_workers={workers}"))
    err = capsys.readouterr().err
    assert rc == 2, err
    named = next(data / "items" / n / f"{key}.npy" for n in train if str(data / "items" / n) in err)
    _one_line(err, named)
    assert ("holds NaN or infinite values" if how == "nan" else "is missing" if how == "delete" else "is damaged") in err


def test_a_damaged_manifest_stops_the_first_run_and_a_resume_with_one_line(data, tmp_path, capsys):
    run = tmp_path / "run"
    assert train_main(_args(data, run)) == 0
    capsys.readouterr()
    (data / "manifest.json").write_bytes(b"\x82\x00 not json")
    for extra in (["--resume", "auto", "--set", "max_updates=4"], ["--run_dir", str(tmp_path / "new")]):
        assert train_main(_args(data, run, *extra)) == 2
        _one_line(capsys.readouterr().err, data / "manifest.json")
    (data / "manifest.json").write_text(json.dumps({"format_version": 1, "settings": {}, "train": 3, "valid": []}))
    assert train_main(_args(data, run, "--resume", "auto")) == 2
    assert "manifest.json is damaged (train not as prepare_data.py writes them)" in capsys.readouterr().err


def test_prepare_again_makes_the_damaged_items_and_manifest_again(tiny_data, tmp_path, capsys):
    wavs = tiny_data.parent / "wavs"
    out = tmp_path / "bin"
    prepare = ["--config", str(TINY_YAML), "--input", str(wavs),
               "--output", str(out)]
    assert prepare_main(prepare) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    first, second, third = manifest["train"][:3]
    kept = (out / "items" / third / "mel.npy").stat().st_mtime_ns
    damage(out / "items" / first / "mel.npy", "truncate")
    damage(out / "items" / second / "f0.npy", "nan")
    damage(out / "manifest.json", "garbage")
    capsys.readouterr()
    assert prepare_main(prepare) == 0
    printed = capsys.readouterr().out
    assert f"damaged prepared item {out / 'items' / first}: mel.npy is damaged" in printed
    assert f"damaged prepared item {out / 'items' / second}: f0.npy holds NaN or infinite values" in printed
    assert "3 already done, 2 to process" in printed
    again = json.loads((out / "manifest.json").read_text())
    assert again["train"] == manifest["train"] and again["valid"] == manifest["valid"]  # no utterance dropped
    assert np.isfinite(np.load(out / "items" / second / "f0.npy")).all()
    assert np.load(out / "items" / first / "mel.npy").shape == (manifest["items"][first]["frames"], 80)
    assert (out / "items" / third / "mel.npy").stat().st_mtime_ns == kept  # an intact item is kept
    assert train_main(_args(out, tmp_path / "run")) == 0
