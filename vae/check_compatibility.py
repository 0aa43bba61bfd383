"""Will VAE training run on this machine? Versions, GPU architecture (sm_120 for RTX 50xx), bf16, a
real tiny bf16 training step, and whether LPIPS' weights are available offline. (What fits in GPU
memory is `vae/memory.py`.)

    python vae/check_compatibility.py

Works on a CPU-only machine (and says so). Exit status 1 only when something training needs is
broken (the bf16 step fails, a GPU is present that this torch cannot run on, or an LPIPS backbone
file is present or given but training would refuse to load it).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
import time
from pathlib import Path

import torch

from common import exit_codes
from common.cli import FlagParser
from common.hardware import (
    arch_support,
    hardware_report,
)
from common.precision import Precision, bf16_supported
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


def main(argv: list[str] | None = None) -> int:
    return exit_codes.run_main(lambda: check(argv))


def check(argv: list[str] | None) -> int:
    """The checks and their report; `main` runs them through `common.exit_codes.run_main` (a user error: one
    line, exit 2; a bug: its traceback)."""
    p = FlagParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--perceptual_weights", default=None, help="check this VGG16 file instead of the cache")
    args = p.parse_args(argv)
    lines, ok = report(args.perceptual_weights)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
