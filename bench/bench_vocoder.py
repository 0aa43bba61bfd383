"""Vocoder training/inference benchmark: one table of ratios measured in one run.

    python -m bench.bench_vocoder                 # CPU: scaled-down models, ~2-3 minutes
    python -m bench.bench_vocoder --steps 20      # more timed steps per row (default 2 + 1 warm-up)
    python -m bench.bench_vocoder --json out.json

Rows: the two shipped configs (base_hifi_gpu, base_hifi_rtx5090_optimized) and each
optimisation of the 5090 config applied *alone* to the base config (precision, Muon_AdamW,
fast MPD, fast critics, DataLoader workers, torch.compile). Columns: step time (one step = one
D + one G update), training samples/s, ratio to base_hifi_gpu, data-wait fraction (time blocked
on the DataLoader / total), peak memory. Then inference real-time factor of the full-size
generators.

On a CPU the training rows are scaled down (generator width / 8, batch 1, 8-frame crops) so the
run stays short; they rank the options but are not GPU numbers. What a CPU cannot measure is
printed as "n/a (needs CUDA)". Timings on a shared machine are noisy: compare ratios from the
same run only.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from common.config import load_config
from common.log import peak_rss_gib
from vocoder.config import VocoderConfig
from vocoder.infer import VocoderInference
from vocoder.prepare_data import prepare
from vocoder.train import VocoderTrainer, build_generator

CONFIGS = Path(__file__).resolve().parent.parent / "vocoder" / "configs"
BASE = CONFIGS / "base_hifi_gpu.yaml"
RTX = CONFIGS / "base_hifi_rtx5090_optimized.yaml"
NA_CUDA = "n/a (needs CUDA)"


@dataclass
class Row:
    name: str
    config: Path
    overrides: list[str] = field(default_factory=list)
    cuda_only: str | None = None  # reason to skip on CPU
    result: dict = field(default_factory=dict)


def rows(cuda: bool, force_compile: bool, force_fp16: bool) -> list[Row]:
    compile_note = None if (cuda or force_compile) else (
        "n/a on CPU (compiling the conv stacks takes minutes here and DESIGN.md measured no conv1d "
        "gain on this CPU; --compile forces it)")
    fp16_note = None if (cuda or force_fp16) else (
        "n/a (needs CUDA): fp16 kernels are emulated on a CPU (measured ~20x slower than fp32 on the "
        "dev machine); --fp16 forces it")
    rtx = Row("base_hifi_rtx5090_optimized (all on)", RTX)
    if not (cuda or force_fp16):  # same options, but bf16 stands in for the CPU-emulated fp16
        rtx = Row("base_hifi_rtx5090_optimized (bf16 for fp16 on CPU)", RTX, ["precision=bf16-mixed"])
    return [
        Row("base_hifi_gpu (fp32, AdamW, MPD+MSD)", BASE),
        rtx,
        Row("  precision bf16-mixed", BASE, ["precision=bf16-mixed"]),
        Row("  precision 16-mixed (GradScaler)", BASE, ["precision=16-mixed"], cuda_only=fp16_note),
        Row("  Muon_AdamW for G and D", BASE, ["generator_optimizer_args.optimizer_cls=Muon_AdamW",
                                              "discriminator_optimizer_args.optimizer_cls=Muon_AdamW"]),
        Row("  fast MPD instead of MPD (+MSD)", BASE, ["model_args.discriminators=[fast_mpd,msd]"]),
        Row("  fast task critics (fast MPD + MRD)", BASE, ["task_cls=nsf_HiFigan_fast_task.nsf_HiFigan"]),
        Row("  mini_nsf source", BASE, ["model_args.mini_nsf=true"]),
        Row("  num_workers=2 (vs 0)", BASE, ["num_workers=2"]),
        Row("  torch.compile", BASE, ["compile=true"], cuda_only=compile_note),
    ]


def cpu_scale(cfg_path: Path, cuda: bool) -> list[str]:
    """Overrides that shrink a config for a CPU run (the same for every row, so ratios hold)."""
    if cuda:
        return []
    width = load_config(cfg_path, VocoderConfig).model_args.upsample_initial_channel // 8
    return [f"model_args.upsample_initial_channel={width}", "batch_size=1", "crop_mel_frames=8"]


def make_dataset(root: Path, seconds: float = 2.0, n: int = 8) -> Path:
    """Synthetic voiced tones at 44.1 kHz, prepared with the base audio settings."""
    sr = 44100
    (root / "wavs").mkdir(parents=True)
    rng = np.random.default_rng(0)
    t = np.arange(int(seconds * sr)) / sr
    for i in range(n):
        f0 = 110 + 30 * i
        phase = 2 * np.pi * np.cumsum(f0 * (1 + 0.03 * np.sin(2 * np.pi * 3 * t))) / sr
        wav = sum(np.sin(k * phase) / k for k in range(1, 10))
        wav = 0.3 * wav / np.abs(wav).max() + 0.003 * rng.standard_normal(len(t))
        sf.write(root / "wavs" / f"{i}.wav", wav.astype(np.float32), sr)
    cfg = load_config(BASE, VocoderConfig, ["val_num=1", "binarization_args.num_workers=0"])
    prepare(cfg, [root / "wavs"], root / "bin", log=lambda *a: None)
    return root / "bin"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_training(row: Row, data: Path, tmp: Path, steps: int, warmup: int, cuda: bool) -> dict:
    overrides = [*cpu_scale(row.config, cuda), *row.overrides, "num_sanity_val_steps=0", "log_interval=1000000",
                 "val_check_interval=1000000", f"max_updates={steps + warmup}"]
    if not any(o.startswith("num_workers=") for o in row.overrides):
        overrides.append("num_workers=0")
    cfg = load_config(row.config, VocoderConfig, overrides)
    device = "cuda" if cuda else "cpu"
    tr = VocoderTrainer(cfg, data, tmp / row.name.strip().replace(" ", "_")[:40], device=device,
                        log=lambda *a, **k: None)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    tr.sampler.set_epoch(0)
    it = iter(tr.loader)
    data_s = step_s = 0.0
    for i in range(steps + warmup):
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            tr.sampler.set_epoch(i)
            it = iter(tr.loader)
            batch = next(it)
        t1 = time.perf_counter()
        tr.train_step(batch)
        _sync(tr.device)
        t2 = time.perf_counter()
        if i >= warmup:
            data_s += t1 - t0
            step_s += t2 - t1
    per_step = (data_s + step_s) / steps
    out = {"step_s": per_step, "samples_per_s": cfg.batch_size / per_step,
           "data_wait": data_s / (data_s + step_s), "batch_size": cfg.batch_size,
           "peak_mem": (f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB" if cuda else NA_CUDA),
           "g_params_m": sum(p.numel() for p in tr.generator.parameters()) / 1e6,
           "d_params_m": sum(p.numel() for p in tr.discriminator.parameters()) / 1e6}
    del tr
    return out


@torch.no_grad()
def measure_inference(cfg_path: Path, cuda: bool, seconds: float = 2.0, repeats: int = 2) -> dict:
    """RTF (compute time / audio time) of the full-size generator, weight norm folded."""
    cfg = load_config(cfg_path, VocoderConfig)
    from vocoder.layouts import export_info

    device = torch.device("cuda" if cuda else "cpu")
    voc = VocoderInference(build_generator(cfg), export_info(cfg), device)
    frames = int(seconds * cfg.audio.sample_rate / cfg.audio.hop_length)
    mel = torch.randn(1, cfg.audio.n_mels, frames, device=device) - 5
    f0 = torch.full((1, frames), 200.0, device=device)
    out = {}
    for label, dtype in (("fp32", None), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        if dtype is torch.float16 and not cuda:
            out[label] = NA_CUDA
            continue
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            voc(mel, f0)
            _sync(device)
            t = time.perf_counter()
            for _ in range(repeats):
                voc(mel, f0)
            _sync(device)
        out[label] = (time.perf_counter() - t) / repeats / seconds
    return out


def _fmt(v, spec: str) -> str:
    return format(v, spec) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=2, help="timed steps per row (after --warmup)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--compile", action="store_true", help="also time torch.compile on a CPU")
    p.add_argument("--fp16", action="store_true", help="also time 16-mixed on a CPU (slow: emulated fp16)")
    p.add_argument("--no_inference", action="store_true")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    t_start = time.time()
    device_text = torch.cuda.get_device_name(0) if cuda else f"CPU, {torch.get_num_threads()} threads"
    print(f"vocoder benchmark on {device_text}, torch {torch.__version__}")
    if not cuda:
        print("CPU run: training rows are scaled down (generator width / 8, batch 1, 8-frame crops at 44.1 kHz);"
              " they compare options, they are not GPU throughput.")
    results: dict = {"device": device_text, "rows": {}, "inference_rtf": {}}
    with tempfile.TemporaryDirectory(prefix="bench_vocoder_") as tmp:
        tmp = Path(tmp)
        data = make_dataset(tmp / "data")
        table = rows(cuda, args.compile, args.fp16)
        for row in table:
            if row.cuda_only:
                row.result = {"skipped": row.cuda_only}
            else:
                try:
                    row.result = measure_training(row, data, tmp / "runs", args.steps, args.warmup, cuda)
                except Exception as e:  # noqa: BLE001 - one failing option must not hide the others
                    row.result = {"skipped": f"failed: {type(e).__name__}: {str(e)[:120]}"}
            results["rows"][row.name.strip()] = row.result
            print(f"  measured {row.name.strip()}", flush=True)
        if not args.no_inference:
            for name, path in (("base_hifi_gpu", BASE), ("base_hifi_rtx5090_optimized", RTX)):
                results["inference_rtf"][name] = measure_inference(path, cuda)

    base = table[0].result.get("step_s")
    print()
    print(f"{'training (1 step = 1 D + 1 G update)':52s} {'step s':>8s} {'samples/s':>10s} {'x base':>7s} "
          f"{'data wait':>9s}  peak memory")
    for row in table:
        r = row.result
        if "skipped" in r:
            print(f"{row.name:52s} {r['skipped']}")
            continue
        ratio = base / r["step_s"] if base else math.nan
        print(f"{row.name:52s} {r['step_s']:8.3f} {r['samples_per_s']:10.2f} {ratio:7.2f} "
              f"{100 * r['data_wait']:8.1f}%  {r['peak_mem']}")
    if results["inference_rtf"]:
        print()
        print(f"{'inference RTF (full-size generator, 2 s audio)':52s} {'fp32':>8s} {'bf16':>8s} {'fp16':>18s}")
        for name, r in results["inference_rtf"].items():
            print(f"{name:52s} {_fmt(r['fp32'], '8.3f')} {_fmt(r['bf16'], '8.3f')} {_fmt(r['fp16'], '>18s')}")
    peak_rss = peak_rss_gib()
    print()
    print(f"x base = base step time / row step time (higher is faster). Process peak RSS {peak_rss:.2f} GiB"
          f"{'' if cuda else '; per-row peak memory ' + NA_CUDA}. Total {time.time() - t_start:.0f} s.")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
