"""A trained VAE for inference, from whichever file a run left: a training checkpoint, `vae_final.pt`
or the exported diffusers folder.

Why here and not in the trainer: `reconstruct.py`, the demo and users' scripts load weights without
importing the training loop (and its DDP, LPIPS and logging imports).
"""

from __future__ import annotations

from pathlib import Path

from common.checkpoint import CheckpointError, load_checkpoint, refuse_other_kind
from vae.diffusers_io import load_diffusers
from vae.model import AutoencoderKL, build_vae


def load_vae_weights(path: str | Path, use_ema: bool = True) -> tuple[AutoencoderKL, dict]:
    """(model, what was loaded). A checkpoint gives its EMA weights when it has them and `use_ema`."""
    path = Path(path)
    if path.is_dir():
        model, cfg = load_diffusers(path)
        return model, {"source": "diffusers", "scaling_factor": cfg.get("scaling_factor")}
    ckpt = load_checkpoint(path)
    refuse_other_kind(path, ckpt, "vae")
    if "state_dict" in ckpt and "arch" in ckpt:  # vae_final.pt
        model = build_vae(ckpt["arch"])
        model.load_state_dict(ckpt["state_dict"])
        return model, {"source": "final", **ckpt.get("latent_stats", {})}
    arch = ckpt.get("extra", {}).get("arch")
    if arch is None:
        raise CheckpointError(f"{path}: not a VAE checkpoint from vae/train_vae.py (no 'extra.arch')")
    model = build_vae(arch)
    ema = ckpt.get("ema", {}).get("vae")
    if use_ema and ema:
        model.load_state_dict({k: v for k, v in ema["shadow"].items()})
        return model, {"source": "checkpoint (EMA weights)"}
    model.load_state_dict(ckpt["models"]["vae"])
    return model, {"source": "checkpoint"}
