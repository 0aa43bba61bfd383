"""FLOPs per step of the configs the published H200 step tables ran, counted here on the CPU.

Why: `FlopCounterMode` counts from shapes alone, so a CPU counts what the GPU ran as long as the config,
the batch and the synthetic data are the same (`bench/gpu/trainers.py` at real size, as `make gpu-check`
builds them). This restated bench/README.md's H200 tables after the count was corrected (grouped conv
weight gradients; optimizer and recompute apart: `peak_flops.count_flops`).

    python -m bench.gpu.recount [--out flops.json] [--only vocoder:base,vits:base]

A 16-mixed config is counted in bf16-mixed: autocast to either runs the same convs and matmuls, and the
CPU has no fast fp16. One real-size step per config: minutes on a small CPU. The vocoder's 5090 config
(batch 32) would want more memory than a 24 GB machine has: `--vocoder-batch 16` counts it at batch 16 and
scales the model's FLOPs to the config's batch (every crop has the same length, so each conv and matmul is per item; the optimizer
step does not depend on the batch and is not scaled).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from bench.gpu.peak_flops import count_flops
from bench.gpu.trainers import TRAINERS, build

# (trainer, config) of every row with a FLOP figure in bench/README.md's H200 tables
PUBLISHED = [("vocoder", "base"), ("vocoder", "rtx5090"), ("vits", "base"), ("clone", "base"), ("vae", "base")]
PRECISION_KEY = {"vocoder": "precision", "vits": "precision", "clone": "train.precision", "vae": "precision"}
# one batch is counted, so no loader workers: their processes kept the command from exiting after its JSON
WORKERS_KEY = {"vocoder": "num_workers", "vits": "num_workers", "clone": "train.num_workers", "vae": "num_workers"}


def recount(name: str, which: str, root: Path, vocoder_batch: int | None = None) -> dict:
    """One real-size step of `name`'s `which` config on the CPU, counted: model / optimizer / recompute.
    `vocoder_batch`: count the vocoder at this batch and scale its model FLOPs to the config's batch."""
    spec = TRAINERS[name]
    t0 = time.perf_counter()
    made = root / f"data_{name}.path"  # make_data may hand back a folder inside the one it was given
    data = Path(made.read_text()) if made.exists() else spec.make_data(root / f"data_{name}", dry=False)
    made.write_text(str(data))
    sets: list[str] = [f"{WORKERS_KEY[name]}=0"]
    batch = None
    if name == "vocoder" and vocoder_batch:
        batch = spec._config(spec.base if which == "base" else spec.rtx, []).batch_size
        sets.append(f"batch_size={vocoder_batch}")
    st = build(spec, which, sets, data, root / f"run_{name}_{which}", torch.device("cpu"), dry=False)
    if st.precision == "16-mixed":
        del st
        sets.append(f"{PRECISION_KEY[name]}=bf16-mixed")
        st = build(spec, which, sets, data, root / f"run_{name}_{which}_bf16", torch.device("cpu"), dry=False)
    first = next(st.batches())
    t1 = time.perf_counter()
    flops = count_flops(lambda: st.step(first))
    scale = (batch / st.batch_size) if batch else 1.0
    row = {"trainer": name, "config": which, "batch": batch or st.batch_size, "batch_counted": st.batch_size,
           "precision_counted": st.precision, "model": round(flops.model * scale), "optimizer": flops.optimizer,
           "recompute": round(flops.recompute * scale), "setup_s": t1 - t0, "count_s": time.perf_counter() - t1}
    row["total"] = row["model"] + row["optimizer"] + row["recompute"]
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("flops.json"))
    ap.add_argument("--only", default="", help="trainer:config,... (default: every published row)")
    ap.add_argument("--vocoder-batch", type=int, default=None, help="count the vocoder at this batch, scaled")
    ap.add_argument("--tmp", type=Path, default=None, help="where the synthetic data goes (default: a temp folder)")
    args = ap.parse_args(argv)
    rows = [tuple(x.split(":")) for x in args.only.split(",")] if args.only else PUBLISHED
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        root = args.tmp or Path(tmp)
        for name, which in rows:
            r = recount(name, which, root, args.vocoder_batch)
            results[f"{name}:{which}"] = r
            args.out.write_text(json.dumps(results, indent=1))
            print(f"{name} {which}: model {r['model'] / 1e12:.3f} TFLOP, optimizer {r['optimizer'] / 1e9:.2f} GFLOP, "
                  f"recompute {r['recompute'] / 1e9:.2f} GFLOP (batch {r['batch']}, {r['count_s']:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
