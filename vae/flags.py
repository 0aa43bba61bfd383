"""The RTX 5090 VAE guide's command-line flags, each a `VAEConfig` key (or its alias: the guide's
`--gradient_clip`, `--val_freq`, `--keep_checkpoints` set `clip_grad_norm`, `val_check_interval`,
`save_n_checkpoints`), and how they meet the config.

A flag left out is None ("not given"), so the config's value stands; `--set key=value` overrides
any key. Kept out of `train_vae.py` so the trainer reads as builders -> one step -> the loop.
"""

from __future__ import annotations

import argparse

from common.best_by import best_by_help
from common.cli import FlagParser
from common.config import ConfigError, add_config_args, config_sources, explicit_keys, load_config
from common.presets import add_preset_arg
from common.run_dir import add_run_args
from vae.config import VALIDATES, VAEConfig
from vae.memory import add_profile_args

VALUE_FLAGS: dict[str, type] = {
    "data_path": str, "val_data_path": str, "image_size": int, "batch_size": str,
    "num_epochs": int, "max_steps": int, "learning_rate": float, "z_channels": int, "kl_weight": float,
    "perceptual_weight": float, "perceptual_weights": str, "gradient_clip": float, "num_workers": int,
    "checkpoint_freq": int, "save_samples_freq": int, "accumulation_steps": int,
    "disc_start": int, "disc_weight": float, "layers_per_block": int, "ema_decay": float,
    "warmup_steps": int, "val_freq": int, "log_freq": int, "seed": int, "device": str,
    "stop_at_step": int, "time_limit_minutes": float, "log_every": int, "validate_every": int,
    "save_every": int, "max_minutes": float, "keep_checkpoints": int, "num_val_images": int,
    "disc_learning_rate": float, "precision": str, "logger": str, "best_by": str,
}
BOOL_FLAGS = ("mixed_precision", "use_bf16", "use_torch_compile", "enable_tf32", "channels_last",
              "persistent_workers", "gradient_checkpointing", "learn_logvar", "random_flip", "export_diffusers",
              "train_decoder_only")


def add_guide_flags(p: argparse.ArgumentParser) -> None:
    """`--<key> VALUE` for every value flag, `--channels W ...`, `--<key>` / `--no-<key>` for switches."""
    own_help = {"best_by": best_by_help(VALIDATES, VAEConfig.best_by)}  # the metrics the VAE measures
    for name, tp in VALUE_FLAGS.items():
        p.add_argument(f"--{name}", type=tp, default=None,
                       help=own_help.get(name, f"config key {VAEConfig.ALIASES.get(name, name)}"))
    p.add_argument("--channels", type=int, nargs="+", default=None, help="block widths, e.g. 128 256 512 512")
    for name in BOOL_FLAGS:
        p.add_argument(f"--{name}", action=argparse.BooleanOptionalAction, default=None)


def resolve_config(args: argparse.Namespace) -> VAEConfig:
    """The config the command line asks for: YAML/JSON file, then the flags given, then `--set`."""
    extra = {name: getattr(args, name) for name in (*VALUE_FLAGS, *BOOL_FLAGS, "channels")}
    extra.update(output_dir=args.run_dir, resume_from=args.resume)
    cfg = load_config(args.config, VAEConfig, overrides=args.overrides, extra=extra)
    given = explicit_keys(cfg)
    if cfg.max_steps > 0 and "num_epochs" in given and "max_steps" not in given:  # a file's max_steps would win
        where = config_sources(cfg).get("max_steps", "the config")
        raise ConfigError(f"num_epochs (given on the command line) has no effect while max_steps is {cfg.max_steps} "
                          f"(set in {where}); give the length as --max_steps N, or add --max_steps 0 to count epochs")
    return cfg


def build_parser(description: str = "Train an SD/FLUX-style KL autoencoder.") -> argparse.ArgumentParser:
    """`vae/train_vae.py`'s command line: config, run folder, the guide's flags, memory profiling, presets."""
    p = FlagParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(p, set_example="ema_decay=0.9999")
    add_run_args(p, run_aliases=("--output_dir",), resume_aliases=("--resume_from",),
                 run_help="config key output_dir: checkpoints, samples, logs (alias --output_dir)")
    add_guide_flags(p)
    add_profile_args(p)
    add_preset_arg(p)
    return p
