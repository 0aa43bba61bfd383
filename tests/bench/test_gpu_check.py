"""`make gpu-check` must not rot while no GPU is lent: its dry run (every section on the CPU at the
tests' tiny sizes, through the same code) runs here and its report is checked section by section."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench import gpu_check
from bench.gpu_trainers import TRAINERS
from bench.peak_flops import peak_tflops

REPO = Path(__file__).resolve().parents[2]
# the fp16 rows' first step: GradScaler skips the optimizer step (inf check at the initial scale), as in training
pytestmark = pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> tuple[int, Path]:
    out = tmp_path_factory.mktemp("gpu_check")
    threads = torch.get_num_threads()
    try:
        rc = gpu_check.main(["--dry-run", "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    return rc, out


def test_dry_run_fills_every_section(dry_run):
    rc, out = dry_run
    assert rc == 0
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= gpu_check.MAX_FILES
    assert {"report.md", "report.json", "gpu_check.log", "pytest_cuda.log"} <= set(files)
    assert "errors.log" not in files, (out / "errors.log").read_text()[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["dry_run"] is True and report["device"] == "CPU"
    assert list(report["sections"]) == list(gpu_check.SECTIONS)
    for name, sec in report["sections"].items():
        assert sec["status"] == "ok", (name, sec["notes"])
        assert sec["data"], name
    md = (out / "report.md").read_text()
    for title, _ in gpu_check.SECTIONS.values():
        assert f"## {title}" in md


def test_environment_and_pytest_sections(dry_run):
    sections = json.loads((dry_run[1] / "report.json").read_text())["sections"]
    env = sections["environment"]["data"]
    assert env["device"] == "CPU" and env["torch"] == torch.__version__
    assert env["check_compatibility"] in ("ready", "NOT ready")
    tests = sections["pytest_cuda"]["data"]
    # every CUDA test was selected by the marker and skipped on this CPU, with the reason
    assert tests["exit_code"] == 0 and tests["counts"]["skipped"] >= 18 and "passed" not in tests["counts"]
    assert any("needs a CUDA GPU" in r for r in tests["skip_reasons"])


def test_step_tables_measure_each_trainer_and_say_what_a_cpu_cannot(dry_run):
    tables = json.loads((dry_run[1] / "report.json").read_text())["sections"]["step_tables"]["data"]
    assert list(tables) == list(TRAINERS)
    for name, rows in tables.items():
        for label in ("base config (as shipped)", "RTX 5090 config (as shipped)", "plain: base with every speed key off",
                      "plain + fp16 (16-mixed + GradScaler)", "plain + bf16 (bf16-mixed)"):
            row = rows[label]
            assert row["step_s"] > 0 and row["samples_per_s"] > 0 and 0 <= row["data_wait"] <= 1, (name, label)
            assert row["achieved_tflops"] > 0 and row["fraction_of_peak"] is None and row["peak_gib"] is None
        assert rows["plain + bf16 (bf16-mixed)"]["precision"] == "bf16-mixed"
        assert rows["plain + fp16 (16-mixed + GradScaler)"]["precision"] == "16-mixed"
        for label in ("plain + TF32", "plain + torch.compile", "plain + cudnn benchmark"):
            assert rows[label]["skipped"].startswith("n/a on CPU"), (name, label)
    assert "step_s" in tables["vae"]["plain + channels_last"] and "step_s" in tables["vits"]["plain + channels_last"]
    assert tables["vocoder"]["plain + channels_last"]["skipped"].startswith("n/a: no such key")


def test_batch_size_section_runs_the_finder_and_the_oom_exit_path(dry_run):
    data = json.loads((dry_run[1] / "report.json").read_text())["sections"]["batch_size"]["data"]
    for name in TRAINERS:
        res = data[name]
        assert "cannot" in res["finder"] and res["picked"] >= 1 and res["step_s"] > 0, name  # no CUDA: says so
        oom = res["oom"]
        assert oom["ok"] and oom["exit_code"] == 4 and oom["advice_printed"], (name, oom)
        assert oom["message"].startswith("error: CUDA out of memory"), oom["message"]


def test_inference_and_profile_memory_sections(dry_run):
    sections = json.loads((dry_run[1] / "report.json").read_text())["sections"]
    rows = sections["inference"]["data"]["rows"]
    assert [r["what"].split()[0] for r in rows] == ["vocoder", "VITS"]
    for r in rows:
        assert r["eager_s"] > 0 and r["onnx_s"] > 0 and r["onnx_provider"].startswith("CPU EP")
        assert r["compiled_s"].startswith("n/a on CPU")
    vae = sections["inference"]["data"]["vae_tiled"]
    assert "128²" in vae["what"] and vae["fp32_s"] > 0 and vae["bf16_s"] > 0
    prof = sections["profile_memory"]
    assert prof["data"]["rows"] == [] and "needs a CUDA GPU" in " ".join(prof["data"]["printed"])
    assert any(n.startswith("n/a on CPU") for n in prof["notes"])


def test_cuda_tests_live_in_tests_cuda_only():
    """The harness runs `pytest -m cuda tests/cuda` (collecting the whole suite would cost the dry run
    minutes on a busy CPU), so a CUDA test anywhere else would never run."""
    here = Path(__file__).resolve()
    stray = [p for p in (REPO / "tests").rglob("*.py")
             if p != here and "cuda" not in p.relative_to(REPO / "tests").parts[:1]
             and "mark.cuda" in p.read_text(encoding="utf-8")]
    assert stray == []


def test_peak_table_names_the_figure_or_says_it_is_unknown():
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16")[0] == 989.4
    assert peak_tflops("NVIDIA H100 PCIe", "bf16")[0] == 756.0
    assert peak_tflops("NVIDIA GeForce RTX 5090", "fp32") == (104.8, "RTX 5090 dense fp32 peak 104.8 TFLOP/s")
    peak, why = peak_tflops("Some Future GPU", "fp16")
    assert peak is None and "no peak known for 'Some Future GPU'" in why


def test_an_unknown_section_is_refused_not_skipped(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        gpu_check.main(["--out", str(tmp_path / "r"), "--dry-run", "--sections", "pytest_cuda,inference_speed"])
    assert exit_.value.code == 2 and not (tmp_path / "r").exists()
    assert "unknown inference_speed; choose from environment," in capsys.readouterr().err
