"""Train an SD/FLUX-style KL autoencoder (the RTX 5090 VAE guide's commands work as written).

    python vae/train_vae.py --data_path data/vae --output_dir runs/vae --image_size 1024 \
        --batch_size 4 --num_epochs 100 --learning_rate 1e-4 --z_channels 16 --kl_weight 1e-6 \
        --perceptual_weight 1.0 --mixed_precision --use_bf16 --enable_tf32 --channels_last
    python vae/train_vae.py --config vae/configs/standard_1024.yaml --data_path data/vae
    torchrun --nproc_per_node 2 vae/train_vae.py --config ...          # DDP
    python vae/train_vae.py --config ... --resume_from runs/vae/checkpoint_epoch_10.pt --image_size 2048

Flags override the config (`--config` YAML, or the guide's JSON); `--set key=value` overrides any key.
Resuming at another `--image_size` starts a new resolution stage (vae/README.md, "Multi-resolution stages").

The loop: accumulate `accumulation_steps` micro-batches -> VAE update (reconstruction + LPIPS + KL
[+ adaptive GAN term]) -> PatchGAN update (after `disc_start`) -> EMA -> log every `log_freq` steps,
samples every `save_samples_freq`, validation every `val_check_interval`, `checkpoint_epoch_N.pt` every
`checkpoint_freq` epochs -> at the end `checkpoint_last.pt`, `vae_final.pt` and the diffusers folder.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

from common import distributed, exit_codes, loop
from common.atomic_write import append_text, save_png
from common.best_by import BestCheckpoints, best_value
from common.checkpoint import BEST_DIR, RunCheckpoints, load_checkpoint, resolve_resume
from common.config import ConfigError, print_config_if_asked
from common.distributed import DistInfo
from common.guards import saving_blocked
from common.log import Printer, Progress, RunLogger, peak_memory_gib, resumed_trackers
from common.loop import Cadence, RunResult
from common.model_card import DATA_SOURCE, read_data_source
from common.presets import apply_preset
from common.run_dir import prepare_run_dir, tensorboard_dir
from common.stopping import TIME_LIMIT, RunStop, exit_code
from common.training import count_parameters
from vae import decoder_only, validation
from vae.config import VAEConfig
from vae.data import PreparedWatch, TrainData, build_train_data, training_images
from vae.diffusers_io import export_final
from vae.flags import build_parser, resolve_config
from vae.losses import FrozenLPIPS
from vae.memory import choose_batch_size, profile_grid, profile_memory
from vae.metrics import evaluate
from vae.presets import CARD_PRESETS
from vae.pretrained import forget_stale_record, init_weights
from vae.rfid import load_inception
from vae.startup import LastCheckpoint, build_lr_schedules, report_plan, start_stage  # noqa: F401 (tests import it)
from vae.step import VAEStep, new_step  # noqa: F401 (re-exported: tests and benches import new_step from here)


# ----------------------------------------------------------------------------- the trainer
class VAETrainer:
    """A run around the model and its step (`vae.step.VAEStep`: what `--batch_size auto`, `--profile_memory`
    and the benches build alone): its data, run folder, counters, checkpoints, validation and `fit`."""

    def __init__(self, cfg: VAEConfig, device: torch.device, info: DistInfo, data: TrainData, out_dir: Path,
                 perceptual: FrozenLPIPS | None = None, init_from: str | None = None) -> None:
        self.cfg, self.device, self.info, self.data, self.out_dir = cfg, device, info, data, out_dir
        main = info.is_main
        self.printer = Printer(main)
        self.core = VAEStep(cfg, device, info, data.total_steps, perceptual)  # the models, optimizers, loss, step
        core = self.core
        self.precision, self.guards, self.divergence = core.precision, core.guards, core.divergence
        self.models, self.optimizers, self.schedulers = core.models, core.optimizers, core.schedulers  # by name
        # The run's position: step of this resolution stage, epoch, micro-batches into it, stage.
        self.step = self.epoch = self.batch_in_epoch = self.steps_before_stage = 0
        self.stage, self.stages = 1, [{"stage": 1, "image_size": cfg.image_size, "first_step": 0, "first_epoch": 0}]
        self.best_psnr: float | None = None
        self.data_source = read_data_source(cfg.data_path)  # of the prepared images (common.model_card)
        self.trackers: dict = {}  # the W&B / MLflow run ids a resumed checkpoint holds
        self.last_best: float | None = None  # the latest validation's best_by metric (ranks the epoch checkpoints)
        self.last_val: tuple[int, dict] = (-1, {})  # (global step, metrics) of the latest validation
        self.printer(f"VAE {count_parameters(core.vae) / 1e6:.1f} M parameters"
                     + (f", discriminator {count_parameters(core.disc) / 1e6:.1f} M" if core.disc else "")
                     + f"; LPIPS: {core.perceptual.source if core.perceptual else 'off (perceptual_weight 0)'}")
        for line in self.precision.report():
            self.printer(f"  {line}")
        # ---- per-rank noise (the models are seeded alike on every rank by `train`), then where the run starts
        torch.manual_seed(cfg.seed + info.rank)
        self.epochs = BestCheckpoints(out_dir, cfg.best_by, "psnr", self.printer, keep_last=cfg.save_n_checkpoints,
                                      name_fn=lambda n: f"checkpoint_epoch_{n}.pt",
                                      best_dir=out_dir / BEST_DIR)  # best.pt where every trainer puts it
        self.checkpoints = RunCheckpoints(self, LastCheckpoint(out_dir, self.epochs, self.printer), "vae",
                                          ema=lambda: {"vae": core.ema} if core.ema else None,
                                          optimizer_spec=cfg.optimizer_spec("disc" in self.optimizers),
                                          counters=self._counters)
        resume = resolve_resume(cfg.resume_from, out_dir, self.epochs, extra_names=("checkpoint_last.pt",))
        if resume is not None:
            self._resume(resume)
        else:  # a new run
            forget_stale_record(out_dir, main)
            if init_from:  # weights only: a diffusers folder, or a checkpoint (see vae/pretrained.py)
                for line in init_weights(self.models, cfg, init_from, out_dir, main):
                    self.printer(line)
                core.reset_ema()  # the one made with the models holds the random initial weights
        if cfg.train_decoder_only:
            distributed.barrier()  # the main rank has written the init's factors
            for line in decoder_only.startup_lines(core.vae, decoder_only.init_factors(out_dir)):
                self.printer(line)
        self.writer = RunLogger(tensorboard_dir(out_dir), enabled=main, purge_step=self.global_step,
                                trackers=cfg.logger, resume=self.trackers, project="vae")
        self.eval_batch = validation.eval_batch_size(cfg)
        self.val_batches = validation.validation_batches(cfg, data, main)
        self.sample_x = validation.sample_images(cfg, data)
        if main and cfg.best_by == "rfid":  # best.pt ranks by it: an unusable weights file stops the run now, not later
            _ = self._rfid_net

    def train_step(self, micro_batches: list[torch.Tensor], global_step: int | None = None) -> dict:
        """One optimizer step (`VAEStep.train_step`) at the run's own `global_step` unless one is named."""
        return self.core.train_step(micro_batches, self.global_step if global_step is None else global_step)

    @property
    def global_step(self) -> int:
        """Steps over all resolution stages (what `disc_start`, the logs and the samples count)."""
        return self.steps_before_stage + self.step

    def _counters(self) -> dict:
        return {"stage": self.stage, "steps_before_stage": self.steps_before_stage, "global_step": self.global_step,
                "image_size": self.cfg.image_size, "samples_per_step": self.data.samples_per_step,
                "num_train": len(self.data.train_files)}

    def state(self) -> dict:
        return {"arch": self.core.vae.arch(), "best_psnr": self.best_psnr, "stages": self.stages,
                **({DATA_SOURCE: self.data_source} if self.data_source else {})}

    def load_state(self, ckpt: dict) -> None:
        """The stage and its history; a changed batch size, GPU count or dataset restarts the data order at
        the beginning of the epoch (everything else continues exactly)."""
        c, extra = ckpt.get("counters", {}), ckpt.get("extra", {})
        self.best_psnr = extra.get("best_psnr")
        self.data_source = self.data_source or extra.get(DATA_SOURCE)
        self.stages = list(extra.get("stages", self.stages))
        self.stage, self.steps_before_stage = int(c.get("stage", 1)), int(c.get("steps_before_stage", 0))
        if (c.get("samples_per_step"), c.get("num_train")) != (self.data.samples_per_step, len(self.data.train_files)):
            self.printer("resume: batch size, GPU count or dataset changed since that checkpoint; the data order "
                         f"restarts at the beginning of epoch {self.epoch}")
            self.batch_in_epoch = 0

    def _resume(self, path: Path) -> None:
        """Continue the run in `path`: exactly at the same `image_size` (`RunCheckpoints.resume`), else a new
        resolution stage (weights and EMA carry over, optimizer and LR plan afresh: `vae.startup.start_stage`)."""
        cfg, info = self.cfg, self.info
        ckpt = load_checkpoint(path, map_location="cpu")  # a checkpoint that does not fit -> exit 2
        decoder_only.check_resume(ckpt, path, cfg)
        if ckpt.get("counters", {}).get("image_size") == cfg.image_size:
            self.checkpoints.resume(path, ckpt)
            return
        c, self.stages = start_stage(ckpt, path, self.models, self.core.ema, cfg, self.out_dir, self.data.total_steps,
                                     info.rank, info.is_main)
        self.epochs.forget_best()  # stage K's best.pt / best.json are kept aside under stage names
        self.step, self.epoch, self.batch_in_epoch = int(c["step"]), int(c["epoch"]), int(c["micro_in_epoch"])
        self.stage, self.steps_before_stage = int(c["stage"]), int(c["steps_before_stage"])
        self.trackers = resumed_trackers(ckpt.get("counters"))  # a new resolution stage continues them too
        self.checkpoints.last_good = path

    @functools.cached_property
    def _rfid_net(self):
        """rFID's Inception, loaded at the first validation (at start with best_by rfid, where an unusable file is
        an error, exit 2); None: rFID off (said in one line)."""
        return load_inception(self.cfg.rfid_weights, self.device, say=self.printer, required=self.cfg.best_by == "rfid")

    def validate(self) -> dict:
        """Held-out metrics of the EMA weights (rank 0, once per step) to TensorBoard and `metrics.jsonl`."""
        if not (self.info.is_main and self.val_batches):
            return {}
        if self.last_val[0] == self.global_step:
            return self.last_val[1]  # already measured at this step
        m = evaluate(self.core.eval_model, self.val_batches, self.device, self.precision.autocast, self.core.perceptual,
                     fid=self._rfid_net)
        if m:
            self.writer.scalars(m, self.global_step, "val")
            self.last_best = best_value(m, self.cfg.best_by)
            self.best_psnr = m["psnr"] if self.best_psnr is None else max(self.best_psnr, m["psnr"])
            append_text(self.out_dir / "metrics.jsonl",
                        json.dumps({"step": self.global_step, "image_size": self.cfg.image_size, **m}) + "\n")
        self.last_val = (self.global_step, m)
        self.printer(f"step {self.global_step}: {validation.describe(m)}")
        return m

    def _save_samples(self) -> None:
        """Inputs over their reconstructions, as `samples/step_N.png` and in TensorBoard."""
        grid = validation.sample_grid(self.core.eval_model, self.sample_x, self.eval_batch, self.precision, self.device)
        save_png(grid, self.out_dir / "samples" / f"step_{self.global_step:07d}.png")
        self.writer.image("samples/reconstruction (top: input)", grid, self.global_step)

    def fit(self) -> RunResult:
        """Say the plan, run the epochs (`common.loop.fit`); a finished (or time-boxed) run is exported. A
        non-finite stop raises `NonFiniteError` naming the last good checkpoint (`main` prints it)."""
        cfg, data, main = self.cfg, self.data, self.info.is_main
        if main:
            report_plan(cfg, data, self.schedulers, self.core.loss, self.out_dir, self.writer, self.steps_before_stage,
                        self.step, self.info.world_size, str(self.device))
            (self.out_dir / "samples").mkdir(exist_ok=True)
            self.writer.scalar("train/image_size", cfg.image_size, self.global_step)  # this stage's resolution
            if self.step == 0 and self.val_batches:
                self.validate()
                self._save_samples()
        # stop_at_step counts the steps of every resolution stage (the global step), as the user sees them
        keys = argparse.Namespace(max_minutes=cfg.max_minutes, stop_at_step=max(0, cfg.stop_at_step - self.steps_before_stage)
                                  if cfg.stop_at_step else 0)
        stop = RunStop.of(keys, cfg, "the VAE training step", lr_hint="--learning_rate <lower>",
                          last_good=lambda: self.checkpoints.last_good, resume_hint="--resume_from auto")
        # validation needs held-out files (every rank knows whether there are; rank 0 alone measures)
        cadence = Cadence.of(cfg, data.total_steps, validate_every=cfg.validate_every if data.val_files else 0,
                             validate_at_end=bool(data.val_files), steps_per_epoch=data.steps_per_epoch,
                             batches_per_step=cfg.accumulation_steps)
        result = loop.fit(self, cadence, stop, self.checkpoints, best_by=cfg.best_by,
                          samples_per_step=data.samples_per_step, after_step=self._samples_on_cadence,
                          epoch_end=self._epoch_checkpoint, run_end=self._export)
        if main:
            result.save(self.out_dir / "summary.json")
        return result

    def batches(self) -> Iterator[list[torch.Tensor]]:
        """The current epoch's optimizer steps from the run's position, each a list of `accumulation_steps`
        micro-batches collected before the step (as this trainer always did: its crops draw no global RNG)."""
        cfg, data = self.cfg, self.data
        data.sampler.set_epoch(self.epoch)
        data.sampler.skip_samples(self.batch_in_epoch * int(cfg.batch_size))
        micro: list[torch.Tensor] = []
        for x in data.loader:
            micro.append(x)
            if len(micro) == cfg.accumulation_steps:
                self._check_data()
                yield micro
                micro = []

    def _check_data(self) -> None:
        """Before each step: a prepared data folder prepared again (another size) or moved aside since the run
        listed it stops the run with one line (exit 2), on every rank at the same step (`PreparedWatch`)."""
        changed = self.data.watch.changed() if self.data.watch is not None else None
        if distributed.any_rank(changed is not None):
            raise ConfigError(changed or "a data folder changed while this run trained on it (another rank saw it)")

    def _samples_on_cadence(self) -> None:
        """Hook (the VAE alone shows reconstructions): sample images every `save_samples_freq` steps, rank 0."""
        freq = self.cfg.save_samples_freq
        if self.info.is_main and freq and self.step % freq == 0:
            self._save_samples()

    def _epoch_checkpoint(self, epochs_done: int) -> None:
        """Hook: the rotated `checkpoint_epoch_N.pt` every `checkpoint_freq` epochs, ranked by the latest `best_by`."""
        if epochs_done % self.cfg.checkpoint_freq or saving_blocked(*self.guards.values(), self.divergence):
            return
        s = self.checkpoints.state()
        if self.info.is_main:
            self.checkpoints.last_good = self.epochs.save(s, epochs_done, metric=self.last_best)
            self.printer(f"saved {self.checkpoints.last_good}")
        distributed.barrier()

    def log(self, logs: dict, progress: Progress) -> dict[str, float]:
        """The step's losses and health to TensorBoard (rank 0); returns the values the progress bar shows."""
        logs.pop("stepped")
        if not self.info.is_main:
            return {}
        logs["memory_gib"] = peak_memory_gib(self.device)
        self.writer.scalars(logs, self.global_step, "train")  # one host sync for all the tensors
        return {"loss": float(logs["total"]), "rec": float(logs[f"rec_{self.cfg.rec_loss}"])}

    def _export(self, reason: str | None) -> None:
        """Hook at the run's end: the final samples, and the export of a finished (or time-boxed) run."""
        if self.info.is_main:
            m = self.last_val[1] if self.last_val[0] == self.global_step else {}
            self._save_samples()
            if reason in (None, TIME_LIMIT) and self.checkpoints.last_good is not None:
                export_final(self.cfg, self.core.eval_model, self.precision, self.data.train_files, self.out_dir,
                             self.writer, self.global_step, m, self.eval_batch, ema=self.core.ema is not None,
                             data=self.data_source, best_psnr=self.best_psnr)
        distributed.barrier()


# ----------------------------------------------------------------------------- CLI


def train(cfg: VAEConfig, overwrite: bool = False, init_from: str | None = None, run_flag: str = "--output_dir") -> int:
    """A training run in `cfg.output_dir`; `run_flag` is how the user named that folder (for messages)."""
    out_dir = Path(cfg.output_dir)
    decoder_only.check_start(cfg, init_from)  # before the run folder is made or touched
    prepare_run_dir(out_dir, None, cfg.resume_from, overwrite, init_from, run_flag=run_flag,
                    inputs={"--data_path": cfg.data_path, "--val_data_path": cfg.val_data_path or None})
    info = distributed.setup_distributed(cfg.device or None)
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank (DDP also broadcasts them)
    watch = PreparedWatch.of(cfg)  # the prepared folders' settings as their files are listed
    train_files, val_files = training_images(cfg, log=print if info.is_main else lambda line: None)
    perceptual = FrozenLPIPS(cfg.perceptual_net, cfg.perceptual_weights or None) if cfg.perceptual_weight > 0 else None
    choose_batch_size(new_step, cfg, info.device, perceptual, info.is_main)
    data = build_train_data(cfg, info.world_size, train_files, val_files, watch)
    try:
        trainer = VAETrainer(cfg, info.device, info, perceptual=perceptual, data=data, out_dir=out_dir,
                             init_from=init_from)
        return exit_code(trainer.fit().stopped)
    finally:
        distributed.cleanup()


def main(argv: list[str] | None = None) -> int:
    args = build_parser(__doc__).parse_args(argv)
    return exit_codes.run_main(lambda: run(args))  # a common.errors.UserError: one line, exit 2; a bug: traceback


def run(args: argparse.Namespace) -> int:
    """The config, then `--profile_memory` or training; failures reach `main` as exceptions."""
    cfg = resolve_config(args)
    apply_preset(cfg, args.preset, CARD_PRESETS)
    print_config_if_asked(args, cfg)
    resolutions, batches = profile_grid(args)
    if args.profile_memory:
        return profile_memory(new_step, cfg, resolutions, batches)
    return train(cfg, args.overwrite, args.init_from, args.run_flag)


if __name__ == "__main__":
    sys.exit(main())
