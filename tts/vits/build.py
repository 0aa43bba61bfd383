"""The VITS trainer's builders from the config (data, models, mel, schedules), its `--init_from` readers and its
command line: what `tts/vits/train.py` and the tools around it share."""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from pathlib import Path

import torch

from common.best_by import add_best_by_arg
from common.checkpoint import load_checkpoint, load_matching, refuse_other_kind
from common.cli import FlagParser
from common.config import ConfigError, add_config_args, load_config, note_prepare_keys, print_config_if_asked
from common.data import BucketBatchSampler, BucketShapes, make_loader
from common.log import add_logger_arg
from common.presets import add_preset_arg, apply_preset
from common.run_dir import add_run_args, prepare_run_dir
from common.training import count_parameters
from speech.audio import MelSpectrogram
from tts.text.phonemes import Frontend
from tts.vits.config import VALIDATES, DataConfig, TrainConfig
from tts.vits.data import DataError, VitsDataset, collate, read_speakers
from tts.vits.discriminator import MultiPeriodDiscriminator
from tts.vits.model import VITS
from tts.vits.presets import CARD_PRESETS
from tts.vits.published.source import SourceError
from tts.vits.published.start import SourceStart, adopt_source_shape, check_data_fits, open_source, plan_start
from vocoder.losses import MultiResolutionSTFTLoss


def build_models(cfg: TrainConfig, n_speakers: int) -> tuple[VITS, MultiPeriodDiscriminator]:
    args = cfg.args()
    gen = VITS(len(Frontend.of(cfg).symbols), cfg.audio.n_fft // 2 + 1, n_speakers, args, cfg.audio.hop_length)
    disc = MultiPeriodDiscriminator(args.mpd_periods, args.disc_channel_scale, args.use_spectral_norm)
    return gen, disc


def build_mel(cfg: TrainConfig) -> MelSpectrogram:
    return MelSpectrogram(**cfg.audio.mel_kwargs)


def build_stft_loss(cfg: TrainConfig, device: torch.device) -> MultiResolutionSTFTLoss | None:
    """With c_stft > 0: three Parallel WaveGAN resolutions (fft, hop, win): short, medium, long windows."""
    if cfg.c_stft <= 0:
        return None
    return MultiResolutionSTFTLoss([512, 1024, 2048], [50, 120, 240], [240, 600, 1200]).to(device)


def startup_lines(generator: VITS, discriminator: torch.nn.Module, train_set: VitsDataset, eval_set: VitsDataset,
                  speakers: list, steps_per_epoch: int, batch_size: int) -> list[str]:
    """What a run says about its size before its first step: parameters and data."""
    n_gen, n_disc = count_parameters(generator), count_parameters(discriminator)
    return [f"parameters: generator {n_gen / 1e6:.2f} M, discriminator {n_disc / 1e6:.2f} M (total "
            f"{(n_gen + n_disc) / 1e6:.2f} M), used at inference {generator.inference_parameters() / 1e6:.2f} M",
            f"data: {len(train_set)} train / {len(eval_set)} eval utterances, {len(speakers)} speaker(s), "
            f"{steps_per_epoch} steps per epoch of batch {batch_size}"]


def schedule_kwargs(cfg: TrainConfig, steps_per_epoch: int) -> dict:
    """The exponential schedule of G and D: lr * lr_gamma ** k, k = finished epochs (the
    references) or optimizer steps. `steps_per_epoch` is this rank's number of optimizer steps
    per epoch (the batch sampler shards batches by rank; VITS does not accumulate gradients)."""
    return {"gamma": cfg.lr_gamma, "per": cfg.lr_scheduler_per, "steps_per_epoch": steps_per_epoch}


def build_data(cfg: TrainConfig, device: torch.device, world_size: int, log: Callable[[str], None]) -> tuple:
    """(speakers, train set, eval set, batch size per rank, the bucket batch sampler, the bucket shapes or
    None, the training loader) of the prepared folder."""
    speakers = read_speakers(cfg.data_dir)
    if cfg.test_speaker is not None and cfg.test_speaker not in speakers:  # not a silent speaker 0
        raise ConfigError(f"test_speaker '{cfg.test_speaker}' is not a speaker of {cfg.data_dir}: choose from "
                          f"{', '.join(speakers)}")
    train_set = VitsDataset(cfg.data_dir, "train", cfg.audio, cfg.data.add_blank, Frontend.of(cfg))
    eval_set = VitsDataset(cfg.data_dir, "eval", cfg.audio, cfg.data.add_blank, Frontend.of(cfg))
    if len(train_set) == 0:
        raise DataError(f"{cfg.data_dir}/train.jsonl is empty")
    batch = min(cfg.batch_size, len(train_set) // world_size)
    if batch < cfg.batch_size:
        log(f"note: batch_size {cfg.batch_size} > training items per rank; using {batch}")
    batch_size = max(1, batch)
    buckets = max(1, min(cfg.data.num_buckets, len(train_set) // (batch_size * world_size)))
    # the frame budget counts frames padded as BucketShapes pads them (its default multiple of 16)
    sampler = BucketBatchSampler(train_set.lengths, batch_size, buckets, shuffle=True, seed=cfg.seed, drop_last=True,
                                 max_frames=cfg.max_frames_per_batch, frame_multiple=16)
    # with cudnn.benchmark (CUDA) or torch.compile, every batch is padded to its length bucket's fixed
    # (text, frames) size: each shape is autotuned / compiled once, not once per batch
    benchmark = cfg.cudnn_benchmark and device.type == "cuda" and not cfg.deterministic  # as Precision
    shapes = (BucketShapes(train_set.lengths, train_set.token_lengths(), sampler.boundaries)
              if cfg.compile or benchmark else None)
    if shapes is not None:
        log(f"batches padded to {len(shapes.shapes())} bucket shapes (text, frames): {shapes.shapes()}")
    loader = make_loader(train_set, batch_sampler=sampler, num_workers=cfg.num_workers,
                         prefetch_factor=cfg.prefetch_factor, pin_memory=cfg.pin_memory,
                         persistent_workers=cfg.persistent_workers, seed=cfg.seed,
                         collate_fn=functools.partial(collate, shapes=shapes))
    return speakers, train_set, eval_set, batch_size, sampler, shapes, loader


def optimizer_spec(cfg: TrainConfig) -> dict:
    """Each optimizer's hyper-parameters and the config keys that set them (a resume that gives
    one explicitly replaces the checkpoint's value: `common.training.optimizer_overrides`)."""
    shared = {"betas": (("betas",), tuple(cfg.betas)), "eps": (("eps",), cfg.eps),
              "weight_decay": (("weight_decay",), cfg.weight_decay)}
    return {name: {"lr": ((own,) if getattr(cfg, own) else (own, "lr"), getattr(cfg, own) or cfg.lr), **shared}
            for name, own in (("generator", "lr_gen"), ("discriminator", "lr_disc"))}


def init_from_own(init_from: str, ckpt: dict | None, generator: torch.nn.Module,
                  discriminator: torch.nn.Module) -> tuple[str | None, list[str]]:
    """A new run from another checkpoint of this trainer (`--init_from`; `ckpt`: it, when `read_own_init` read it
    already): loads the weights that fit; returns the weights' licence and the lines that say what loaded."""
    ckpt = read_own_init(init_from) if ckpt is None else ckpt
    licence = ckpt.get("extra", {}).get("licence")
    lines = [f"licence of the weights: {licence} (carried into the checkpoints and the export)"] if licence else []
    for name, model in (("generator", generator), ("discriminator", discriminator)):
        required = {"source": init_from, "ckpt": ckpt} if name == "generator" else {}  # critics: reported only
        lines.append(f"{name} {load_matching(model, ckpt['models'][name], **required)}")
    return licence, lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def build_parser() -> FlagParser:
    """tts/train.py's command line."""
    p = FlagParser(description="Train the Uzbek VITS model.")
    add_config_args(p, default_config=None)
    p.add_argument("--data_dir", default=None, help="prepared dataset folder (tts/prepare_data.py --output_dir)")
    add_run_args(p, run_help="where checkpoints, TensorBoard logs and samples go (default: runs/<run_name>)")
    p.add_argument("--device", default=None, help="cpu / cuda (default: cuda when available)")
    p.add_argument("--init_config", default=None,
                   help="the voice config of a Piper --init_from checkpoint (default: config.json or the one "
                        "*.onnx.json beside it)")
    p.add_argument("--init_speaker", default=None, metavar="NAME|ID",
                   help="the speaker of a multi-speaker --init_from voice a single-speaker run keeps (default: "
                        "the mean of its speakers)")
    add_logger_arg(p)
    add_best_by_arg(p, (*VALIDATES, "speaker_sim"), TrainConfig.best_by)
    add_preset_arg(p)
    return p


def read_own_init(path: str) -> dict:
    """A checkpoint of this trainer for `--init_from`, read and checked (which trainer made it, both
    networks' weights) before the run folder changes."""
    ckpt = load_checkpoint(path)
    refuse_other_kind(path, ckpt, "vits")
    for name in ("generator", "discriminator"):
        if name not in ckpt.get("models", {}):
            raise ConfigError(f"--init_from {path}: no '{name}' weights in the checkpoint")
    return ckpt


def plan_source_start(cfg: TrainConfig, args: argparse.Namespace) -> SourceStart | None:
    """`--init_from` a published voice (Piper .ckpt, transformers VitsModel folder): read and check it,
    put its shape into `cfg`, map every tensor onto the model `cfg` now builds (on the meta device: no
    memory, no time). None for no --init_from or a checkpoint of this trainer (loaded by the trainer)."""
    voice = open_source(args.init_from, args.init_config) if args.init_from else None
    if voice is None:
        if args.init_config or args.init_speaker:
            raise ConfigError("--init_config and --init_speaker go with --init_from a published voice "
                              "(a Piper .ckpt or a transformers VitsModel folder)")
        return None
    if not cfg.data_dir:
        raise ConfigError("no data folder: pass --data_dir (a folder made by tts/prepare_data.py)")
    lines = adopt_source_shape(cfg, voice)
    check_data_fits(cfg, voice)
    speakers = read_speakers(cfg.data_dir)
    try:
        with torch.device("meta"):
            generator, discriminator = build_models(cfg, len(speakers))
    except ValueError as e:  # sizes that do not make a model (e.g. upsampling vs hop length)
        raise SourceError(f"--init_from {voice.path}: {e}") from None
    return plan_start(cfg, voice, generator.state_dict(), discriminator.state_dict(), speakers, args.init_speaker,
                      lines)


def resolve_run(args: argparse.Namespace) -> tuple[TrainConfig, SourceStart | None, dict | None]:
    """The config the command line asks for, and its --init_from read and checked (a published voice's plan,
    or a checkpoint of this trainer), with the run folder prepared after both."""
    cfg = load_config(args.config, TrainConfig, args.overrides, extra={"data_dir": args.data_dir, "run_dir": args.run_dir,
                                                                           "logger": args.logger,
                                                                           "best_by": args.best_by})
    apply_preset(cfg, args.preset, CARD_PRESETS)
    print_config_if_asked(args, cfg)
    note_prepare_keys(cfg, DataConfig.PREPARE_ONLY, "tts/prepare_data.py")
    source = plan_source_start(cfg, args)
    own = read_own_init(args.init_from) if args.init_from and source is None else None
    run_dir = Path(cfg.run_dir or f"runs/{cfg.run_name}")
    prepare_run_dir(run_dir, run_dir / "checkpoints", args.resume, args.overwrite, args.init_from,
                    inputs={"--data_dir": cfg.data_dir})  # --overwrite must never move the dataset aside
    return cfg, source, own
