"""`make gpu-check` must not rot while no GPU is lent: its dry run (every section on the CPU at the
tests' tiny sizes, through the same code) runs here and its report is checked section by section."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench.gpu import check as gpu_check
from bench.gpu.peak_flops import peak_tflops
from bench.gpu.trainers import TRAINERS

REPO = Path(__file__).resolve().parents[2]
# the fp16 rows' first step: GradScaler skips the optimizer step (inf check at the initial scale), as in training
pytestmark = pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")


# A stand-in for an openvpi/SingingVocoders checkout (the real one is never committed): the names and
# call signatures section 7 uses, with tiny networks, so the section's own code runs end to end.
STAND_IN = {
    "models/nsf_HiFigan/models.py": """
import torch

class AttrDict(dict):
    def __getattr__(self, key):
        return self[key]

class Generator(torch.nn.Module):
    def __init__(self, h):
        super().__init__()
        hop = h["hop_size"]
        self.up = torch.nn.ConvTranspose1d(h["num_mels"], 1, 2 * hop, hop, padding=hop // 2)

    def forward(self, x, f0):
        return self.up(x)

class _Critic(torch.nn.Module):
    def __init__(self, periods=None):
        super().__init__()
        self.conv = torch.nn.Conv1d(1, 1, 3, padding=1)

    def forward(self, y):
        f = self.conv(y)
        return [f.flatten(1)], [[f]]

MultiScaleDiscriminator = MultiPeriodDiscriminator = _Critic
""",
    "modules/loss/HiFiloss.py": """
import torch

class HiFiloss(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.weight = config["lab_aux_melloss"]

    def Dloss(self, Dfake, Dtrue):
        return sum(((1 - t[0][0]) ** 2).mean() + (f[0][0] ** 2).mean() for f, t in zip(Dfake, Dtrue)), {}

    def GDloss(self, GDfake, GDtrue):
        return sum(((1 - f[0][0]) ** 2).mean() for f in GDfake), {}

    def Auxloss(self, Goutput, sample):
        l1 = (Goutput["audio"].reshape(sample["audio"].shape) - sample["audio"]).abs().mean() * self.weight
        return l1, {"aux_mel_loss": l1}
""",
    "modules/loss/stft_loss.py": "", "utils/wav2mel.py": "",
}


@pytest.fixture(scope="module")
def stand_in_checkout(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("SingingVocoders")
    for rel, text in STAND_IN.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory, stand_in_checkout) -> tuple[int, Path]:
    out = tmp_path_factory.mktemp("gpu_check")
    threads = torch.get_num_threads()
    try:
        rc = gpu_check.main(["--dry-run", "--out", str(out), "--reference-dir", str(stand_in_checkout)])
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
    for name in ("vae", "vits", "vocoder"):  # the vocoder's: mpd_channels_last
        assert "step_s" in tables[name]["plain + channels_last"], name


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


# ---------------------------------------------------------------------------------- the lent machine's limits
def test_default_fits_one_command_on_the_lent_machine_most_valuable_first(dry_run, monkeypatch):
    """One command there may run 10 minutes; pytest (slowest to say anything new) comes last."""
    assert gpu_check.DEFAULT_BUDGET_MINUTES + 1 <= 9 and gpu_check.DEFAULT_COMPILE_MINUTES < gpu_check.DEFAULT_BUDGET_MINUTES
    assert list(gpu_check.SECTIONS) == ["environment", "step_tables", "batch_size", "inference", "profile_memory",
                                        "reference", "pytest_cuda"]
    sections = json.loads((dry_run[1] / "report.json").read_text())["sections"]
    # a section that finishes early leaves its time to the ones after it: the last gets more than its share
    share = gpu_check.BUDGET_SHARES["pytest_cuda"] / sum(gpu_check.BUDGET_SHARES.values())
    assert sections["pytest_cuda"]["budget_s"] > 2 * share * 60 * gpu_check.DEFAULT_BUDGET_MINUTES
    monkeypatch.setenv("OUT", "/somewhere/out")
    assert gpu_check.default_out() == str(Path("/somewhere/out") / "gpu_check")
    monkeypatch.delenv("OUT")
    assert gpu_check.default_out() == "runs/gpu_check"


def test_a_compile_starts_only_when_its_time_is_left(tmp_path):
    import time

    from bench.gpu.base import Check, Section

    chk = Check(tmp_path, True, torch.device("cpu"), tmp_path, compile_left_s=150.0)
    sec = Section("step_tables", "t", 100.0, deadline=time.monotonic() + 30)
    why = chk.compile_skip(sec, "vocoder / plain + torch.compile")
    assert why.startswith("vocoder / plain + torch.compile: skipped, a compile needs ~60 s") and "section's time" in why
    sec.deadline = time.monotonic() + 1000
    assert chk.compile_skip(sec, "x") is None
    chk.compiled(120.0)  # a slow compile: the allowance shrinks and the next estimate grows
    assert chk.compile_need_s == 120.0 and "run's compile allowance" in chk.compile_skip(sec, "x")


def test_a_run_stopped_by_a_signal_keeps_its_report(tmp_path):
    """A command killed at its time limit (SIGINT / SIGTERM) still brings back report.md with what it measured."""
    import signal
    import subprocess
    import sys
    import time

    from tests.child_env import child_env

    out = tmp_path / "stopped"
    proc = subprocess.Popen([sys.executable, "-m", "bench.gpu", "--dry-run", "--out", str(out)], cwd=REPO,
                            env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        t_end = time.monotonic() + 120
        while time.monotonic() < t_end:  # wait for a step-table row: the run is inside a section
            report = out / "report.json"
            if report.is_file() and "step_s" in report.read_text():
                break
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        said, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, said
    report = json.loads((out / "report.json").read_text())
    assert report["stopped_by"] == "SIGINT" and report["finished"] is False
    secs = report["sections"]
    assert secs["environment"]["status"] == "ok"
    assert secs["step_tables"]["status"] == "stopped" and secs["pytest_cuda"]["status"] == "skipped"
    assert any("step_s" in row for row in secs["step_tables"]["data"]["vocoder"].values())
    assert "STOPPED by SIGINT" in (out / "report.md").read_text()


def test_without_a_gpu_a_real_run_says_so_in_its_report(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    rc = gpu_check.main(["--out", str(tmp_path / "r")])
    assert rc == 2 and "error: no CUDA GPU here" in capsys.readouterr().err
    assert (tmp_path / "r" / "report.md").read_text().startswith("# gpu_check: NOT RUN")


def test_the_vae_cli_trains_with_a_random_backbone_when_none_is_cached(tmp_path, monkeypatch, capsys):
    """The lent machine has no torchvision cache: the VAE's forced OOM (its CLI at real size) must reach
    exit 4, not stop at exit 2 for the missing VGG16."""
    from unittest import mock

    from bench.gpu import trainers as gpu_trainers
    from vae.train_vae import VAETrainer

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty_torch_home"))
    spec = TRAINERS["vae"]
    data = spec.make_data(tmp_path / "data", dry=True)

    def oom(*_a, **_k):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB (test)")

    codes = []
    for context in (mock.MagicMock(), spec.cli_context()):  # without it, then with it
        main, argv = gpu_trainers.cli(spec, "rtx5090", ["perceptual_weight=1.0"], data, tmp_path / f"run{len(codes)}",
                                      torch.device("cpu"), dry=True, steps=1)
        with mock.patch.object(VAETrainer, "train_step", oom), context:
            codes.append(main(argv))
    said = capsys.readouterr()
    assert codes == [2, 4], said.err[-2000:]
    assert "not in the torchvision cache" in said.err and gpu_trainers.RANDOM_BACKBONE_NOTE in said.out


@pytest.mark.skipif(__import__("os").name == "nt", reason="a bash script")
def test_the_shell_entry_uses_the_torch_it_is_given(tmp_path):
    """shell/gpu_check.sh with an interpreter that has everything: nothing installed, one line says what it used."""
    import subprocess
    import sys

    from tests.child_env import child_env

    proc = subprocess.run(["bash", "shell/gpu_check.sh", "--dry-run", "--sections", "environment", "--out",
                           str(tmp_path / "r")], cwd=REPO, env=child_env(PYTHON=sys.executable),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    first = proc.stdout.splitlines()[0]
    assert first.startswith(f"gpu_check: {sys.executable} (Python ") and f"torch {torch.__version__}" in first
    assert first.endswith("nothing to install")
    assert json.loads((tmp_path / "r" / "report.json").read_text())["sections"]["environment"]["status"] == "ok"


def test_section_7_times_the_reference_beside_ours_on_the_same_batches(dry_run):
    sec = json.loads((dry_run[1] / "report.json").read_text())["sections"]["reference"]
    rows = sec["data"]["rows"]
    fp32 = rows["fp32 (IEEE)"]
    assert fp32["step_s"]["ours"] > 0 and fp32["step_s"]["SingingVocoders"] > 0
    assert fp32["theirs_over_ours"] == pytest.approx(fp32["step_s"]["SingingVocoders"] / fp32["step_s"]["ours"])
    assert fp32["precision"] == "32-true" and fp32["params"].startswith("generator ")
    assert rows["TF32"]["skipped"].startswith("n/a on CPU")


def test_without_a_checkout_section_7_is_skipped_and_says_how_to_get_one(tmp_path):
    report = gpu_check.run(tmp_path / "r", True, 1.0, ["environment", "reference"], 0.0, reference_dir=None)
    sec = report["sections"]["reference"]
    assert sec["status"] == "skipped" and "--reference-dir" in sec["notes"][0]


def test_passes_run_key_by_key_across_the_trainers_with_plain_beside_them():
    from bench.gpu.training import autotunes, run_order, step_rows

    plan = {name: step_rows(spec, cuda=True) for name, spec in TRAINERS.items()}
    label = {(n, i): plan[n][i][0] for n in plan for i in range(len(plan[n]))}
    only_keys = [label[o] for o in run_order(plan, (1,))]
    n = len(TRAINERS)
    assert all(x.startswith("plain: ") for x in only_keys[:n])  # plain first, for every trainer
    assert not any("compile" in x or "as shipped" in x for x in only_keys)
    assert only_keys[n:2 * n] == ["plain + fp16 (16-mixed + GradScaler)"] * n  # then one key for all trainers
    everything = [label[o] for o in run_order(plan, (0, 1, 2))]
    assert len(everything) == sum(len(r) for r in plan.values())
    assert all("compile" in x for x in everything[-n:])
    # rows where cuDNN autotunes run in a process of their own on a GPU (bench/gpu/row.py)
    assert autotunes("base config (as shipped)") and autotunes("plain + cudnn benchmark")
    assert not autotunes("plain: base with every speed key off") and not autotunes("plain + TF32")


def test_a_row_measured_in_its_own_process_is_the_same_row(tmp_path):
    """The GPU path for autotuning rows, on the CPU: the child builds the trainer from the parent's
    synthetic data and hands its row back."""
    from bench.gpu.row import measure_in_child

    spec = TRAINERS["vocoder"]
    data = spec.make_data(tmp_path / "data", dry=True)
    job = {"trainer": "vocoder", "which": "base", "overrides": spec.plain, "data": str(data), "tmp": str(tmp_path),
           "device": "cpu", "dry": True, "steps": 1, "warmup": 1, "count": True}
    row, said = measure_in_child(job, timeout_s=300)
    assert row["step_s"] > 0 and row["flops"]["model"] > 0 and row["precision"] == "32-true"
    assert 0 < row["compute_s"] <= row["step_s"] and row["flops"]["optimizer"] == row["flops"]["recompute"] == 0
    with pytest.raises(RuntimeError, match="exited 1"):
        measure_in_child({**job, "trainer": "no_such_trainer"}, timeout_s=300)


@pytest.mark.parametrize("argv", [["--passes", "3"], ["--passes", "x"], ["--reference-dir", "/no/such/folder"]])
def test_bad_passes_or_reference_dir_are_refused(tmp_path, argv, capsys):
    with pytest.raises(SystemExit) as e:
        gpu_check.main(["--out", str(tmp_path / "r"), "--dry-run", *argv])
    assert e.value.code == 2
    assert ("--passes" if "--passes" in argv else "--reference-dir") in capsys.readouterr().err
