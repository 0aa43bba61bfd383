"""vae/rfid.py: rFID of the held-out set through pytorch-fid's Inception, never downloaded. Random weights
here (the real architecture, He init): a set against itself is ~0, a noised copy is farther the more noise;
the Fréchet distance equals pytorch-fid's sqrtm formula; no weights file is one line and validation runs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy import linalg
from test_vae_train import run

from common.model_files import ModelFileError
from vae import rfid
from vae.metrics import evaluate

pytest.importorskip("pytorch_fid")


@pytest.fixture(scope="module")
def features() -> rfid.InceptionFeatures:
    return rfid.InceptionFeatures(rfid.build_inception(seed=0))


def test_rfid_of_a_set_with_itself_is_zero_and_grows_with_noise(features):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(6, 3, 48, 48, generator=g) * 2 - 1
    noise = torch.randn(x.shape, generator=g)
    base = features(x)
    values = [rfid.frechet_distance(base, features((x + s * noise).clamp(-1, 1))) for s in (0.0, 0.1, 0.4)]
    assert values[0] < 1e-6 and values[1] > 100 * max(values[0], 1e-9) and values[2] > values[1], values


def test_frechet_distance_is_pytorch_fids_formula():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((12, 5)), rng.standard_normal((9, 5)) * 1.3 + 0.2
    s1, s2 = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    ref = ((a.mean(0) - b.mean(0)) ** 2).sum() + np.trace(s1) + np.trace(s2) - 2 * np.trace(linalg.sqrtm(s1 @ s2).real)
    assert rfid.frechet_distance(a, b) == pytest.approx(ref, rel=1e-9)
    assert np.isnan(rfid.frechet_distance(a[:1], b))


class Identity(torch.nn.Module):
    """A 'VAE' whose reconstruction is its input, blurred by `blur` (a box filter)."""

    def __init__(self, blur: int = 1) -> None:
        super().__init__()
        self.blur = blur

    def encode(self, x):
        return type("Posterior", (), {"mode": lambda _self: x})()

    def decode(self, z):
        return torch.nn.functional.avg_pool2d(z, self.blur, 1, self.blur // 2) if self.blur > 1 else z


def test_validation_reports_rfid_with_a_weights_file(tmp_path, features):
    with torch.random.fork_rng():
        torch.manual_seed(0)
        torch.save(rfid.fid_inception().state_dict(), tmp_path / rfid.WEIGHTS_NAME)
    loaded = rfid.load_inception(str(tmp_path / rfid.WEIGHTS_NAME), say=pytest.fail)
    assert loaded is not None and loaded.source.endswith(rfid.WEIGHTS_NAME)
    x = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(1)) * 2 - 1
    same = evaluate(Identity(), [x[:2], x[2:]], torch.device("cpu"), fid=features)
    blurred = evaluate(Identity(blur=5), [x[:2], x[2:]], torch.device("cpu"), fid=features)
    assert same["rfid"] < 1e-6 < blurred["rfid"] and "rfid" not in evaluate(Identity(), [x], torch.device("cpu"))


def test_no_weights_is_one_line_and_validation_still_runs(image_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))  # an empty cache: nothing to find
    lines = []
    assert rfid.load_inception("", say=lines.append) is None and len(lines) == 1
    assert lines[0].startswith("rFID off: no pt_inception-2015-12-05-6726825d.pth in ")
    assert rfid.load_inception("off", say=lines.append) is None and len(lines) == 1  # off: nothing said
    out = tmp_path / "run"
    assert run(image_dir, out, "--max_steps", "2", "--no-export_diffusers", "--set", "val_check_interval=1") == 0
    said = capsys.readouterr().out
    assert said.count("rFID off") == 1, said
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) >= 2 and all("psnr" in r and "rfid" not in r for r in rows)  # validated, without rFID


def test_the_trainer_logs_rfid_from_the_weights_file_it_is_given(image_dir, tmp_path):
    with torch.random.fork_rng():
        torch.manual_seed(0)
        torch.save(rfid.fid_inception().state_dict(), tmp_path / "inception.pth")
    out = tmp_path / "run"
    assert run(image_dir, out, "--max_steps", "1", "--no-export_diffusers", "--set",
               f"rfid_weights={tmp_path / 'inception.pth'}") == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows and all(r["rfid"] > 0 for r in rows), rows


class TinyNet(torch.nn.Module):
    """Stands in for the Inception built from the weights (building it costs seconds): it records what it got."""

    def __init__(self, state: dict) -> None:
        super().__init__()
        self.state = state


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_rfid_weights_of_another_dtype_are_converted(tmp_path, monkeypatch, dtype):
    """Before: an fp16 / fp64 file built an Inception of that dtype, and the first validation was a traceback."""
    monkeypatch.setattr(rfid, "build_inception", TinyNet)
    torch.save({"conv.weight": torch.ones(2, 2, dtype=dtype), "bn.num_batches_tracked": torch.tensor(3)},
               tmp_path / "w.pth")
    loaded = rfid.load_inception(str(tmp_path / "w.pth"), say=pytest.fail)
    assert loaded.net.state["conv.weight"].dtype == torch.float32
    assert loaded.net.state["bn.num_batches_tracked"].dtype == torch.int64


def test_rfid_weights_with_nan_are_refused_naming_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(rfid, "build_inception", TinyNet)
    torch.save({"conv.weight": torch.tensor([1.0, float("nan")], dtype=torch.float16)}, tmp_path / "w.pth")
    lines = []
    assert rfid.load_inception(str(tmp_path / "w.pth"), say=lines.append) is None
    assert len(lines) == 1 and lines[0].startswith("rFID off: ") and str(tmp_path / "w.pth") in lines[0], lines
    assert "'conv.weight' holds NaN" in lines[0]
    with pytest.raises(ModelFileError) as info:  # --best_by rfid: the run stops (exit 2) instead
        rfid.load_inception(str(tmp_path / "w.pth"), say=pytest.fail, required=True)
    assert "\n" not in str(info.value) and str(tmp_path / "w.pth") in str(info.value)
    assert str(info.value).endswith("best_by rfid needs it")


def test_best_by_rfid_with_nan_weights_stops_at_start_with_one_line(image_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(rfid, "build_inception", TinyNet)
    torch.save({"conv.weight": torch.full((2,), float("nan"))}, tmp_path / "w.pth")
    out = tmp_path / "run"
    assert run(image_dir, out, "--max_steps", "1", "--no-export_diffusers", "--best_by", "rfid", "--set",
               f"rfid_weights={tmp_path / 'w.pth'}") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "holds NaN" in err[0], err
    assert not list(out.glob("checkpoint_*.pt"))  # nothing trained
