"""Train the Uzbek VITS model.

    python tts/train.py --config tts/vits/configs/uzbek_vits.yaml --data_dir data/prepared --run_dir runs/uzbek
        [--set batch_size=32] [--resume auto|PATH] [--init_from CKPT] [--device cpu]
    ... --init_from piper/epoch=N-step=M.ckpt [--init_config config.json] [--init_speaker NAME|ID]
        (a published voice: tts/vits/published/, README "Fine-tuning from a published voice")
    torchrun --nproc_per_node 2 tts/train.py ...            (DDP, one process per GPU)

One loop: discriminator step → generator step → log → evaluate → checkpoint. Separate AdamW
optimizers and exponential schedulers for G and D (``lr_gamma`` per step or per epoch, see
``lr_scheduler_per``), gradient-norm clipping of each network (``clip_grad_norm``; the norm before
clipping is logged), mixed precision (autocast for the networks; spectrograms, flows'
log-determinants, MAS and every loss in fp32), non-finite steps skipped and a run that keeps
producing them stopped with its last good checkpoint intact, exact resume.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from common import exit_codes, loop
from common.best_by import BestCheckpoints, best_value
from common.checkpoint import (
    CheckpointError,
    load_checkpoint,
    make_state,
    resolve_resume,
    restore_state,
)
from common.config import ConfigError, config_to_dict, format_config, save_config
from common.distributed import DistInfo, barrier, cleanup, setup_distributed, wrap_ddp
from common.log import Printer, Progress, RunLogger, report_lr_plan, resumed_trackers
from common.loop import Cadence
from common.muon import build_optimizer
from common.precision import Precision, compile_unavailable
from common.run_dir import tensorboard_dir
from common.schedulers import build_scheduler, lr_curve
from common.stopping import RunStop, exit_code
from common.training import (
    ClipStats,
    DivergenceGuard,
    NonFiniteGuard,
    apply_optimizer_overrides,
    critic_outputs_for_generator,
    frozen,
    optimizer_overrides,
    saving_blocked,
    step_optimizer,
)
from speech.plots import plot_alignment
from speech.speaker_similarity import load_speaker_encoder
from tts.text.phonemes import Frontend
from tts.vits.build import (  # noqa: F401 (parse_args, plan_source_start: imported from here by tests)
    build_data,
    build_mel,
    build_models,
    build_stft_loss,
    init_from_own,
    optimizer_spec,
    parse_args,
    plan_source_start,
    resolve_run,
    schedule_kwargs,
    startup_lines,
)
from tts.vits.config import TrainConfig
from tts.vits.data import DataError
from tts.vits.evaluation import evaluate, record_metrics, speak_test_sentences
from tts.vits.losses import discriminator_loss, feature_loss, generator_loss, kl_loss
from tts.vits.model import apply_layout_and_compile, slice_segments
from tts.vits.published.start import SourceStart, load_start
from vocoder.losses import frame_energy_loss


class VitsTrainer:
    """Everything one run holds (data, G and D with their optimizers and schedules, checkpoints);
    `train_step` is one D update then one G update, `fit` the loop."""

    def __init__(self, cfg: TrainConfig, info: DistInfo, resume: str | None = None, init_from: str | None = None,
                 source: SourceStart | None = None, init_ckpt: dict | None = None):
        self.cfg, self.info = cfg, info
        self.licence: str | None = None  # of the weights the run started from (published voices declare one)
        self.device = info.device
        if not cfg.data_dir:
            raise ConfigError("no data folder: pass --data_dir (a folder made by tts/prepare_data.py)")
        self.run_dir = Path(cfg.run_dir or f"runs/{cfg.run_name}")
        self.log = Printer(info.is_main)
        # Build order as before (per-rank seed, data, models, optimizers, layout + compile of parts, resume, DDP):
        # the seed already comes first; compile before DDP is left as is (a swap needs a GPU run to check it).
        torch.manual_seed(cfg.seed + info.rank)

        # data
        (self.speakers, self.train_set, self.eval_set, self.batch_size, self.sampler, self.shapes,
         self.loader) = build_data(cfg, self.device, info.world_size, self.log)
        self.steps_per_epoch = len(self.sampler)

        # models, optimizers, schedulers, precision
        self.generator, self.discriminator = (m.to(self.device) for m in build_models(cfg, len(self.speakers)))
        self.mel = build_mel(cfg).to(self.device)
        self.stft = build_stft_loss(cfg, self.device)
        self.precision = Precision(cfg.precision, self.device, tf32=cfg.tf32,
                                   cudnn_benchmark=cfg.cudnn_benchmark, deterministic=cfg.deterministic)
        self.scaler = self.precision.scaler
        opt_kw = {"betas": tuple(cfg.betas), "eps": cfg.eps, "weight_decay": cfg.weight_decay}
        self.g_opt = build_optimizer(cfg.optimizer_cls, self.generator, lr=cfg.lr_gen or cfg.lr, **opt_kw)
        self.d_opt = build_optimizer(cfg.optimizer_cls, self.discriminator, lr=cfg.lr_disc or cfg.lr, **opt_kw)
        sched_kw = schedule_kwargs(cfg, self.steps_per_epoch)
        self.g_sched = build_scheduler(self.g_opt, "exponential", **sched_kw)
        self.d_sched = build_scheduler(self.d_opt, "exponential", **sched_kw)
        # by network name: the checkpoint's layout
        self.models = {"generator": self.generator, "discriminator": self.discriminator}
        self.optimizers = {"generator": self.g_opt, "discriminator": self.d_opt}
        self.schedulers = {"generator": self.g_sched, "discriminator": self.d_sched}
        self.guard = NonFiniteGuard(cfg.max_nonfinite_steps)
        # one guard judges the D and G updates together (a step is finite when both are): it covers both optimizers
        self.guards = {"generator": self.guard, "discriminator": self.guard}
        self.divergence = DivergenceGuard([*self.generator.parameters(), *self.discriminator.parameters()],
                                          cfg.max_nonfinite_steps)
        self.clip_stats = ClipStats(cfg.clip_grad_norm)
        self.manager = BestCheckpoints(self.run_dir / "checkpoints", cfg.best_by, "score", self.log,
                                       keep_last=cfg.save_n_checkpoints, save_best_after=cfg.save_best_after, prefix="vits")
        self.step = self.epoch = self.batch_in_epoch = 0
        self.trackers: dict = {}  # the W&B / MLflow run ids a resumed checkpoint holds
        self.last_good: Path | None = None  # the newest checkpoint known to hold a good state
        self.last_metrics: dict | None = None  # the latest held-out metrics (fit's result)
        self.last_attn: torch.Tensor | None = None  # the latest step's first alignment, for the log

        for line in startup_lines(self.generator, self.discriminator, self.train_set, self.eval_set, self.speakers,
                                  self.steps_per_epoch, self.batch_size):
            self.log(line)
        why_not = compile_unavailable(self.device) if cfg.compile else None  # it compiles parts, not the model
        notes = [f"not applied: torch.compile requested but {why_not}: training runs eager"] if why_not else []
        for line in (self.precision.report() + notes + apply_layout_and_compile(
                self.generator, self.discriminator, cfg.channels_last, cfg.compile and not why_not)):
            self.log(line)
        path = resolve_resume(resume, self.manager.dir, self.manager)
        if path is not None:
            self.restore(path)
        elif source is not None:  # a published voice (Piper, MMS), planned and checked by `plan_source_start`
            load_start(source, self.generator, self.discriminator)
            self.licence = source.voice.licence
            for line in source.lines:
                self.log(line)
        elif init_from:
            self.licence, lines = init_from_own(init_from, init_ckpt, self.generator, self.discriminator)
            for line in lines:
                self.log(line)
        elif resume == "auto":
            self.log("no checkpoint to resume in this run folder: starting fresh")
        self.writer = RunLogger(tensorboard_dir(self.run_dir), enabled=info.is_main, purge_step=self.step,
                                trackers=cfg.logger, resume=self.trackers, project="vits")
        self.generator_ddp = wrap_ddp(self.generator, info)
        self.discriminator_ddp = wrap_ddp(self.discriminator, info)

    # ------------------------------------------------------------------ checkpoints
    def restore(self, path: Path) -> None:
        """Continue the run saved in `path` exactly (weights, optimizers, schedules, scaler, counters, RNG)."""
        ckpt = load_checkpoint(path)
        self.licence = ckpt.get("extra", {}).get("licence")
        counters = restore_state(ckpt, self.models, self.optimizers, self.schedulers, self.scaler, rank=self.info.rank, source=path)
        self.step, self.epoch = counters["step"], counters["epoch"]
        self.batch_in_epoch = counters["batch_in_epoch"]
        self.guard.load_state_dict(counters["guard"])
        self.divergence.load_state_dict(counters.get("divergence"))
        self.trackers = resumed_trackers(counters)
        self.last_good = path
        self.log(f"resumed from {path} at step {self.step} (epoch {self.epoch}, batch {self.batch_in_epoch})")
        changed = apply_optimizer_overrides(self.optimizers, self.schedulers, optimizer_overrides(self.cfg, optimizer_spec(self.cfg)))
        if changed:
            self.log(changed)

    def save(self, metric: float | None = None) -> Path | None:
        if saving_blocked(self.guard, self.divergence):
            self.log(f"step {self.step}: no checkpoint while steps are non-finite or diverging (last good: {self.last_good or 'none'})")
            return None
        counters = {"step": self.step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
                    "guard": self.guard.state_dict(), "divergence": self.divergence.state_dict(),
                    **self.writer.checkpoint_state()}
        state = make_state(self.models, self.optimizers, self.schedulers, self.scaler, counters=counters, config=config_to_dict(self.cfg),
                           extra={"speakers": self.speakers, **Frontend.of(self.cfg).to_checkpoint(),
                                  **({"licence": self.licence} if self.licence else {})}, trainer="vits")
        path = self.manager.save(state, self.step, metric) if self.info.is_main else None
        self.last_good = path or self.last_good
        barrier()
        return path

    # ------------------------------------------------------------------ one step
    def _generator_losses(self, out: dict, y_d_g, fmap_r, fmap_g, mel_y, mel_hat, y, y_hat) -> dict[str, torch.Tensor]:
        cfg = self.cfg
        losses = {
            "mel": F.l1_loss(mel_hat, mel_y) * cfg.c_mel,
            **({"stft": self.stft.distance(y_hat, y) * cfg.c_stft} if cfg.c_stft > 0 else {}),
            **({"energy": frame_energy_loss(mel_hat, mel_y) * cfg.c_energy} if cfg.c_energy > 0 else {}),
            "kl": kl_loss(out["z_p"], out["logs_q"], out["m_p"], out["logs_p"], out["y_mask"]) * cfg.c_kl,
            "dur": torch.sum(out["l_length"].float()),
            **({"fm": feature_loss(fmap_r, fmap_g), "gen": generator_loss(y_d_g)} if y_d_g is not None else {}),
        }
        losses["total"] = sum(losses.values())
        return losses

    def train_step(self, batch: dict) -> dict[str, torch.Tensor]:
        dev, hop, seg = self.device, self.cfg.audio.hop_length, self.generator.segment_frames
        nb = self.device.type == "cuda"
        x, x_len = batch["ids"].to(dev, non_blocking=nb), batch["ids_len"].to(dev, non_blocking=nb)
        spec, spec_len = batch["spec"].to(dev, non_blocking=nb), batch["spec_len"].to(dev, non_blocking=nb)
        wav, sid = batch["wav"].to(dev, non_blocking=nb), batch["sid"].to(dev, non_blocking=nb)

        prior_w = 0.0
        if self.cfg.mas_prior_steps > 0:
            prior_w = self.cfg.mas_prior_weight * max(0.0, 1.0 - self.step / self.cfg.mas_prior_steps)
        with self.precision.autocast():
            out = self.generator_ddp(x, x_len, spec, spec_len, sid, mas_prior_weight=prior_w)
        with self.precision.no_autocast():
            if wav.size(1) < seg * hop:
                wav = F.pad(wav, (0, seg * hop - wav.size(1)))
            y = slice_segments(wav.unsqueeze(1), out["starts"] * hop, seg * hop)
            y_hat = out["wav"].float()
            mel_y, mel_hat = self.mel(y.squeeze(1)), self.mel(y_hat.squeeze(1))

        # discriminator: none during the generator-only warm-up (discriminator_train_start_steps)
        adversarial = self.step >= self.cfg.discriminator_train_start_steps
        loss_d, gn_d, ok_d = torch.zeros((), device=dev), torch.zeros((), device=dev), True
        if adversarial:
            self.d_opt.zero_grad(set_to_none=True)
            with self.precision.autocast():
                y_d_r, y_d_g, _, _ = self.discriminator_ddp(y, y_hat.detach())
            with self.precision.no_autocast():
                loss_d = discriminator_loss(y_d_r, y_d_g)
            gn_d, ok_d = step_optimizer(loss_d, self.d_opt, self.discriminator.parameters(), self.scaler, self.cfg.clip_grad_norm)

        # generator (through the unwrapped, frozen D: its gradients are not needed)
        self.g_opt.zero_grad(set_to_none=True)
        y_d_g = fmap_r = fmap_g = None
        if adversarial:
            with frozen(self.discriminator), self.precision.autocast():
                (_, fmap_r), (y_d_g, fmap_g) = critic_outputs_for_generator(self.discriminator.score, y, y_hat)
        with self.precision.no_autocast():
            losses = self._generator_losses(out, y_d_g, fmap_r, fmap_g, mel_y, mel_hat, y, y_hat)
        self.divergence.observe(losses["mel"])  # the weights that made this loss, before G's update
        gn_g, ok_g = step_optimizer(losses["total"], self.g_opt, self.generator.parameters(), self.scaler,
                                    self.cfg.clip_grad_norm)
        self.clip_stats.update("g", gn_g)
        if adversarial:
            self.clip_stats.update("d", gn_d)
        # the gradient norms (all-reduced under DDP: equal on every rank), as the other trainers: a non-finite
        # loss makes its gradients non-finite, while a rank's own loss could tell the ranks apart
        finite = ok_d and ok_g
        # before update(): an fp16 loss-scale back-off is counted but is not divergence
        self.guard.check_step(finite, self.scaler)  # raises NonFiniteError after max_nonfinite_steps in a row
        self.scaler.update()
        self.g_sched.step()
        if adversarial:  # D's schedule starts with D (as ParallelWaveGAN's)
            self.d_sched.step()
        out_metrics = {f"loss_{k}": v.detach() for k, v in losses.items()}
        # a frame budget makes batches vary: the bar counts what each step held (common.loop)
        out_metrics.update(grad_norm_g=gn_g, samples=x.size(0) * self.info.world_size)
        if adversarial:
            out_metrics.update(loss_disc=loss_d.detach(), grad_norm_d=gn_d)
        self.last_attn = out["attn"][0].detach()
        return out_metrics

    # ------------------------------------------------------------------ evaluation
    def validate(self) -> dict | None:
        """Held-out metrics (best.pt's score) and the test sentences, on rank 0, eager: eval lengths
        vary, so compiling them would recompile."""
        if not (self.info.is_main and self.cfg.run_eval and len(self.eval_set)):
            return None
        cfg = self.cfg
        with torch.compiler.set_stance("force_eager"):
            metrics = evaluate(self.generator, self.eval_set, build_mel(cfg), self.device, cfg.eval_max_items,
                               noise_scale=cfg.noise_scale, seed=cfg.seed, batch_size=cfg.eval_batch_size,
                               num_workers=cfg.num_eval_loader_workers, speaker_encoder=self._speaker_encoder)
            record_metrics(metrics, self.step, self.writer, self.run_dir, self.log)
            speak_test_sentences(self.generator, cfg, self.speakers, self.train_set.tokens, self.mel, self.writer,
                                 self.run_dir, self.step)
        self.last_metrics = metrics
        return metrics

    @functools.cached_property
    def _speaker_encoder(self):
        """`speaker_encoder`'s network for speaker_sim, loaded at the first evaluation (None: off, said once)."""
        return load_speaker_encoder(self.cfg.speaker_encoder, self.device, say=self.log) if self.cfg.speaker_encoder else None

    def _log_step(self, metrics: dict[str, torch.Tensor], progress: Progress) -> dict:
        """Every ``print_step`` steps (rank 0): TensorBoard ``train/`` scalars (with the clipped fraction since
        the last line) and the alignment, and one progress line."""
        if not self.info.is_main:
            return {}
        lr = self.g_opt.param_groups[0]["lr"]
        metrics.update(self.clip_stats.pop())  # fraction of clipped steps since the last line
        self.writer.scalars({**metrics, "lr": lr, "data_wait": progress.data_wait_fraction,
                             "skipped_steps": self.guard.skipped_total}, self.step, prefix="train")
        self.writer.figure("train/alignment", plot_alignment(self.last_attn.cpu()), self.step)
        line = " ".join(f"{k.replace('loss_', '')}={float(v):.3f}" for k, v in metrics.items())
        self.log(f"step {self.step} epoch {self.epoch}: {line} lr={lr:.2e}")
        return {}

    # ------------------------------------------------------------------ the loop
    def fit(self) -> dict:
        """The loop; returns {"step", "stopped" (None when the plan ran out), "metrics" (the latest held-out)}."""
        cfg, by_epochs = self.cfg, self.cfg.epochs * self.steps_per_epoch
        total = min(by_epochs, cfg.max_steps) if cfg.max_steps else by_epochs
        if self.info.is_main:
            save_config(cfg, self.run_dir)
            self.log(format_config(cfg))
            d_start, lr_d = cfg.discriminator_train_start_steps, lr_curve(self.d_sched)
            curves = {"lr_g": lr_curve(self.g_sched),
                      "lr_d": lambda t: lr_d(t - d_start) if t >= d_start else 0.0}  # D's schedule starts with D
            report_lr_plan(curves, total, "lr_gamma / lr_scheduler_per (or lr, epochs, max_steps)", self.run_dir,
                           self.writer, self.log)
        if cfg.eval_at_start and self.step == 0:
            self.validate()
        progress = Progress(total, initial=self.step, samples_per_step=self.batch_size * self.info.world_size,
                            enabled=self.info.is_main and cfg.progress_bar)
        self.log.bar = progress
        self.generator_ddp.train(), self.discriminator_ddp.train()
        stop = RunStop(cfg.max_minutes, last_good=lambda: self.last_good, lr_hint="--set lr=<lower>", oom=(
            "VITS training", cfg.batch_size, {
                "accum_key": None, "precision": cfg.precision, "crop_key": "model_args.segment_frames",
                "crop": cfg.args().segment_frames, "resume": "--resume auto"}))
        cadence = Cadence(total, cfg.print_step, cfg.val_check_interval or 0, cfg.save_step,
                          validate_from_epoch=cfg.test_delay_epochs, validate_at_end=cfg.run_eval)
        try:
            reason = loop.run(self, cadence, stop, progress, epoch_batches=self._epoch_batches,
                              optimizers=self.optimizers, guards=self.guards, divergence=self.divergence,
                              log=self._log_step, metric=lambda m: best_value(m, cfg.best_by))
        finally:
            self.log.bar = None
            progress.close()
            self.writer.close()
        self.log(stop.message(self.step, str(self.manager.dir)) if reason
                 else f"done at step {self.step}; checkpoints in {self.manager.dir}")
        return {"step": self.step, "stopped": reason, "metrics": self.last_metrics}

    def _epoch_batches(self) -> DataLoader:
        """The current epoch's batches from the run's position (the sampler skips what was trained)."""
        self.sampler.set_epoch(self.epoch)
        self.sampler.skip_batches(self.batch_in_epoch)
        return self.loader


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return exit_codes.run_main(lambda: run(args), (ConfigError, DataError, CheckpointError), cleanup)


def run(args: argparse.Namespace) -> int:
    """The run the command line asks for; failures reach `main` as exceptions (`common.exit_codes`)."""
    cfg, source, own = resolve_run(args)  # --init_from is read and checked before the run folder changes
    trainer = VitsTrainer(cfg, setup_distributed(args.device), resume=args.resume, init_from=args.init_from,
                          source=source, init_ckpt=own)
    return exit_code(trainer.fit()["stopped"])


if __name__ == "__main__":
    sys.exit(main())
