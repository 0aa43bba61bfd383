"""Train an NSF-HiFiGAN vocoder.

    python vocoder/train.py --config vocoder/configs/base_hifi_gpu.yaml \
        --data_dir data/vocoder_bin --run_dir runs/vocoder [--resume auto] [--set batch_size=8]
    torchrun --nproc_per_node 2 vocoder/train.py ...        # DDP, one wrapper per network

One step = one discriminator update followed by one generator update; ``max_updates``,
``val_check_interval``, ``log_interval`` and the LR warmup count these steps.

The loop: crop batch -> G(mel, f0) -> D update (LSGAN on real vs detached fake) -> G update
(adversarial + feature matching + mel L1 [+ MR-STFT] [+ pitch-shift cycle]) -> log ->
every ``val_check_interval`` steps: held-out MR-STFT distance, audio + mel plots, checkpoint
(last ``save_n_checkpoints`` kept, ``best.pt`` by ``best_by`` (default the distance) after ``save_best_after``).
Ctrl-C / SIGTERM saves a checkpoint and exits; ``--resume auto`` continues bit-exactly.
A non-finite loss or gradient skips that network's update (no optimizer state touched);
``max_nonfinite_steps`` in a row stop the run with the last good checkpoint left as newest.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import torch

from common import distributed, exit_codes, loop
from common.atomic_write import write_text
from common.best_by import BestCheckpoints, best_value
from common.checkpoint import (
    CheckpointError,
    load_checkpoint,
    make_state,
    resolve_resume,
    restore_state,
)
from common.config import (
    ConfigError,
    config_to_dict,
    save_config,
)
from common.log import Printer, Progress, RunLogger, report_lr_plan, resumed_trackers
from common.loop import Cadence
from common.precision import Precision
from common.run_dir import tensorboard_dir
from common.schedulers import lr_curve
from common.stopping import RunStop, exit_code
from common.training import (
    DivergenceGuard,
    NonFiniteGuard,
    apply_optimizer_overrides,
    critic_outputs_for_generator,
    frozen,
    optimizer_overrides,
    saving_blocked,
    step_optimizer,
)
from vocoder import pitch_cycle, validation
from vocoder.build import (  # noqa: F401 (the builders are imported from here by tests and tools)
    build_data,
    build_discriminator,
    build_generator,
    build_losses,
    build_lr_scheduler,
    build_optimizer_from_args,
    build_parser,
    resolve_run,
    startup_lines,
)
from vocoder.config import VocoderConfig
from vocoder.data import DatasetError
from vocoder.discriminators import head_outputs, split_outputs
from vocoder.layouts import export_info
from vocoder.losses import (
    discriminator_loss,
    feature_matching_loss,
    generator_adv_loss,
)
from vocoder.pretrained import apply_freezing, load_start_weights

# With fp16 the GradScaler skips a step now and then (inf gradients while it calibrates the scale);
# the schedule still counts that iteration, by design (one step = one iteration), so torch's
# "scheduler.step() before optimizer.step()" warning is noise here.
warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")

LR_HINT = "--set generator_optimizer_args.lr=<lower> --set discriminator_optimizer_args.lr=<lower>"


# --------------------------------------------------------------------------------------- trainer
class VocoderTrainer:
    """Everything a run needs, built from the config; ``fit()`` runs the loop."""

    def __init__(self, cfg: VocoderConfig, data_dir: str | Path, run_dir: str | Path,
                 resume: str | None = None, init_from: str | None = None, device: str | None = None,
                 log=None):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.info = distributed.setup_distributed(device)
        self.is_main = self.info.is_main
        self.log = Printer(self.is_main, log)  # log=None: print (through the progress bar while it is up)
        self.device = self.info.device
        if cfg.pc_aug and self.info.world_size > 1:
            raise ConfigError("pc_aug runs the generator several times per step, which DDP does not support here; "
                              "train pc_aug on one GPU")
        self.precision = Precision(cfg.precision, self.device, tf32=cfg.tf32,
                                   cudnn_benchmark=cfg.cudnn_benchmark, compile=cfg.compile)
        self.scaler = self.precision.scaler

        # ---- data
        self.train_set, self.valid_set, self.sampler, self.loader = build_data(cfg, data_dir, self.info.world_size,
                                                                                self.device)

        # ---- models (same init on every rank), then per-rank noise. Build order kept as it was (seed, models,
        # optimizers, per-rank seed, compile, DDP): the per-rank seed first would change the RNG stream (the digest).
        torch.manual_seed(cfg.seed)
        self.generator = build_generator(cfg).to(self.device)
        self.discriminator = build_discriminator(cfg).to(self.device)
        self.manager = BestCheckpoints(self.run_dir / "checkpoints", cfg.best_by, "mrstft", self.log,
                                       keep_last=cfg.save_n_checkpoints, save_best_after=cfg.save_best_after, prefix="model")
        resume_path = resolve_resume(resume, self.run_dir / "checkpoints", self.manager)
        if resume_path is None:  # a new run: weights from elsewhere, if asked
            load_start_weights(cfg, init_from, self.generator, self.discriminator, self.log)
        self.frozen = apply_freezing(cfg, self.generator, self.discriminator)
        if self.frozen:
            self.log(f"frozen: {len(self.frozen)} parameter tensors ({', '.join(cfg.frozen_params)})")

        self.g_opt = build_optimizer_from_args(cfg.generator_optimizer_args, self.generator)
        self.d_opt = build_optimizer_from_args(cfg.discriminator_optimizer_args, self.discriminator)
        if self.g_opt is None:
            raise ConfigError("every generator parameter is frozen: nothing to train")
        self.g_sched = build_lr_scheduler(self.g_opt, cfg, cfg.generator_optimizer_args.lr)
        self.d_sched = build_lr_scheduler(self.d_opt, cfg, cfg.discriminator_optimizer_args.lr) if self.d_opt else None
        # by network name, as the checkpoint holds them (no discriminator ones when every critic is frozen)
        self.optimizers = {k: v for k, v in (("generator", self.g_opt), ("discriminator", self.d_opt)) if v is not None}
        self.schedulers = {k: v for k, v in (("generator", self.g_sched), ("discriminator", self.d_sched)) if v is not None}
        self.g_guard = NonFiniteGuard(cfg.max_nonfinite_steps)
        self.d_guard = NonFiniteGuard(cfg.max_nonfinite_steps)
        self.guards = {"generator": self.g_guard, "discriminator": self.d_guard}  # by optimizer name
        self.divergence = DivergenceGuard([*self.generator.parameters(), *self.discriminator.parameters()],
                                          cfg.max_nonfinite_steps)

        self.mel_loss, self.input_mel, self.stft = build_losses(cfg, self.device)  # fp32 inside

        # ---- counters and resume
        self.step = self.epoch = self.batch_in_epoch = 0
        self.history: dict = {}
        self.trackers: dict = {}  # the W&B / MLflow run ids a resumed checkpoint holds
        self.last_good: Path | None = resume_path  # the newest checkpoint known to hold a good state
        if resume_path is not None:
            self.restore(resume_path)
        else:
            torch.manual_seed(cfg.seed + 1000 * self.info.rank)  # per-rank noise (resume restores RNG instead)

        # The networks as trained: DDP-wrapped (under torchrun) and compiled (if asked).
        self.generator_ddp = distributed.wrap_ddp(self.precision.prepare_model(self.generator), self.info)
        self.discriminator_ddp = distributed.wrap_ddp(self.precision.prepare_model(self.discriminator), self.info)
        # The G update calls the critics without DDP (no critic gradients are wanted there).
        self._critics_no_ddp = getattr(self.discriminator_ddp, "module", self.discriminator_ddp)
        self.writer = RunLogger(tensorboard_dir(self.run_dir), enabled=self.is_main, purge_step=self.step,
                                trackers=cfg.logger, resume=self.trackers, project="vocoder")
        self.logged_gt: set[str] = set()  # validation files whose ground truth is logged

    # ------------------------------------------------------------------ checkpoint
    def restore(self, path: Path) -> None:
        """Continue the run saved in `path` exactly (weights, optimizers, schedules, scaler, counters, RNG)."""
        counters = restore_state(load_checkpoint(path, map_location=self.device),
                                 {"generator": self.generator, "discriminator": self.discriminator},
                                 self.optimizers, self.schedulers, self.scaler, rank=self.info.rank, source=path)
        self.step = int(counters["step"])
        self.epoch = int(counters["epoch"])
        self.batch_in_epoch = int(counters["batch_in_epoch"])
        self.g_guard.load_state_dict(counters["g_guard"])
        self.d_guard.load_state_dict(counters["d_guard"])
        self.divergence.load_state_dict(counters.get("divergence"))
        self.history = json.loads(counters.get("history", "{}"))
        self.trackers = resumed_trackers(counters)
        self.log(f"resumed from {path} at step {self.step} (epoch {self.epoch}, batch {self.batch_in_epoch})")
        changed = apply_optimizer_overrides(self.optimizers, self.schedulers,
                                            optimizer_overrides(self.cfg, self.cfg.optimizer_spec()))
        if changed:
            self.log(changed)

    def save(self, metric: float | None = None) -> Path | None:
        if saving_blocked(self.g_guard, self.d_guard, self.divergence):
            self.log(f"step {self.step}: no checkpoint while steps are non-finite or diverging (last good: {self.last_good or 'none'})")
            return None
        counters = {"step": self.step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
                    "g_guard": self.g_guard.state_dict(), "d_guard": self.d_guard.state_dict(),
                    "divergence": self.divergence.state_dict(), "history": json.dumps(self.history),
                    **self.writer.checkpoint_state()}
        state = make_state({"generator": self.generator, "discriminator": self.discriminator},
                           self.optimizers, self.schedulers, self.scaler, counters=counters,
                           config=config_to_dict(self.cfg), extra={"export": export_info(self.cfg)}, trainer="vocoder")
        path = self.manager.save(state, self.step, metric) if self.is_main else None
        self.last_good = path or self.last_good
        distributed.barrier()
        return path

    # ------------------------------------------------------------------ one step
    def _generate(self, mel: torch.Tensor, f0: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """G forward; with ``pc_aug`` the pitch-shift cycle (`vocoder.pitch_cycle`). Returns (fake, extras)."""
        if not self.cfg.pc_aug:
            return self.generator_ddp(mel, f0), {}
        return pitch_cycle.generate(self.generator_ddp, self.input_mel, mel, f0, self.cfg.pc_aug_rate,
                                    self.cfg.pc_aug_key, self.generator.source_sr / 2)

    def _critic_outputs(self, real: torch.Tensor, fake: torch.Tensor) -> tuple[dict, dict]:
        """The frozen critics' outputs for the G update: (on real, no grad), (on fake, with grad)."""
        with self.precision.autocast():
            return critic_outputs_for_generator(self._critics_no_ddp, real, fake)

    def train_step(self, batch: dict) -> dict:
        cfg = self.cfg
        dev = self.device
        mel = batch["mel"].to(dev, non_blocking=True)
        f0 = batch["f0"].to(dev, non_blocking=True)
        real = batch["audio"].to(dev, non_blocking=True)
        b = real.shape[0]
        logs: dict = {}
        with self.precision.autocast():
            fake, extras = self._generate(mel, f0)

        # ---- discriminator update (on the detached fake); none during the generator-only warm-up
        adversarial = self.step >= cfg.discriminator_train_start_steps
        if self.d_opt is not None and adversarial:
            with self.precision.autocast():
                out = self.discriminator_ddp(torch.cat([real, fake.detach().to(real.dtype)]))
            d_real, d_fake = split_outputs(out, b)
            loss_d, d_logs = discriminator_loss(d_real, d_fake)
            d_norm, _ = step_optimizer(loss_d, self.d_opt, self.discriminator.parameters(), self.scaler,
                                       cfg.clip_grad_norm, self.d_guard)
            logs.update(d_logs, loss_d=loss_d.detach(), grad_norm_d=d_norm)

        # ---- generator update (critics frozen, called unwrapped: their grads are not needed)
        with frozen(self.discriminator):
            mel_l, energy_l = self.mel_loss.with_energy(fake[:b], real, energy=cfg.lab_aux_energyloss > 0)
            mel_l = mel_l * cfg.lab_aux_melloss
            loss_g = mel_l
            logs.update(loss_mel=mel_l.detach())
            if energy_l is not None:
                energy_l = energy_l * cfg.lab_aux_energyloss
                loss_g = loss_g + energy_l
                logs["loss_energy"] = energy_l.detach()
            if adversarial:
                d_real, d_fake = self._critic_outputs(real, fake.to(real.dtype))
                adv, adv_logs = generator_adv_loss(d_fake)
                fm, fm_logs = feature_matching_loss(d_real, head_outputs(d_fake, b))
                loss_g = loss_g + adv + fm
                logs.update(**adv_logs, **fm_logs)
            if cfg.use_stftloss:
                sc, mag = self.stft(fake[:b], real)
                stft_l = (sc + mag) * cfg.lab_aux_stftloss
                loss_g = loss_g + stft_l
                logs["loss_stft"] = stft_l.detach()
            if extras:
                pc, pc_mel, pc_logs = pitch_cycle.losses(extras, self.mel_loss, cfg.lab_aux_melloss)
                loss_g = loss_g + pc + pc_mel
                logs.update(pc_logs)
            self.divergence.observe(mel_l)  # the weights that made this loss, before G's update
            g_norm, _ = step_optimizer(loss_g, self.g_opt, self.generator.parameters(), self.scaler,
                                       cfg.clip_grad_norm, self.g_guard)
        logs.update(loss_g=loss_g.detach(), grad_norm_g=g_norm)
        self.scaler.update()
        self.g_sched.step()
        if self.d_sched is not None:
            self.d_sched.step()
        return logs

    # ------------------------------------------------------------------ loop
    def validate(self, limit: int | None = None) -> dict | None:
        """Held-out MR-STFT distance and mel L1 on rank 0 (`vocoder.validation`), logged and kept in the
        run's history; None on the other ranks or without validation files."""
        result = None
        if self.is_main and self.valid_set is not None:
            cfg = self.cfg
            result, plots = validation.validate(self.generator, self.valid_set, self.precision, self.stft,
                                                self.input_mel, cfg.seed, limit, cfg.num_valid_plots,
                                                (cfg.audio.sample_rate, cfg.audio.hop_length, cfg.f0_min, cfg.f0_max),
                                                cfg.valid_pesq)
            for plot in plots:
                validation.log_plot(self.writer, self.step, plot, cfg.audio.sample_rate, cfg.mel_vmin, cfg.mel_vmax,
                                    self.logged_gt)
            self.writer.scalars(result, self.step, prefix="valid")
            self.history.setdefault("valid", []).append({"step": self.step, **result})
            self.log(f"step {self.step}: valid MR-STFT distance {result['mrstft']:.4f}, mel L1 {result['mel_l1']:.4f}, "
                     f"F0 RMSE {result['f0_rmse']:.1f} cents, V/UV error {result['vuv_error']:.3f}, periodicity "
                     f"error {result['periodicity']:.3f}" + (f", PESQ {result['pesq']:.2f}" if "pesq" in result else ""))
        distributed.barrier()
        return result

    def fit(self) -> dict:
        """The loop; returns {"step", "stopped" (None when max_updates ran out), "valid", ...} (also summary.json)."""
        cfg = self.cfg
        if self.is_main:
            save_config(cfg, self.run_dir)
            report_lr_plan({"lr_g": lr_curve(self.g_sched)} | ({"lr_d": lr_curve(self.d_sched)} if self.d_sched else {}),
                           cfg.max_updates, "lr_scheduler_args (scheduler_cls, warmup_steps, min_lr, gamma) or max_updates",
                           self.run_dir, self.writer, self.log)
        if self.step == 0 and cfg.num_sanity_val_steps > 0:
            self.validate(limit=cfg.num_sanity_val_steps)
        progress = Progress(cfg.max_updates, initial=self.step, samples_per_step=cfg.batch_size * self.info.world_size,
                            enabled=self.is_main, desc="vocoder")
        self.log.bar = progress
        stop = RunStop(last_good=lambda: self.last_good, lr_hint=LR_HINT, oom=("the vocoder training step", cfg.batch_size, {
            "accum_key": None, "precision": cfg.precision, "crop_key": "crop_mel_frames",
            "crop": cfg.crop_mel_frames, "resume": "--resume auto"}))
        cadence = Cadence(total_steps=cfg.max_updates, log_every=cfg.log_interval, validate_every=cfg.val_check_interval)
        try:
            reason = loop.run(self, cadence, stop, progress, epoch_batches=self._epoch_batches,
                              optimizers=self.optimizers, guards=self.guards, divergence=self.divergence,
                              log=self._log_train, metric=lambda result: best_value(result, cfg.best_by))
        finally:
            self.log.bar = None
            progress.close()
            self.writer.close()
        if reason:
            self.log(stop.message(self.step))
        result = {"step": self.step, "stopped": reason, "valid": self.history.get("valid", []),
                  "skipped_g": self.g_guard.skipped_total, "skipped_d": self.d_guard.skipped_total,
                  "data_wait_fraction": progress.data_wait_fraction, "latest": str(self.manager.latest())}
        if self.is_main:
            write_text(self.run_dir / "summary.json", json.dumps(result, indent=1))
        return result

    def _epoch_batches(self):
        """The current epoch's batches from the run's position (the sampler skips what was trained)."""
        self.sampler.set_epoch(self.epoch)
        self.sampler.skip_samples(self.batch_in_epoch * self.cfg.batch_size)
        return self.loader

    def _log_train(self, logs: dict, progress: Progress) -> dict:
        """One log point to TensorBoard; returns what the progress bar shows."""
        logs.update(lr_g=self.g_opt.param_groups[-1]["lr"], skipped_g=self.g_guard.skipped_total,
                    skipped_d=self.d_guard.skipped_total, data_wait_fraction=progress.data_wait_fraction)
        self.writer.scalars(logs, self.step, prefix="train")
        return {"loss_g": float(logs["loss_g"]), "mel": float(logs["loss_mel"])}


# --------------------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return exit_codes.run_main(lambda: run(args), (ConfigError, DatasetError, CheckpointError), distributed.cleanup)


def run(args: argparse.Namespace) -> int:
    """The run the command line asks for; failures reach `main` as exceptions (`common.exit_codes`)."""
    cfg, run_dir = resolve_run(args)
    trainer = VocoderTrainer(cfg, cfg.binary_data_dir, run_dir, args.resume, args.init_from, args.device)
    if trainer.is_main:
        print(startup_lines(cfg, trainer.precision, trainer.generator, trainer.discriminator, run_dir))
    return exit_code(trainer.fit()["stopped"])


if __name__ == "__main__":
    sys.exit(main())
