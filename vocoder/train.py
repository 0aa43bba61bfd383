"""Train an NSF-HiFiGAN vocoder.

    python vocoder/train.py --config vocoder/configs/base_hifi_gpu.yaml \
        --data_dir data/vocoder_bin --run_dir runs/vocoder [--resume auto] [--set batch_size=8]
    torchrun --nproc_per_node 2 vocoder/train.py ...        # DDP, one wrapper per network

One step = one discriminator update followed by one generator update; ``max_updates``, the cadence keys
(``log_every``, ``validate_every``, ``save_every``, ``stop_at_step``; the seed's ``log_interval`` and
``val_check_interval`` are aliases) and the LR warmup count these steps; ``max_minutes`` bounds the wall time.

The loop: crop batch -> G(mel, f0) -> D update (LSGAN on real vs detached fake) -> G update
(adversarial + feature matching + mel L1 [+ MR-STFT] [+ pitch-shift cycle]) -> log ->
every ``validate_every`` steps: held-out MR-STFT distance, audio + mel plots, checkpoint
(last ``save_n_checkpoints`` kept, ``best.pt`` by ``best_by`` (default the distance) after ``save_best_after``).
Ctrl-C / SIGTERM saves a checkpoint and exits; ``--resume auto`` continues bit-exactly.
A non-finite loss or gradient skips that network's update (no optimizer state touched);
``max_nonfinite_steps`` in a row stop the run with the last good checkpoint left as newest.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from common import distributed, exit_codes, loop
from common.best_by import BestCheckpoints
from common.checkpoint import RunCheckpoints, ranking_start, ranking_start_note, resolve_resume
from common.config import ConfigError, save_config
from common.guards import DivergenceGuard, NonFiniteGuard
from common.log import Printer, Progress, RunLogger, report_lr_plan
from common.loop import Cadence, RunResult
from common.model_card import DATA_SOURCE, read_data_source
from common.precision import Precision
from common.run_dir import tensorboard_dir
from common.schedulers import lr_curve
from common.stopping import RunStop, exit_code
from common.training import critic_outputs_for_generator, frozen, step_optimizer, step_schedules
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
from vocoder.discriminators import head_outputs, split_outputs
from vocoder.layouts import export_info
from vocoder.losses import discriminator_loss, feature_matching_loss, generator_adv_loss
from vocoder.pretrained import apply_freezing, load_start_weights

LR_HINT = "--set generator_optimizer_args.lr=<lower> --set discriminator_optimizer_args.lr=<lower>"


class VocoderTrainer:
    """Everything a run needs, built from the config in the one build order (per-rank seed, models,
    channels_last, DDP, compile, optimizers); ``fit()`` runs `common.loop.fit`."""

    def __init__(self, cfg: VocoderConfig, data_dir: str | Path, run_dir: str | Path,
                 resume: str | None = None, init_from: str | None = None, device: str | None = None,
                 log=None):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.info = distributed.setup_distributed(device)
        self.printer = Printer(self.info.is_main, log)  # log=None: print (through the progress bar while it is up)
        self.device = self.info.device
        if cfg.pc_aug and self.info.world_size > 1:
            raise ConfigError("pc_aug runs the generator several times per step, which DDP does not support here; "
                              "train pc_aug on one GPU")
        if cfg.cuda_graphs and self.info.world_size > 1:  # untried: DDP's gradient hooks beside the graph trees
            raise ConfigError("cuda_graphs under torchrun is not supported yet (DDP's all-reduce beside CUDA graph "
                              "trees is untried); train it on one GPU, or drop cuda_graphs")
        self.precision = Precision(cfg.precision, self.device, tf32=cfg.tf32,
                                   cudnn_benchmark=cfg.cudnn_benchmark, compile=cfg.compile,
                                   cuda_graphs=cfg.cuda_graphs)
        self.train_set, self.valid_set, self.sampler, self.loader = build_data(cfg, data_dir, self.info.world_size,
                                                                                self.device)
        self.data_source = read_data_source(data_dir)  # carried in the checkpoints into every export's card
        # ---- per-rank seed, models (DDP broadcasts rank 0's initial weights), their weights from elsewhere
        torch.manual_seed(cfg.seed + 1000 * self.info.rank)
        self.generator = build_generator(cfg).to(self.device)
        self.discriminator = build_discriminator(cfg).to(self.device)
        self.models = {"generator": self.generator, "discriminator": self.discriminator}
        note = ranking_start_note(cfg.save_best_after, cfg.discriminator_train_start_steps,
                                  "discriminator_train_start_steps")
        if note:
            self.printer(note)
        store = BestCheckpoints(self.run_dir / "checkpoints", cfg.best_by, "mrstft", self.printer,
                                keep_last=cfg.save_n_checkpoints, prefix="model",
                                save_best_after=ranking_start(cfg.save_best_after, cfg.discriminator_train_start_steps))
        resume_path = resolve_resume(resume, store.dir, store)
        if resume_path is None:  # a new run: weights from elsewhere, if asked
            load_start_weights(cfg, init_from, self.generator, self.discriminator, self.printer)
        self.frozen = apply_freezing(cfg, self.generator, self.discriminator)
        if self.frozen:
            self.printer(f"frozen: {len(self.frozen)} parameter tensors ({', '.join(cfg.frozen_params)})")
        # ---- channels_last, DDP, compile: the networks as trained; the G update calls the critics without DDP
        self.generator_ddp = self.precision.prepare_model(self.generator, self.info)
        self.discriminator_ddp = self.precision.prepare_model(self.discriminator, self.info)
        self._critics = self.precision.prepare_model(self.discriminator) if self.info.enabled else self.discriminator_ddp
        # ---- optimizers, schedules, guards (by network name, as the checkpoint holds them)
        self.g_opt = build_optimizer_from_args(cfg.generator_optimizer_args, self.generator)
        self.d_opt = build_optimizer_from_args(cfg.discriminator_optimizer_args, self.discriminator,
                                               "discriminator_optimizer_args")
        if self.g_opt is None:
            raise ConfigError("every generator parameter is frozen: nothing to train")
        self.g_sched = build_lr_scheduler(self.g_opt, cfg, cfg.generator_optimizer_args.lr)
        self.d_sched = build_lr_scheduler(self.d_opt, cfg, cfg.discriminator_optimizer_args.lr) if self.d_opt else None
        self.optimizers = {k: v for k, v in (("generator", self.g_opt), ("discriminator", self.d_opt)) if v is not None}
        self.schedulers = {k: v for k, v in (("generator", self.g_sched), ("discriminator", self.d_sched)) if v is not None}
        self.guards = {name: NonFiniteGuard(cfg.max_nonfinite_steps) for name in self.optimizers}
        self.divergence = DivergenceGuard([*self.generator.parameters(), *self.discriminator.parameters()],
                                          cfg.max_nonfinite_steps)
        self.mel_loss, self.input_mel, self.stft = build_losses(cfg, self.device)  # fp32 inside
        # ---- position, then resume (exact: weights, optimizers, schedules, scaler, counters, guards, RNG)
        self.step = self.epoch = self.batch_in_epoch = 0
        self.history: dict = {}
        self.trackers: dict = {}  # the W&B / MLflow run ids a resumed checkpoint holds
        self.checkpoints = RunCheckpoints(self, store, "vocoder", optimizer_spec=cfg.optimizer_spec(),
                                          map_location=self.device)
        if resume_path is not None:
            self.checkpoints.resume(resume_path)
        self.writer = RunLogger(tensorboard_dir(self.run_dir), enabled=self.info.is_main, purge_step=self.step,
                                trackers=cfg.logger, resume=self.trackers, project="vocoder")
        self.logged_gt: set[str] = set()  # validation files whose ground truth is logged

    # ------------------------------------------------------------------ checkpoint: this trainer's part
    def state(self) -> dict:
        return {"export": export_info(self.cfg), "history": self.history,
                **({DATA_SOURCE: self.data_source} if self.data_source else {})}

    def load_state(self, ckpt: dict) -> None:
        legacy = json.loads(ckpt.get("counters", {}).get("history", "{}"))  # written before the one layout
        self.history = ckpt.get("extra", {}).get("history", legacy)
        self.data_source = self.data_source or ckpt.get("extra", {}).get(DATA_SOURCE)

    # ------------------------------------------------------------------ one step
    def _generate(self, mel: torch.Tensor, f0: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """G forward; with ``pc_aug`` the pitch-shift cycle (`vocoder.pitch_cycle`). Returns (fake, extras)."""
        if not self.cfg.pc_aug:
            return self.generator_ddp(mel, f0), {}
        return pitch_cycle.generate(self.generator_ddp, self.input_mel, mel, f0, self.cfg.pc_aug_rate,
                                    self.cfg.pc_aug_key, self.generator.source_sr / 2)

    def train_step(self, batch: dict) -> dict:
        cfg, dev = self.cfg, self.device
        self.precision.step_begin()
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
            d_norm, _ = step_optimizer(loss_d, self.d_opt, self.discriminator.parameters(), self.precision.scaler,
                                       cfg.clip_grad_norm, self.guards["discriminator"])
            logs.update(d_logs, loss_d=loss_d.detach(), grad_norm_d=d_norm)
            # The critic outputs (logits and every feature map of 2B items) are spent: without this they
            # would stay alive through the whole generator update (3.3 GiB of the fp32 peak at
            # base_hifi_gpu.yaml's b16 x 48 frames; bench/README.md, "Memory").
            del out, d_real, d_fake, loss_d

        # ---- generator update (critics frozen, called without DDP: their grads are not needed)
        with frozen(self.discriminator):
            mel_l, energy_l = self.mel_loss.with_energy(fake[:b], real, energy=cfg.lab_aux_energyloss > 0)
            loss_g = mel_l = mel_l * cfg.lab_aux_melloss
            logs.update(loss_mel=mel_l.detach())
            if energy_l is not None:
                energy_l = energy_l * cfg.lab_aux_energyloss
                loss_g = loss_g + energy_l
                logs["loss_energy"] = energy_l.detach()
            if adversarial:
                with self.precision.autocast():
                    d_real, d_fake = critic_outputs_for_generator(self._critics, real, fake.to(real.dtype))
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
            g_norm, _ = step_optimizer(loss_g, self.g_opt, self.generator.parameters(), self.precision.scaler,
                                       cfg.clip_grad_norm, self.guards["generator"])
        logs.update(loss_g=loss_g.detach(), grad_norm_g=g_norm)
        self.precision.scaler.update()
        step_schedules(self.g_sched, self.d_sched)
        return logs

    # ------------------------------------------------------------------ around the step
    def validate(self, limit: int | None = None) -> dict:
        """Held-out MR-STFT distance, mel L1 and pitch metrics on rank 0 (`vocoder.validation`), logged and
        kept in the run's history; {} on the other ranks or without validation files."""
        result: dict = {}
        if self.info.is_main and self.valid_set is not None:
            cfg = self.cfg
            result, plots = validation.validate(self.generator, self.valid_set, self.precision, self.stft,
                                                self.input_mel, cfg.seed, limit, cfg.num_valid_plots,
                                                validation.PitchSettings(cfg.audio.sample_rate, cfg.audio.hop_length,
                                                                         cfg.f0_min, cfg.f0_max, cfg.pe,
                                                                         cfg.pe_ckpt or None),
                                                cfg.valid_pesq)
            for plot in plots:
                validation.log_plot(self.writer, self.step, plot, cfg.audio.sample_rate, cfg.mel_vmin, cfg.mel_vmax,
                                    self.logged_gt)
            self.writer.scalars(result, self.step, prefix="valid")
            self.history.setdefault("valid", []).append({"step": self.step, **result})
            self.printer(f"step {self.step}: valid MR-STFT distance {result['mrstft']:.4f}, mel L1 {result['mel_l1']:.4f}, "
                         f"F0 RMSE {result['f0_rmse']:.1f} cents (median {result['f0_median_error']:.1f}, "
                         f"{100 * result['f0_gross_error']:.1f}% > 50 cents), V/UV error {result['vuv_error']:.3f}, periodicity "
                         f"error {result['periodicity']:.3f}" + (f", PESQ {result['pesq']:.2f}" if "pesq" in result else ""))
        distributed.barrier()
        return result

    def batches(self):
        """The current epoch's batches from the run's position (the sampler skips what was trained)."""
        self.sampler.set_epoch(self.epoch)
        self.sampler.skip_samples(self.batch_in_epoch * self.cfg.batch_size)
        return self.loader

    def log(self, logs: dict, progress: Progress) -> dict:
        """One log point to TensorBoard; returns what the progress bar shows."""
        self.writer.scalars(logs, self.step, prefix="train")
        return {"loss_g": float(logs["loss_g"]), "mel": float(logs["loss_mel"])}

    def fit(self) -> RunResult:
        """The plan's report and the sanity validation, then `common.loop.fit`; the result also as summary.json."""
        cfg = self.cfg
        if self.info.is_main:
            save_config(cfg, self.run_dir)
            report_lr_plan({"lr_generator": lr_curve(self.g_sched)}
                           | ({"lr_discriminator": lr_curve(self.d_sched)} if self.d_sched else {}), cfg.max_updates,
                           "lr_scheduler_args (scheduler_cls, warmup_steps, min_lr, gamma) or max_updates",
                           self.run_dir, self.writer, self.printer)
        if self.step == 0 and cfg.num_sanity_val_steps > 0:
            self.validate(limit=cfg.num_sanity_val_steps)
        stop = RunStop.of(cfg, cfg, "the vocoder training step", last_good=lambda: self.checkpoints.last_good,
                          lr_hint=LR_HINT)
        result = loop.fit(self, Cadence.of(cfg, cfg.max_updates), stop, self.checkpoints, best_by=cfg.best_by,
                          samples_per_step=cfg.batch_size * self.info.world_size, desc="vocoder")
        if self.info.is_main:
            result.save(self.run_dir / "summary.json")
        return result


# --------------------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return exit_codes.run_main(lambda: run(args), cleanup=distributed.cleanup)


def run(args: argparse.Namespace) -> int:
    """The run the command line asks for; failures reach `main` as exceptions (`common.exit_codes`)."""
    cfg, run_dir = resolve_run(args)
    trainer = VocoderTrainer(cfg, cfg.binary_data_dir, run_dir, args.resume, args.init_from, args.device)
    if trainer.info.is_main:
        print(startup_lines(cfg, trainer.precision, trainer.generator, trainer.discriminator, run_dir))
    return exit_code(trainer.fit().stopped)


if __name__ == "__main__":
    sys.exit(main())
