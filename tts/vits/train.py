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
from common.audio import MelSpectrogram
from common.checkpoint import (
    CheckpointError,
    CheckpointManager,
    load_checkpoint,
    load_matching,
    make_state,
    refuse_other_kind,
    resolve_resume,
    restore_state,
)
from common.config import (
    ConfigError,
    add_config_args,
    config_to_dict,
    format_config,
    load_config,
    note_prepare_keys,
    save_config,
)
from common.data import BucketBatchSampler, BucketShapes, make_loader
from common.distributed import DistInfo, barrier, cleanup, setup_distributed, wrap_ddp
from common.log import Printer, Progress, RunLogger, plot_alignment, report_lr_plan
from common.loop import Cadence
from common.muon import build_optimizer
from common.precision import Precision, compile_unavailable
from common.presets import add_preset_arg, apply_preset
from common.run_dir import add_run_args, prepare_run_dir, tensorboard_dir
from common.schedulers import build_scheduler, lr_curve
from common.stopping import RunStop, exit_code
from common.training import (
    ClipStats,
    DivergenceGuard,
    NonFiniteGuard,
    apply_optimizer_overrides,
    count_parameters,
    critic_outputs_for_generator,
    frozen,
    optimizer_overrides,
    saving_blocked,
    step_optimizer,
)
from tts.text.phonemes import Frontend
from tts.vits.config import DataConfig, TrainConfig
from tts.vits.data import DataError, VitsDataset, collate, read_speakers
from tts.vits.discriminator import MultiPeriodDiscriminator
from tts.vits.evaluation import evaluate, record_metrics, speak_test_sentences
from tts.vits.losses import discriminator_loss, feature_loss, generator_loss, kl_loss
from tts.vits.model import VITS, apply_layout_and_compile, slice_segments
from tts.vits.presets import CARD_PRESETS
from tts.vits.published.source import SourceError
from tts.vits.published.start import (
    SourceStart,
    adopt_source_shape,
    check_data_fits,
    load_start,
    open_source,
    plan_start,
)
from vocoder.losses import MultiResolutionSTFTLoss, frame_energy_loss


def build_models(cfg: TrainConfig, n_speakers: int) -> tuple[VITS, MultiPeriodDiscriminator]:
    args = cfg.args()
    gen = VITS(len(Frontend.of(cfg).symbols), cfg.audio.n_fft // 2 + 1, n_speakers, args, cfg.audio.hop_length)
    disc = MultiPeriodDiscriminator(args.mpd_periods, args.disc_channel_scale, args.use_spectral_norm)
    return gen, disc


def build_mel(cfg: TrainConfig) -> MelSpectrogram:
    return MelSpectrogram(**cfg.audio.mel_kwargs)


def schedule_kwargs(cfg: TrainConfig, steps_per_epoch: int) -> dict:
    """The exponential schedule of G and D: lr * lr_gamma ** k, k = finished epochs (the
    references) or optimizer steps. `steps_per_epoch` is this rank's number of optimizer steps
    per epoch (the batch sampler shards batches by rank; VITS does not accumulate gradients)."""
    return {"gamma": cfg.lr_gamma, "per": cfg.lr_scheduler_per, "steps_per_epoch": steps_per_epoch}


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
        torch.manual_seed(cfg.seed + info.rank)

        # data
        self.speakers = read_speakers(cfg.data_dir)
        if cfg.test_speaker is not None and cfg.test_speaker not in self.speakers:  # not a silent speaker 0
            raise ConfigError(f"test_speaker '{cfg.test_speaker}' is not a speaker of {cfg.data_dir}: choose from "
                              f"{', '.join(self.speakers)}")
        self.train_set = VitsDataset(cfg.data_dir, "train", cfg.audio, cfg.data.add_blank, Frontend.of(cfg))
        self.eval_set = VitsDataset(cfg.data_dir, "eval", cfg.audio, cfg.data.add_blank, Frontend.of(cfg))
        if len(self.train_set) == 0:
            raise DataError(f"{cfg.data_dir}/train.jsonl is empty")
        batch = min(cfg.batch_size, len(self.train_set) // info.world_size)
        if batch < cfg.batch_size:
            self.log(f"note: batch_size {cfg.batch_size} > training items per rank; using {batch}")
        self.batch_size = max(1, batch)
        buckets = max(1, min(cfg.data.num_buckets, len(self.train_set) // (self.batch_size * info.world_size)))
        self.sampler = BucketBatchSampler(self.train_set.lengths, self.batch_size, buckets,
                                          shuffle=True, seed=cfg.seed, drop_last=True)
        # with cudnn.benchmark (CUDA) or torch.compile, every batch is padded to its length bucket's fixed
        # (text, frames) size: each shape is autotuned / compiled once, not once per batch
        benchmark = cfg.cudnn_benchmark and self.device.type == "cuda" and not cfg.deterministic  # as Precision
        self.shapes = (BucketShapes(self.train_set.lengths, self.train_set.token_lengths(), self.sampler.boundaries)
                       if cfg.compile or benchmark else None)
        if self.shapes is not None:
            self.log(f"batches padded to {len(self.shapes.shapes())} bucket shapes (text, frames): {self.shapes.shapes()}")
        self.loader = make_loader(self.train_set, batch_sampler=self.sampler, num_workers=cfg.num_workers,
                                  prefetch_factor=cfg.prefetch_factor, pin_memory=cfg.pin_memory,
                                  persistent_workers=cfg.persistent_workers, seed=cfg.seed,
                                  collate_fn=functools.partial(collate, shapes=self.shapes))
        self.steps_per_epoch = len(self.sampler)

        # models, optimizers, schedulers, precision
        self.generator, self.discriminator = build_models(cfg, len(self.speakers))
        self.generator.to(self.device)
        self.discriminator.to(self.device)
        self.mel = build_mel(cfg).to(self.device)
        # c_stft > 0: three Parallel WaveGAN resolutions (fft, hop, win): short, medium, long windows
        self.stft = (MultiResolutionSTFTLoss([512, 1024, 2048], [50, 120, 240], [240, 600, 1200]).to(self.device)
                     if cfg.c_stft > 0 else None)
        self.precision = Precision(cfg.precision, self.device, tf32=cfg.tf32,
                                   cudnn_benchmark=cfg.cudnn_benchmark, deterministic=cfg.deterministic)
        self.scaler = self.precision.scaler
        opt_kw = {"betas": tuple(cfg.betas), "eps": cfg.eps, "weight_decay": cfg.weight_decay}
        self.g_opt = build_optimizer(cfg.optimizer_cls, self.generator, lr=cfg.lr_gen or cfg.lr, **opt_kw)
        self.d_opt = build_optimizer(cfg.optimizer_cls, self.discriminator, lr=cfg.lr_disc or cfg.lr, **opt_kw)
        sched_kw = schedule_kwargs(cfg, self.steps_per_epoch)
        self.g_sched = build_scheduler(self.g_opt, "exponential", **sched_kw)
        self.d_sched = build_scheduler(self.d_opt, "exponential", **sched_kw)
        self.optimizers = {"generator": self.g_opt, "discriminator": self.d_opt}  # by network name
        self.guard = NonFiniteGuard(cfg.max_nonfinite_steps)
        # one guard judges the D and G updates together (a step is finite when both are): it covers both optimizers
        self.guards = {"generator": self.guard, "discriminator": self.guard}
        self.divergence = DivergenceGuard([*self.generator.parameters(), *self.discriminator.parameters()],
                                          cfg.max_nonfinite_steps)
        self.clip_stats = ClipStats(cfg.clip_grad_norm)
        self.manager = CheckpointManager(self.run_dir / "checkpoints", keep_last=cfg.save_n_checkpoints,
                                         save_best_after=cfg.save_best_after, mode="min", prefix="vits")
        self.step = self.epoch = self.batch_in_epoch = 0
        self.last_good: Path | None = None  # the newest checkpoint known to hold a good state
        self.last_metrics: dict | None = None  # the latest held-out metrics (fit's result)
        self.last_attn: torch.Tensor | None = None  # the latest step's first alignment, for the log

        n_gen, n_disc = count_parameters(self.generator), count_parameters(self.discriminator)
        self.log(f"parameters: generator {n_gen / 1e6:.2f} M, discriminator {n_disc / 1e6:.2f} M "
                 f"(total {(n_gen + n_disc) / 1e6:.2f} M), used at inference "
                 f"{self.generator.inference_parameters() / 1e6:.2f} M")
        self.log(f"data: {len(self.train_set)} train / {len(self.eval_set)} eval utterances, "
                 f"{len(self.speakers)} speaker(s), {self.steps_per_epoch} steps per epoch of batch {self.batch_size}")
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
            self._init_from(init_from, init_ckpt)
        elif resume == "auto":
            self.log("no checkpoint to resume in this run folder: starting fresh")
        self.writer = RunLogger(tensorboard_dir(self.run_dir), enabled=info.is_main, purge_step=self.step)
        self.generator_ddp = wrap_ddp(self.generator, info)
        self.discriminator_ddp = wrap_ddp(self.discriminator, info)

    # ------------------------------------------------------------------ checkpoints
    def _parts(self) -> tuple[dict, dict, dict]:
        """(models, optimizers, schedulers) by network name: the checkpoint's layout."""
        return ({"generator": self.generator, "discriminator": self.discriminator},
                {"generator": self.g_opt, "discriminator": self.d_opt},
                {"generator": self.g_sched, "discriminator": self.d_sched})

    def restore(self, path: Path) -> None:
        """Continue the run saved in `path` exactly (weights, optimizers, schedules, scaler, counters, RNG)."""
        ckpt = load_checkpoint(path)
        self.licence = ckpt.get("extra", {}).get("licence")
        counters = restore_state(ckpt, *self._parts(), self.scaler, rank=self.info.rank, source=path)
        self.step, self.epoch = counters["step"], counters["epoch"]
        self.batch_in_epoch = counters["batch_in_epoch"]
        self.guard.load_state_dict(counters["guard"])
        self.divergence.load_state_dict(counters.get("divergence"))
        self.last_good = path
        self.log(f"resumed from {path} at step {self.step} (epoch {self.epoch}, batch {self.batch_in_epoch})")
        changed = apply_optimizer_overrides(*self._parts()[1:], optimizer_overrides(self.cfg, self._optimizer_spec()))
        if changed:
            self.log(changed)

    def _init_from(self, init_from: str, ckpt: dict | None = None) -> None:
        """A new run from another checkpoint's weights (`--init_from`; `ckpt`: it, already read by
        `read_own_init`); mismatched layers are listed."""
        ckpt = read_own_init(init_from) if ckpt is None else ckpt
        self.licence = ckpt.get("extra", {}).get("licence")
        if self.licence:
            self.log(f"licence of the weights: {self.licence} (carried into the checkpoints and the export)")
        for name, model in (("generator", self.generator), ("discriminator", self.discriminator)):
            required = {"source": init_from, "ckpt": ckpt} if name == "generator" else {}  # critics: reported only
            self.log(f"{name} {load_matching(model, ckpt['models'][name], **required)}")

    def _optimizer_spec(self) -> dict:
        """Each optimizer's hyper-parameters and the config keys that set them (a resume that gives
        one explicitly replaces the checkpoint's value: `common.training.optimizer_overrides`)."""
        cfg = self.cfg
        shared = {"betas": (("betas",), tuple(cfg.betas)), "eps": (("eps",), cfg.eps),
                  "weight_decay": (("weight_decay",), cfg.weight_decay)}
        return {name: {"lr": ((own,) if getattr(cfg, own) else (own, "lr"), getattr(cfg, own) or cfg.lr), **shared}
                for name, own in (("generator", "lr_gen"), ("discriminator", "lr_disc"))}

    def save(self, metric: float | None = None) -> Path | None:
        if saving_blocked(self.guard, self.divergence):
            self.log(f"step {self.step}: no checkpoint while steps are non-finite or diverging (last good: {self.last_good or 'none'})")
            return None
        counters = {"step": self.step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
                    "guard": self.guard.state_dict(), "divergence": self.divergence.state_dict()}
        state = make_state(*self._parts(), self.scaler, counters=counters, config=config_to_dict(self.cfg),
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
        out_metrics.update(grad_norm_g=gn_g)
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
                               num_workers=cfg.num_eval_loader_workers)
            record_metrics(metrics, self.step, self.writer, self.run_dir, self.log)
            speak_test_sentences(self.generator, cfg, self.speakers, self.train_set.tokens, self.mel, self.writer,
                                 self.run_dir, self.step)
        self.last_metrics = metrics
        return metrics

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
        self.generator_ddp.train()
        self.discriminator_ddp.train()
        stop = RunStop(cfg.max_minutes, last_good=lambda: self.last_good, lr_hint="--set lr=<lower>", oom=(
            "VITS training", cfg.batch_size, {
                "accum_key": None, "precision": cfg.precision, "crop_key": "model_args.segment_frames",
                "crop": cfg.args().segment_frames, "resume": "--resume auto"}))
        cadence = Cadence(total_steps=total, log_every=cfg.print_step, validate_every=cfg.val_check_interval or 0,
                          save_every=cfg.save_step, validate_from_epoch=cfg.test_delay_epochs,
                          validate_at_end=cfg.run_eval)
        try:
            reason = loop.run(self, cadence, stop, progress, epoch_batches=self._epoch_batches,
                              optimizers=self.optimizers, guards=self.guards, divergence=self.divergence,
                              log=self._log_step, metric=lambda m: m["score"] if m else None)
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    add_preset_arg(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return exit_codes.run_main(lambda: run(args), (ConfigError, DataError, CheckpointError), cleanup)


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


def run(args: argparse.Namespace) -> int:
    """The run the command line asks for; failures reach `main` as exceptions (`common.exit_codes`)."""
    cfg = load_config(args.config, TrainConfig, args.overrides, extra={"data_dir": args.data_dir, "run_dir": args.run_dir})
    apply_preset(cfg, args.preset, CARD_PRESETS)
    note_prepare_keys(cfg, DataConfig.PREPARE_ONLY, "tts/prepare_data.py")
    source = plan_source_start(cfg, args)  # --init_from is read and checked before the run folder changes
    own = read_own_init(args.init_from) if args.init_from and source is None else None
    run_dir = Path(cfg.run_dir or f"runs/{cfg.run_name}")
    prepare_run_dir(run_dir, run_dir / "checkpoints", args.resume, args.overwrite, args.init_from)
    trainer = VitsTrainer(cfg, setup_distributed(args.device), resume=args.resume, init_from=args.init_from,
                          source=source, init_ckpt=own)
    return exit_code(trainer.fit()["stopped"])


if __name__ == "__main__":
    sys.exit(main())
