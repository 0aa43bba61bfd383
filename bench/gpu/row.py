"""One step-table row: `measure_steps`, in this process or in a process of its own (`measure_in_child`;
bench/gpu/training.py starts it).

Why: cuDNN keeps the plans it chose per process, keyed by shape and math mode but not by
`cudnn.benchmark`. A row that autotunes after another row ran the same shapes reuses that row's
heuristic plans and measures nothing; a row after an autotuned one inherits its tuned plans. On the
first lent H200 the vocoder's "plain" row ran after its autotuned base row and matched it (0.499 s
against 0.502 s); run first, plain takes 0.626 s. So the rows where cuDNN autotunes (the configs as
shipped and "plain + cudnn benchmark") each start from an empty plan cache here.

    python -m bench.gpu.row '<json: trainer, which, overrides, data, tmp, device, dry, steps, warmup, count>'

The row's dict is the last stdout line, after MARK."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench.gpu.base import Check
from bench.gpu.peak_flops import count_flops, math_mode
from bench.gpu.trainers import TRAINERS, TrainerSpec, build

MARK = "[gpu_check_row] "
REPO = Path(__file__).resolve().parents[2]


def measure_steps(chk: Check, spec: TrainerSpec, which: str, overrides: list[str], steps: int, warmup: int,
                  count: bool) -> dict:
    """Step time, samples/s, data-wait fraction (time blocked on the trainer's own loader), the compute
    time (step time minus that wait: what "% of peak" divides by), peak memory, and with `count` FLOPs
    (model / optimizer / recompute: `peak_flops.StepFlops`), counted on the first, untimed step (rows of
    the same config and batch do the same math whatever the precision or layout, so they reuse that count).
    A 16-mixed row's first step may skip its optimizer step (GradScaler's inf check at the initial scale):
    its optimizer FLOPs then read 0, the model's are the same."""
    t0 = time.perf_counter()
    data = chk.data(spec)
    t1 = time.perf_counter()
    st = build(spec, which, overrides, data, chk.run_dir(f"{spec.name}_{which}"), chk.device, chk.dry)
    it = st.batches()
    first = next(it)
    t2 = time.perf_counter()
    flops = None
    if count and not st.compiled:
        flops = count_flops(lambda: st.step(first)).as_dict()
    else:
        st.step(first)
    chk.sync()
    t3 = time.perf_counter()
    for _ in range(warmup - 1):
        st.step(next(it))
    chk.sync()
    # where a row's time goes besides its timed steps (the first lent GPU spent ~40 s a row at real size)
    phases = {"data_s": t1 - t0, "build_s": t2 - t1, "first_step_s": t3 - t2, "warmup_s": time.perf_counter() - t3}
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
           "compute_s": busy / steps, "samples_per_s": st.samples / step_s, "data_wait": wait / (wait + busy),
           "peak_gib": chk.peak_gib(), "flops": flops, "math": math_mode(st.precision, tf32), "phases": phases}
    return row


def measure_in_child(job: dict, timeout_s: float) -> tuple[dict, str]:
    """Runs `job` (see the module docstring) in a fresh interpreter; returns (row, what it printed).
    Raises TimeoutError when it runs past `timeout_s`, RuntimeError naming its last line when it fails."""
    try:
        proc = subprocess.run([sys.executable, "-m", "bench.gpu.row", json.dumps(job)], cwd=REPO,
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        raise TimeoutError(f"the row's process ran past {timeout_s:.0f} s") from e
    said = proc.stdout + proc.stderr
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith(MARK)), None)
    if proc.returncode or line is None:
        last = next((ln for ln in reversed(said.splitlines()) if ln.strip()), "no output")
        raise RuntimeError(f"the row's process exited {proc.returncode}: {last[:300]}")
    return json.loads(line[len(MARK):]), said


def main(argv: list[str]) -> int:
    job = json.loads(argv[0])
    spec = TRAINERS[job["trainer"]]
    if job["dry"]:
        torch.set_num_threads(1)
    chk = Check(Path(job["tmp"]), job["dry"], torch.device(job["device"]), Path(job["tmp"]))
    chk._data[spec.name] = Path(job["data"])  # made once by the parent
    row = measure_steps(chk, spec, job["which"], job["overrides"], job["steps"], job["warmup"], job["count"])
    print(MARK + json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
