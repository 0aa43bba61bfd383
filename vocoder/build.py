"""The vocoder's builders from the config (data, models, optimizers, LR schedules) and its command line's
parser and run folder: what `vocoder/train.py` and the tools around it (benchmarks, reference checks) share."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch.optim.lr_scheduler import LambdaLR

from common.best_by import add_best_by_arg
from common.cli import FlagParser
from common.config import (
    ConfigError,
    add_config_args,
    format_config,
    load_config,
    note_prepare_keys,
    print_config_if_asked,
)
from common.data import ResumableSampler, make_loader
from common.log import add_logger_arg
from common.muon import build_optimizer
from common.precision import Precision
from common.presets import add_preset_arg, apply_preset
from common.run_dir import add_run_args, prepare_run_dir
from common.schedulers import lr_lambda
from common.training import count_parameters
from speech.audio import MelSpectrogram
from vocoder.config import VALIDATES, OptimizerArgs, VocoderConfig
from vocoder.data import VocoderDataset, collate, load_manifest
from vocoder.discriminators import Discriminators, build_discriminators
from vocoder.layouts import export_info, generator_args
from vocoder.losses import MelLoss, MultiResolutionSTFTLoss
from vocoder.model import Generator
from vocoder.presets import CARD_PRESETS


def build_generator(cfg: VocoderConfig) -> Generator:
    return Generator(generator_args(export_info(cfg)))


def build_discriminator(cfg: VocoderConfig) -> Discriminators:
    m = cfg.model_args
    return build_discriminators(cfg.discriminator_names, m.discriminator_periods, m.fast_mpd_strides,
                                m.fast_mpd_kernel_size, m.fast_mpd_init_channel, m.mrd_fft_sizes,
                                m.mrd_hop_sizes, m.mrd_win_lengths, m.mrd_channels, cfg.mpd_channels_last)


def build_data(cfg: VocoderConfig, data_dir: str | Path, world_size: int, device: torch.device) -> tuple:
    """(train set, validation set or None, the resumable sampler, the training loader) of a prepared folder."""
    manifest = load_manifest(data_dir, cfg)
    train_set = VocoderDataset(data_dir, manifest["train"], cfg, train=True, min_len=cfg.batch_size * world_size)
    valid_set = VocoderDataset(data_dir, manifest["valid"], cfg, train=False) if manifest["valid"] else None
    sampler = ResumableSampler(train_set, shuffle=True, seed=cfg.seed)
    loader = make_loader(
        train_set, batch_size=cfg.batch_size, sampler=sampler, num_workers=cfg.num_workers,
        prefetch_factor=cfg.dataloader_prefetch_factor, pin_memory=device.type == "cuda",
        persistent_workers=cfg.num_workers > 0, collate_fn=collate, seed=cfg.seed, drop_last=True,
    )
    return train_set, valid_set, sampler, loader


def build_losses(cfg: VocoderConfig, device: torch.device) -> tuple[MelLoss, MelSpectrogram, MultiResolutionSTFTLoss]:
    """(the mel loss, the input mel for pc_aug and validation, the MR-STFT loss), fp32 inside."""
    mel_loss = MelLoss(MelSpectrogram(**dict(cfg.audio.mel_kwargs, fmax=cfg.fmax_for_loss))).to(device)
    stft = MultiResolutionSTFTLoss(cfg.loss_fft_sizes, cfg.loss_hop_sizes, cfg.loss_win_lengths).to(device)
    return mel_loss, MelSpectrogram(**cfg.audio.mel_kwargs).to(device), stft


def build_optimizer_from_args(args: OptimizerArgs, model: torch.nn.Module,
                              key: str = "generator_optimizer_args") -> torch.optim.Optimizer | None:
    """The config's optimizer (the config's `key` block) over the model's trainable parameters (None if all
    are frozen). beta1/beta2 reach AdamW and the AdamW half of Muon_AdamW alike."""
    if not any(p.requires_grad for p in model.parameters()):
        return None
    kwargs = dict(lr=args.lr, beta1=args.beta1, beta2=args.beta2, eps=args.eps, weight_decay=args.weight_decay)
    if args.is_muon and args.muon_weight_decay is not None:
        kwargs["muon_weight_decay"] = args.muon_weight_decay
    return build_optimizer(args.optimizer_cls, model, key=f"{key}.optimizer_cls", fused=args.fused,
                           batched_ns=args.batched_ns, prefix=f"{key}.", **kwargs)


def build_lr_scheduler(optimizer: torch.optim.Optimizer, cfg: VocoderConfig, base_lr: float) -> LambdaLR:
    """LambdaLR stepped once per training step. The multiplier is evaluated at step + 1 so the
    first update already has a non-zero learning rate (lr / warmup_steps)."""
    s = cfg.lr_scheduler_args
    kwargs: dict = {"warmup_steps": s.warmup_steps}
    if s.name == "exponential":
        kwargs["gamma"] = s.gamma
    if s.name == "cosine_with_warmup":
        kwargs["total_steps"] = cfg.max_updates
        kwargs["min_ratio"] = min(1.0, s.min_lr / base_lr) if base_lr > 0 else 0.0
    fn = lr_lambda(s.name, **kwargs)
    return LambdaLR(optimizer, lambda step: fn(step + 1))


def build_parser() -> argparse.ArgumentParser:
    p = FlagParser(description="Train an NSF-HiFiGAN vocoder.",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(p, default_config=str(Path(__file__).parent / "configs" / "base_hifi_gpu.yaml"))
    p.add_argument("--data_dir", default=None, help="prepared dataset (default: binary_data_dir)")
    add_run_args(p, run_help="checkpoints, TensorBoard logs, config (default: runs/vocoder/<config>)")
    p.add_argument("--precision", default=None,
                   help="shortcut for --set precision=... (32-true|16-mixed|bf16-mixed|auto)")
    p.add_argument("--device", default=None, help="force a device, e.g. cpu (default: cuda if available)")
    add_logger_arg(p)
    add_best_by_arg(p, (*VALIDATES, "pesq"), VocoderConfig.best_by)
    add_preset_arg(p)
    return p




def resolve_run(args: argparse.Namespace) -> tuple[VocoderConfig, Path]:
    """The config the command line asks for (YAML, --set, flags, preset) and its prepared run folder."""
    cfg = load_config(args.config, VocoderConfig, args.overrides,
                      extra={"precision": args.precision, "binary_data_dir": args.data_dir, "logger": args.logger,
                             "best_by": args.best_by})
    apply_preset(cfg, args.preset, CARD_PRESETS)
    print_config_if_asked(args, cfg)
    note_prepare_keys(cfg, VocoderConfig.PREPARE_ONLY, "vocoder/prepare_data.py")
    if not cfg.binary_data_dir:
        raise ConfigError("no dataset: pass --data_dir (a folder made by vocoder/prepare_data.py) or set binary_data_dir")
    run_dir = Path(args.run_dir or Path("runs") / "vocoder" / Path(args.config or "default").stem)
    prepare_run_dir(run_dir, run_dir / "checkpoints", args.resume, args.overwrite, args.init_from,
                    inputs={"--data_dir": cfg.binary_data_dir})  # --overwrite must never move the dataset aside
    return cfg, run_dir


def startup_lines(cfg: VocoderConfig, precision: Precision, generator: torch.nn.Module,
                  discriminator: torch.nn.Module, run_dir: Path) -> str:
    """What a run prints before its first step: the config, the precision report, the sizes."""
    return "\n".join([format_config(cfg), *precision.report(),
                      f"run dir: {run_dir}; generator {count_parameters(generator) / 1e6:.2f} M params, critics "
                      f"{cfg.discriminator_names} {count_parameters(discriminator) / 1e6:.2f} M params"])
