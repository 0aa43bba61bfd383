"""Train an SD/FLUX-style KL autoencoder (the RTX 5090 VAE guide's commands work as written).

    python vae/train_vae.py --data_path data/vae --output_dir runs/vae --image_size 1024 \
        --batch_size 4 --num_epochs 100 --learning_rate 1e-4 --z_channels 16 --kl_weight 1e-6 \
        --perceptual_weight 1.0 --mixed_precision --use_bf16 --enable_tf32 --channels_last
    python vae/train_vae.py --config vae/configs/standard_1024.yaml --data_path data/vae
    torchrun --nproc_per_node 2 vae/train_vae.py --config ...          # DDP
    python vae/train_vae.py --config ... --resume_from runs/vae/checkpoint_epoch_10.pt --image_size 2048

Flags override the config (`--config` YAML, or the guide's JSON); `--set key=value` overrides any key.
Resuming at a different `--image_size` starts a new resolution stage: weights (and EMA) carry over,
the optimizer and the warmup+cosine schedule are re-planned for the new run, and the epoch and step
counters continue (see vae/README.md, "Multi-resolution stages").
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import resource
import sys
import time
import warnings
from pathlib import Path

import torch
from PIL import Image
from torch import nn

from common import exit_codes
from common.checkpoint import (
    CheckpointError,
    CheckpointManager,
    GracefulExit,
    load_checkpoint,
    make_state,
    resolve_resume,
    restore_state,
    save_atomic,
)
from common.config import (
    ConfigError,
    add_config_args,
    config_to_dict,
    format_config,
    load_config,
    save_config,
)
from common.data import ResumableSampler, make_loader
from common.distributed import (
    DistInfo,
    all_reduce_mean,
    barrier,
    cleanup,
    gather_objects,
    is_enabled,
    setup_distributed,
    wrap_ddp,
)
from common.hardware import (
    OutOfMemory,
    cuda_memory_stats,
    find_batch_size,
    fit_batch_size,
    is_oom,
    oom_message,
    resolve_preset,
)
from common.log import Progress, RunLogger, report_lr_plan
from common.muon import build_optimizer
from common.precision import Precision
from common.presets import add_preset_arg, apply_preset
from common.run_dir import add_run_args, check_output_dir, prepare_run_dir, tensorboard_dir
from common.schedulers import build_scheduler, lr_curve
from common.training import (
    EMA,
    BufferSnapshot,
    NonFiniteError,
    NonFiniteGuard,
    apply_optimizer_overrides,
    backward,
    nonfinite_stop_message,
    optimizer_overrides,
    saving_blocked,
    step_optimizer,
)
from vae.config import VAEConfig
from vae.data import ImageDataset, find_training_images, read_manifest, split_train_val, usable_images
from vae.diffusers_io import pipeline_factors, save_diffusers
from vae.losses import FrozenLPIPS, PatchDiscriminator, PerceptualWeightsError, VAELoss
from vae.metrics import evaluate, grid_image, latent_statistics
from vae.model import AutoencoderKL, build_vae, count_parameters
from vae.pretrained import export_factors, init_weights
from vae.run_plan import gan_phase_report, world_size_note

# The guide's flags, each a VAEConfig key. None = "not given", so the config's value stands.
VALUE_FLAGS: dict[str, type] = {
    "data_path": str, "val_data_path": str, "image_size": int, "batch_size": str,
    "num_epochs": int, "max_steps": int, "learning_rate": float, "z_channels": int, "kl_weight": float,
    "perceptual_weight": float, "perceptual_weights": str, "gradient_clip": float, "num_workers": int,
    "checkpoint_freq": int, "save_samples_freq": int, "accumulation_steps": int,
    "disc_start": int, "disc_weight": float, "layers_per_block": int, "ema_decay": float,
    "warmup_steps": int, "val_freq": int, "log_freq": int, "seed": int, "device": str,
    "stop_at_step": int, "time_limit_minutes": float, "keep_checkpoints": int, "num_val_images": int,
    "disc_learning_rate": float,
}
BOOL_FLAGS = ("mixed_precision", "use_bf16", "use_torch_compile", "enable_tf32", "channels_last",
              "persistent_workers", "gradient_checkpointing", "learn_logvar", "random_flip", "export_diffusers")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(p)
    add_run_args(p, run_aliases=("--output_dir",), resume_aliases=("--resume_from",),
                 run_help="config key output_dir: checkpoints, samples, logs (alias --output_dir)")
    for name, tp in VALUE_FLAGS.items():
        p.add_argument(f"--{name}", type=tp, default=None, help=f"config key {name}")
    p.add_argument("--channels", type=int, nargs="+", default=None, help="block widths, e.g. 128 256 512 512")
    for name in BOOL_FLAGS:
        p.add_argument(f"--{name}", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--profile_memory", action="store_true",
                   help="measure peak GPU memory per resolution and batch size, write a table, exit")
    p.add_argument("--profile_resolutions", type=int, nargs="+", default=[256, 512, 768, 1024, 1536, 2048])
    p.add_argument("--profile_batches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    add_preset_arg(p)
    return p


def resolve_config(args: argparse.Namespace) -> VAEConfig:
    extra = {name: getattr(args, name) for name in (*VALUE_FLAGS, *BOOL_FLAGS, "channels")}
    extra.update(output_dir=args.run_dir, resume_from=args.resume)
    return load_config(args.config, VAEConfig, overrides=args.overrides, extra=extra)


def precision_name(cfg: VAEConfig) -> str:
    if not cfg.mixed_precision:
        return "32-true"
    return "bf16-mixed" if cfg.use_bf16 else "16-mixed"


# ----------------------------------------------------------------------------- models + one step


class VAETrainer:
    """The models, optimizers, loss and ONE optimisation step; `train()` below is the loop.

    Kept apart from the loop so `--batch_size auto`, `--profile_memory` and bench/bench_vae.py run the
    very step that training runs.
    """

    def __init__(self, cfg: VAEConfig, device: torch.device, info: DistInfo | None = None,
                 total_steps: int = 1, perceptual: FrozenLPIPS | None = None, quiet: bool = False) -> None:
        self.cfg, self.device = cfg, device
        self.info = info or DistInfo(0, 1, 0, device, False)
        self.precision = Precision(precision_name(cfg), device, tf32=cfg.enable_tf32,
                                   cudnn_benchmark=cfg.cudnn_benchmark, channels_last=cfg.channels_last,
                                   compile=cfg.use_torch_compile)
        fmt = torch.channels_last if cfg.channels_last else torch.contiguous_format
        vae = build_vae({**config_to_dict(cfg)}).to(device)
        vae.set_gradient_checkpointing(cfg.gradient_checkpointing)
        self.vae_module: AutoencoderKL = vae.to(memory_format=fmt)
        # channels_last before DDP (its gradient buckets copy the parameter layout), compile after.
        self.vae = self.precision.prepare_model(wrap_ddp(self.vae_module, self.info))
        if cfg.perceptual_weight > 0 and perceptual is None:
            perceptual = FrozenLPIPS(cfg.perceptual_net, cfg.perceptual_weights or None)
        self.perceptual = perceptual.to(device) if perceptual is not None else None
        self.loss = VAELoss(cfg.kl_weight, cfg.perceptual_weight, self.perceptual, cfg.rec_loss, cfg.learn_logvar,
                            cfg.logvar_init, cfg.disc_start, cfg.disc_weight, cfg.disc_factor,
                            cfg.gan_weight_clamp).to(device)
        self.disc_module: nn.Module | None = None
        self.disc = None
        if cfg.disc_weight > 0:
            self.disc_module = PatchDiscriminator(3, cfg.disc_channels, cfg.disc_layers).to(device).to(memory_format=fmt)
            self.disc = wrap_ddp(self.disc_module, self.info)
        betas = (cfg.adam_beta1, cfg.adam_beta2)
        g_model = nn.ModuleDict({"vae": self.vae_module, "logvar": self.loss.logvar})
        self.g_params = [p for p in g_model.parameters() if p.requires_grad]
        self.opt_g = build_optimizer(cfg.optimizer_cls, g_model, lr=cfg.learning_rate, betas=betas,
                                     weight_decay=cfg.weight_decay)
        self.optimizers = {"vae": self.opt_g}
        self.opt_d = None
        if self.disc_module is not None:
            self.opt_d = build_optimizer(cfg.optimizer_cls, self.disc_module, betas=betas,
                                         lr=cfg.disc_learning_rate or cfg.learning_rate, weight_decay=cfg.weight_decay)
            self.optimizers["disc"] = self.opt_d
        self.plan(total_steps)
        self.ema = EMA(self.vae_module, cfg.ema_decay) if cfg.ema_decay > 0 else None
        self.guard = NonFiniteGuard(cfg.max_nonfinite)
        self.buffers = BufferSnapshot(self.vae_module, self.disc_module)  # the discriminator's BatchNorm stats
        if not quiet and self.info.is_main:
            print(f"VAE {count_parameters(self.vae_module) / 1e6:.1f} M parameters"
                  + (f", discriminator {count_parameters(self.disc_module) / 1e6:.1f} M" if self.disc_module else "")
                  + f"; LPIPS: {self.perceptual.source if self.perceptual else 'off (perceptual_weight 0)'}")
            for line in self.precision.report():
                print(f"  {line}")

    def plan(self, total_steps: int) -> None:
        """(Re)build the LR schedules for a run of `total_steps` optimizer steps."""
        self.total_steps = max(1, int(total_steps))
        warmup = min(self.cfg.warmup_steps, max(0, self.total_steps - 1))
        kw = {"warmup_steps": warmup}
        if self.cfg.lr_scheduler == "cosine_with_warmup":
            kw.update(total_steps=self.total_steps, min_ratio=self.cfg.min_lr_ratio)
        self.schedulers = {name: build_scheduler(opt, self.cfg.lr_scheduler, **kw) for name, opt in self.optimizers.items()}

    def optimizer_spec(self) -> dict:
        """Each optimizer's hyper-parameters and the config keys that set them (for a resume that
        changes them: `common.training.optimizer_overrides`)."""
        cfg = self.cfg
        shared = {"betas": (("adam_beta1", "adam_beta2"), (cfg.adam_beta1, cfg.adam_beta2)),
                  "weight_decay": (("weight_decay",), cfg.weight_decay)}
        spec = {"vae": {"lr": (("learning_rate",), cfg.learning_rate), **shared}}
        if self.opt_d is not None:
            keys = ("disc_learning_rate",) if cfg.disc_learning_rate else ("disc_learning_rate", "learning_rate")
            spec["disc"] = {"lr": (keys, cfg.disc_learning_rate or cfg.learning_rate), **shared}
        return spec

    def models(self) -> dict[str, nn.Module]:
        out = {"vae": self.vae_module, "logvar": self.loss.logvar}
        if self.disc_module is not None:
            out["disc"] = self.disc_module
        return out

    def _no_sync(self, module: nn.Module, last: bool) -> contextlib.AbstractContextManager:
        # DDP: all-reduce gradients only on the last micro-batch of an accumulation group.
        if self.info.enabled and not last and hasattr(module, "no_sync"):
            return module.no_sync()
        return contextlib.nullcontext()

    def step(self, micro_batches: list[torch.Tensor], global_step: int) -> tuple[dict[str, torch.Tensor], bool]:
        """One optimizer step over `len(micro_batches)` accumulated micro-batches (the loss of each is
        divided by their number, so the gradient is the mean over the whole effective batch)."""
        cfg, scaler = self.cfg, self.precision.scaler
        n = len(micro_batches)
        gan = self.disc_module is not None and self.loss.gan_active(global_step)
        grad_scale = float(scaler.get_scale()) if scaler.is_enabled() else 1.0
        logs: dict[str, torch.Tensor] = {}
        recs = []
        self.buffers.take()
        if gan:
            self.disc_module.requires_grad_(False)  # the generator's GAN term must not train D
        for i, x in enumerate(micro_batches):
            x = self.precision.prepare_input(x.to(self.device, non_blocking=True))
            with self._no_sync(self.vae, i == n - 1):
                with self.precision.autocast():
                    x_rec, posterior = self.vae(x)
                    loss, parts = self.loss.generator_loss(x, x_rec, posterior, global_step,
                                                           self.disc_module if gan else None,
                                                           self.vae_module.last_layer, grad_scale)
                backward(loss / n, scaler)
            recs.append((x, x_rec.detach()))
            for k, v in parts.items():
                logs[k] = logs.get(k, 0) + v / n
        if gan:
            self.disc_module.requires_grad_(True)
        logvar = self.loss.logvar.logvar
        if self.info.enabled and logvar.requires_grad and logvar.grad is not None:
            logvar.grad.copy_(all_reduce_mean(logvar.grad))  # not inside the DDP module: average by hand
        clip = cfg.gradient_clip or None
        g_norm, stepped = step_optimizer(None, self.opt_g, self.g_params, scaler, clip, self.guard)
        logs["grad_norm"] = g_norm
        d_finite = True
        if gan and stepped:  # a skipped generator step skips the whole step
            for i, (x, x_rec) in enumerate(recs):
                with self._no_sync(self.disc, i == n - 1):
                    with self.precision.autocast():
                        d_loss, parts = self.loss.discriminator_loss(self.disc, x, x_rec, global_step)
                    backward(d_loss / n, scaler)
                for k, v in parts.items():
                    logs[k] = logs.get(k, 0) + v / n
            d_norm, d_finite = step_optimizer(None, self.opt_d, self.disc_module.parameters(), scaler, clip, None)
            logs["disc_grad_norm"] = d_norm
        if not (stepped and d_finite):
            self.buffers.restore()  # no BatchNorm statistics from a skipped step
        scaler.update()
        with warnings.catch_warnings():
            # LambdaLR warns when an optimizer skipped its step (non-finite skip, D before disc_start);
            # the schedule is a pure function of the step count, so stepping it regardless is intended.
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)`")
            for sched in self.schedulers.values():
                sched.step()
        if stepped and self.ema is not None:
            self.ema.update(self.vae_module)
        return logs, stepped

    def eval_model(self) -> AutoencoderKL:
        """The weights to evaluate/export: the EMA copy when EMA is on."""
        if self.ema is None:
            return self.vae_module
        if not hasattr(self, "_ema_model"):
            self._ema_model = copy.deepcopy(self.vae_module).to(memory_format=torch.contiguous_format)
            self._ema_model.requires_grad_(False)
        self.ema.copy_to(self._ema_model)
        return self._ema_model


# ----------------------------------------------------------------------------- helpers


def memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return cuda_memory_stats(device).get("peak_gib", 0.0)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # peak RSS (Linux: KiB)


def auto_batch_size(cfg: VAEConfig, device: torch.device, perceptual: FrozenLPIPS | None) -> int:
    """`--batch_size auto`: measure on CUDA with the real training step; on a CPU say why not."""
    if device.type != "cuda":
        fallback = resolve_preset("cpu", "vae")["batch_size"]
        print(f"--batch_size auto: no CUDA device, so GPU memory cannot be measured; using batch_size "
              f"{fallback} (the CPU preset). Give an explicit --batch_size to choose another.")
        return fallback
    best = find_batch_size(_trial_step(cfg, device, perceptual), start=1, limit=256, headroom=0.9)
    sizes = gather_objects(best)
    return min(sizes)


def _trial_step(cfg: VAEConfig, device: torch.device, perceptual: FrozenLPIPS | None):
    """One real training step at batch b (GAN on: the heaviest step), for the batch-size searches;
    eager (compiling each trial would take minutes, and eager needs at least the compiled memory)."""
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


def fit_profile_batch(cfg: VAEConfig, device: torch.device, perceptual: FrozenLPIPS | None) -> str:
    """The profile's batch (the guide's 4/8/16/24/12) as written, lowered at start when it does not fit
    this GPU (accumulation raised so images per step stay the same); every rank takes the smallest."""
    cuda = device.type == "cuda"
    batch, accum, line = fit_batch_size(_trial_step(cfg, device, perceptual) if cuda else lambda b: None,
                                        int(cfg.batch_size), cfg.accumulation_steps, cuda_available=cuda)
    batch, accum = min(gather_objects((batch, accum)), key=lambda ba: ba[0])
    cfg.batch_size, cfg.accumulation_steps = batch, accum
    return line


def checked_images(folder: str, cfg: VAEConfig) -> list[Path]:
    """The images of `folder`: a prepared folder's manifest as is (prepare_data.py filtered it), a
    raw folder through the same filters once, so an unusable file is never upscaled or counted."""
    files = find_training_images(folder)
    if read_manifest(Path(folder)) is not None:
        return files
    return usable_images(files, cfg.image_size, cfg.max_pixels, folder)


def next_stage(old: dict, extra: dict, image_size: int) -> tuple[dict, list[dict]]:
    """Counters and stage history for a new resolution stage: the step and epoch counts continue
    (checkpoint_epoch_N.pt numbers keep rising, so no stage overwrites another's files and rotation
    keeps the newest), the data position restarts."""
    stage = int(old.get("stage", 1)) + 1
    first_step = int(old.get("steps_before_stage", 0)) + int(old.get("step", 0))
    counters = {"step": 0, "epoch": int(old.get("epoch", 0)), "micro_in_epoch": 0, "stage": stage,
                "steps_before_stage": first_step}
    stages = list(extra.get("stages") or [{"stage": stage - 1, "image_size": old.get("image_size"),
                                             "first_step": first_step - int(old.get("step", 0)), "first_epoch": 0}])
    stages = [s for s in stages if s["stage"] < stage]  # a re-run of this stage replaces its record
    stages.append({"stage": stage, "image_size": image_size, "first_step": first_step, "first_epoch": counters["epoch"]})
    return counters, stages


def keep_stage_files(out_dir: Path, stage: int, image_size: int | None) -> list[str]:
    """At a new stage, the previous stage's `checkpoint_last.pt` and `best.pt` (+ best.json) would be
    overwritten by this stage's (and PSNR at another crop size is not comparable for "best"): they are
    renamed `stage{K}_{size}px_last.pt` / `_best.pt`, outside rotation. An existing name is never
    overwritten: a re-run of the same transition keeps the first copy and leaves the files of the
    interrupted attempt (same resolution as this one) where they are."""
    kept = []
    for name, suffix in (("checkpoint_last.pt", "last.pt"), ("best.pt", "best.pt"), ("best.json", "best.json")):
        src, dst = out_dir / name, out_dir / f"stage{stage}_{image_size}px_{suffix}"
        if src.is_file() and not dst.exists():
            os.replace(src, dst)
            kept.append(dst.name)
    return [k for k in kept if not k.endswith(".json")]


def load_vae_weights(path: str | Path, use_ema: bool = True) -> tuple[AutoencoderKL, dict]:
    """A trained VAE from a training checkpoint, `vae_final.pt`, or a diffusers folder."""
    path = Path(path)
    if path.is_dir():
        from vae.diffusers_io import load_diffusers

        model, cfg = load_diffusers(path)
        return model, {"source": "diffusers", "scaling_factor": cfg.get("scaling_factor")}
    ckpt = load_checkpoint(path)
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


def _loader_batches(files: list[Path], cfg: VAEConfig, limit: int | None = None, batch_size: int = 4):
    ds = ImageDataset(files[:limit] if limit else files, cfg.image_size, train=False, max_pixels=cfg.max_pixels)
    return make_loader(ds, batch_size=batch_size, num_workers=0, seed=cfg.seed)


# ----------------------------------------------------------------------------- the loop


def train(cfg: VAEConfig, overwrite: bool = False, init_from: str | None = None) -> int:
    out_dir = Path(cfg.output_dir)
    prepare_run_dir(out_dir, None, cfg.resume_from, overwrite, init_from, run_flag="--output_dir")
    info = setup_distributed(cfg.device or None)
    device = info.device
    main = info.is_main
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank (DDP also broadcasts them)

    files = checked_images(cfg.data_path, cfg)
    if cfg.val_data_path:
        train_files, val_files = files, checked_images(cfg.val_data_path, cfg)
    else:
        train_files, val_files = split_train_val(files, cfg.num_val_images, seed=cfg.seed)

    perceptual = None
    if cfg.perceptual_weight > 0:
        perceptual = FrozenLPIPS(cfg.perceptual_net, cfg.perceptual_weights or None)
    if cfg.batch_size == "auto":
        cfg.batch_size = auto_batch_size(cfg, device, perceptual)
    elif cfg.fit_batch_size:
        fit_line = fit_profile_batch(cfg, device, perceptual)
        if main:
            print(f"batch finder: {fit_line}")
    batch, accum = int(cfg.batch_size), cfg.accumulation_steps

    train_ds = ImageDataset(train_files, cfg.image_size, train=True, random_flip=cfg.random_flip,
                            max_pixels=cfg.max_pixels)
    sampler = ResumableSampler(train_ds, shuffle=True, seed=cfg.seed)
    loader = make_loader(train_ds, batch_size=batch, sampler=sampler, num_workers=cfg.num_workers,
                         prefetch_factor=cfg.prefetch_factor, pin_memory=cfg.pin_memory,
                         persistent_workers=cfg.persistent_workers, seed=cfg.seed, drop_last=True)
    steps_per_epoch = (len(sampler) // batch) // accum
    if steps_per_epoch < 1:
        raise ConfigError(f"{len(train_files)} training images cannot fill one step of batch_size {batch} x "
                          f"accumulation_steps {accum} x {info.world_size} GPU(s); lower them or add images")
    total_steps = cfg.max_steps if cfg.max_steps > 0 else cfg.num_epochs * steps_per_epoch

    trainer = VAETrainer(cfg, device, info, total_steps, perceptual)
    torch.manual_seed(cfg.seed + info.rank)  # distinct posterior noise per rank (restored on resume)
    samples_per_step = batch * accum * info.world_size
    counters = {"step": 0, "epoch": 0, "micro_in_epoch": 0, "stage": 1, "steps_before_stage": 0}
    stages = [{"stage": 1, "image_size": cfg.image_size, "first_step": 0, "first_epoch": 0}]
    best_psnr = last_psnr = None

    manager = CheckpointManager(out_dir, keep_last=cfg.keep_checkpoints, mode="max",
                                name_fn=lambda n: f"checkpoint_epoch_{n}.pt")
    resume = resolve_resume(cfg.resume_from, out_dir, manager, extra_names=("checkpoint_last.pt",))
    if resume is not None:
        ckpt = load_checkpoint(resume, map_location="cpu")
        old = ckpt.get("counters", {})
        ema = {"vae": trainer.ema} if trainer.ema else None
        try:
            if old.get("image_size") == cfg.image_size:
                counters = restore_state(ckpt, trainer.models(), trainer.optimizers, trainer.schedulers,
                                         trainer.precision.scaler, ema, rank=info.rank)
                extra = ckpt.get("extra", {})
                trainer.guard.load_state_dict(extra.get("guard", trainer.guard.state_dict()))
                best_psnr = extra.get("best_psnr")
                stages = list(extra.get("stages", stages))
                changed = apply_optimizer_overrides(trainer.optimizers, trainer.schedulers,
                                                    optimizer_overrides(cfg, trainer.optimizer_spec()))
                if changed and main:
                    print(changed)
                if (old.get("samples_per_step"), old.get("num_train")) != (samples_per_step, len(train_files)):
                    if main:
                        print(f"resume: batch size, GPU count or dataset changed since {resume.name}; the data "
                              f"order restarts at the beginning of epoch {counters['epoch']}")
                    counters["micro_in_epoch"] = 0
                if main:
                    print(f"resumed {resume} at step {counters['step']} (epoch {counters['epoch']})")
            else:
                # A new resolution stage: weights carry over; optimizer and LR schedule are re-planned.
                models = {k: m for k, m in trainer.models().items() if k in ckpt.get("models", {})}
                restore_state(ckpt, models, ema=ema if ckpt.get("ema") else None, rank=info.rank)
                counters, stages = next_stage(old, ckpt.get("extra", {}), cfg.image_size)
                if main:
                    kept = keep_stage_files(out_dir, int(old.get("stage", 1)), old.get("image_size"))
                    print(f"resume {resume.name}: trained at {old.get('image_size')} px, now {cfg.image_size} px -> "
                          f"stage {counters['stage']}: weights{' and EMA' if ema else ''} loaded; optimizer "
                          f"and LR schedule re-planned for this run ({total_steps} steps, warmup "
                          f"{min(cfg.warmup_steps, total_steps - 1)}); epochs continue at {counters['epoch'] + 1}, "
                          f"global step at {counters['steps_before_stage']}"
                          + (f"; kept the previous stage's {', '.join(kept)}" if kept else ""))
        except (RuntimeError, KeyError) as exc:
            raise CheckpointError(f"{resume}: cannot resume into this configuration (architecture changed?): "
                                  f"{str(exc)[:400]}") from None
    elif init_from:  # weights only (a new run): a diffusers folder, or a checkpoint (see vae/pretrained.py)
        for line in init_weights(trainer, init_from, out_dir, main):
            if main:
                print(line)
    step = int(counters["step"])
    last_good: Path | None = resume  # the newest checkpoint known to hold a good state

    logger = RunLogger(tensorboard_dir(out_dir, main), enabled=main)
    if main:
        out_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, out_dir)
        print(format_config(cfg))
        print(f"{len(train_files)} training / {len(val_files)} validation images, {steps_per_epoch} steps per "
              f"epoch, {samples_per_step} images per step, {total_steps} steps planned, device {device}")
        report_lr_plan({f"lr_{k}": lr_curve(v) for k, v in trainer.schedulers.items()}, trainer.total_steps,
                       "learning_rate / lr_scheduler / warmup_steps / min_lr_ratio (or num_epochs, max_steps)",
                       out_dir, logger)
        for line in (gan_phase_report(trainer.loss, trainer.schedulers["vae"], total_steps, steps_per_epoch,
                                      int(counters["steps_before_stage"]), step)
                     + world_size_note(cfg.learning_rate, samples_per_step, info.world_size)):
            print(line)
    eval_batch = max(1, min(4, batch))  # never above the training batch: validation must not OOM
    val_batches = list(_loader_batches(val_files, cfg, batch_size=eval_batch)) if (val_files and main) else []
    sample_src = val_files or train_files
    sample_ds = ImageDataset(sample_src, cfg.image_size, train=False, max_pixels=cfg.max_pixels)
    sample_x = torch.stack([sample_ds[i] for i in range(min(cfg.num_sample_images, len(sample_src)))])

    def gstep() -> int:
        return int(counters["steps_before_stage"]) + step

    def state() -> dict:
        c = {**counters, "step": step, "global_step": gstep(), "image_size": cfg.image_size,
             "samples_per_step": samples_per_step, "num_train": len(train_files)}
        return make_state(trainer.models(), trainer.optimizers, trainer.schedulers, trainer.precision.scaler,
                          {"vae": trainer.ema} if trainer.ema else None, c, config_to_dict(cfg),
                          extra={"arch": trainer.vae_module.arch(), "guard": trainer.guard.state_dict(),
                                 "best_psnr": best_psnr, "stages": stages})

    def save_last(reason: str) -> bool:
        nonlocal last_good
        if saving_blocked(trainer.guard):
            if main:
                print(f"not saving checkpoint_last.pt at step {step} ({reason}): the newest steps were non-finite; "
                      f"the last good checkpoint is {last_good or 'none'}")
            return False
        s = state()  # on every rank: it gathers every rank's RNG state
        if main:
            last_good = save_atomic(s, out_dir / "checkpoint_last.pt")
            print(f"saved {out_dir / 'checkpoint_last.pt'} at step {step} ({reason})")
        return True

    def save_samples() -> None:
        model = trainer.eval_model()
        with torch.no_grad(), trainer.precision.autocast():
            rec = torch.cat([model.decode(model.encode(x.to(device)).mode()).float().cpu()
                             for x in sample_x.split(eval_batch)])
        grid = grid_image(sample_x, rec)
        Image.fromarray(grid).save(out_dir / "samples" / f"step_{gstep():07d}.png")
        logger.image("samples/reconstruction (top: input)", grid, gstep())

    last_val: dict = {"step": -1, "metrics": {}}

    def validate() -> dict:
        nonlocal best_psnr, last_psnr
        if last_val["step"] == gstep():
            return last_val["metrics"]  # already measured at this step (val_freq hit the last step)
        model = trainer.eval_model()
        m = evaluate(model, val_batches, device, trainer.precision.autocast, trainer.perceptual)
        if m:
            logger.scalars(m, gstep(), "val")
            last_psnr = m["psnr"]
            best_psnr = m["psnr"] if best_psnr is None else max(best_psnr, m["psnr"])
            with open(out_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps({"step": gstep(), "image_size": cfg.image_size, **m}) + "\n")
        last_val.update(step=gstep(), metrics=m)
        return m

    def describe(m: dict) -> str:
        return (f"val PSNR {m['psnr']:.2f} dB, SSIM {m['ssim']:.3f}" + (f", LPIPS {m['lpips']:.3f}" if "lpips" in m
                                                                      else ""))

    if main:
        (out_dir / "samples").mkdir(exist_ok=True)
        logger.scalar("train/image_size", cfg.image_size, gstep())  # the resolution of this stage, in the log
        if step == 0 and val_batches:
            print(f"step {gstep()}: {describe(validate())}")
            save_samples()

    progress = Progress(total_steps, initial=step, samples_per_step=samples_per_step, enabled=main)
    t_start = time.time()
    stop_reason = ""
    last_log_t, last_log_step = time.perf_counter(), step
    bar: dict[str, float] = {}  # loss values shown on the progress bar, refreshed at log steps only
    try:
        with GracefulExit() as stopper:
            while step < total_steps and not stop_reason:
                epoch = int(counters["epoch"])
                sampler.set_epoch(epoch)
                sampler.skip(int(counters["micro_in_epoch"]) * batch)
                micro: list[torch.Tensor] = []
                t0 = time.perf_counter()
                for x in loader:
                    micro.append(x)
                    if len(micro) < accum:
                        continue
                    t1 = time.perf_counter()
                    try:
                        logs, _ = trainer.step(micro, gstep())
                    except torch.OutOfMemoryError as exc:
                        raise OutOfMemory(oom_message("the VAE training step", batch, {
                            "accum_key": "accumulation_steps", "accumulation": accum,
                            "precision_key": "mixed_precision", "precision": precision_name(cfg),
                            "checkpointing_key": "gradient_checkpointing", "crop_key": "image_size",
                            "crop": cfg.image_size})) from exc
                    micro = []
                    step += 1
                    counters["micro_in_epoch"] = int(counters["micro_in_epoch"]) + accum
                    if main and (step % cfg.log_freq == 0 or step == total_steps):
                        now = time.perf_counter()
                        ips = (step - last_log_step) * samples_per_step / max(now - last_log_t, 1e-9)
                        last_log_t, last_log_step = now, step
                        logs.update({"lr": trainer.opt_g.param_groups[0]["lr"], "images_per_sec": ips,
                                     "memory_gib": memory_gib(device), "data_wait": progress.data_wait_fraction,
                                     "nonfinite_skipped": trainer.guard.skipped_total})
                        if trainer.opt_d is not None:
                            logs["disc_lr"] = trainer.opt_d.param_groups[0]["lr"]
                        logger.scalars(logs, gstep(), "train")  # one host sync for all the tensors
                        bar = {"loss": float(logs["total"]), "rec": float(logs[f"rec_{cfg.rec_loss}"])}
                    progress.update(step, t1 - t0, time.perf_counter() - t1, **bar)
                    if main and cfg.save_samples_freq and step % cfg.save_samples_freq == 0:
                        save_samples()
                    if main and cfg.val_freq and step % cfg.val_freq == 0 and val_batches:
                        progress.write(f"step {gstep()}: {describe(validate())}")
                    if cfg.save_every_steps and step % cfg.save_every_steps == 0:
                        save_last(f"every {cfg.save_every_steps} steps")
                    flags = [bool(cfg.stop_at_step and gstep() >= cfg.stop_at_step),
                             bool(cfg.time_limit_minutes and time.time() - t_start > cfg.time_limit_minutes * 60),
                             stopper.requested]
                    if is_enabled():  # every rank must stop at the same step
                        flags = [any(f) for f in zip(*gather_objects(flags))]
                    if any(flags):
                        stop_reason = ("stop_at_step", "time limit", stopper.signal_name or "signal")[flags.index(True)]
                        break
                    if step >= total_steps:
                        break
                    t0 = time.perf_counter()
                if counters["micro_in_epoch"] // accum < steps_per_epoch:
                    break  # left mid-epoch (stop request or the planned last step)
                counters["epoch"] = epoch + 1
                counters["micro_in_epoch"] = 0
                if (epoch + 1) % cfg.checkpoint_freq == 0 and not saving_blocked(trainer.guard):
                    s = state()
                    if main:
                        last_good = manager.save(s, epoch + 1, metric=last_psnr)
                        progress.write(f"saved {last_good}")
                    barrier()
    except NonFiniteError as exc:
        progress.close()
        print(f"error: {exc}", file=sys.stderr)
        print(nonfinite_stop_message(last_good, "--learning_rate <lower>", "--resume_from auto"), file=sys.stderr)
        logger.close()
        cleanup()
        return exit_codes.NON_FINITE
    progress.close()
    saved = save_last(stop_reason or "end of training")
    if main:
        m = validate() if val_batches else {}
        save_samples()
        if m:
            print(f"final (step {gstep()}): {describe(m)}")
        if stop_reason:
            print(f"stopped early ({stop_reason}) at step {step} of {total_steps}; continue with "
                  f"--resume_from {last_good or 'auto'}")
        if stop_reason in ("", "time limit") and saved:  # a time-boxed run is a finished run: export it
            export_final(cfg, trainer, train_files, out_dir, device, logger, gstep(), m, eval_batch)
    logger.close()
    barrier()
    cleanup()
    return exit_codes.OK if stop_reason in ("", "time limit", "stop_at_step") else exit_codes.INTERRUPTED


def export_final(cfg: VAEConfig, trainer: VAETrainer, train_files: list[Path], out_dir: Path,
                 device: torch.device, logger: RunLogger, gstep: int, metrics: dict, eval_batch: int = 4) -> None:
    """Latent statistics (scaling factor), `vae_final.pt` and the diffusers folder."""
    model = trainer.eval_model()
    n = min(cfg.latent_stats_images, len(train_files))
    batches = _loader_batches(train_files, cfg, limit=n, batch_size=eval_batch)
    stats = latent_statistics(model, batches, device, trainer.precision.autocast, seed=cfg.seed)
    stats["images"] = n
    (out_dir / "latent_stats.json").write_text(json.dumps(stats, indent=1) + "\n", encoding="utf-8")
    logger.scalars({"scaling_factor": stats["scaling_factor"], "shift_factor": stats["shift_factor"],
                    "std": stats["std"]}, gstep, "latent")
    for c, (mu, sd) in enumerate(zip(stats["per_channel_mean"], stats["per_channel_std"])):
        logger.scalars({f"mean_{c}": mu, f"std_{c}": sd}, gstep, "latent_channel")
    print(f"latents over {n} images: mean {stats['mean']:.4f}, std {stats['std']:.4f} -> scaling_factor "
          f"{stats['scaling_factor']:.5f} (shift_factor {stats['shift_factor']:.5f} for FLUX-style pipelines)")
    final = {"arch": model.arch(), "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
             "latent_stats": stats, "metrics": metrics, "config": config_to_dict(cfg), "step": gstep}
    save_atomic(final, out_dir / "vae_final.pt")
    print(f"saved {out_dir / 'vae_final.pt'}" + (" (EMA weights)" if trainer.ema else ""))
    if cfg.export_diffusers:
        factors, notes = export_factors(cfg, out_dir, pipeline_factors(model, stats))
        for line in notes:
            print(line)
        folder = save_diffusers(model, out_dir / "diffusers", sample_size=cfg.image_size, **factors)
        print(f"saved diffusers AutoencoderKL folder {folder} (AutoencoderKL.from_pretrained('{folder}')), "
              + ", ".join(f"{k} {v:.5f}" for k, v in factors.items() if v is not None))


# ----------------------------------------------------------------------------- --profile_memory


def profile_memory(cfg: VAEConfig, resolutions: list[int], batches: list[int]) -> int:
    """Peak GPU memory of one full training step (VAE + LPIPS + GAN on) per resolution and batch."""
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
    print(f"profiling on {name} ({total:.1f} GiB), precision {precision_name(cfg)}, channels {cfg.channels}, "
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
    (out / "memory_profile.json").write_text(json.dumps({"gpu": name, "total_gib": total, "rows": rows,
                                                         "config": config_to_dict(cfg)}, indent=1), encoding="utf-8")
    lines = [f"# VAE training memory on {name} ({total:.1f} GiB)", "",
             f"precision {precision_name(cfg)}, channels {cfg.channels}, z_channels {cfg.z_channels}, "
             f"gradient_checkpointing {cfg.gradient_checkpointing}, LPIPS {'on' if perceptual else 'off'}, "
             f"GAN on", "", "| image_size | batch | peak GiB | images/s |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['image_size']} | {r['batch_size']} | "
                     + (f"{r['peak_gib']} | {r['images_per_s']} |" if r["status"] == "ok" else "OOM | - |"))
    (out / "memory_profile.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {out / 'memory_profile.md'} and memory_profile.json")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = resolve_config(args)
        apply_preset(cfg, args.preset, "vae")
        if args.profile_memory:
            return profile_memory(cfg, args.profile_resolutions, args.profile_batches)
        return train(cfg, args.overwrite, args.init_from)
    except (ConfigError, CheckpointError, PerceptualWeightsError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    except OutOfMemory as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.OUT_OF_MEMORY


if __name__ == "__main__":
    sys.exit(main())
