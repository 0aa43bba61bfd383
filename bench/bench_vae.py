"""VAE training throughput and memory: per profile, and each optimisation flag's effect alone.

    python -m bench.bench_vae                 # on the machine at hand (scaled down on a CPU)
    python -m bench.bench_vae --steps 10 --output runs/bench/vae.json

One run prints one table: images/s and peak memory of the real training step (`VAEStep.train_step`:
VAE + KL + GAN on, LPIPS when its weights are cached) for every profile in vae/configs, then the
baseline (fp32, no compile, contiguous layout, TF32 off, 0 DataLoader workers) against each flag
switched on alone, as a ratio. What this device cannot measure is printed as "n/a (needs CUDA)".
On a CPU the profiles are scaled down (widths / 8, crops / 16, batch 1) and it says so; the ratios
are still real measurements of this machine (and of its load: run it on an idle machine).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from common.config import load_config
from common.data import ResumableSampler, make_loader
from vae.config import VAEConfig
from vae.data import ImageDataset
from vae.losses import FrozenLPIPS, PerceptualWeightsError
from vae.step import VAEStep

PROFILES = ("fast_768", "standard_1024", "high_1536", "max_2048", "large_channel_z32")
CONFIGS = Path(__file__).resolve().parents[1] / "vae" / "configs"
NA = "n/a (needs CUDA)"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def scale_for_cpu(cfg: VAEConfig) -> VAEConfig:
    cfg = copy.deepcopy(cfg)
    cfg.channels = [max(8, c // 8) for c in cfg.channels]
    cfg.norm_num_groups = 8
    cfg.image_size = max(32, cfg.image_size // 16 // 8 * 8)
    cfg.batch_size, cfg.accumulation_steps = 1, 1
    cfg.disc_channels = 16
    return cfg


def measure_step(cfg: VAEConfig, device: torch.device, steps: int, perceptual, warmup: int = 2) -> dict:
    """Median images/s of `steps` training steps on random data, and the peak CUDA memory."""
    torch.manual_seed(0)
    trial = copy.deepcopy(cfg)
    trial.disc_start, trial.ema_decay = 0, 0.999  # the full step: GAN and EMA on
    trial.perceptual_weight = cfg.perceptual_weight if perceptual is not None else 0.0
    t = VAEStep(trial, device, total_steps=steps + warmup, perceptual=perceptual)
    b = int(cfg.batch_size)
    x = torch.rand(b, 3, cfg.image_size, cfg.image_size, device=device) * 2 - 1
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    for i in range(warmup):
        t.train_step([x], i)
    _sync(device)
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        t.train_step([x], warmup + i)
        _sync(device)
        times.append(time.perf_counter() - t0)
    out = {"images_per_s": b / statistics.median(times)}
    out["peak_gib"] = torch.cuda.max_memory_allocated(device) / 1024**3 if device.type == "cuda" else None
    return out


def write_noise_pngs(folder: Path, n: int, side: int) -> list[Path]:
    """`n` random RGB PNGs of `side` px: real decode and crop work for the data loop, nothing to learn."""
    rng = np.random.default_rng(0)
    paths = [folder / f"{i:04d}.png" for i in range(n)]
    for p in paths:
        Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8)).save(p)
    return paths


def measure_loader(cfg: VAEConfig, device: torch.device, steps: int, workers: int, folder: Path, perceptual) -> dict:
    """images/s of the real loop (PNG decode + random crop + step) with `workers` DataLoader workers."""
    torch.manual_seed(0)
    trial = copy.deepcopy(cfg)
    trial.disc_start = 0
    trial.perceptual_weight = cfg.perceptual_weight if perceptual is not None else 0.0
    t = VAEStep(trial, device, total_steps=steps + 2, perceptual=perceptual)
    ds = ImageDataset(sorted(folder.glob("*.png")), cfg.image_size)
    loader = make_loader(ds, batch_size=int(cfg.batch_size), sampler=ResumableSampler(ds, seed=0), num_workers=workers,
                         prefetch_factor=4, pin_memory=True, persistent_workers=False, seed=0, drop_last=True)
    it = iter(loader)
    t.train_step([next(it)], 0)  # warm-up (workers started, first batch)
    _sync(device)
    t0 = time.perf_counter()
    n = 0
    for i in range(steps):
        t.train_step([next(it)], i + 1)
        n += int(cfg.batch_size)
    _sync(device)
    return {"images_per_s": n / (time.perf_counter() - t0), "peak_gib": None}


def _fmt_ips(r: dict | str | None) -> str:
    return r if isinstance(r, str) else f"{r['images_per_s']:.2f}"


def _fmt_mem(r: dict | str | None) -> str:
    if isinstance(r, str):
        return "-"
    return f"{r['peak_gib']:.2f}" if r.get("peak_gib") is not None else NA


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="", help="cuda / cpu (default: cuda if available)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per measurement (default 10 GPU, 4 CPU)")
    p.add_argument("--profile", default="standard_1024", help="profile the flag ablation runs on")
    p.add_argument("--workers", type=int, default=None, help="workers for the 'workers' row (default: min(4, cpus))")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="measure torch.compile (default: on for CUDA; on CPU it costs minutes of compile time)")
    p.add_argument("--output", default="", help="also write the results as JSON here")
    p.add_argument("--threads", type=int, default=0,
                   help="CPU threads (default: torch's, or 1 when other jobs already fill the CPU)")
    args = p.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = device.type == "cuda"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if args.threads:
        torch.set_num_threads(args.threads)
    elif not cuda and load >= (os.cpu_count() or 1) and torch.get_num_threads() > 1:
        # OpenMP threads on a CPU that other jobs already fill stall at every barrier (10x slower here).
        print(f"CPU busy (load {load:.1f} on {os.cpu_count()} cores): 1 thread; numbers reflect that load")
        torch.set_num_threads(1)
    steps = args.steps or (10 if cuda else 3)
    workers = args.workers if args.workers is not None else min(4, os.cpu_count() or 1)
    do_compile = cuda if args.compile is None else args.compile
    print(f"bench_vae on {torch.cuda.get_device_name(device) if cuda else 'CPU'} "
          f"(torch {torch.__version__}, {torch.get_num_threads()} threads), {steps} timed steps each")
    if not cuda:
        print("CPU: every profile is scaled down (channel widths / 8, crop / 16, batch 1); memory columns need CUDA")

    perceptual = None
    try:
        perceptual = FrozenLPIPS("vgg").to(device)
        lpips_note = "LPIPS on (VGG16 cached)"
    except PerceptualWeightsError:
        lpips_note = "LPIPS off (VGG16 backbone not cached; nothing is downloaded)"
    print(lpips_note)

    results: dict = {"device": str(device), "steps": steps, "lpips": perceptual is not None, "profiles": {},
                     "flags": {}, "scaled_down": not cuda}
    rows = []
    for name in PROFILES:
        cfg = load_config(CONFIGS / f"{name}.yaml", VAEConfig)
        if not cuda:
            cfg = scale_for_cpu(cfg)
        cfg.use_torch_compile = False
        try:
            r = measure_step(cfg, device, steps, perceptual)
        except torch.OutOfMemoryError:
            r = "OOM"
            torch.cuda.empty_cache()
        results["profiles"][name] = {"image_size": cfg.image_size, "batch_size": cfg.batch_size, "result": r}
        rows.append((name, f"{cfg.image_size}px b{cfg.batch_size} {cfg.channels} z{cfg.z_channels}", r))
        print(f"  profile {name:18s} {_fmt_ips(r):>8s} img/s  peak {_fmt_mem(r)} GiB", flush=True)

    base = load_config(CONFIGS / f"{args.profile}.yaml", VAEConfig)
    if not cuda:
        base = scale_for_cpu(base)
    base.precision, base.use_torch_compile = "32-true", False
    base.channels_last, base.enable_tf32, base.cudnn_benchmark = False, False, cuda
    variants = {
        "baseline (fp32)": {},
        "bf16 autocast": {"precision": "bf16-mixed"},
        "fp16 autocast + GradScaler": {"precision": "16-mixed"},
        "torch.compile": {"use_torch_compile": True},
        "channels_last": {"channels_last": True},
        "TF32": {"enable_tf32": True},
    }
    flag_results: dict[str, dict | str] = {}
    for label, change in variants.items():
        if label == "TF32" and not cuda:
            flag_results[label] = NA
        elif label == "torch.compile" and not do_compile:
            flag_results[label] = "skipped (CPU: minutes of compile time; --compile to measure)"
        else:
            cfg = copy.deepcopy(base)
            for k, v in change.items():
                setattr(cfg, k, v)
            try:
                flag_results[label] = measure_step(cfg, device, steps, perceptual)
            except torch.OutOfMemoryError:
                flag_results[label] = "OOM"
        print(f"  {label:28s} {_fmt_ips(flag_results[label])}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        # decode + crop work like real prepared data (crop < image)
        write_noise_pngs(folder, max(32, 4 * steps * int(base.batch_size)), base.image_size * 2)
        loop0 = measure_loader(base, device, steps * 2, 0, folder, perceptual)
        loopn = measure_loader(base, device, steps * 2, workers, folder, perceptual)
    flag_results["loop, 0 workers"] = loop0
    flag_results[f"loop, {workers} workers"] = loopn
    print(f"  {'loop with data, 0 workers':28s} {_fmt_ips(loop0)}\n  {f'loop with data, {workers} workers':28s} "
          f"{_fmt_ips(loopn)}", flush=True)
    results["flags"] = flag_results

    ref = flag_results["baseline (fp32)"]
    lines = ["", f"## VAE training on {'CUDA: ' + torch.cuda.get_device_name(device) if cuda else 'CPU (scaled down)'}",
             f"{lpips_note}; {steps} timed steps each; ratio = images/s / baseline images/s", "",
             "| what | setting | images/s | ratio | peak GiB |", "|---|---|---|---|---|"]
    for name, desc, r in rows:
        ratio = f"{r['images_per_s'] / ref['images_per_s']:.2f}" if isinstance(r, dict) and isinstance(ref, dict) else "-"
        lines.append(f"| profile {name} | {desc} | {_fmt_ips(r)} | {ratio} | {_fmt_mem(r)} |")
    for label, r in flag_results.items():
        if label.startswith("loop"):
            continue
        ratio = f"{r['images_per_s'] / ref['images_per_s']:.2f}" if isinstance(r, dict) else "-"
        lines.append(f"| flag alone | {label} ({args.profile}) | {_fmt_ips(r)} | {ratio} | {_fmt_mem(r)} |")
    lines.append(f"| workers | data loop, 0 -> {workers} workers | {_fmt_ips(loop0)} -> {_fmt_ips(loopn)} | "
                 f"{loopn['images_per_s'] / loop0['images_per_s']:.2f} | - |")
    print("\n".join(lines))
    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1, default=str) + "\n", encoding="utf-8")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
