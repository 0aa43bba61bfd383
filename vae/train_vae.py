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

The loop: accumulate `accumulation_steps` micro-batches -> VAE update (reconstruction + LPIPS + KL
[+ adaptive GAN term]) -> PatchGAN update (after `disc_start`) -> EMA -> log every `log_freq` steps,
samples every `save_samples_freq`, validation every `val_freq`, `checkpoint_epoch_N.pt` every
`checkpoint_freq` epochs -> at the end `checkpoint_last.pt`, `vae_final.pt` and the diffusers folder.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import nn

from common import distributed, exit_codes
from common.checkpoint import (
    CheckpointError,
    CheckpointManager,
    GracefulExit,
    make_state,
    resolve_resume,
    save_atomic,
)
from common.config import ConfigError, add_config_args, config_to_dict
from common.distributed import DistInfo, all_reduce_mean, wrap_ddp
from common.hardware import explain_oom
from common.log import Progress, RunLogger, peak_memory_gib
from common.muon import build_optimizer
from common.precision import Precision
from common.presets import add_preset_arg, apply_preset
from common.run_dir import add_run_args, prepare_run_dir, tensorboard_dir
from common.schedulers import build_scheduler
from common.training import (
    EMA,
    BufferSnapshot,
    NonFiniteError,
    NonFiniteGuard,
    backward,
    count_parameters,
    nonfinite_stop_message,
    saving_blocked,
    step_optimizer,
)
from vae import validation
from vae.check_compatibility import choose_batch_size, profile_memory
from vae.config import VAEConfig
from vae.data import TrainData, build_train_data, training_images
from vae.diffusers_io import export_final
from vae.flags import add_guide_flags, resolve_config
from vae.losses import FrozenLPIPS, PatchDiscriminator, PerceptualWeightsError, VAELoss
from vae.model import AutoencoderKL, build_vae
from vae.pretrained import init_weights
from vae.run_plan import report_plan, resume_run

# ----------------------------------------------------------------------------- the trainer


class VAETrainer:
    """The models, optimizers, loss and ONE optimisation step (`step`), then the run around it (`fit`).

    `step` stands alone so `--batch_size auto`, `--profile_memory` and bench/bench_vae.py run the very
    step that training runs (a trainer built for that never calls `fit`).
    """

    def __init__(self, cfg: VAEConfig, device: torch.device, info: DistInfo | None = None,
                 total_steps: int = 1, perceptual: FrozenLPIPS | None = None, quiet: bool = False) -> None:
        self.cfg, self.device = cfg, device
        self.info = info or DistInfo(0, 1, 0, device, False)
        self.precision = Precision(cfg.precision, device, tf32=cfg.enable_tf32,
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
                            cfg.logvar_init, cfg.disc_start, cfg.disc_weight, cfg.disc_factor).to(device)
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
        # The run's position (`fit` restores it on resume): step of this stage, epoch, data position, stage.
        self.step_count = 0
        self.counters = {"epoch": 0, "micro_in_epoch": 0, "stage": 1, "steps_before_stage": 0}
        self.stages = [{"stage": 1, "image_size": cfg.image_size, "first_step": 0, "first_epoch": 0}]
        self.best_psnr: float | None = None
        self.last_psnr: float | None = None
        self.last_good: Path | None = None  # the newest checkpoint known to hold a good state
        self.last_val: tuple[int, dict] = (-1, {})  # (global step, metrics) of the latest validation
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

    # ------------------------------------------------------------------ one step
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

    # ------------------------------------------------------------------ checkpoints
    @property
    def global_step(self) -> int:
        """Steps over all resolution stages (what `disc_start`, the logs and the samples count)."""
        return int(self.counters["steps_before_stage"]) + self.step_count

    def state(self) -> dict:
        c = {**self.counters, "step": self.step_count, "global_step": self.global_step,
             "image_size": self.cfg.image_size, "samples_per_step": self.data.samples_per_step,
             "num_train": len(self.data.train_files)}
        return make_state(self.models(), self.optimizers, self.schedulers, self.precision.scaler,
                          {"vae": self.ema} if self.ema else None, c, config_to_dict(self.cfg),
                          extra={"arch": self.vae_module.arch(), "guard": self.guard.state_dict(),
                                 "best_psnr": self.best_psnr, "stages": self.stages})

    def save_last(self, reason: str) -> bool:
        if saving_blocked(self.guard):
            if self.info.is_main:
                print(f"not saving checkpoint_last.pt at step {self.step_count} ({reason}): the newest steps were "
                      f"non-finite; the last good checkpoint is {self.last_good or 'none'}")
            return False
        s = self.state()  # on every rank: it gathers every rank's RNG state
        if self.info.is_main:
            self.last_good = save_atomic(s, self.out_dir / "checkpoint_last.pt")
            print(f"saved {self.out_dir / 'checkpoint_last.pt'} at step {self.step_count} ({reason})")
        return True

    # ------------------------------------------------------------------ the loop
    def fit(self, data: TrainData, out_dir: Path, init_from: str | None = None) -> int:
        """Resume (or `--init_from`), say the plan, run the epochs, save and export; returns the exit code
        (a non-finite stop raises `NonFiniteError` naming the last good checkpoint: `main` prints it)."""
        cfg, main = self.cfg, self.info.is_main
        self.data, self.out_dir = data, out_dir
        self.manager = CheckpointManager(out_dir, keep_last=cfg.keep_checkpoints, mode="max",
                                         name_fn=lambda n: f"checkpoint_epoch_{n}.pt")
        resume = resolve_resume(cfg.resume_from, out_dir, self.manager, extra_names=("checkpoint_last.pt",))
        if resume is not None:
            resume_run(self, resume)
        elif init_from:  # weights only (a new run): a diffusers folder, or a checkpoint (see vae/pretrained.py)
            for line in init_weights(self, init_from, out_dir, main):
                if main:
                    print(line)
        self.logger = RunLogger(tensorboard_dir(out_dir), enabled=main)
        if main:
            report_plan(self)
        validation.prepare(self, data)
        if main:
            (out_dir / "samples").mkdir(exist_ok=True)
            self.logger.scalar("train/image_size", cfg.image_size, self.global_step)  # this stage's resolution
            if self.step_count == 0 and self.val_batches:
                print(f"step {self.global_step}: {validation.describe(validation.validate(self))}")
                validation.save_samples(self)

        progress = Progress(data.total_steps, initial=self.step_count, samples_per_step=data.samples_per_step,
                            enabled=main)
        self._t_start, self._last_log = time.time(), (time.perf_counter(), self.step_count)
        self._bar: dict[str, float] = {}  # loss values shown on the progress bar, refreshed at log steps only
        stop_reason = ""
        try:
            with GracefulExit() as stopper:
                while self.step_count < data.total_steps and not stop_reason:
                    epoch = self.counters["epoch"]
                    stop_reason = self._run_epoch(progress, stopper)
                    if self.counters["epoch"] == epoch:
                        break  # left mid-epoch (a stop request or the planned last step)
        except NonFiniteError as exc:  # main prints it: exit code 3, with the way back
            progress.close()
            self.logger.close()
            hint = nonfinite_stop_message(self.last_good, "--learning_rate <lower>", "--resume_from auto")
            raise NonFiniteError(f"{exc}\n{hint}") from None
        progress.close()
        return self._finish(stop_reason)

    def _run_epoch(self, progress: Progress, stopper: GracefulExit) -> str:
        """One (possibly resumed) pass over the data; returns why the run stops early ("" = it does not)."""
        cfg, data, c, main = self.cfg, self.data, self.counters, self.info.is_main
        accum, epoch, stop_reason = cfg.accumulation_steps, int(c["epoch"]), ""
        data.sampler.set_epoch(epoch)
        data.sampler.skip_samples(int(c["micro_in_epoch"]) * int(cfg.batch_size))
        micro: list[torch.Tensor] = []
        oom_hints = {"accum_key": "accumulation_steps", "accumulation": accum, "precision": self.precision.precision,
                     "checkpointing_key": "gradient_checkpointing", "crop_key": "image_size", "crop": cfg.image_size,
                     "resume": "--resume auto"}
        t0 = time.perf_counter()
        for x in data.loader:
            micro.append(x)
            if len(micro) < accum:
                continue
            t1 = time.perf_counter()
            with explain_oom("the VAE training step", int(cfg.batch_size), oom_hints):
                logs, _ = self.step(micro, self.global_step)
            micro = []
            self.step_count += 1
            step = self.step_count
            c["micro_in_epoch"] = int(c["micro_in_epoch"]) + accum
            if main and (step % cfg.log_freq == 0 or step == data.total_steps):
                self._log(logs, progress)
            progress.update(step, t1 - t0, time.perf_counter() - t1, **self._bar)
            if main and cfg.save_samples_freq and step % cfg.save_samples_freq == 0:
                validation.save_samples(self)
            if main and cfg.val_freq and step % cfg.val_freq == 0 and self.val_batches:
                progress.write(f"step {self.global_step}: {validation.describe(validation.validate(self))}")
            if cfg.save_every_steps and step % cfg.save_every_steps == 0:
                self.save_last(f"every {cfg.save_every_steps} steps")
            flags = [bool(cfg.stop_at_step and self.global_step >= cfg.stop_at_step),
                     bool(cfg.time_limit_minutes and time.time() - self._t_start > cfg.time_limit_minutes * 60),
                     stopper.requested]
            if distributed.is_enabled():  # every rank must stop at the same step
                flags = [any(f) for f in zip(*distributed.gather_objects(flags))]
            if any(flags):
                stop_reason = ("stop_at_step", "time limit", stopper.signal_name or "signal")[flags.index(True)]
                break
            if step >= data.total_steps:
                break
            t0 = time.perf_counter()
        if c["micro_in_epoch"] // accum < data.steps_per_epoch:
            return stop_reason  # left mid-epoch: the epoch counter stays
        c["epoch"], c["micro_in_epoch"] = epoch + 1, 0
        if (epoch + 1) % cfg.checkpoint_freq == 0 and not saving_blocked(self.guard):
            s = self.state()
            if main:
                self.last_good = self.manager.save(s, epoch + 1, metric=self.last_psnr)
                progress.write(f"saved {self.last_good}")
            distributed.barrier()
        return stop_reason

    def _log(self, logs: dict, progress: Progress) -> None:
        now = time.perf_counter()
        ips = (self.step_count - self._last_log[1]) * self.data.samples_per_step / max(now - self._last_log[0], 1e-9)
        self._last_log = (now, self.step_count)
        logs.update({"lr": self.opt_g.param_groups[0]["lr"], "images_per_sec": ips,
                     "memory_gib": peak_memory_gib(self.device), "data_wait": progress.data_wait_fraction,
                     "nonfinite_skipped": self.guard.skipped_total})
        if self.opt_d is not None:
            logs["disc_lr"] = self.opt_d.param_groups[0]["lr"]
        self.logger.scalars(logs, self.global_step, "train")  # one host sync for all the tensors
        self._bar = {"loss": float(logs["total"]), "rec": float(logs[f"rec_{self.cfg.rec_loss}"])}

    def _finish(self, stop_reason: str) -> int:
        """The last checkpoint, validation and samples; a finished (or time-boxed) run is exported."""
        saved = self.save_last(stop_reason or "end of training")
        if self.info.is_main:
            m = validation.validate(self) if self.val_batches else {}
            validation.save_samples(self)
            if m:
                print(f"final (step {self.global_step}): {validation.describe(m)}")
            if stop_reason:
                print(f"stopped early ({stop_reason}) at step {self.step_count} of {self.data.total_steps}; "
                      f"continue with --resume_from {self.last_good or 'auto'}")
            if stop_reason in ("", "time limit") and saved:
                export_final(self.cfg, self, self.data.train_files, self.out_dir, self.device, self.logger,
                             self.global_step, m, self.eval_batch)
        self.logger.close()
        distributed.barrier()
        return exit_codes.OK if stop_reason in ("", "time limit", "stop_at_step") else exit_codes.INTERRUPTED


# ----------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(p)
    add_run_args(p, run_aliases=("--output_dir",), resume_aliases=("--resume_from",),
                 run_help="config key output_dir: checkpoints, samples, logs (alias --output_dir)")
    add_guide_flags(p)
    p.add_argument("--profile_memory", action="store_true",
                   help="measure peak GPU memory per resolution and batch size, write a table, exit")
    p.add_argument("--profile_resolutions", type=int, nargs="+", default=[256, 512, 768, 1024, 1536, 2048])
    p.add_argument("--profile_batches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    add_preset_arg(p)
    return p


def train(cfg: VAEConfig, overwrite: bool = False, init_from: str | None = None) -> int:
    out_dir = Path(cfg.output_dir)
    prepare_run_dir(out_dir, None, cfg.resume_from, overwrite, init_from, run_flag="--output_dir")
    info = distributed.setup_distributed(cfg.device or None)
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank (DDP also broadcasts them)
    train_files, val_files = training_images(cfg)
    perceptual = FrozenLPIPS(cfg.perceptual_net, cfg.perceptual_weights or None) if cfg.perceptual_weight > 0 else None
    choose_batch_size(cfg, info.device, perceptual, info.is_main)
    data = build_train_data(cfg, info.world_size, train_files, val_files)
    trainer = VAETrainer(cfg, info.device, info, data.total_steps, perceptual)
    torch.manual_seed(cfg.seed + info.rank)  # distinct posterior noise per rank (restored on resume)
    try:
        return trainer.fit(data, out_dir, init_from)
    finally:
        distributed.cleanup()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return exit_codes.run_main(lambda: run(args), (ConfigError, CheckpointError, PerceptualWeightsError,
                                                   FileNotFoundError, ValueError))


def run(args: argparse.Namespace) -> int:
    """The config, then `--profile_memory` or training; failures reach `main` as exceptions."""
    cfg = resolve_config(args)
    apply_preset(cfg, args.preset, "vae")
    if args.profile_memory:
        return profile_memory(cfg, args.profile_resolutions, args.profile_batches)
    return train(cfg, args.overwrite, args.init_from)


if __name__ == "__main__":
    sys.exit(main())
