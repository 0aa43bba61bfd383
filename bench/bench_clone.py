"""Voice-cloning TTS benchmark: throughput per model size, data-wait fraction, and time-to-target
validation loss for the default settings vs --fast-convergence vs --aggressive-lr.

    python -m bench.bench_clone                 # CPU: ~4 minutes; GPU: the same, bigger shapes
    python -m bench.bench_clone --samples 6000  # longer convergence runs

1. Samples/s per size: training steps (forward + MAS + backward + AdamW) on fixed-shape synthetic
   batches, after warm-up steps. `normal` runs with a smaller batch on the CPU (said in the table).
2. Data-wait fraction: the share of step time spent waiting for the DataLoader in the real
   training loop on the demo corpus (common.log.Progress), with 0 and 2 workers.
3. Convergence: `tiny` on the demo corpus (data/demo/tts_prepared) under the three option sets,
   each with the SAME budget of training samples, timing when the teacher-forced validation mel
   L1 first reaches the target (default: what the default settings reach at the end of their
   budget). SCALED FOR THE CPU: batch sizes and grad-accum divided by --scale, warmups divided by
   --warmup-scale; the learning rates and the presets' other values are unchanged. The printed
   numbers are measured in this run, not claimed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch
import yaml

from bench.timing import seconds_per_step
from tts.clone.config import LossConfig, ModelConfig
from tts.clone.model import VoiceCloneTTS, count_parameters
from tts.clone.options import build_parser, resolve_config
from tts.clone.train import train
from tts.text import SYMBOLS

PREPARED = Path("data/demo/tts_prepared")
CONFIG = Path(__file__).resolve().parents[1] / "tts" / "clone" / "configs" / "clone_demo.yaml"


def synthetic_batch(b: int, t_text: int, t_frames: int, t_ref: int, n_mels: int, device: torch.device) -> dict:
    g = torch.Generator().manual_seed(0)
    batch = {
        "text": torch.randint(1, len(SYMBOLS), (b, t_text), generator=g),
        "text_mask": torch.ones(b, t_text, dtype=torch.bool),
        "mel": torch.randn(b, n_mels, t_frames, generator=g) - 5.0,
        "mel_mask": torch.ones(b, t_frames, dtype=torch.bool),
        "ref_mel": torch.randn(b, n_mels, t_ref, generator=g) - 5.0,
        "ref_mask": torch.ones(b, t_ref, dtype=torch.bool),
        "f0": torch.full((b, t_frames), 150.0), "voiced": torch.ones(b, t_frames, dtype=torch.bool),
    }
    return {k: v.to(device) for k, v in batch.items()}


def throughput(size: str, batch: int, device: torch.device, steps: int, warmup: int = 1) -> dict:
    """Training samples/s of one size on fixed shapes (4 s utterances at the demo mel settings)."""
    torch.manual_seed(0)
    model = VoiceCloneTTS(ModelConfig(size=size), len(SYMBOLS), 80).to(device)
    opt = torch.optim.AdamW(model.parameters(), 1e-4)
    data = synthetic_batch(batch, 56, 344, 172, 80, device)
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    def step() -> None:
        with amp:
            out = model(data["text"], data["text_mask"], data["mel"], data["mel_mask"], data["ref_mel"],
                        data["ref_mask"])
        loss = model.losses(out, data, LossConfig())["loss"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    dt = seconds_per_step(step, steps, device, warmup)
    return {"size": size, "params_M": count_parameters(model) / 1e6, "batch": batch, "step_s": dt,
            "samples_per_s": batch / dt}


def base_config(root: Path) -> Path:
    """The demo config's model/audio/data sections only: the optimisation settings stay the documented
    defaults, so 'default' in the table means train_main's defaults, not the demo's tuning."""
    demo = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    out = root / "bench_base.yaml"
    out.write_text(yaml.safe_dump({k: demo[k] for k in ("model", "audio", "data") if k in demo}))
    return out


def run_variant(name: str, flags: list[str], args, run_root: Path, cache: Path, target: float | None,
                quiet: bool) -> dict:
    """One convergence run of `tiny` on the demo corpus with the given option set, scaled for the CPU."""
    argv = ["--config", str(base_config(run_root)), "--train-data", str(PREPARED), "--checkpoint-dir", str(run_root / name),
            "--set", f"data.cache_dir={cache}", "--set", "val.at_start=true", "--set", "val.sentences=[]",
            "--precision", "32-true", *flags]
    res = resolve_config(build_parser().parse_args(argv))
    cfg = res.cfg
    if args.scale > 1:  # the presets were written for a GPU: same ratios, CPU-sized
        cfg.train.batch_size = max(1, round(cfg.train.batch_size / args.scale))
        cfg.train.grad_accum = max(1, round(cfg.train.grad_accum / args.scale))
    cfg.scheduler.warmup_steps = max(1, round(cfg.scheduler.warmup_steps / args.warmup_scale))
    per_step = cfg.train.batch_size * cfg.train.grad_accum
    cfg.train.max_updates = max(cfg.scheduler.warmup_steps + 1, args.samples // per_step)
    cfg.train.validate_every = max(1, args.val_every_samples // per_step)
    cfg.train.save_every = cfg.train.max_updates
    cfg.train.log_every = cfg.train.validate_every
    cfg.train.num_workers = 0
    cfg.val.max_batches = 0
    summary = train(res, progress=False, log=(lambda *a: None) if quiet else print)
    hist = summary["history"]
    reached = next((h for h in hist if target is not None and h["mel_l1"] <= target), None)
    return {"name": name, "flags": " ".join(flags) or "(defaults)", "lr": cfg.optim.lr,
            "batch": f"{cfg.train.batch_size}x{cfg.train.grad_accum}", "warmup": cfg.scheduler.warmup_steps,
            "steps": summary["step"], "train_s": summary["train_s"], "first": hist[0]["mel_l1"],
            "final": hist[-1]["mel_l1"], "best": min(h["mel_l1"] for h in hist), "history": hist,
            "time_to_target_s": None if reached is None else reached["train_s"],
            "data_wait": summary["data_wait_fraction"]}


def data_wait(workers: int, run_root: Path, cache: Path, steps: int) -> float:
    argv = ["--config", str(base_config(run_root)), "--train-data", str(PREPARED),
            "--checkpoint-dir", str(run_root / f"dw{workers}"), "--batch-size", "8",
            "--set", f"data.cache_dir={cache}", "--set", "val.at_start=false", "--set", "val.sentences=[]",
            "--num-workers", str(workers), "--set", f"train.max_updates={steps}",
            "--set", f"train.val_check_interval={steps}", "--set", "scheduler.warmup_steps=1", "--set", "val.max_batches=1"]
    summary = train(resolve_config(build_parser().parse_args(argv)), progress=False, log=lambda *a: None)
    return summary["data_wait_fraction"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=1600, help="training samples per convergence run")
    p.add_argument("--val-every-samples", type=int, default=200)
    p.add_argument("--scale", type=float, default=4.0, help="divide batch sizes and grad-accum by this (CPU)")
    p.add_argument("--warmup-scale", type=float, default=20.0, help="divide warmups by this (short CPU runs)")
    p.add_argument("--target", type=float, default=None,
                   help="validation mel L1 target (default: the default settings' final value)")
    p.add_argument("--skip-sizes", action="store_true")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t_all = time.time()
    results: dict = {"device": str(device), "threads": torch.get_num_threads()}
    print(f"voice-cloning benchmark on {device} ({torch.get_num_threads()} threads)")

    if not args.skip_sizes:
        print("\n1. training throughput per model size (synthetic 4 s utterances, fixed shapes)")
        plan = [("tiny", 8, 4), ("small", 4, 2), ("normal", 2, 1)] if device.type == "cpu" else \
            [("tiny", 64, 20), ("small", 32, 20), ("normal", 16, 20)]
        rows = [throughput(s, b, device, n) for s, b, n in plan]
        results["sizes"] = rows
        print(f"   {'size':<8}{'params':>9}{'batch':>7}{'step s':>9}{'samples/s':>11}")
        for r in rows:
            print(f"   {r['size']:<8}{r['params_M']:>8.1f}M{r['batch']:>7}{r['step_s']:>9.3f}{r['samples_per_s']:>11.2f}")

    if not (PREPARED / "train.jsonl").is_file():
        print(f"\n{PREPARED} missing: run `make tts-demo` (or tts/clone_demo.py) first for parts 2 and 3")
        return 0
    root = Path(tempfile.mkdtemp(prefix="bench_clone_"))
    cache = root / "features"
    try:
        print("\n2. data-wait fraction in the real loop (demo corpus, cached features, tiny)")
        waits = {w: data_wait(w, root, cache, 12) for w in (0, 2)}
        results["data_wait"] = waits
        for w, f in waits.items():
            print(f"   num_workers={w}: {f:.1%} of step time waiting for data")

        print(f"\n3. time to target validation mel L1, tiny on the demo corpus, {args.samples} training samples each "
              f"(SCALED FOR CPU: batch and grad-accum / {args.scale:g}, warmup / {args.warmup_scale:g})")
        variants = [("default", []), ("fast-convergence", ["--fast-convergence"]),
                    ("aggressive-lr", ["--aggressive-lr"])]
        runs = [run_variant(n, f, args, root, cache, None, not args.verbose) for n, f in variants]
        target = args.target if args.target is not None else runs[0]["final"]
        for r in runs:
            hit = next((h for h in r["history"] if h["mel_l1"] <= target), None)
            r["time_to_target_s"] = None if hit is None else hit["train_s"]
        results["target"] = target
        results["convergence"] = [{k: v for k, v in r.items() if k != "history"} for r in runs]
        base = runs[0]["time_to_target_s"]
        print(f"   target: mel L1 <= {target:.4f}" + (" (the default run's final value)" if args.target is None else ""))
        print(f"   {'variant':<18}{'LR':>9}{'batch':>7}{'warmup':>7}{'steps':>7}{'step0':>8}{'final':>8}"
              f"{'to target':>13}{'vs default':>11}")
        for r in runs:
            ttt = r["time_to_target_s"]
            rel = f"{base / ttt:.2f}x" if ttt and base else "-"
            print(f"   {r['name']:<18}{r['lr']:>9.1e}{r['batch']:>7}{r['warmup']:>7}{r['steps']:>7}{r['first']:>8.3f}"
                  f"{r['final']:>8.3f}{(f'{ttt:.1f} s' if ttt is not None else 'not reached'):>13}{rel:>11}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\n(total {time.time() - t_all:.0f} s; 'vs default' > 1 means faster to the target)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
