"""Will VAE training run on this machine? Versions, GPU architecture (sm_120 for RTX 50xx), bf16, a
real tiny bf16 training step, and whether LPIPS' weights are available offline. And what fits in GPU
memory, measured with the trainer's own step: the batch size at start-up (`choose_batch_size`) and the
whole table per resolution and batch (`profile_memory`, the trainer's `--profile_memory`).

    python vae/check_compatibility.py
    python vae/train_vae.py --config vae/configs/standard_1024.yaml --profile_memory --output_dir runs/mem

Works on a CPU-only machine (and says so). Exit status 1 only when something training needs is
broken (the bf16 step fails, a GPU is present that this torch cannot run on, or an LPIPS backbone
file is present or given but training would refuse to load it).
"""

from __future__ import annotations

import argparse
import copy
import importlib.metadata
import json
import sys
import time
from pathlib import Path

import torch

from common.atomic_write import write_text
from common.config import config_to_dict
from common.distributed import gather_objects
from common.hardware import (
    arch_support,
    find_batch_size,
    fit_batch_size,
    hardware_report,
    is_oom,
    resolve_preset,
)
from common.precision import Precision, bf16_supported, normalize_precision
from common.run_dir import check_output_dir
from vae.config import VAEConfig
from vae.losses import BACKBONE_FILES, FrozenLPIPS, PerceptualWeightsError, backbone_cache_path


def _version(pkg: str) -> str:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def tiny_bf16_step(device: torch.device) -> tuple[bool, str]:
    """One forward/backward/AdamW step of a tiny VAE under bf16 autocast on `device`."""
    from vae.model import AutoencoderKL

    try:
        torch.manual_seed(0)
        model = AutoencoderKL([32, 64], z_channels=4, layers_per_block=1).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        prec = Precision("bf16-mixed", device)
        x = torch.rand(2, 3, 64, 64, device=device) * 2 - 1
        t0 = time.perf_counter()
        with prec.autocast():
            rec, post = model(x)
            loss = (rec.float() - x).abs().mean() + 1e-6 * post.kl().mean()
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        ms = (time.perf_counter() - t0) * 1000
        if not torch.isfinite(loss):
            return False, f"loss is {loss.item()}"
        return True, f"ok on {device} ({prec.precision}, output {rec.dtype}, loss {loss.item():.4f}, {ms:.0f} ms)"
    except Exception as exc:  # noqa: BLE001 - the report shows what failed
        return False, f"{type(exc).__name__}: {str(exc)[:300]}"


def backbone_status(net: str, path: Path, given: bool) -> tuple[bool | None, str]:
    """Loads the backbone file exactly as training does (FrozenLPIPS: the safe weights-only loader,
    then the torchvision key/shape check). None = no file (fine unless it is needed), False = a file
    training would refuse (or a `--perceptual_weights` file that does not exist)."""
    if not path.is_file():
        if given:
            return False, f"--perceptual_weights {path}: no such file"
        return None, f"NOT cached ({path})"
    try:
        FrozenLPIPS(net, path)
    except (PerceptualWeightsError, ValueError) as exc:
        return False, f"UNUSABLE: {exc}"
    return True, f"{'given' if given else 'cached'}, loads (weights-only, torchvision {net} layout) ({path})"


def report(perceptual_weights: str | None = None) -> tuple[list[str], bool]:
    lines, ok = [], True
    lines.append(hardware_report())
    lines.append("")
    lines.append("VAE trainer")
    for pkg in ("lpips", "pillow", "scikit-image", "tensorboard", "safetensors", "diffusers"):
        lines.append(f"  {pkg:14s} {_version(pkg)}")
    cuda = torch.cuda.is_available()
    archs = torch.cuda.get_arch_list() if torch.version.cuda else []
    lines.append(f"  sm_120 (RTX 50xx) kernels in this torch: {'yes' if 'sm_120' in archs else 'no'}"
                 + ("" if archs else " (CPU-only torch build)"))
    if cuda:
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            usable, why = arch_support((p.major, p.minor), archs)
            ok &= usable
            lines.append(f"  GPU {i} {p.name} sm_{p.major}{p.minor}: {why}")
        device = torch.device("cuda")
    else:
        lines.append("  no CUDA GPU: this is a CPU-only machine; training runs on the CPU (tests, demo), slowly")
        device = torch.device("cpu")
    lines.append(f"  bf16 on {device.type}: {'supported' if bf16_supported(device) else 'NOT supported (use fp16)'}")
    step_ok, msg = tiny_bf16_step(device)
    ok &= step_ok
    lines.append(f"  tiny bf16 training step: {msg}")

    import lpips

    lin = Path(lpips.__file__).parent / "weights" / "v0.1" / "vgg.pth"
    lines.append(f"  LPIPS linear weights (ship with lpips): {'found' if lin.is_file() else 'MISSING'} ({lin})")
    for net in BACKBONE_FILES:
        given = bool(perceptual_weights and net == "vgg")
        path = Path(perceptual_weights) if given else backbone_cache_path(net)
        usable, state = backbone_status(net, path, given)
        ok &= usable is not False
        lines.append(f"  LPIPS {net} backbone: {state}")
    if not backbone_cache_path("vgg").is_file() and not perceptual_weights:
        lines.append("    -> training with --perceptual_weight > 0 needs it: copy vgg16-397923af.pth into "
                     f"{backbone_cache_path('vgg').parent}/ or pass --perceptual_weights PATH "
                     "(nothing is downloaded at run time)")
    lines.append("")
    lines.append(f"Verdict: {'ready' if ok else 'NOT ready'}"
                 + ("" if cuda else " for CPU runs (no CUDA GPU found: CPU-only machine)"))
    return lines, ok


def _trial_step(cfg: VAEConfig, device: torch.device, perceptual: FrozenLPIPS | None):
    """One real training step at batch b (GAN on: the heaviest step), for the batch-size searches;
    eager (compiling each trial would take minutes, and eager needs at least the compiled memory)."""
    # Imported here: train_vae imports this module, and the checks above must run where training's imports fail.
    from vae.train_vae import VAETrainer

    trial_cfg = copy.copy(cfg)
    trial_cfg.ema_decay, trial_cfg.disc_start, trial_cfg.use_torch_compile = 0.0, 0, False

    def try_batch(b: int) -> None:
        t = VAETrainer(trial_cfg, device, perceptual=perceptual, quiet=True)
        x = torch.rand(b, 3, cfg.image_size, cfg.image_size, device=device) * 2 - 1
        try:
            t.step([x], global_step=0)
            torch.cuda.synchronize(device)
        finally:
            del t, x

    return try_batch


def choose_batch_size(cfg: VAEConfig, device: torch.device, perceptual: FrozenLPIPS | None, main: bool) -> None:
    """`--batch_size auto`: the largest batch that fits (measured on CUDA with the real step; the CPU
    preset's on a CPU). Otherwise the profile's batch as written, lowered at start when it does not fit
    this GPU (accumulation raised so images per step stay the same). Every rank takes the smallest."""
    cuda = device.type == "cuda"
    if cfg.batch_size == "auto":
        if not cuda:
            cfg.batch_size = resolve_preset("cpu", "vae")["batch_size"]
            print(f"--batch_size auto: no CUDA device, so GPU memory cannot be measured; using batch_size "
                  f"{cfg.batch_size} (the CPU preset). Give an explicit --batch_size to choose another.")
            return
        cfg.batch_size = min(gather_objects(find_batch_size(_trial_step(cfg, device, perceptual), start=1,
                                                            limit=256, headroom=0.9)))
    elif cfg.fit_batch_size:
        batch, accum, line = fit_batch_size(_trial_step(cfg, device, perceptual) if cuda else lambda b: None,
                                            int(cfg.batch_size), cfg.accumulation_steps, cuda_available=cuda)
        cfg.batch_size, cfg.accumulation_steps = min(gather_objects((batch, accum)), key=lambda ba: ba[0])
        if main:
            print(f"batch finder: {line}")


def profile_memory(cfg: VAEConfig, resolutions: list[int], batches: list[int]) -> int:
    """Peak GPU memory of one full training step (VAE + LPIPS + GAN on) per resolution and batch, written
    to `<output_dir>/memory_profile.md` and `.json`. The step is the trainer's own `VAETrainer.step`."""
    from vae.train_vae import VAETrainer  # imported here: see _trial_step

    device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type != "cuda":
        print("--profile_memory measures GPU memory and needs a CUDA GPU; this machine has none, so there is "
              "nothing to measure. Run it on the training machine.")
        return 0
    perceptual = None
    if cfg.perceptual_weight > 0:
        try:
            perceptual = FrozenLPIPS(cfg.perceptual_net, cfg.perceptual_weights or None)
        except PerceptualWeightsError:
            print("note: LPIPS backbone not cached; profiling with a random-weight backbone (same memory)")
            perceptual = FrozenLPIPS(cfg.perceptual_net, random_backbone=True)
    trial = copy.copy(cfg)
    trial.disc_start = 0
    rows = []
    name = torch.cuda.get_device_name(device)
    total = torch.cuda.get_device_properties(device).total_memory / 1024**3
    precision = normalize_precision(cfg.mixed_precision, device, cfg.amp_dtype)
    print(f"profiling on {name} ({total:.1f} GiB), precision {precision}, channels {cfg.channels}, "
          f"z {cfg.z_channels}, gradient_checkpointing {cfg.gradient_checkpointing}")
    for res in resolutions:
        trial.image_size = res
        for b in batches:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            row = {"image_size": res, "batch_size": b}
            try:
                t = VAETrainer(trial, device, perceptual=perceptual, quiet=True)
                x = torch.rand(b, 3, res, res, device=device) * 2 - 1
                t.step([x], 0)  # warm-up step (allocator, cudnn autotune)
                torch.cuda.synchronize(device)
                t0 = time.perf_counter()
                t.step([x], 1)
                torch.cuda.synchronize(device)
                row.update(peak_gib=round(torch.cuda.max_memory_allocated(device) / 1024**3, 2),
                           step_s=round(time.perf_counter() - t0, 3), status="ok")
                row["images_per_s"] = round(b / row["step_s"], 2)
                del t, x
            except Exception as exc:
                if not is_oom(exc):
                    raise
                row.update(status="OOM")
            rows.append(row)
            print(f"  {res:5d} px  batch {b:3d}: " + (f"{row['peak_gib']:6.2f} GiB  {row['images_per_s']} img/s"
                                                      if row["status"] == "ok" else "OOM"))
            if row["status"] == "OOM":
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
                     + (f"{r['peak_gib']} | {r['images_per_s']} |" if r["status"] == "ok" else "OOM | - |"))
    write_text(out / "memory_profile.md", "\n".join(lines) + "\n")
    print(f"wrote {out / 'memory_profile.md'} and memory_profile.json")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--perceptual_weights", default=None, help="check this VGG16 file instead of the cache")
    args = p.parse_args(argv)
    lines, ok = report(args.perceptual_weights)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
