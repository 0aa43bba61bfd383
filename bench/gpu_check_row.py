"""One step-table row in a process of its own (bench/gpu_check_training.py starts it).

Why: cuDNN keeps the plans it chose per process, keyed by shape and math mode but not by
`cudnn.benchmark`. A row that autotunes after another row ran the same shapes reuses that row's
heuristic plans and measures nothing; a row after an autotuned one inherits its tuned plans. On the
first lent H200 the vocoder's "plain" row ran after its autotuned base row and matched it (0.499 s
against 0.502 s); run first, plain takes 0.626 s. So the rows where cuDNN autotunes (the configs as
shipped and "plain + cudnn benchmark") each start from an empty plan cache here.

    python -m bench.gpu_check_row '<json: trainer, which, overrides, data, tmp, device, dry, steps, warmup, count>'

The row's dict is the last stdout line, after MARK."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

MARK = "[gpu_check_row] "
REPO = Path(__file__).resolve().parents[1]


def measure_in_child(job: dict, timeout_s: float) -> tuple[dict, str]:
    """Runs `job` (see the module docstring) in a fresh interpreter; returns (row, what it printed).
    Raises TimeoutError when it runs past `timeout_s`, RuntimeError naming its last line when it fails."""
    try:
        proc = subprocess.run([sys.executable, "-m", "bench.gpu_check_row", json.dumps(job)], cwd=REPO,
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
    from bench.gpu_check_base import Check
    from bench.gpu_check_training import measure_steps
    from bench.gpu_trainers import TRAINERS

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
