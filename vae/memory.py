"""What fits in GPU memory, measured with the trainer's own training step: the batch size at start-up
(`choose_batch_size`: `--batch_size auto` and `fit_batch_size`) and the whole table per resolution and
batch (`profile_memory`, the trainer's `--profile_memory`).

    python vae/train_vae.py --config vae/configs/standard_1024.yaml --profile_memory --output_dir runs/mem

The trainer hands in `new_step(cfg)`: a fresh model's training step for that config, so this module
measures the very step training runs without importing the trainer.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from collections.abc import Callable

import torch

from common.atomic_write import write_text
from common.config import ConfigError, config_to_dict
from common.distributed import gather_objects
from common.hardware import exceeds_int32_indexing, find_batch_size, fit_batch_size, is_oom
from common.precision import normalize_precision
from common.run_dir import check_output_dir
from vae.config import VAEConfig
from vae.losses import FrozenLPIPS, lpips_or_random
from vae.presets import CARD_PRESETS

# new_step(cfg, device, perceptual) -> a fresh model's training step: step(micro_batches, global_step)
NewStep = Callable[[VAEConfig, torch.device, FrozenLPIPS | None], Callable[[list[torch.Tensor], int], object]]


def add_profile_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile_memory", action="store_true",
                   help="measure peak GPU memory per resolution and batch size, write a table, exit")
    p.add_argument("--profile_resolutions", type=int, nargs="+", default=None,
                   help="with --profile_memory (default 256 512 768 1024 1536 2048)")
    p.add_argument("--profile_batches", type=int, nargs="+", default=None, help="with --profile_memory (default 1 2 4 8 16)")


def profile_grid(args: argparse.Namespace) -> tuple[list[int], list[int]]:
    """The resolutions and batch sizes `--profile_memory` measures; ConfigError for either without it."""
    if not args.profile_memory:
        given = [f for f, v in (("--profile_resolutions", args.profile_resolutions),
                                ("--profile_batches", args.profile_batches)) if v is not None]
        if given:
            raise ConfigError(f"{', '.join(given)} only shape --profile_memory; add it, or drop them")
    return (args.profile_resolutions or [256, 512, 768, 1024, 1536, 2048], args.profile_batches or [1, 2, 4, 8, 16])


def _trial_step(new_step: NewStep, cfg: VAEConfig, device: torch.device, perceptual: FrozenLPIPS | None):
    """One real training step at batch b (GAN on: the heaviest step), for the batch-size searches;
    eager (compiling each trial would take minutes, and eager needs at least the compiled memory)."""
    trial_cfg = copy.copy(cfg)
    trial_cfg.ema_decay, trial_cfg.disc_start, trial_cfg.use_torch_compile = 0.0, 0, False

    def try_batch(b: int) -> None:
        step = new_step(trial_cfg, device, perceptual)
        x = torch.rand(b, 3, cfg.image_size, cfg.image_size, device=device) * 2 - 1
        try:
            step([x], 0)
            torch.cuda.synchronize(device)
        finally:
            del step, x

    return try_batch


def choose_batch_size(new_step: NewStep, cfg: VAEConfig, device: torch.device, perceptual: FrozenLPIPS | None,
                      main: bool) -> None:
    """`--batch_size auto`: the largest batch that fits (measured on CUDA with the real step; the CPU
    preset's on a CPU). Otherwise the profile's batch as written, lowered at start when it does not fit
    this GPU (accumulation raised so images per step stay the same). Every rank takes the smallest."""
    cuda = device.type == "cuda"
    if cfg.batch_size == "auto":
        if not cuda:
            cfg.batch_size = CARD_PRESETS.values["cpu"]["batch_size"]
            print(f"--batch_size auto: no CUDA device, so GPU memory cannot be measured; using batch_size "
                  f"{cfg.batch_size} (the CPU preset). Give an explicit --batch_size to choose another.")
            return
        cfg.batch_size = min(gather_objects(find_batch_size(_trial_step(new_step, cfg, device, perceptual), start=1,
                                                            limit=256, headroom=0.9)))
    elif cfg.fit_batch_size:
        batch, accum, line = fit_batch_size(_trial_step(new_step, cfg, device, perceptual) if cuda else lambda b: None,
                                            int(cfg.batch_size), cfg.accumulation_steps, cuda_available=cuda)
        cfg.batch_size, cfg.accumulation_steps = min(gather_objects((batch, accum)), key=lambda ba: ba[0])
        if main:
            print(f"batch finder: {line}")


def profile_memory(new_step: NewStep, cfg: VAEConfig, resolutions: list[int], batches: list[int],
                   deadline: float | None = None) -> int:
    """Peak GPU memory of one full training step (VAE + LPIPS + GAN on) per resolution and batch, written
    to `<output_dir>/memory_profile.md` and `.json`. The step is the trainer's own (`new_step`). A batch past
    memory or a kernel's 2^31-element limit ends its resolution's row; past `deadline` (time.monotonic())
    the cells not yet measured are listed as not measured."""
    device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type != "cuda":
        print("--profile_memory measures GPU memory and needs a CUDA GPU; this machine has none, so there is "
              "nothing to measure. Run it on the training machine.")
        return 0
    perceptual = None
    if cfg.perceptual_weight > 0:
        perceptual = lpips_or_random(cfg.perceptual_net, cfg.perceptual_weights or None,
                                     note="LPIPS backbone not cached; profiling with a random-weight backbone (same memory)")
    trial = copy.copy(cfg)
    trial.disc_start = 0
    rows = []
    name = torch.cuda.get_device_name(device)
    total = torch.cuda.get_device_properties(device).total_memory / 1024**3
    precision = normalize_precision(cfg.precision, device)
    print(f"profiling on {name} ({total:.1f} GiB), precision {precision}, channels {cfg.channels}, "
          f"z {cfg.z_channels}, gradient_checkpointing {cfg.gradient_checkpointing}")
    for res in resolutions:
        trial.image_size = res
        for b in batches:
            if deadline is not None and time.monotonic() > deadline:
                rows.append({"image_size": res, "batch_size": b, "status": "not measured (time limit)"})
                continue
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            row = {"image_size": res, "batch_size": b}
            try:
                step = new_step(trial, device, perceptual)
                x = torch.rand(b, 3, res, res, device=device) * 2 - 1
                step([x], 0)  # warm-up step (allocator, cudnn autotune)
                torch.cuda.synchronize(device)
                t0 = time.perf_counter()
                step([x], 1)
                torch.cuda.synchronize(device)
                row.update(peak_gib=round(torch.cuda.max_memory_allocated(device) / 1024**3, 2),
                           step_s=round(time.perf_counter() - t0, 3), status="ok")
                row["images_per_s"] = round(b / row["step_s"], 2)
                del step, x
            except Exception as exc:
                if not is_oom(exc):
                    raise
                row.update(status="too large (2^31 elements)" if exceeds_int32_indexing(exc) else "OOM")
            rows.append(row)
            print(f"  {res:5d} px  batch {b:3d}: " + (f"{row['peak_gib']:6.2f} GiB  {row['images_per_s']} img/s"
                                                      if row["status"] == "ok" else row["status"]))
            if row["status"] != "ok":
                break  # larger batches will not fit either
    out = check_output_dir(cfg.output_dir, "--output_dir")
    write_text(out / "memory_profile.json", json.dumps({"gpu": name, "total_gib": total, "rows": rows,
                                                       "config": config_to_dict(cfg)}, indent=1))
    lines = [f"# VAE training memory on {name} ({total:.1f} GiB)", "",
             f"precision {precision}, channels {cfg.channels}, z_channels {cfg.z_channels}, "
             f"gradient_checkpointing {cfg.gradient_checkpointing}, LPIPS {'on' if perceptual else 'off'}, "
             f"GAN on", "", "| image_size | batch | peak GiB | images/s |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['image_size']} | {r['batch_size']} | "
                     + (f"{r['peak_gib']} | {r['images_per_s']} |" if r["status"] == "ok" else f"{r['status']} | - |"))
    write_text(out / "memory_profile.md", "\n".join(lines) + "\n")
    print(f"wrote {out / 'memory_profile.md'} and memory_profile.json")
    return 0


