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
from common.best_by import BestCheckpoints
from common.checkpoint import RunCheckpoints, ranking_start, ranking_start_note, resolve_resume
from common.config import ConfigError, format_config, save_config
from common.distributed import DistInfo, cleanup, setup_distributed, wrap_ddp
from common.guards import DivergenceGuard, NonFiniteGuard
from common.log import Printer, Progress, RunLogger, report_lr_plan
from common.loop import Cadence, RunResult
from common.model_card import DATA_SOURCE, read_data_source
from common.muon import build_optimizer
from common.precision import Precision, compile_unavailable
from common.run_dir import tensorboard_dir
from common.schedulers import build_scheduler, lr_curve
from common.stopping import RunStop, exit_code
from common.training import ClipStats, critic_outputs_for_generator, frozen, step_optimizer, step_schedules
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
from tts.vits.evaluation import evaluate, record_metrics, speak_test_sentences
from tts.vits.losses import discriminator_loss, feature_loss, generator_loss, kl_loss
from tts.vits.model import apply_layout_and_compile, slice_segments
from tts.vits.published.start import SourceStart, load_start
from vocoder.losses import frame_energy_loss


class VitsTrainer:
    """Everything one run holds (data, G and D with their optimizers and schedules, checkpoints), built in the
    one build order (per-rank seed, models, channels_last + compile of its parts, DDP, optimizers);
    `train_step` is one D update then one G update, `fit` runs `common.loop.fit`."""

    def __init__(self, cfg: TrainConfig, info: DistInfo, resume: str | None = None, init_from: str | None = None,
                 source: SourceStart | None = None, init_ckpt: dict | None = None):
        self.cfg, self.info = cfg, info
        self.licence: str | None = None  # of the weights the run started from (published voices declare one)
        self.data_source = read_data_source(cfg.data_dir)  # of the prepared data (common.model_card)
        self.last_valid: dict = {}  # the latest held-out metrics and their step, for the exports' cards
        self.device = info.device
        if not cfg.data_dir:
            raise ConfigError("no data folder: pass --data_dir (a folder made by tts/prepare_data.py)")
        self.run_dir = Path(cfg.run_dir or f"runs/{cfg.run_name}")
        self.printer = Printer(info.is_main)
        torch.manual_seed(cfg.seed + info.rank)

        # data
        (self.speakers, self.train_set, self.eval_set, self.batch_size, self.sampler, self.shapes,
         self.loader) = build_data(cfg, self.device, info.world_size, self.printer)
        self.steps_per_epoch = len(self.sampler)

        # models, their layout and compiled parts, weights from elsewhere, DDP
        self.generator, self.discriminator = (m.to(self.device) for m in build_models(cfg, len(self.speakers)))
        self.models = {"generator": self.generator, "discriminator": self.discriminator}  # the checkpoint's names
        self.mel = build_mel(cfg).to(self.device)
        self.stft = build_stft_loss(cfg, self.device)
        self.precision = Precision(cfg.precision, self.device, tf32=cfg.tf32,
                                   cudnn_benchmark=cfg.cudnn_benchmark, deterministic=cfg.deterministic)
        for line in startup_lines(self.generator, self.discriminator, self.train_set, self.eval_set, self.speakers,
                                  self.steps_per_epoch, self.batch_size):
            self.printer(line)
        why_not = compile_unavailable(self.device) if cfg.compile else None  # it compiles parts, not the model
        notes = [f"not applied: torch.compile requested but {why_not}: training runs eager"] if why_not else []
        for line in (self.precision.report() + notes + apply_layout_and_compile(
                self.generator, self.discriminator, cfg.channels_last, cfg.compile and not why_not)):
            self.printer(line)
        note = ranking_start_note(cfg.save_best_after, cfg.discriminator_train_start_steps,
                                  "discriminator_train_start_steps")
        if note:
            self.printer(note)
        store = BestCheckpoints(self.run_dir / "checkpoints", cfg.best_by, "score", self.printer,
                                keep_last=cfg.save_n_checkpoints, prefix="vits",
                                save_best_after=ranking_start(cfg.save_best_after, cfg.discriminator_train_start_steps))
        path = resolve_resume(resume, store.dir, store)
        if path is None and source is not None:  # a published voice (Piper, MMS), planned by `plan_source_start`
            load_start(source, self.generator, self.discriminator)
            self.licence = source.voice.licence
            for line in source.lines:
                self.printer(line)
        elif path is None and init_from:
            self.licence, lines = init_from_own(init_from, init_ckpt, self.generator, self.discriminator)
            for line in lines:
                self.printer(line)
        elif path is None and resume == "auto":
            self.printer("no checkpoint to resume in this run folder: starting fresh")
        self.generator_ddp = wrap_ddp(self.generator, info)
        self.discriminator_ddp = wrap_ddp(self.discriminator, info)

        # optimizers, schedules, one guard each
        opt_kw = {"betas": tuple(cfg.betas), "eps": cfg.eps, "weight_decay": cfg.weight_decay,
                  "fused": cfg.optimizer_fused, "batched_ns": cfg.optimizer_batched_ns, "prefix": "optimizer_"}
        self.g_opt = build_optimizer(cfg.optimizer_cls, self.generator, lr=cfg.lr_gen or cfg.lr, **opt_kw)
        self.d_opt = build_optimizer(cfg.optimizer_cls, self.discriminator, lr=cfg.lr_disc or cfg.lr, **opt_kw)
        sched_kw = schedule_kwargs(cfg, self.steps_per_epoch)
        self.g_sched = build_scheduler(self.g_opt, "exponential", **sched_kw)
        self.d_sched = build_scheduler(self.d_opt, "exponential", **sched_kw)
        self.optimizers = {"generator": self.g_opt, "discriminator": self.d_opt}
        self.schedulers = {"generator": self.g_sched, "discriminator": self.d_sched}
        self.guards = {name: NonFiniteGuard(cfg.max_nonfinite_steps) for name in self.optimizers}
        self.divergence = DivergenceGuard([*self.generator.parameters(), *self.discriminator.parameters()],
                                          cfg.max_nonfinite_steps)
        self.clip_stats = ClipStats(cfg.clip_grad_norm)

        # position, then resume
        self.step = self.epoch = self.batch_in_epoch = 0
        self.trackers: dict = {}  # the W&B / MLflow run ids a resumed checkpoint holds
        self.last_attn: torch.Tensor | None = None  # the latest step's first alignment, for the log
        self.checkpoints = RunCheckpoints(self, store, "vits", optimizer_spec=optimizer_spec(cfg))
        if path is not None:
            self.checkpoints.resume(path)
        self.writer = RunLogger(tensorboard_dir(self.run_dir), enabled=info.is_main, purge_step=self.step,
                                trackers=cfg.logger, resume=self.trackers, project="vits")

    # ------------------------------------------------------------------ checkpoint: this trainer's part
    def state(self) -> dict:
        return {"speakers": self.speakers, **Frontend.of(self.cfg).to_checkpoint(),
                **({"licence": self.licence} if self.licence else {}),
                **({DATA_SOURCE: self.data_source} if self.data_source else {}),
                **({"valid": self.last_valid} if self.last_valid else {})}

    def load_state(self, ckpt: dict) -> None:
        extra = ckpt.get("extra", {})
        self.licence = extra.get("licence")
        self.data_source = self.data_source or extra.get(DATA_SOURCE)
        self.last_valid = extra.get("valid", {})

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
        loss_d, gn_d = torch.zeros((), device=dev), torch.zeros((), device=dev)
        if adversarial:
            self.d_opt.zero_grad(set_to_none=True)
            with self.precision.autocast():
                y_d_r, y_d_g, _, _ = self.discriminator_ddp(y, y_hat.detach())
            with self.precision.no_autocast():
                loss_d = discriminator_loss(y_d_r, y_d_g)
            gn_d, _ = step_optimizer(loss_d, self.d_opt, self.discriminator.parameters(), self.precision.scaler,
                                     self.cfg.clip_grad_norm, self.guards["discriminator"])

        # generator (through the unwrapped, frozen D: its gradients are not needed)
        self.g_opt.zero_grad(set_to_none=True)
        y_d_g = fmap_r = fmap_g = None
        if adversarial:
            with frozen(self.discriminator), self.precision.autocast():
                (_, fmap_r), (y_d_g, fmap_g) = critic_outputs_for_generator(self.discriminator.score, y, y_hat)
        with self.precision.no_autocast():
            losses = self._generator_losses(out, y_d_g, fmap_r, fmap_g, mel_y, mel_hat, y, y_hat)
        self.divergence.observe(losses["mel"])  # the weights that made this loss, before G's update
        gn_g, _ = step_optimizer(losses["total"], self.g_opt, self.generator.parameters(), self.precision.scaler,
                                 self.cfg.clip_grad_norm, self.guards["generator"])
        self.clip_stats.update("g", gn_g)
        if adversarial:
            self.clip_stats.update("d", gn_d)
        self.precision.scaler.update()
        step_schedules(self.g_sched, self.d_sched if adversarial else None)  # D's schedule starts with D (as ParallelWaveGAN's)
        out_metrics = {f"loss_{k}": v.detach() for k, v in losses.items()}
        # a frame budget makes batches vary: the bar counts what each step held (common.loop)
        out_metrics.update(grad_norm_g=gn_g, samples=x.size(0) * self.info.world_size)
        if adversarial:
            out_metrics.update(loss_disc=loss_d.detach(), grad_norm_d=gn_d)
        self.last_attn = out["attn"][0].detach()
        return out_metrics

    # ------------------------------------------------------------------ evaluation
    def validate(self) -> dict:
        """Held-out metrics (best.pt's score) and the test sentences, on rank 0, eager: eval lengths
        vary, so compiling them would recompile. {} where nothing is measured."""
        if not (self.info.is_main and self.cfg.run_eval and len(self.eval_set)):
            return {}
        cfg = self.cfg
        with torch.compiler.set_stance("force_eager"):
            metrics = evaluate(self.generator, self.eval_set, build_mel(cfg), self.device, cfg.eval_max_items,
                               noise_scale=cfg.noise_scale, seed=cfg.seed, batch_size=cfg.eval_batch_size,
                               num_workers=cfg.num_eval_loader_workers, speaker_encoder=self._speaker_encoder)
            record_metrics(metrics, self.step, self.writer, self.run_dir, self.printer)
            self.last_valid = {"step": self.step, **metrics}
            speak_test_sentences(self.generator, cfg, self.speakers, self.train_set.tokens, self.mel, self.writer,
                                 self.run_dir, self.step)
        return metrics

    @functools.cached_property
    def _speaker_encoder(self):
        """`speaker_encoder`'s network for speaker_sim, loaded at the first evaluation (None: off, said once)."""
        return load_speaker_encoder(self.cfg.speaker_encoder, self.device, say=self.printer) if self.cfg.speaker_encoder else None

    def log(self, metrics: dict, progress: Progress) -> dict:
        """Every ``log_every`` steps (rank 0): TensorBoard ``train/`` scalars (with the clipped fraction since
        the last line) and the alignment, and one progress line."""
        if not self.info.is_main:
            return {}
        metrics.update(self.clip_stats.pop())  # fraction of clipped steps since the last line
        self.writer.scalars(metrics, self.step, prefix="train")
        self.writer.figure("train/alignment", plot_alignment(self.last_attn.cpu()), self.step)
        own = (k for k in metrics if not k.startswith(("lr", "skipped_", "data_wait", "samples_per")))  # loop.health's
        line = " ".join(f"{k.replace('loss_', '')}={float(metrics[k]):.3f}" for k in own)
        self.printer(f"step {self.step} epoch {self.epoch}: {line} lr={metrics['lr_generator']:.2e}")
        return {}

    def batches(self) -> DataLoader:
        """The current epoch's batches from the run's position (the sampler skips what was trained)."""
        self.sampler.set_epoch(self.epoch)
        self.sampler.skip_batches(self.batch_in_epoch)
        return self.loader

    # ------------------------------------------------------------------ the loop
    def fit(self) -> RunResult:
        """The plan's report (and the untrained model's figures), then `common.loop.fit`."""
        cfg, by_epochs = self.cfg, self.cfg.epochs * self.steps_per_epoch
        total = min(by_epochs, cfg.max_steps) if cfg.max_steps else by_epochs
        if self.info.is_main:
            save_config(cfg, self.run_dir)
            self.printer(format_config(cfg))
            d_start, lr_d = cfg.discriminator_train_start_steps, lr_curve(self.d_sched)
            curves = {"lr_generator": lr_curve(self.g_sched),
                      "lr_discriminator": lambda t: lr_d(t - d_start) if t >= d_start else 0.0}  # D's starts with D
            report_lr_plan(curves, total, "lr_gamma / lr_scheduler_per (or lr, epochs, max_steps)", self.run_dir,
                           self.writer, self.printer)
        if cfg.eval_at_start and self.step == 0:
            self.validate()
        self.generator_ddp.train(), self.discriminator_ddp.train()
        stop = RunStop.of(cfg, cfg, "VITS training", last_good=lambda: self.checkpoints.last_good,
                          lr_hint="--set lr=<lower>")
        cadence = Cadence.of(cfg, total, validate_from_epoch=cfg.test_delay_epochs, validate_at_end=cfg.run_eval)
        result = loop.fit(self, cadence, stop, self.checkpoints, best_by=cfg.best_by,
                          samples_per_step=self.batch_size * self.info.world_size, show_progress=cfg.progress_bar,
                          desc="vits")
        if self.info.is_main:
            result.save(self.run_dir / "summary.json")
        return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return exit_codes.run_main(lambda: run(args), cleanup=cleanup)


def run(args: argparse.Namespace) -> int:
    """The run the command line asks for; failures reach `main` as exceptions (`common.exit_codes`)."""
    cfg, source, own = resolve_run(args)  # --init_from is read and checked before the run folder changes
    trainer = VitsTrainer(cfg, setup_distributed(args.device), resume=args.resume, init_from=args.init_from,
                          source=source, init_ckpt=own)
    return exit_code(trainer.fit().stopped)


if __name__ == "__main__":
    sys.exit(main())
