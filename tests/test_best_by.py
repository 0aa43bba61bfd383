"""`--best_by <metric>` (common.best_by) through short real runs of the four trainers, and the vocoder's new
held-out metrics (pitch errors, PESQ).

Each trainer trains a few steps validating at every step with a metric other than its default, one whose
direction differs where the trainer has one (VITS align_sharpness and VAE ssim are higher-is-better): best.json
names the metric and its direction, and its value is the best of the run's validations in that direction. An
unknown or unmeasured metric is exit 2 with one line naming the key and the trainer's metrics, before any file
is written; a resume that changes --best_by forgets the old best with one line instead of comparing two metrics.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from common import exit_codes
from common.best_by import METRICS, BestCheckpoints, check_best_by
from tests import test_run_contract as contract

TRAINERS = contract.TRAINERS
data = contract.data  # the four trainers' tiny data (a module fixture)


def _validations(name: str, run: Path) -> list[dict]:
    """Every validation's metrics, as the trainer records them."""
    if name == "vocoder":
        return json.loads((run / "summary.json").read_text())["validations"]
    if name == "clone":
        from common.checkpoint import load_checkpoint
        newest = max(run.glob("clone_*.pt"), key=TRAINERS["clone"].steps_of)
        return load_checkpoint(newest)["extra"]["history"]
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


# name -> (metric, how often to validate: argv added to the contract's tiny run)
RUNS = {
    "vocoder": ("periodicity", ["--set", "val_check_interval=1"]),
    "vits": ("align_sharpness", ["--set", "run_eval=true", "--set", "val_check_interval=1", "--set",
                                 "test_delay_epochs=0", "--set", "save_best_after=0", "--set", "eval_max_items=2"]),
    "clone": ("loss", ["--set", "train.val_check_interval=1"]),
    "vae": ("ssim", ["--val_freq", "1"]),
}


@pytest.mark.parametrize("name", list(RUNS))
def test_best_pt_is_chosen_by_the_named_metric_in_its_direction(name, data, tmp_path):
    trainer = TRAINERS[name]
    metric, extra = RUNS[name]
    run = tmp_path / "run"
    steps = 8 if name == "vae" else 2  # the VAE: two epochs of 4 steps (its best ranks per-epoch checkpoints)
    assert trainer.main([*trainer.argv(data, run, steps), *extra, "--best_by", metric]) == 0
    best = json.loads((run / "checkpoints" / "best.json").read_text())  # one place in every trainer's run folder
    assert best["by"] == metric and best["mode"] == METRICS[metric], best
    assert (run / "checkpoints" / "best.pt").is_file()
    ranked = _validations(name, run)
    if name == "vae":  # the VAE ranks its per-epoch checkpoints only, by the validation at each epoch's end
        ranked = [v for v in ranked if v["step"] in (4, 8)]
    values = [v[metric] for v in ranked if math.isfinite(v.get(metric, math.nan))]
    assert len(values) >= 2 and len(set(values)) >= 2, values
    assert best["metric"] == pytest.approx(max(values) if METRICS[metric] == "max" else min(values))


@pytest.mark.parametrize("name", list(RUNS))
def test_an_unknown_metric_is_exit_2_naming_the_key_and_the_trainers_metrics(name, data, tmp_path, capsys):
    trainer = TRAINERS[name]
    run = tmp_path / "run"
    assert trainer.main([*trainer.argv(data, run, 1), "--best_by", "loudness"]) == exit_codes.BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "best_by" in err[0] and "'loudness'" in err[0], err
    assert f"{RUNS[name][0]} (" in err[0]  # the metrics this trainer validates are listed
    assert not list(run.rglob("*.pt"))


@pytest.mark.parametrize("name, metric, how", [("vocoder", "pesq", "valid_pesq"), ("vae", "lpips", "perceptual_weight"),
                                               ("vae", "rfid", "rfid_weights")])
def test_a_metric_this_run_does_not_measure_says_how_to_turn_it_on(name, metric, how, data, tmp_path, capsys,
                                                                  monkeypatch):
    from vae import config as vae_config

    monkeypatch.setattr(vae_config, "hub_weights", lambda: None)  # a machine with the Inception cached measures rFID
    trainer = TRAINERS[name]
    assert trainer.main([*trainer.argv(data, tmp_path / "run", 1), "--best_by", metric]) == exit_codes.BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"best_by: {metric} is not measured" in err[0] and how in err[0], err


def test_a_resume_with_another_metric_forgets_the_old_best_with_one_line(data, tmp_path, capsys):
    trainer = TRAINERS["vocoder"]
    run = tmp_path / "run"
    assert trainer.main(trainer.argv(data, run, 2)) == 0
    best = json.loads((run / "checkpoints" / "best.json").read_text())
    assert best["by"] == "mrstft" and best["mode"] == "min"
    capsys.readouterr()
    assert trainer.main([*trainer.argv(data, run, 3), "--resume", "auto", "--best_by", "f0_rmse"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("best.pt:")]
    assert len(lines) == 1 and "by mrstft" in lines[0] and "f0_rmse" in lines[0], lines
    best = json.loads((run / "checkpoints" / "best.json").read_text())
    assert best["by"] == "f0_rmse" and best["step"] == 3  # a new best, whatever the old metric's value was


# ----------------------------------------------------------------------------- the helper alone
def _save(manager, step, metric):
    return manager.save({"step": step}, step, metric)


def test_a_higher_is_better_metric_keeps_the_max(tmp_path):
    m = BestCheckpoints(tmp_path, "psnr", "psnr", keep_last=5)
    for step, value in enumerate([20.0, 25.0, 22.0], 1):
        _save(m, step, value)
    best = json.loads((tmp_path / "best.json").read_text())
    assert best == {"metric": 25.0, "step": 2, "mode": "max", "by": "psnr"}
    lines = []
    m = BestCheckpoints(tmp_path, "psnr", "psnr", lines.append)  # a resume by the same metric keeps it
    assert m.best_metric == 25.0 and not lines
    _save(m, 4, 24.0)
    assert json.loads((tmp_path / "best.json").read_text())["step"] == 2


def test_a_best_json_without_by_was_the_trainers_default(tmp_path):
    (tmp_path / "best.json").write_text(json.dumps({"metric": 0.5, "step": 3, "mode": "min"}))
    lines = []
    assert BestCheckpoints(tmp_path, "mrstft", "mrstft", lines.append).best_metric == 0.5 and not lines
    m = BestCheckpoints(tmp_path, "pesq", "mrstft", lines.append)
    assert m.best_metric is None and m.mode == "max" and len(lines) == 1 and "by mrstft" in lines[0]


def test_check_best_by():
    assert check_best_by("mcd", ["mcd", "score"]) == "mcd"
    with pytest.raises(ValueError, match=r"best_by: 'psnr' is not a metric.*mcd \(lower is better\)"):
        check_best_by("psnr", ["mcd"])


# ----------------------------------------------------------------------------- the vocoder's new metrics
def speech_like(sr: int, seconds: float = 3.0) -> np.ndarray:
    """Voiced syllables: a gliding harmonic source through two formant-like bumps, on and off at 3 Hz."""
    t = np.arange(int(sr * seconds)) / sr
    f0 = 140 + 40 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / sr
    x = sum(np.sin(k * phase) / k * (np.exp(-((k * f0 - 500) ** 2) / 1.8e5) + 0.5 * np.exp(-((k * f0 - 1500) ** 2) / 3.2e5))
            for k in range(1, 30))
    x = x * np.clip(np.sin(2 * np.pi * 3.0 * t), 0, None) ** 0.5
    return (0.3 * x / np.abs(x).max()).astype(np.float32)


def test_pesq_of_speech_against_itself_is_the_maximum():
    pytest.importorskip("pesq")
    from vocoder.validation import pesq_wb

    x = speech_like(22050)
    assert pesq_wb(x, x, 22050) == pytest.approx(4.64, abs=0.01)
    noisy = x + 0.05 * np.random.default_rng(0).standard_normal(len(x)).astype(np.float32)
    assert pesq_wb(noisy, x, 22050) < 3.0
    assert math.isnan(pesq_wb(np.zeros(22050), np.zeros(22050), 22050))  # no speech: no score


def test_vocoder_validation_reports_the_pitch_errors_and_pesq(data, tmp_path):
    trainer = TRAINERS["vocoder"]
    run = tmp_path / "run"
    assert trainer.main([*trainer.argv(data, run, 1), "--set", "valid_pesq=true"]) == 0
    valid = json.loads((run / "summary.json").read_text())["validations"][-1]
    assert {"mrstft", "mel_l1", "f0_rmse", "vuv_error", "periodicity", "pesq"} <= set(valid), valid
    assert 0.0 <= valid["vuv_error"] <= 1.0 and valid["periodicity"] >= 0.0


def test_best_by_rfid_needs_inception_weights_and_ranks_lower_first(tmp_path, monkeypatch):
    """rFID is a metric only where its Inception weights are (a local file or the torch hub cache)."""
    from vae import config as vae_config
    from vae.config import VAEConfig

    monkeypatch.setattr(vae_config, "hub_weights", lambda: None)
    with pytest.raises(ValueError, match="rfid is not measured by this run .*rfid_weights"):
        VAEConfig(best_by="rfid")
    weights = tmp_path / "pt_inception-2015-12-05-6726825d.pth"
    weights.write_bytes(b"x")
    assert VAEConfig(best_by="rfid", rfid_weights=str(weights)).best_by == "rfid" and METRICS["rfid"] == "min"
    with pytest.raises(ValueError, match="rfid is not measured"):
        VAEConfig(best_by="rfid", rfid_weights="off")
