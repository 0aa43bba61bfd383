"""`make gpu-check`: everything this repository claims about CUDA, checked in one run on one GPU.

    python -m bench.gpu_check --out runs/gpu_check [--budget-minutes 25]
    python -m bench.gpu_check --out /tmp/gc --dry-run        # the same run on the CPU, tiny sizes

Six sections, each with its own share of the time budget: 1 environment, 2 `pytest -m cuda`
(tests/cuda), 3 step tables per trainer (base and RTX 5090 configs, each speed key alone, fraction of
the card's peak FLOP/s), 4 batch size (the finder, 20 steps at its pick, a forced OOM through the
trainer's own exit path: exit code 4 and the advice), 5 inference speed (vocoder, VITS, tiled VAE
reconstruction at 2048 px), 6 the VAE's `--profile_memory` table. A section that runs past its budget
stops between measurements and says what it skipped; an exception is written to errors.log and the
next section runs. Out: report.md, report.json, gpu_check.log (everything the trainers printed),
pytest_cuda.log, errors.log (only when something failed): at most 8 files.

`--dry-run` runs every section on the CPU at the tests' tiny sizes through the same code (the trainers'
own steps, loaders, finder, exit path), marks what a CPU cannot measure as "n/a on CPU" with the reason,
and simulates the OOM by raising torch.cuda.OutOfMemoryError from the trainer's step.
tests/bench/test_gpu_check.py runs it in `make test`, so the harness cannot rot while no GPU is lent.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from unittest import mock

import torch

from bench import gpu_trainers
from bench.gpu_trainers import TRAINERS, TrainerSpec, build, tile_batch
from bench.peak_flops import count_flops, math_mode, peak_tflops
from bench.timing import seconds_per_step

REPO = Path(__file__).resolve().parents[1]
# minutes of the default 25 per section (scaled to --budget-minutes)
BUDGET_MINUTES = {"environment": 1.0, "pytest_cuda": 6.0, "step_tables": 8.0, "batch_size": 4.0,
                  "inference": 3.0, "profile_memory": 3.0}
NA_CPU = {
    "TF32": "n/a on CPU: TF32 is a CUDA tensor-core math mode",
    "torch.compile": "n/a on CPU: compiling takes minutes here and gained nothing on conv1d (DESIGN.md); "
                     "the GPU run measures it",
    "cudnn benchmark": "n/a on CPU: cuDNN autotuning is CUDA's",
}
MAX_FILES = 8


class OverBudget(Exception):
    """A section's time is used up: what remains of it is skipped (with a note)."""


@dataclass
class Section:
    name: str
    title: str
    budget_s: float
    status: str = "ok"  # ok | partial (some parts skipped or failed) | skipped | failed
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)
    markdown: list[str] = field(default_factory=list)
    deadline: float = 0.0

    def check_time(self, what: str) -> None:
        if time.monotonic() > self.deadline:
            raise OverBudget(f"{what}: skipped, the section's {self.budget_s:.0f} s budget is used up")

    def partial(self, note: str) -> None:
        self.notes.append(note)
        if self.status == "ok":
            self.status = "partial"


@dataclass
class Check:
    """The run: where it writes, CPU or GPU, and the synthetic data made once per trainer."""

    out: Path
    dry: bool
    device: torch.device
    tmp: Path
    errors: list[str] = field(default_factory=list)
    _data: dict = field(default_factory=dict)

    def data(self, spec: TrainerSpec) -> Path:
        if spec.name not in self._data:
            self._data[spec.name] = spec.make_data(self.tmp / f"data_{spec.name}", self.dry)
        return self._data[spec.name]

    def run_dir(self, label: str) -> Path:
        n = len(list(self.tmp.glob("run_*")))
        return self.tmp / f"run_{n:03d}_{re.sub(r'[^A-Za-z0-9]+', '_', label)[:40]}"

    def error(self, where: str) -> str:
        """Keeps the traceback for errors.log; returns the one line for the report."""
        self.errors.append(f"## {where}\n{traceback.format_exc()}")
        exc = sys.exc_info()[1]
        return f"{where}: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''} (errors.log)"

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def reset_memory(self) -> None:
        if self.device.type == "cuda":  # (a full gc.collect costs ~0.25 s a call on the CPU: only where it frees)
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)

    def peak_gib(self) -> float | None:
        return torch.cuda.max_memory_allocated(self.device) / 2**30 if self.device.type == "cuda" else None

    @property
    def card(self) -> str:
        return torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "CPU"


def _fmt(v, spec: str = ".3f") -> str:
    if v is None:
        return "n/a on CPU"
    return format(v, spec) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


# ---------------------------------------------------------------------------------------- 1 environment
def _driver() -> str:
    if shutil.which("nvidia-smi") is None:
        return "n/a (no nvidia-smi)"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def section_environment(chk: Check, sec: Section) -> None:
    from common.hardware import _cudnn_version
    from vae.check_compatibility import report

    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda_build": torch.version.cuda,
           "cudnn": _cudnn_version(), "device": chk.card, "dry_run": chk.dry}
    if chk.device.type == "cuda":
        p = torch.cuda.get_device_properties(chk.device)
        env.update(memory_gib=round(p.total_memory / 2**30, 1), capability=f"sm_{p.major}{p.minor}",
                   driver=_driver(), bf16=torch.cuda.is_bf16_supported())
    else:
        env.update(memory_gib=None, capability=None, driver=None,
                   cpu=f"{os.cpu_count()} logical CPUs, {torch.get_num_threads()} torch threads")
    lines, ok = report()
    env["check_compatibility"] = "ready" if ok else "NOT ready"
    sec.data = env
    sec.markdown += [f"- {k}: {v}" for k, v in env.items()]
    sec.markdown += ["", "`vae/check_compatibility.py` (which includes `common.hardware.hardware_report`):", "",
                     "```", *lines, "```"]
    if not ok:
        sec.partial("check_compatibility says NOT ready: read its lines above")


# ---------------------------------------------------------------------------------------- 2 pytest -m cuda
PYTEST_COUNTS = re.compile(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed)")


def section_pytest(chk: Check, sec: Section) -> None:
    """The CUDA-only tests (tests/cuda, marker `cuda`) in a child process, killed at the budget."""
    cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "tests/cuda", "-rs"]  # pyproject adds -q
    log = chk.out / "pytest_cuda.log"
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=os.environ.get("CUBLAS_WORKSPACE_CONFIG", ":4096:8"))
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env,
                              timeout=max(10.0, sec.deadline - time.monotonic()))
        text, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        text = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        text, rc = text + f"\n[gpu_check] killed at the section's budget ({sec.budget_s:.0f} s)\n", None
        sec.partial(f"pytest killed at the section's {sec.budget_s:.0f} s budget: counts are partial")
    log.write_text(text)
    tail = next((ln for ln in reversed(text.splitlines()) if PYTEST_COUNTS.search(ln) and " in " in ln), "")
    counts = {k.rstrip("s") if k.startswith("error") else k: int(n) for n, k in PYTEST_COUNTS.findall(tail)}
    reasons = sorted({m.strip() for m in re.findall(r"SKIPPED \[\d+\] [^:]+:\d+: (.*)", text)})
    sec.data = {"command": " ".join(cmd[2:]), "exit_code": rc, "counts": counts, "skip_reasons": reasons}
    sec.markdown += [f"`python {' '.join(cmd[1:])}` → exit code {rc}: "
                     + (", ".join(f"{n} {k}" for k, n in counts.items()) or "no summary line") + " (pytest_cuda.log)"]
    sec.markdown += [f"- skipped because: {r}" for r in reasons]
    if counts.get("failed") or counts.get("error"):
        sec.partial(f"{counts.get('failed', 0)} failed, {counts.get('error', 0)} errors: read pytest_cuda.log")
    if chk.device.type == "cuda" and counts.get("skipped"):
        sec.partial(f"{counts['skipped']} CUDA tests skipped on a CUDA machine: read the reasons")
    if not counts:
        sec.partial("no pytest summary line: read pytest_cuda.log")


# ---------------------------------------------------------------------------------------- 3 step tables
def measure_steps(chk: Check, spec: TrainerSpec, which: str, overrides: list[str], steps: int, warmup: int,
                  count: bool) -> dict:
    """Step time, samples/s, data-wait fraction (time blocked on the trainer's own loader), peak memory,
    and with `count` FLOPs, counted on the first, untimed step (rows of the same config and batch do the
    same math whatever the precision or layout, so they reuse that count)."""
    data = chk.data(spec)
    st = build(spec, which, overrides, data, chk.run_dir(f"{spec.name}_{which}"), chk.device, chk.dry)
    it = st.batches()
    first = next(it)
    flops = None
    if count and not st.compiled:
        flops = count_flops(lambda: st.step(first))
    else:
        st.step(first)
    for _ in range(warmup - 1):
        st.step(next(it))
    chk.sync()
    chk.reset_memory()
    wait = busy = 0.0
    for _ in range(steps):
        t0 = time.perf_counter()
        batch = next(it)
        t1 = time.perf_counter()
        st.step(batch)
        chk.sync()
        wait, busy = wait + t1 - t0, busy + time.perf_counter() - t1
    step_s = (wait + busy) / steps
    tf32 = chk.device.type == "cuda" and torch.backends.cuda.matmul.fp32_precision == "tf32"
    row = {"batch": st.batch_size, "samples_per_step": st.samples, "precision": st.precision, "step_s": step_s,
           "samples_per_s": st.samples / step_s, "data_wait": wait / (wait + busy), "peak_gib": chk.peak_gib(),
           "flops_per_step": flops, "math": math_mode(st.precision, tf32)}
    return row


def _flop_columns(chk: Check, row: dict, flops: int | None) -> None:
    if flops is None:
        return
    row["achieved_tflops"] = flops / row["step_s"] / 1e12
    if chk.device.type == "cuda":
        peak, row["peak_note"] = peak_tflops(chk.card, row["math"])
        row["fraction_of_peak"] = row["achieved_tflops"] / peak if peak else None
    else:
        row["fraction_of_peak"], row["peak_note"] = None, "n/a on CPU: no card peak to compare with"


def step_rows(spec: TrainerSpec, cuda: bool) -> list[tuple[str, str, list[str] | str]]:
    """(label, config, overrides or the reason it is not measured) for one trainer's table."""
    compile_off = [o.replace("=true", "=false") for o in spec.options["torch.compile"]]
    shipped = [] if cuda else compile_off  # a shipped config that compiles is not compiled on the CPU
    rows: list[tuple[str, str, list[str] | str]] = [
        ("base config (as shipped)", "base", shipped), ("RTX 5090 config (as shipped)", "rtx5090", shipped),
        ("plain: base with every speed key off", "base", spec.plain)]
    for label, change in spec.options.items():
        if isinstance(change, str):
            rows.append((f"plain + {label}", "base", f"n/a: {change}"))
        elif not cuda and label in NA_CPU:
            rows.append((f"plain + {label}", "base", NA_CPU[label]))
        else:
            rows.append((f"plain + {label}", "base", [*spec.plain, *change]))
    return rows


def section_step_tables(chk: Check, sec: Section) -> None:
    steps, warmup = (1, 1) if chk.dry else (20, 3)
    sec.markdown += [f"{steps} timed steps after {warmup} untimed (the first counts FLOPs) per row; synthetic data "
                     f"through each trainer's own DataLoader; × plain = plain step time / row step time. "
                     + ("DRY RUN: the tests' tiny sizes on the CPU; the times say nothing about a GPU." if chk.dry
                        else "Real config sizes."), ""]
    for name, spec in TRAINERS.items():
        table: dict[str, dict] = {}
        sec.data[name] = table
        flops_by_config: dict[str, int] = {}
        for label, which, change in step_rows(spec, chk.device.type == "cuda"):
            if isinstance(change, str):
                table[label] = {"skipped": change}
                continue
            try:
                sec.check_time(f"{name} / {label}")
                key = which if label.endswith("(as shipped)") else "plain"
                row = measure_steps(chk, spec, which, change, steps, warmup, count=not flops_by_config.get(key))
                chk.reset_memory()  # the trainer is gone with measure_steps' frame
                if row["flops_per_step"]:
                    flops_by_config[key] = row["flops_per_step"]
                _flop_columns(chk, row, row["flops_per_step"] or flops_by_config.get(key))
                table[label] = row
            except OverBudget as e:
                table[label] = {"skipped": str(e)}
                sec.partial(str(e))
            except Exception:
                table[label] = {"skipped": "failed: " + chk.error(f"step table {name} / {label}")}
                sec.partial(table[label]["skipped"])
            print(f"[step_tables] {name} / {label}: {table[label]}", flush=True)
        plain = table.get("plain: base with every speed key off", {}).get("step_s")
        sec.markdown += [f"### {name}", "", "| row | batch | precision | step s | samples/s | × plain | data wait "
                         "| peak GiB | GFLOP/step | TFLOP/s | % of peak |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        notes = set()
        for label, r in table.items():
            if "skipped" in r:
                sec.markdown.append(f"| {label} | {r['skipped']} |||||||||| ")
                continue
            ratio = f"{plain / r['step_s']:.2f}" if plain else "-"
            frac = r.get("fraction_of_peak")
            gflop = r.get("achieved_tflops", 0) * r["step_s"] * 1e3 if r.get("achieved_tflops") else None
            sec.markdown.append(
                f"| {label} | {r['batch']} | {r['precision']} | {r['step_s']:.4f} | {r['samples_per_s']:.2f} | {ratio} "
                f"| {100 * r['data_wait']:.1f} % | {_fmt(r['peak_gib'], '.2f')} | {_fmt(gflop, '.2f')} "
                f"| {_fmt(r.get('achieved_tflops'), '.4f')} | {'-' if frac is None else f'{100 * frac:.1f} %'} |")
            notes.add(r.get("peak_note", ""))
        sec.markdown += ["", *[f"- peak used: {n}" for n in sorted(notes) if n], ""]


# ---------------------------------------------------------------------------------------- 4 batch size
OOM_ADVICE = "Try, in this order"


def _choose_vae_batch(spec: gpu_trainers.Vae, chk: Check) -> int:
    """The VAE's own finder (`--batch_size auto`: vae.memory.choose_batch_size) on its 5090 profile."""
    from vae.memory import choose_batch_size
    from vae.train_vae import new_step

    cfg = spec.config(spec.rtx, spec.tiny() if chk.dry else [])
    cfg.batch_size = "auto"
    choose_batch_size(new_step, cfg, chk.device, spec.perceptual(cfg), main=True)
    return int(cfg.batch_size)


def forced_oom(chk: Check, spec: TrainerSpec) -> dict:
    """The trainer's CLI `main` on its 5090 config with a step that runs out of memory: exit code 4 and
    the advice on stderr, through the trainer's own stop handling and `common.exit_codes.run_main`.

    CUDA: a real OOM inside the trainer's own step: when the step is first called, this process's CUDA
    memory is capped just above what the models and optimizers already hold, so no batch fits (what a
    far-too-large batch does, without synthesising a dataset that large). CPU (dry run):
    torch.cuda.OutOfMemoryError raised from the trainer's train_step instead."""
    main, argv = gpu_trainers.cli(spec, "rtx5090", [], chk.data(spec), chk.run_dir(f"{spec.name}_oom"),
                                  chk.device, chk.dry)
    real_step = spec.step_class().train_step
    if chk.device.type == "cuda":
        how = "real CUDA OOM in the trainer's step (memory capped above the weights at its first call)"
        total = torch.cuda.get_device_properties(chk.device).total_memory

        def step(*a, **k):
            cap = torch.cuda.memory_reserved(chk.device) + 64 * 2**20
            torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), chk.device)
            return real_step(*a, **k)
    else:
        how = "simulated: torch.cuda.OutOfMemoryError raised from the trainer's train_step"

        def step(*_a, **_k):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB (gpu_check --dry-run)")

    err = io.StringIO()
    chk.reset_memory()
    try:
        with mock.patch.object(spec.step_class(), "train_step", step), contextlib.redirect_stderr(err):
            rc = main(argv)
    finally:
        if chk.device.type == "cuda":
            torch.cuda.set_per_process_memory_fraction(1.0, chk.device)
        chk.reset_memory()
    text = err.getvalue()
    print(text, flush=True)
    ok = rc == 4 and "out of memory" in text.lower() and OOM_ADVICE in text
    return {"how": how, "exit_code": rc, "advice_printed": OOM_ADVICE in text, "ok": ok,
            "message": next((ln for ln in text.splitlines() if ln.startswith("error:")), text.strip()[:200])}


def finder_and_steps(chk: Check, sec: Section, spec: TrainerSpec, steps: int) -> dict:
    """What the batch-size finder picks for the 5090 config here, then `steps` steps at that batch (one
    real batch of the trainer's loader, repeated to the size: `tile_batch`)."""
    from common.hardware import find_batch_size

    log = io.StringIO()
    if isinstance(spec, gpu_trainers.Vae):  # its finder builds a fresh model per trial: nothing else in memory
        with contextlib.redirect_stdout(log):
            picked = _choose_vae_batch(spec, chk)
        chk.reset_memory()
    st = build(spec, "rtx5090", [], chk.data(spec), chk.run_dir(f"{spec.name}_finder"), chk.device, chk.dry)
    one = next(st.batches())

    def try_batch(b: int) -> None:
        sec.check_time(f"{spec.name} batch finder at {b}")
        st.step(tile_batch(one, b))
        chk.sync()

    if not isinstance(spec, gpu_trainers.Vae):  # the trainer's models and optimizer states stay in memory
        with contextlib.redirect_stdout(log):
            picked = find_batch_size(try_batch, start=1, limit=4096)
    print(log.getvalue(), flush=True)
    chk.reset_memory()
    batch = tile_batch(one, picked)
    step_s = seconds_per_step(lambda: st.step(batch), steps, chk.device, warmup=1)
    return {"finder": log.getvalue().strip().splitlines()[-1] if log.getvalue().strip() else "", "picked": picked,
            "step_s": step_s, "steps": steps, "peak_gib": chk.peak_gib()}


def section_batch_size(chk: Check, sec: Section) -> None:
    steps = 2 if chk.dry else 20
    sec.markdown += ["| trainer | finder says | picked | steps at it | step s | peak GiB | forced OOM | exit code |",
                     "|---|---|---|---|---|---|---|---|"]
    for name, spec in TRAINERS.items():
        res: dict = {}
        sec.data[name] = res
        try:
            sec.check_time(f"{name} batch size")
            res.update(finder_and_steps(chk, sec, spec, steps))
            chk.reset_memory()
        except OverBudget as e:
            res["skipped"] = str(e)
            sec.partial(str(e))
        except Exception:
            res["skipped"] = "failed: " + chk.error(f"batch size {name}")
            sec.partial(res["skipped"])
        try:
            sec.check_time(f"{name} forced OOM")
            res["oom"] = forced_oom(chk, spec)
            if not res["oom"]["ok"]:
                sec.partial(f"{name}: forced OOM gave exit code {res['oom']['exit_code']}, advice printed: "
                            f"{res['oom']['advice_printed']}")
        except OverBudget as e:
            res["oom"] = {"skipped": str(e)}
            sec.partial(str(e))
        except Exception:
            res["oom"] = {"skipped": "failed: " + chk.error(f"forced OOM {name}")}
            sec.partial(res["oom"]["skipped"])
        oom = res["oom"]
        sec.markdown.append(
            f"| {name} | {res.get('finder', res.get('skipped', ''))} | {res.get('picked', '-')} | {res.get('steps', '-')} "
            f"| {_fmt(res.get('step_s'), '.4f') if 'step_s' in res else '-'} | {_fmt(res.get('peak_gib'), '.2f')} "
            f"| {oom.get('how', oom.get('skipped'))}: {'OK' if oom.get('ok') else 'NOT OK'} | {oom.get('exit_code', '-')} |")
    first_oom = next((r["oom"]["message"] for r in sec.data.values() if r.get("oom", {}).get("message")), None)
    if first_oom:
        sec.markdown += ["", f"First OOM message (the rest in gpu_check.log): `{first_oom}`"]


# ---------------------------------------------------------------------------------------- 5 inference
def _onnx_session(path: Path, cuda: bool):
    import onnxruntime as ort

    providers = ort.get_available_providers()
    if cuda and "CUDAExecutionProvider" in providers:
        return ort.InferenceSession(str(path), providers=["CUDAExecutionProvider", "CPUExecutionProvider"]), "CUDA EP"
    why = "dry run" if not cuda else "onnxruntime has no CUDA EP here (pip install onnxruntime-gpu to measure it)"
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]), f"CPU EP ({why})"


def _inference_row(chk: Check, what: str, audio_s: float, eager: Callable, compiled: Callable | None,
                   onnx: Callable[[], tuple[Callable, str]], repeats: int) -> dict:
    row: dict = {"what": what, "audio_s": audio_s}
    row["eager_s"] = seconds_per_step(eager, repeats, chk.device)
    if compiled is None:
        row["compiled_s"] = NA_CPU["torch.compile"]
    else:
        row["compiled_s"] = seconds_per_step(compiled, repeats, chk.device, warmup=2)
    run_onnx, row["onnx_provider"] = onnx()
    row["onnx_s"] = seconds_per_step(run_onnx, repeats, torch.device("cpu"))
    return row


def vocoder_inference(chk: Check, repeats: int) -> dict:
    from vocoder.export import export_info, export_onnx
    from vocoder.infer import VocoderInference
    from vocoder.train import build_generator

    spec = TRAINERS["vocoder"]
    cfg = spec._config(spec.base, spec.tiny() if chk.dry else [])
    voc = VocoderInference(build_generator(cfg), export_info(cfg), chk.device)
    seconds = 0.25 if chk.dry else 2.0
    frames = int(seconds * cfg.audio.sample_rate / cfg.audio.hop_length)
    mel = torch.randn(1, cfg.audio.n_mels, frames, device=chk.device) - 5
    f0 = torch.full((1, frames), 200.0, device=chk.device)
    compiled = None
    if chk.device.type == "cuda":
        gen = torch.compile(voc.generator)

        def compiled():
            with torch.no_grad():
                return gen(mel, f0)

    def onnx():
        path = export_onnx(voc.generator.cpu(), export_info(cfg), chk.tmp)
        voc.generator.to(chk.device)
        sess, provider = _onnx_session(path, chk.device.type == "cuda")
        feeds = {"mel": mel.transpose(1, 2).cpu().numpy(), "f0": f0.cpu().numpy()}
        return (lambda: sess.run(None, feeds)), provider

    return _inference_row(chk, f"vocoder base_hifi_gpu generator, {seconds} s of audio", seconds,
                          lambda: voc(mel, f0), compiled, onnx, repeats)


def vits_inference(chk: Check, preset: str, repeats: int) -> dict:
    from bench.bench_tts import SENTENCE, _models
    from tts.vits.export_onnx import export, run_onnx
    from tts.vits.synthesize import text_to_input

    gen, _ = _models(preset)
    gen.eval().remove_weight_norm()
    gen.to(chk.device)
    x = text_to_input(SENTENCE, add_blank=True).to(chk.device)
    x_len = torch.tensor([x.size(1)], device=chk.device)

    def eager():
        with torch.no_grad():
            return gen.infer(x, x_len, None, 0.667, 4.0, 0.0)[0]

    audio_s = eager().size(-1) / 22050
    compiled = None
    if chk.device.type == "cuda":  # the HiFi-GAN decoder is 90-95 % of inference; lengths vary: dynamic
        gen_c, _ = _models(preset)
        gen_c.eval().remove_weight_norm()
        gen_c.load_state_dict(gen.state_dict())
        gen_c.to(chk.device)
        gen_c.dec = torch.compile(gen_c.dec, dynamic=True)

        def compiled():
            with torch.no_grad():
                return gen_c.infer(x, x_len, None, 0.667, 4.0, 0.0)[0]

    def onnx():
        path = export(gen.cpu(), chk.tmp / f"vits_{preset}.onnx")
        gen.to(chk.device)
        sess, provider = _onnx_session(path, chk.device.type == "cuda")
        return (lambda: run_onnx(sess, x.cpu(), (0.667, 4.0, 0.0))), provider

    return _inference_row(chk, f"VITS {preset} (random weights, 4 frames/token)", audio_s, eager, compiled, onnx,
                          repeats)


def vae_tiled(chk: Check, side: int) -> dict:
    from common.config import config_to_dict
    from vae.model import build_vae
    from vae.reconstruct import reconstruct_tiled

    spec = TRAINERS["vae"]
    cfg = spec.config(spec.rtx, spec.tiny() if chk.dry else [])
    model = build_vae(config_to_dict(cfg)).to(chk.device).eval()
    x = torch.rand(1, 3, side, side, device=chk.device) * 2 - 1
    tile, overlap = (64, 16) if chk.dry else (512, 64)
    row: dict = {"what": f"VAE {spec.rtx.stem} reconstruction of a {side}² image, {tile}-px tiles, overlap {overlap}"}
    for label, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
        chk.reset_memory()
        with torch.autocast(chk.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            row[f"{label}_s"] = seconds_per_step(lambda: reconstruct_tiled(model, x, tile, overlap), 1, chk.device)
        row[f"{label}_peak_gib"] = chk.peak_gib()
    return row


def section_inference(chk: Check, sec: Section) -> None:
    repeats = 2 if chk.dry else 10
    rows = sec.data.setdefault("rows", [])
    jobs: list[tuple[str, Callable[[], dict]]] = [("vocoder", lambda: vocoder_inference(chk, repeats))]
    for preset in (["tiny"] if chk.dry else ["tiny", "medium", "vits_base"]):
        jobs.append((f"vits {preset}", lambda p=preset: vits_inference(chk, p, repeats)))
    for label, job in jobs:
        try:
            sec.check_time(label)
            rows.append(job())
        except OverBudget as e:
            sec.partial(str(e))
        except Exception:
            sec.partial(chk.error(f"inference {label}"))
    sec.markdown += ["| what | eager s | compiled s | ONNX Runtime s | ONNX provider | RTF eager |",
                     "|---|---|---|---|---|---|"]
    for r in rows:
        sec.markdown.append(f"| {r['what']} | {r['eager_s']:.4f} | {_fmt(r['compiled_s'], '.4f')} | {r['onnx_s']:.4f} "
                            f"| {r['onnx_provider']} | {r['eager_s'] / r['audio_s']:.4f} |")
    try:
        sec.check_time("VAE tiled reconstruction")
        vae = vae_tiled(chk, 128 if chk.dry else 2048)
        sec.data["vae_tiled"] = vae
        sec.markdown += ["", f"{vae['what']}: fp32 {vae['fp32_s']:.3f} s (peak GiB: {_fmt(vae['fp32_peak_gib'], '.2f')}), "
                             f"bf16 {vae['bf16_s']:.3f} s (peak GiB: {_fmt(vae['bf16_peak_gib'], '.2f')})"]
    except OverBudget as e:
        sec.partial(str(e))
    except Exception:
        sec.partial(chk.error("inference VAE tiled"))


# ---------------------------------------------------------------------------------------- 6 --profile_memory
def section_profile_memory(chk: Check, sec: Section) -> None:
    """`vae/train_vae.py --profile_memory` (vae.memory.profile_memory with the trainer's own step)."""
    from vae.memory import profile_memory
    from vae.train_vae import new_step

    spec = TRAINERS["vae"]
    cfg = spec.config(spec.rtx, spec.tiny() if chk.dry else [])
    cfg.output_dir = str(chk.tmp / "profile_memory")
    resolutions, batches = ([32, 64], [1, 2]) if chk.dry else ([256, 512, 1024, 2048], [1, 2, 4, 8, 16])
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        rc = profile_memory(new_step, cfg, resolutions, batches)
    said = log.getvalue().strip()
    print(said, flush=True)
    table = Path(cfg.output_dir) / "memory_profile.json"
    sec.data = {"exit_code": rc, "resolutions": resolutions, "batches": batches, "printed": said.splitlines()}
    if table.is_file():
        sec.data["rows"] = json.loads(table.read_text())["rows"]
        sec.markdown += (Path(cfg.output_dir) / "memory_profile.md").read_text().splitlines()
    else:
        sec.data["rows"] = []
        sec.markdown += [f"`profile_memory` returned {rc} and printed: {said}"]
        if chk.device.type == "cuda":
            sec.partial("no memory table was written on a CUDA machine")
        else:
            sec.notes.append("n/a on CPU: peak GPU memory cannot be measured without CUDA (the CPU path ran and said so)")


SECTIONS: dict[str, tuple[str, Callable[[Check, Section], None]]] = {
    "environment": ("1. Environment", section_environment),
    "pytest_cuda": ("2. pytest -m cuda", section_pytest),
    "step_tables": ("3. Training step tables", section_step_tables),
    "batch_size": ("4. Batch size: finder, 20 steps, forced OOM", section_batch_size),
    "inference": ("5. Inference speed", section_inference),
    "profile_memory": ("6. VAE --profile_memory", section_profile_memory),
}


# ---------------------------------------------------------------------------------------- the run
def run(out: Path, dry: bool, budget_minutes: float, only: list[str] | None = None) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available() and not dry
    device = torch.device("cuda" if cuda else "cpu")
    if dry:
        torch.set_num_threads(1)  # tiny shapes gain nothing from more, and a shared CPU stalls OpenMP
    scale = budget_minutes / sum(BUDGET_MINUTES.values())
    started, t_all = time.strftime("%Y-%m-%d %H:%M:%S %Z"), time.monotonic()
    end_all = t_all + 60 * budget_minutes
    sections: list[Section] = []
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp, open(out / "gpu_check.log", "w") as log:
        chk = Check(out, dry, device, Path(tmp))
        for key, (title, fn) in SECTIONS.items():
            sec = Section(key, title, 60 * BUDGET_MINUTES[key] * scale)
            sections.append(sec)
            if only and key not in only:
                sec.status, sec.notes = "skipped", ["not selected (--sections)"]
                continue
            if time.monotonic() > end_all:
                sec.status, sec.notes = "skipped", [f"skipped: the run's {budget_minutes:g} min budget is used up"]
                continue
            print(f"[gpu_check] {title} (budget {sec.budget_s:.0f} s)", flush=True)
            t0 = time.monotonic()
            sec.deadline = min(t0 + sec.budget_s, end_all)
            log.write(f"\n===== {title} =====\n")
            log.flush()
            try:
                with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                    fn(chk, sec)
            except OverBudget as e:
                sec.partial(str(e))
            except Exception:
                sec.status = "failed"
                sec.notes.append(chk.error(f"section {key}"))
            sec.seconds = time.monotonic() - t0
            print(f"[gpu_check]   {sec.status} in {sec.seconds:.1f} s" + (f": {sec.notes[0]}" if sec.notes else ""),
                  flush=True)
    if chk.errors:
        (out / "errors.log").write_text("\n\n".join(chk.errors))
    report = {"version": 1, "dry_run": dry, "device": "CPU" if not cuda else torch.cuda.get_device_name(0),
              "started": started, "total_s": time.monotonic() - t_all, "budget_s": 60 * budget_minutes,
              "command": " ".join(sys.argv), "sections": {s.name: _section_json(s) for s in sections}}
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "report.md").write_text(render_markdown(report, sections))
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= MAX_FILES, f"gpu_check wrote {len(files)} files into {out}, more than {MAX_FILES}: {files}"
    return report


def _section_json(s: Section) -> dict:
    d = asdict(s)
    d.pop("markdown")
    d.pop("deadline")
    return d


def render_markdown(report: dict, sections: list[Section]) -> str:
    lines = [f"# gpu_check report{' (DRY RUN on the CPU: tiny sizes)' if report['dry_run'] else ''}", "",
             f"{report['device']}, started {report['started']}, {report['total_s']:.0f} s of a "
             f"{report['budget_s'] / 60:g} min budget. `{report['command']}`", "",
             "| section | status | seconds | budget s | notes |", "|---|---|---|---|---|"]
    for s in sections:
        lines.append(f"| {s.title} | {s.status} | {s.seconds:.0f} | {s.budget_s:.0f} | {'; '.join(s.notes)[:300]} |")
    for s in sections:
        lines += ["", f"## {s.title}", "", f"status **{s.status}**" + (": " + "; ".join(s.notes) if s.notes else ""),
                  "", *s.markdown]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for report.md, report.json and the logs (at most 8 files)")
    p.add_argument("--dry-run", action="store_true", help="every section on the CPU at tiny sizes")
    p.add_argument("--budget-minutes", type=float, default=25.0, help="the whole run's time; sections get shares")
    p.add_argument("--sections", default="", help=f"comma-separated subset of {','.join(SECTIONS)} (default: all)")
    args = p.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("no CUDA GPU here: `python -m bench.gpu_check --dry-run --out DIR` runs the same sections on the CPU",
              file=sys.stderr)
        return 2
    only = [s for s in args.sections.split(",") if s] or None
    report = run(Path(args.out), args.dry_run, args.budget_minutes, only)
    bad = [k for k, s in report["sections"].items() if s["status"] == "failed"]
    print(f"[gpu_check] wrote {args.out}/report.md and report.json" + (f"; failed: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
