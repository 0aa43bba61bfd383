"""`make gpu-check`: everything this repository claims about CUDA, checked in one run on one GPU.

    shell/gpu_check.sh [args]                     # = make gpu-check: finds a CUDA torch, installs what is missing
    python -m bench.gpu [--out DIR] [--budget-minutes 8] [--compile-minutes 2.5] [--sections a,b]
    python -m bench.gpu --out /tmp/gc --dry-run        # the same run on the CPU, tiny sizes

Eleven sections, most valuable first, each with its share of what is left of the budget when it starts:
1 environment; the questions of "Fast on the card" (`FAST_ON_THE_CARD`): 2 openvpi/SingingVocoders at its
own defaults beside our fastest shipped vocoder config in audio-seconds per second (only with
`--reference-dir` or `.ref/SingingVocoders`), 3 a vocoder bf16 step under torch.profiler (top kernels, GPU
idle share, kernels and host syncs per step), 4 the vocoder's peak memory with its largest allocations'
stacks (TF32 and IEEE fp32), 5 the alignment search's share of a VITS step at 8-s items, 6 the VAE at
1024 px with and without channels_last and gradient checkpointing; then 7 step tables per trainer
(`--passes`: 0 shipped and plain configs, 1 each speed key alone, 2 compiled rows; key by key across the
trainers; fraction of the card's peak FLOP/s; rows where cuDNN autotunes in a process of their own), 8 batch
size (the finder, steps at its pick, a forced OOM through the trainer's own exit path: exit code 4 and the
advice), 9 inference speed (vocoder, VITS, tiled VAE reconstruction at 2048 px), 10 the VAE's
`--profile_memory` table, 11 `pytest -m cuda` (tests/cuda). A section stops between measurements when its budget is spent and says what it
skipped; a compiled measurement starts only when the time it needs is left (--compile-minutes caps them
all); an exception is written to errors.log and the next section runs. report.md and report.json are
rewritten after every measurement and on SIGINT / SIGTERM (exit 130), so a run stopped at a command's
time limit still brings back what it measured. Out: report.md, report.json, gpu_check.log (everything the
trainers printed), pytest_cuda.log, errors.log (only when something failed): at most 8 files.

`--dry-run` runs every section on the CPU at the tests' tiny sizes through the same code (the trainers'
own steps, loaders, finder, exit path), marks what a CPU cannot measure as "n/a on CPU" with the reason,
and simulates the OOM by raising torch.cuda.OutOfMemoryError from the trainer's step.
tests/bench/test_gpu_check.py runs it in `make test`, so the harness cannot rot while no GPU is lent.

Files, all in bench/gpu/: this one (the run, the report, sections 1, 10, 11), reference.py (2), profiling.py (3,
4), mas_share.py (5), vae_1024.py (6), training.py (7, 8), row.py (one row in its own process), inference.py (9),
base.py (budgets, the run's state), trainers.py (the four
trainers: configs, tiny sizes, synthetic data, their real step and loader), peak_flops.py, wheels.txt (what a CUDA
image lacks); __main__.py makes `python -m bench.gpu` this module's `main`; shell/gpu_check.sh (the interpreter and
the offline wheels).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

from bench.gpu.base import Check, OverBudget, Section, Stopped
from bench.gpu.inference import section_inference
from bench.gpu.mas_share import section_vits_mas
from bench.gpu.profiling import section_step_profile, section_vocoder_memory
from bench.gpu.reference import section_reference
from bench.gpu.trainers import TRAINERS
from bench.gpu.training import section_batch_size, section_step_tables
from bench.gpu.vae_1024 import section_vae_1024
from common.atomic_write import write_text

REPO = Path(__file__).resolve().parents[2]
# The default fits one command on the lent GPU machine (10 min a command, 15 min a session, its start
# included): 8 min of checks, of which at most 2.5 compiling. A section's budget is its share below of what
# is left of the run when it starts.
DEFAULT_BUDGET_MINUTES = 8.0
DEFAULT_COMPILE_MINUTES = 2.5
BUDGET_SHARES = {"environment": 0.25, "reference": 1.0, "step_profile": 0.75, "vocoder_memory": 0.75,
                 "vits_mas": 0.75, "vae_1024": 1.25, "step_tables": 3.25, "batch_size": 1.5, "inference": 1.0,
                 "profile_memory": 0.5, "pytest_cuda": 1.5}
# The questions of "Fast on the card" (issue item 6), most valuable first: one call of `--sections` these fits
# 8 minutes (bench/README.md gives the lent machine's call).
FAST_ON_THE_CARD = ("environment", "reference", "step_profile", "vocoder_memory", "vits_mas", "vae_1024")
REFERENCE_DIR = REPO / ".ref" / "SingingVocoders"  # ignored; fetched by hand and carried (bench/README.md)
MAX_FILES = 8


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


# ---------------------------------------------------------------------------------------- 11 pytest -m cuda
PYTEST_COUNTS = re.compile(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed)")


def section_pytest(chk: Check, sec: Section) -> None:
    """The CUDA-only tests (tests/cuda, marker `cuda`) in a child process, killed at the budget."""
    cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "tests/cuda", "-rs"]  # pyproject adds -q
    if chk.device.type == "cuda" and importlib.util.find_spec("xdist"):  # tiny trainings: 4 at once share the card
        cmd += ["-n", "4"]
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


# ---------------------------------------------------------------------------------------- 10 --profile_memory
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
        rc = profile_memory(new_step, cfg, resolutions, batches, deadline=sec.deadline)
    said = log.getvalue().strip()
    print(said, flush=True)
    table = Path(cfg.output_dir) / "memory_profile.json"
    sec.data = {"exit_code": rc, "resolutions": resolutions, "batches": batches, "printed": said.splitlines()}
    if table.is_file():
        sec.data["rows"] = json.loads(table.read_text())["rows"]
        late = [r for r in sec.data["rows"] if r["status"].startswith("not measured")]
        if late:
            sec.partial(f"{len(late)} of {len(sec.data['rows'])} cells not measured: the section's time ran out")
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
    "reference": ("2. SingingVocoders at its defaults beside our fastest config (audio s / s)", section_reference),
    "step_profile": ("3. Vocoder bf16 step under torch.profiler", section_step_profile),
    "vocoder_memory": ("4. Vocoder peak memory: largest allocations and their stacks", section_vocoder_memory),
    "vits_mas": ("5. VITS at 8-s items: the alignment search's share of the step", section_vits_mas),
    "vae_1024": ("6. VAE at 1024 px: channels_last and gradient checkpointing", section_vae_1024),
    "step_tables": ("7. Training step tables", section_step_tables),
    "batch_size": ("8. Batch size: finder, steps at its pick, forced OOM", section_batch_size),
    "inference": ("9. Inference speed", section_inference),
    "profile_memory": ("10. VAE --profile_memory", section_profile_memory),
    "pytest_cuda": ("11. pytest -m cuda", section_pytest),
}


# ---------------------------------------------------------------------------------------- the run
def _on_signal(signum, _frame) -> None:
    raise Stopped(signal.Signals(signum).name)


def run(out: Path, dry: bool, budget_minutes: float, only: list[str] | None = None,
        compile_minutes: float = DEFAULT_COMPILE_MINUTES, passes: tuple[int, ...] = (0, 1, 2),
        reference_dir: Path | None = None) -> dict:
    """Runs the sections in order; report.md / report.json are rewritten after every measurement, every
    section and on SIGINT / SIGTERM, so a run stopped at any point brings back what it measured."""
    out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available() and not dry
    device = torch.device("cuda" if cuda else "cpu")
    if dry:
        torch.set_num_threads(1)  # tiny shapes gain nothing from more, and a shared CPU stalls OpenMP
    started, t_all = time.strftime("%Y-%m-%d %H:%M:%S %Z"), time.monotonic()
    end_all = t_all + 60 * budget_minutes
    todo = [k for k in SECTIONS if (not only or k in only) and (k != "reference" or reference_dir)]
    sections = [Section(key, title, 0.0) for key, (title, _) in SECTIONS.items()]
    report = {"version": 2, "dry_run": dry, "device": "CPU" if not cuda else torch.cuda.get_device_name(0),
              "started": started, "total_s": 0.0, "budget_s": 60 * budget_minutes, "command": " ".join(sys.argv),
              "finished": False, "sections": {}}
    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp, open(out / "gpu_check.log", "w") as log:
        chk = Check(out, dry, device, Path(tmp), compile_left_s=60 * compile_minutes, passes=passes,
                    reference_dir=reference_dir)
        chk.progress = lambda: _write(out, report, sections, chk, t_all)
        try:
            for sec in sections:
                _run_section(chk, sec, todo, end_all, budget_minutes, log)
            report["finished"] = True
        except Stopped as e:
            for sec in sections:
                if sec.started and not sec.seconds:  # the section in progress
                    sec.status, sec.seconds = "stopped", time.monotonic() - sec.started
                    sec.notes.append(f"stopped by {e} part-way: what it measured is kept")
                elif sec.status == "waiting":
                    sec.status, sec.notes = "skipped", [f"skipped: the run was stopped by {e}"]
            report["stopped_by"] = str(e)
            print(f"[gpu_check] stopped by {e}: writing what was measured", flush=True)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            _write(out, report, sections, chk, t_all)
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= MAX_FILES, f"gpu_check wrote {len(files)} files into {out}, more than {MAX_FILES}: {files}"
    return report


def _run_section(chk: Check, sec: Section, todo: list[str], end_all: float, budget_minutes: float, log) -> None:
    """One section, with its share of what is left of the run (a section that finishes early leaves its
    time to the ones after it)."""
    if sec.name not in todo:
        why = ("no SingingVocoders checkout: --reference-dir, or .ref/SingingVocoders (bench/README.md)"
               if sec.name == "reference" and not chk.reference_dir else "not selected (--sections)")
        sec.status, sec.notes = "skipped", [why]
        return
    left = end_all - time.monotonic()
    if left <= 0:
        sec.status, sec.notes = "skipped", [f"skipped: the run's {budget_minutes:g} min budget is used up"]
        return
    later = todo[todo.index(sec.name):]
    sec.budget_s = left * BUDGET_SHARES[sec.name] / sum(BUDGET_SHARES[k] for k in later)
    title, fn = SECTIONS[sec.name]
    print(f"[gpu_check] {title} (budget {sec.budget_s:.0f} s)", flush=True)
    sec.status, sec.started = "running", time.monotonic()
    sec.deadline, sec.run_end = min(sec.started + sec.budget_s, end_all), end_all
    log.write(f"\n===== {title} =====\n")
    log.flush()
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            fn(chk, sec)
        sec.status = "ok" if sec.status == "running" else sec.status
    except OverBudget as e:
        sec.partial(str(e))
    except Exception:
        sec.status = "failed"
        sec.notes.append(chk.error(f"section {sec.name}"))
    sec.seconds = time.monotonic() - sec.started
    print(f"[gpu_check]   {sec.status} in {sec.seconds:.1f} s" + (f": {sec.notes[0]}" if sec.notes else ""), flush=True)
    chk.progress()


def _write(out: Path, report: dict, sections: list[Section], chk: Check, t_all: float) -> None:
    """report.json and report.md as they stand (each written whole: `common.atomic_write`)."""
    report["total_s"] = time.monotonic() - t_all
    report["sections"] = {s.name: _section_json(s) for s in sections}
    if chk.errors:
        write_text(out / "errors.log", "\n\n".join(chk.errors))
    write_text(out / "report.json", json.dumps(report, indent=1, default=str))
    write_text(out / "report.md", render_markdown(report, sections))


def _section_json(s: Section) -> dict:
    d = asdict(s)
    for k in ("markdown", "deadline", "started", "run_end"):
        d.pop(k)
    return d


def render_markdown(report: dict, sections: list[Section]) -> str:
    state = ("finished" if report["finished"] else f"STOPPED by {report['stopped_by']}" if "stopped_by" in report
             else "still running when this was written")
    lines = [f"# gpu_check report{' (DRY RUN on the CPU: tiny sizes)' if report['dry_run'] else ''}", "",
             f"{report['device']}, started {report['started']}, {report['total_s']:.0f} s of a "
             f"{report['budget_s'] / 60:g} min budget, {state}. `{report['command']}`", "",
             "| section | status | seconds | budget s | notes |", "|---|---|---|---|---|"]
    for s in sections:
        lines.append(f"| {s.title} | {s.status} | {s.seconds:.0f} | {s.budget_s:.0f} | {'; '.join(s.notes)[:300]} |")
    for s in sections:
        lines += ["", f"## {s.title}", "", f"status **{s.status}**" + (": " + "; ".join(s.notes) if s.notes else ""),
                  "", *s.markdown]
        if s.data.get("phases_s"):  # where the time went besides the measurement (Section.phase)
            lines += ["", "Set-up, s: " + ", ".join(f"{k} {v:g}" for k, v in s.data["phases_s"].items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=default_out(), help="folder for report.md, report.json and the logs (at most 8 "
                   "files); default $OUT/gpu_check where OUT is set (the lent GPU machine), else runs/gpu_check")
    p.add_argument("--dry-run", action="store_true", help="every section on the CPU at tiny sizes")
    p.add_argument("--budget-minutes", type=float, default=DEFAULT_BUDGET_MINUTES,
                   help="the whole run's time; each section gets its share of what is left when it starts")
    p.add_argument("--compile-minutes", type=float, default=DEFAULT_COMPILE_MINUTES,
                   help="of that, the most spent on torch.compile'd measurements (each skipped, with a note, "
                        "when less is left than a compile needs)")
    p.add_argument("--passes", default="0,1,2", help="the step tables' passes: 0 shipped configs and plain, "
                   "1 each speed key alone, 2 compiled (plain runs with 1 or 2: × plain needs it in the same run)")
    p.add_argument("--reference-dir", default=str(REFERENCE_DIR) if REFERENCE_DIR.is_dir() else None,
                   help="an openvpi/SingingVocoders checkout: section 2 times its step beside ours (default "
                        ".ref/SingingVocoders when present; without one the section is skipped)")
    p.add_argument("--sections", default="", help=f"comma-separated subset of {','.join(SECTIONS)} (default: all)")
    args = p.parse_args(argv)
    only = [s for s in args.sections.split(",") if s] or None
    unknown = [s for s in only or () if s not in SECTIONS]
    if unknown:  # a typo would skip every section and pass
        p.error(f"--sections: unknown {', '.join(unknown)}; choose from {','.join(SECTIONS)}")
    if not args.dry_run and not torch.cuda.is_available():
        why = ("no CUDA GPU here (torch " + torch.__version__ + ", CUDA build " + str(torch.version.cuda) + "): "
               "`python -m bench.gpu --dry-run` runs the same sections on the CPU")
        run(Path(args.out), False, args.budget_minutes, ["environment"], 0.0)  # the report says what it found
        report_md = Path(args.out) / "report.md"
        report_md.write_text(f"# gpu_check: NOT RUN\n\n{why}\n\n" + report_md.read_text(encoding="utf-8"), encoding="utf-8")
        print(f"error: {why}", file=sys.stderr)
        return 2
    try:
        passes = tuple(sorted({int(x) for x in args.passes.split(",") if x.strip()}))
    except ValueError:
        passes = ()
    if not passes or not set(passes) <= {0, 1, 2}:
        p.error(f"--passes: a comma-separated subset of 0,1,2, got {args.passes!r}")
    reference = Path(args.reference_dir) if args.reference_dir else None
    if reference is not None and not reference.is_dir():
        p.error(f"--reference-dir {args.reference_dir}: no such folder; fetch openvpi/SingingVocoders there")
    for flag, v in (("--budget-minutes", args.budget_minutes), ("--compile-minutes", args.compile_minutes)):
        if not v >= 0:
            p.error(f"{flag} must be a number of minutes >= 0, got {v}")
    report = run(Path(args.out), args.dry_run, args.budget_minutes, only, args.compile_minutes, passes, reference)
    bad = [k for k, s in report["sections"].items() if s["status"] == "failed"]
    print(f"[gpu_check] wrote {args.out}/report.md and report.json" + (f"; failed: {', '.join(bad)}" if bad else ""))
    if "stopped_by" in report:
        return 130
    return 1 if bad else 0


def default_out() -> str:
    return str(Path(os.environ["OUT"]) / "gpu_check") if os.environ.get("OUT") else "runs/gpu_check"


if __name__ == "__main__":
    raise SystemExit(main())
