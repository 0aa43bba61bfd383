"""`train_decoder_only`: fine-tune the decoder of an existing VAE and keep its latent space (the
sd-vae-ft-mse recipe; diffusers' `train_autoencoderkl.py --decoder_only`).

Why these checks: a diffusion model is trained on one encoder's latents, scaled by that VAE's
`scaling_factor` (and `shift_factor`). A decoder-only run is useful only if both stay exactly the
init's, so the run refuses to start without an init (a random frozen encoder would be a useless
latent space), without the init's factors (re-estimating them on the user's images would change
what the diffusion model receives), and without the whole encoder loaded.

The model side is `AutoencoderKL.freeze_encoder`; the EMA holds only `AutoencoderKL.DECODER_SIDE`.
"""

from __future__ import annotations

import json
from pathlib import Path

from common.checkpoint import CheckpointError
from common.errors import ConfigError
from common.run_dir import existing_checkpoints
from vae.config import DECODER_ONLY_FLAG as FLAG
from vae.config import VAEConfig
from vae.diffusers_io import INIT_RECORD
from vae.model import AutoencoderKL


def check_start(cfg: VAEConfig, init_from: str | None) -> None:
    """Before the run folder is touched: a decoder-only run starts from --init_from, or continues a run."""
    if not cfg.train_decoder_only or init_from:
        return
    resume = cfg.resume_from
    if resume and (resume != "auto" or existing_checkpoints(cfg.output_dir)):
        return
    raise ConfigError(f"{FLAG} fine-tunes the decoder of an existing VAE and keeps its latent space, but no VAE was "
                      "given: add --init_from <diffusers AutoencoderKL folder, vae_final.pt or checkpoint> "
                      "(or --resume_from a decoder-only run's checkpoint)")


def check_resume(ckpt: dict, path: Path, cfg: VAEConfig) -> None:
    """A run keeps its mode: resuming a decoder-only checkpoint without the flag, or the reverse, would
    rebuild another optimizer and EMA than the ones saved."""
    saved = bool(ckpt.get("config", {}).get("train_decoder_only", False))
    if saved != cfg.train_decoder_only:
        fix = f"add {FLAG}" if saved else f"leave out {FLAG} (or start a new run from it with --init_from)"
        raise CheckpointError(f"cannot resume from {path}: it was trained {'with' if saved else 'without'} "
                              f"{FLAG}; {fix}")


def init_factors(out_dir: Path) -> dict:
    """The init's {"init_from", "scaling_factor", "shift_factor"} the export will carry; ConfigError
    (exit 2) when the init recorded none."""
    record = out_dir / INIT_RECORD
    init = json.loads(record.read_text(encoding="utf-8")) if record.is_file() else {}
    if init.get("scaling_factor") is None:
        source = init.get("init_from") or "the init"
        raise ConfigError(f"{FLAG} exports the init's scaling_factor/shift_factor, and {source} records none "
                          f"({out_dir / INIT_RECORD}). Init from a VAE that carries them: a diffusers AutoencoderKL "
                          "folder (its config.json) or a finished run's vae_final.pt or diffusers/ folder")
    return init


def startup_lines(vae: AutoencoderKL, init: dict) -> list[str]:
    """What the run trains and which factors its export will carry (printed once at start)."""
    trainable = sum(p.numel() for p in vae.parameters() if p.requires_grad)
    return [f"{FLAG}: encoder and quant_conv frozen (eval mode, not in the optimizer or the EMA); training the "
            f"decoder side, {trainable / 1e6:.1f} M parameters",
            f"{FLAG}: the export keeps {init['init_from']}'s scaling_factor {init['scaling_factor']}, shift_factor "
            f"{init.get('shift_factor')} (not re-estimated: the latent space is the init's)"]
