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
# call signatures the reference section uses, with tiny networks, so the section's own code runs end to end.
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
    assert list(gpu_check.SECTIONS) == ["environment", "reference", "step_profile", "vocoder_memory", "vits_mas",
                                        "vae_1024", "step_tables", "batch_size", "inference", "profile_memory",
                                        "pytest_cuda"]
    assert list(gpu_check.SECTIONS)[:len(gpu_check.FAST_ON_THE_CARD)] == list(gpu_check.FAST_ON_THE_CARD)
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


def test_a_measurement_past_its_set_up_takes_its_minimum_steps_within_the_runs_end():
    """The third lent H200: sections 2 and 3 spent their budgets on set-up (the first step's cuDNN autotuning)
    and measured nothing. Past the section's budget a measurement still takes its warm-up and MIN_TIMED timed
    steps, up to the run's own end, and says it overran; a new measurement (a build) is still refused."""
    import time

    from bench.gpu.base import MIN_TIMED, OverBudget, Section

    now = time.monotonic()
    sec = Section("reference", "t", 80.0, status="running", deadline=now - 1, run_end=now + 100)
    with pytest.raises(OverBudget, match="budget is used up"):
        sec.check_time("a new row's build")
    warmup, steps = 2, 10
    taken = [i for i in range(warmup + steps) if sec.timed_steps_left(i, warmup, steps, "step") is None]
    assert taken == list(range(warmup + MIN_TIMED))  # warm-up, then the minimum, then it stops
    assert sec.status == "partial" and any("after its set-up" in n for n in sec.notes)
    assert any(f"{MIN_TIMED} of {steps} timed steps" in n for n in sec.notes)
    sec.run_end = now - 1  # the run's own end is past: nothing more, not even the minimum
    with pytest.raises(OverBudget):
        sec.timed_steps_left(0, warmup, steps, "step")
    with pytest.raises(OverBudget):
        sec.check_time("profiled steps", finishing=True)
    with sec.phase("build"):
        pass
    assert sec.data["phases_s"]["build"] >= 0


def test_a_run_stopped_by_a_signal_keeps_its_report(tmp_path):
    """A command killed at its time limit (SIGINT / SIGTERM) still brings back report.md with what it measured."""
    import signal
    import subprocess
    import sys
    import time

    from tests.child_env import child_env

    out = tmp_path / "stopped"
    proc = subprocess.Popen([sys.executable, "-m", "bench.gpu", "--dry-run", "--out", str(out), "--sections",
                             "environment,step_tables,pytest_cuda"], cwd=REPO,
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


def test_the_reference_section_gives_the_2x_denominator_in_audio_seconds_per_second(dry_run):
    sec = json.loads((dry_run[1] / "report.json").read_text())["sections"]["reference"]
    d = sec["data"]
    ours, theirs = d["rows"]["ours (5090 config as shipped)"], d["rows"]["SingingVocoders (its defaults)"]
    assert ours["audio_s_per_s"] > 0 and theirs["audio_s_per_s"] > 0 and d["audio_s_per_step"] > 0
    assert d["ours_over_theirs"] == pytest.approx(ours["audio_s_per_s"] / theirs["audio_s_per_s"])
    assert d["denominator_audio_s_per_s"] == theirs["audio_s_per_s"] and d["target"] == 2.0
    assert d["ours"]["config"] == TRAINERS["vocoder"].rtx.name and d["ours"]["precision"] == "16-mixed"
    assert d["theirs"]["precision"] == "32-true" and d["theirs"]["conv"] == "tf32" and d["theirs"]["matmul"] == "ieee"
    assert d["theirs"]["cudnn_benchmark"] is False


def test_their_flags_set_pytorchs_defaults_around_their_step_and_restore_ours():
    from bench.gpu.reference import their_flags

    saved = (torch.backends.cudnn.conv.fp32_precision, torch.backends.cuda.matmul.fp32_precision,
             torch.backends.cudnn.benchmark)
    try:
        torch.backends.cudnn.conv.fp32_precision = torch.backends.cuda.matmul.fp32_precision = "tf32"
        torch.backends.cudnn.benchmark = True
        with their_flags():
            assert torch.backends.cudnn.conv.fp32_precision == "tf32"
            assert torch.backends.cuda.matmul.fp32_precision == "ieee" and not torch.backends.cudnn.benchmark
        assert torch.backends.cuda.matmul.fp32_precision == "tf32" and torch.backends.cudnn.benchmark
    finally:
        (torch.backends.cudnn.conv.fp32_precision, torch.backends.cuda.matmul.fp32_precision,
         torch.backends.cudnn.benchmark) = saved


def test_step_profile_section_says_cpu_dry_run(dry_run):
    sec = json.loads((dry_run[1] / "report.json").read_text())["sections"]["step_profile"]
    d = sec["data"]
    assert d["what"] == "CPU ops (CPU dry run)" and d["config"].endswith("precision=bf16-mixed")
    assert d["kernels_per_step"] > 100 and d["wall_ms_per_step"] > 0
    assert len(d["top"]) == 15 and d["top"][0]["self_ms_per_step"] >= d["top"][-1]["self_ms_per_step"]
    assert any("convolution" in r["name"] for r in d["top"])
    assert d["gpu_idle_share"] is None and d["sync_calls_per_step"] is None
    assert d["sync_debug_warnings_per_step"].startswith("n/a on CPU")
    md = (dry_run[1] / "report.md").read_text()
    assert "CPU dry run" in md and "top op by self CPU time (CPU dry run)" in md


def test_memory_section_is_na_on_cpu_and_says_the_critic_update_is_one_call(dry_run):
    d = json.loads((dry_run[1] / "report.json").read_text())["sections"]["vocoder_memory"]["data"]
    assert d["rows"]["TF32"]["skipped"].startswith("n/a on CPU")
    fp32 = d["rows"]["IEEE fp32"]
    assert fp32["skipped"].startswith("n/a on CPU") and fp32["top"] == [] and fp32["peak_above_start_bytes"] == 0
    assert "no switch for two" in d["critic_update"]


def test_peak_allocations_replays_the_trace_to_its_peak():
    from bench.gpu.profiling import REPO as ROOT
    from bench.gpu.profiling import _intervals_union_us, peak_allocations

    def frame(path, line, name):
        return {"filename": str(path), "line": line, "name": name}

    conv = [frame("/site-packages/torch/nn/modules/conv.py", 370, "_conv_forward"),
            frame(ROOT / "vocoder/discriminators.py", 88, "forward"), frame(ROOT / "bench/gpu/row.py", 1, "x")]
    mib = 2**20
    trace = [{"action": "alloc", "addr": 1, "size": 10 * mib, "frames": conv},
             {"action": "alloc", "addr": 2, "size": 30 * mib, "frames": []},
             {"action": "free_requested", "addr": 2, "size": 30 * mib},
             {"action": "free_completed", "addr": 2, "size": 30 * mib},
             {"action": "alloc", "addr": 3, "size": 5 * mib, "frames": conv}]
    found = peak_allocations(trace, top=5)
    assert found["peak_above_start_bytes"] == 40 * mib and found["live_at_peak"] == 2
    assert [a["mib"] for a in found["top"]] == [30.0, 10.0]
    assert found["top"][1]["stack"] == "conv.py:370 _conv_forward < discriminators.py:88 forward"
    assert found["top"][0]["stack"] == "(no Python frame)"
    assert _intervals_union_us([(0, 10), (5, 12), (20, 25), (21, 22)]) == 17


def test_vits_mas_share_runs_at_8_second_items(dry_run):
    d = json.loads((dry_run[1] / "report.json").read_text())["sections"]["vits_mas"]["data"]
    assert d["item_seconds"] == 8.0 and d["frames"] >= 8 * 22050 // 256 and d["implementation"] == "maximum_path_numba"
    assert d["mas_shape"][-1] == d["frames"] and all(ms > 0 for ms in d["mas_ms"])
    assert 0 < d["mas_share"] < 1 and d["mas_ms_at_median"] / 1e3 < d["median_step_s"]


def test_vae_1024_rows_toggle_channels_last_and_checkpointing(dry_run):
    d = json.loads((dry_run[1] / "report.json").read_text())["sections"]["vae_1024"]["data"]
    assert d["config"] == "standard_1024.yaml"
    assert list(d["rows"]) == ["as shipped (channels_last, checkpointing)", "channels_last off", "checkpointing off",
                               "both off"]
    for row in d["rows"].values():
        assert row["step_s"] > 0 and row["images_per_s"] > 0 and row["peak_gib"] is None


def test_without_a_checkout_the_reference_section_is_skipped_and_says_how_to_get_one(tmp_path):
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


def test_the_vocoder_channels_last_row_measures_base_critics_on_a_gpu_and_the_mpd_alone_in_the_dry_run():
    from bench.gpu.training import step_rows

    def row(**kw):
        (change,) = [c for label, _, c in step_rows(TRAINERS["vocoder"], **kw) if label == "plain + channels_last"]
        return change

    assert row(cuda=True)[-2:] == ["model_args.discriminators=[mpd,msd]", "mpd_channels_last=true"]
    assert row(cuda=False, dry=True)[-2:] == ["model_args.discriminators=[mpd]", "mpd_channels_last=true"]
    assert row(cuda=True, dry=True) == row(cuda=False, dry=True)  # what the dry run measures either way


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


def test_the_cuda_profile_summary_counts_kernels_idle_time_and_syncs_inside_the_steps():
    """The CUDA branch of the profile summary on hand-made events (no GPU here): kernels only (copies and
    the record_function ranges' device twins are not kernels), the union of device intervals as busy time,
    host syncs counted inside the step ranges only."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from bench.gpu.profiling import STEP_RANGE, summarize_profile

    def ev(name, start, end, device=DeviceType.CUDA, annotation=False):
        span = SimpleNamespace(start=start, end=end, elapsed_us=lambda: end - start)
        return SimpleNamespace(name=name, device_type=device, time_range=span, is_user_annotation=annotation,
                               self_cpu_time_total=end - start)

    cpu = DeviceType.CPU
    events = [ev(STEP_RANGE, 0, 1000, cpu, True), ev(STEP_RANGE, 0, 1000, annotation=True),
              ev("conv_kernel", 100, 400), ev("conv_kernel", 300, 500), ev("elementwise", 600, 700),
              ev("Memcpy DtoH (Device -> Pageable)", 800, 810),
              ev("cudaStreamSynchronize", 500, 800, cpu), ev("cudaDeviceSynchronize", 1500, 1600, cpu)]
    s = summarize_profile(events, steps=1, wall_s=0.002, cuda=True)
    assert s["kernels_per_step"] == 3 and [r["name"] for r in s["top"]] == ["conv_kernel", "elementwise"]
    assert s["top"][0]["self_ms_per_step"] == pytest.approx(0.5) and s["top"][0]["calls_per_step"] == 2
    assert s["busy_ms_per_step"] == pytest.approx(0.51) and s["gpu_idle_share"] == pytest.approx(1 - 0.51 / 2)
    assert s["sync_calls_per_step"] == 1 and s["d2h_copies_per_step"] == 1  # the sync after the steps is outside
