"""Train the voice-cloning TTS model (text + reference audio → mel + f0), with the fast-convergence options.

    python tts/train_main.py --train-data data/tts_prepared --checkpoint-dir runs/tts_clone \
        --model-size normal [--fast-convergence | --aggressive-lr] [--config tts/clone/configs/clone_base.yaml]

Defaults are the documented "after" values of tts/CLONE.md. Flags override the YAML (`--config`),
`--set key=value` overrides anything (the whole rule: `tts/clone/options.py`). Before training, one
block prints the effective configuration; any option the effective configuration would not use is
an error, never silently ignored. See tts/CLONE.md for the flag table and measured figures.

The loop: `grad_accum` bucketed micro-batches -> forward + losses (MAS alignment inside the model)
-> one optimizer step through `common.training.step_optimizer` (unscale, clip, skip a non-finite
step) -> log -> every `val_check_interval` steps: teacher-forced validation, the fixed sentences
in TensorBoard (`tts/clone/evaluation.py`), checkpoint (last `save_n_checkpoints` kept + best by
validation mel L1). Ctrl-C / SIGTERM saves and exits; `--resume auto` continues bit-exactly.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from pathlib import Path

import numpy as np
import torch

from common import exit_codes, loop
from common.best_by import BestCheckpoints, best_value
from common.checkpoint import (
    CheckpointError,
    load_checkpoint,
    load_matching,
    make_state,
    refuse_other_kind,
    resolve_resume,
    restore_state,
)
from common.config import ConfigError, config_to_dict, save_config
from common.distributed import all_reduce_mean, barrier, cleanup, no_sync, setup_distributed, wrap_ddp
from common.log import Printer, Progress, RunLogger, report_lr_plan, resumed_trackers
from common.loop import Cadence
from common.precision import Precision
from common.presets import apply_preset
from common.run_dir import prepare_run_dir, tensorboard_dir
from common.schedulers import lr_curve
from common.stopping import RunStop, exit_code
from common.training import (
    DivergenceGuard,
    NonFiniteError,
    NonFiniteGuard,
    apply_optimizer_overrides,
    backward,
    count_parameters,
    optimizer_overrides,
    saving_blocked,
    step_optimizer,
)
from speech.speaker_similarity import load_speaker_encoder
from tts.clone.build import build_clone_optimizer, build_clone_scheduler, pick_device, planned_steps
from tts.clone.data import CloneData, DataError, feature_stats, load_reference
from tts.clone.evaluation import PlateauDetector, evaluate, log_validation, synthesis_metrics, to_device
from tts.clone.infer import VocoderMismatchError, load_matching_vocoder
from tts.clone.model import VoiceCloneTTS
from tts.clone.options import (
    Resolved,
    UsageError,
    build_parser,
    device_notices,
    effective_block,
    resolve_config,
)
from tts.clone.presets import CARD_PRESETS, cap_gpu_memory
from tts.text import SYMBOLS


# --------------------------------------------------------------------------------------- trainer
class CloneTrainer:
    """Everything a run needs, built from the resolved options; `fit()` runs the loop."""

    def __init__(self, res: Resolved, resume: str | None = None, init_from: str | None = None,
                 log: Callable[..., None] = print) -> None:
        self.res, self.cfg = res, res.cfg
        cfg, t = res.cfg, res.cfg.train
        self.info = setup_distributed(None if t.device == "auto" else t.device)
        self.device = device = pick_device(t.device) if not self.info.enabled else self.info.device
        self.log = Printer(self.info.is_main, log)
        res.notices.extend(device_notices(res, device))
        cap_gpu_memory(t.max_gpu_memory, device)  # on a CPU run device_notices() above says it is ignored
        # Build order kept (seed, data, model, optimizer, resume, compile, DDP; no per-rank seed): a reseed or a
        # moved model init changes the order of RNG draws, which the digest pins.
        torch.manual_seed(t.seed)
        np.random.seed(t.seed)
        self.run_dir = Path(t.checkpoint_dir)

        # ---- data, model, optimizer, schedule
        self.data = CloneData(cfg, device, self.run_dir, self.log)
        self.steps_per_epoch, self.total_steps = planned_steps(t, len(self.data.sampler), len(self.data.train_items))
        self.model = VoiceCloneTTS(cfg.model, len(SYMBOLS), cfg.audio.n_mels).to(device)
        on_cuda = device.type == "cuda"  # tf32 / cudnn.benchmark are CUDA settings (device_notices says so)
        self.precision = Precision(t.precision, device, tf32=t.tf32 and on_cuda,
                                   cudnn_benchmark=t.cudnn_benchmark and on_cuda, compile=t.compile)
        self.optimizer = build_clone_optimizer(cfg, self.model)
        self.scheduler = build_clone_scheduler(self.optimizer, cfg.scheduler, self.total_steps)
        self.guard = NonFiniteGuard(t.max_nonfinite)
        self.optimizers, self.guards = {"optimizer": self.optimizer}, {"optimizer": self.guard}  # by optimizer name
        self.divergence = DivergenceGuard(self.model.parameters(), t.max_nonfinite)
        self.plateau = PlateauDetector(cfg.val.plateau_patience, cfg.val.plateau_min_delta)
        self.manager = BestCheckpoints(self.run_dir, t.best_by, "mel_l1", self.log, keep_last=t.save_n_checkpoints,
                                       save_best_after=t.save_best_after, prefix="clone")

        # ---- counters, then resume (exact) or a new run (feature statistics, optional --init_from weights)
        self.step = self.epoch = self.batch_in_epoch = 0  # batch_in_epoch counts micro-batches
        self.train_time = 0.0  # wall time spent in training steps (not validating or saving)
        self.history: list[dict] = []
        self.trackers: dict = {}  # the W&B / MLflow run ids a resumed checkpoint holds
        self.last_good = resolve_resume(resume, self.run_dir, self.manager)  # newest checkpoint known good
        if self.last_good is not None:
            self.restore(self.last_good)
        else:
            self.model.set_stats(*feature_stats(self.data.train_items, cfg.data.stats_items))
            if init_from:  # weights only: a new run (fine-tuning), mismatched layers re-initialised and listed
                ckpt = load_checkpoint(init_from)
                refuse_other_kind(init_from, ckpt, "clone")
                weights = ckpt.get("models", {}).get("model")
                if weights is None:
                    raise CheckpointError(f"--init_from {init_from}: no 'model' weights (not a tts/train_main.py checkpoint)")
                self.log(str(load_matching(self.model, weights, source=init_from, ckpt=ckpt)))
        self.n_params = count_parameters(self.model)
        self.model_ddp = wrap_ddp(self.precision.prepare_model(self.model), self.info)

        # ---- fixed reference voice and vocoder for the validation audio
        self.reference = load_reference(cfg.val.reference or self.data.val_items[0]["wav"], cfg.audio, cfg.data)
        self.vocoder = load_matching_vocoder(cfg.vocoder.path, cfg.audio, device) if cfg.vocoder.path else None
        self.writer = RunLogger(tensorboard_dir(self.run_dir), enabled=self.info.is_main, purge_step=self.step,
                                trackers=t.logger, resume=self.trackers, project="clone")
        self.recent: list[float] = []  # train losses at log points, for the plateau's trend
        self._acc: dict[str, torch.Tensor] = {}  # loss sums since the last log point
        self._n_acc = 0

    def restore(self, path: Path) -> None:
        """Continue the run saved in `path` exactly (weights, optimizer, schedule, scaler, counters, RNG)."""
        ckpt = load_checkpoint(path)
        counters = restore_state(ckpt, {"model": self.model}, {"optimizer": self.optimizer}, {"scheduler": self.scheduler},
                                 self.precision.scaler, rank=self.info.rank, source=path)
        extra = ckpt.get("extra", {})
        self.guard.load_state_dict(extra["guard"])
        self.divergence.load_state_dict(extra.get("divergence"))
        self.plateau.load_state_dict(extra["plateau"])
        self.history = list(extra["history"])
        self.step, self.epoch, self.batch_in_epoch = counters["step"], counters["epoch"], counters["batch_in_epoch"]
        self.train_time = float(counters.get("train_s", 0.0))
        self.trackers = resumed_trackers(counters)
        self.log(f"resumed from {path} at step {self.step} (epoch {self.epoch}, batch {self.batch_in_epoch})")
        o = self.cfg.optim
        spec = {"optimizer": {"lr": (("optim.lr",), o.lr), "betas": (("optim.beta1", "optim.beta2"), (o.beta1, o.beta2)),
                              "eps": (("optim.eps",), o.eps), "weight_decay": (("optim.weight_decay",), o.weight_decay)}}
        changed = apply_optimizer_overrides({"optimizer": self.optimizer}, {"optimizer": self.scheduler},
                                            optimizer_overrides(self.cfg, spec))
        if changed:
            self.log(changed)

    def save(self, metric: float | None = None) -> None:
        if saving_blocked(self.guard, self.divergence):
            self.log(f"step {self.step}: no checkpoint while steps are non-finite or diverging (last good: {self.last_good or 'none'})")
            return
        counters = {"step": self.step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
                    "train_s": self.train_time, **self.writer.checkpoint_state()}
        state = make_state({"model": self.model}, {"optimizer": self.optimizer}, {"scheduler": self.scheduler},
                           self.precision.scaler, counters=counters, config=config_to_dict(self.cfg),
                           extra={"guard": self.guard.state_dict(), "divergence": self.divergence.state_dict(),
                                  "plateau": self.plateau.state_dict(),
                                  "history": self.history}, trainer="clone")
        if self.info.is_main:
            self.last_good = self.manager.save(state, self.step, metric)
        barrier()  # no rank runs ahead (or tears the process group down) while rank 0 still writes

    # ------------------------------------------------------------------ one step
    def train_step(self, batch: Iterable[dict]) -> dict:
        """One optimizer step over the `grad_accum` micro-batches of `batch`, fetched one by one between the
        forward passes (the order of data and RNG draws the digest pins; DDP syncs on the last only); the
        losses add up for the next log point. Returns the grad norm before clipping, the data wait and the samples
        it held (a frame budget makes batches vary: the bar counts them, common.loop)."""
        cfg, accum = self.cfg, self.cfg.train.grad_accum
        t_start = time.perf_counter()
        micro_batches = iter(batch)
        data_s, step_loss, samples = 0.0, 0.0, 0
        for micro in range(accum):
            td = time.perf_counter()
            mb = to_device(next(micro_batches), self.device)
            data_s += time.perf_counter() - td
            samples += mb["text"].size(0)
            with no_sync(self.model_ddp, micro < accum - 1):
                with self.precision.autocast():
                    out = self.model_ddp(mb["text"], mb["text_mask"], mb["mel"], mb["mel_mask"], mb["ref_mel"],
                                         mb["ref_mask"])
                losses = self.model.losses(out, mb, cfg.loss)
                backward(losses["loss"] / accum, self.precision.scaler)
            step_loss = step_loss + losses["loss"].detach() / accum
            for k, v in losses.items():
                self._acc[k] = self._acc.get(k, 0.0) + v.detach() / accum
        self.divergence.observe(step_loss)  # the weights that made this loss, before the update
        grad_norm, stepped = step_optimizer(None, self.optimizer, self.model.parameters(), self.precision.scaler,
                                            cfg.optim.clip_grad_norm or None, self.guard)
        self.precision.scaler.update()
        self.scheduler.step()
        self._n_acc += 1
        if not stepped:
            self.writer.scalar("train/skipped_steps", self.guard.skipped_total, self.step + 1)
        self.train_time += time.perf_counter() - t_start  # training time: validation and saving excluded
        return {"grad_norm": grad_norm, "data_wait_s": data_s, "samples": samples * self.info.world_size}

    def _log_train(self, logs: dict, bar: Progress, print_line: bool) -> dict:
        """The means since the last log point (over ranks) and the step's health, to TensorBoard."""
        means = {k: all_reduce_mean(v / self._n_acc) for k, v in self._acc.items()}
        self.writer.scalars(means, self.step, "train")
        loss_now = float(means["loss"])
        self.recent.append(loss_now)
        self.writer.scalars({"lr": self.scheduler.get_last_lr()[-1], "grad_norm": float(logs["grad_norm"]),
                            "skipped_steps": self.guard.skipped_total, "data_wait_fraction": bar.data_wait_fraction,
                            "samples_per_s": bar.samples_per_second() or 0.0}, self.step, "train")
        if print_line:  # no progress bar: one line per log point
            self.log(f"step {self.step}: loss {loss_now:.4f} (skipped {self.guard.skipped_total})")
        self._acc, self._n_acc = {}, 0
        return {}

    def validate(self) -> float | None:
        """Teacher-forced held-out mel L1 (`tts.clone.evaluation`), the fixed sentences in TensorBoard, the
        plateau note; kept in the run's history. Returns the `train.best_by` metric (best.pt's; mel L1 by default)."""
        step = self.step
        metrics = evaluate(self.model, self.data.val_loader, self.cfg, self.precision, self.device)
        synth = {}
        if self.info.is_main:  # free-running synthesis against the recordings: monitoring only, rank 0
            synth = synthesis_metrics(self.model, self.data.val_items, self.cfg, self.vocoder, self.device,
                                      self._speaker_encoder)
            metrics.update(synth)
        val = float(metrics["mel_l1"])
        lr_ratio = self.scheduler.get_last_lr()[-1] / max(self.cfg.optim.lr, 1e-30)
        recent = self.recent
        trend = (recent[-1] - recent[0]) / max(abs(recent[0]), 1e-8) if len(recent) >= 2 else None
        self.history.append({"step": step, "mel_l1": val, "loss": float(metrics["loss"]), "train_s": self.train_time,
                             "skipped": self.guard.skipped_total, **synth})
        if self.info.is_main:
            log_validation(self.writer, self.model, metrics, self.cfg, self.reference, self.vocoder, step)
            self.writer.flush()
        self.log(f"step {step}: validation mel L1 {val:.4f} (loss {metrics['loss']:.4f})"
                 + "".join(f", {k} {v:.3f}" for k, v in synth.items()))
        note = self.plateau.update(val, step, lr_ratio, trend)
        if note:
            self.log(note)
            self.writer.text("plateau", note, step)
        recent.clear()
        return best_value(metrics, self.cfg.train.best_by)

    @functools.cached_property
    def _speaker_encoder(self):
        """`val.speaker_encoder`'s network for speaker_sim, loaded at the first validation (None: off, said once)."""
        path = self.cfg.val.speaker_encoder
        return load_speaker_encoder(path, self.device, say=self.log) if path and self.cfg.val.synth_items else None

    # ------------------------------------------------------------------ the loop
    def fit(self, progress: bool = True, stop_at_step: int | None = None) -> dict:
        """Runs training; returns a summary (validation history, skipped steps, throughput, why it stopped:
        "stopped", None when the plan ran out, else `common.stopping`'s reason, as every trainer's `fit`).
        A non-finite stop raises `NonFiniteError`."""
        cfg, t, info = self.cfg, self.cfg.train, self.info
        if info.is_main:
            save_config(cfg, self.run_dir)
        self.log(effective_block(self.res, self.device, self.precision, self.n_params, self.steps_per_epoch,
                                 self.total_steps, self.data.collate.shapes(), info.world_size))
        if info.is_main:
            report_lr_plan({"lr": lr_curve(self.scheduler)}, self.total_steps, "--lr / --scheduler / --warmup-steps "
                           "(scheduler.*) or --epochs / train.max_updates", self.run_dir, self.writer, self.log)
        if self.step == 0 and not self.history and cfg.val.at_start:
            self.validate()
        bar = Progress(self.total_steps, self.step, t.batch_size * t.grad_accum * info.world_size,
                       enabled=progress and info.is_main)
        self.model_ddp.train()
        stop = RunStop(t.max_minutes, stop_at_step, last_good=lambda: self.last_good, lr_hint="--lr <lower>", oom=(
            "voice-cloning training", t.batch_size, {
                "batch_key": "train.batch_size", "accum_key": "train.grad_accum", "accumulation": t.grad_accum,
                "precision_key": "train.precision", "precision": self.precision.precision, "resume": "--resume auto"}))
        cadence = Cadence(total_steps=self.total_steps, log_every=t.log_interval, validate_every=t.val_check_interval,
                          save_every=t.save_interval, steps_per_epoch=self.steps_per_epoch, batches_per_step=t.grad_accum)
        try:
            reason = loop.run(self, cadence, stop, bar, epoch_batches=self._epoch_batches, optimizers=self.optimizers,
                              guards=self.guards, divergence=self.divergence,
                              log=lambda logs, bar: self._log_train(logs, bar, print_line=not progress))
        finally:
            bar.close()
            self.writer.close()
        if reason:
            self.log(stop.message(self.step))
        return self._summary(reason, bar.data_wait_fraction)

    def _epoch_batches(self) -> Iterator[Iterator[dict]]:
        """The current epoch's optimizer steps from the run's position, each a lazy run of `grad_accum`
        micro-batches (fetched by `train_step` one at a time, as before the loop was shared)."""
        accum = self.cfg.train.grad_accum
        it = iter(self.data.epoch_loader(self.epoch, self.batch_in_epoch, self.cfg.train.seed))
        while self.batch_in_epoch + accum <= self.steps_per_epoch * accum:
            yield islice(it, accum)

    def _summary(self, stopped: str | None, data_wait_fraction: float | None = None) -> dict:
        history = self.history
        if history:
            self.log(f"validation mel L1: step {history[0]['step']} {history[0]['mel_l1']:.4f} -> step "
                     f"{history[-1]['step']} {history[-1]['mel_l1']:.4f}; skipped non-finite steps: "
                     f"{self.guard.skipped_total}")
        return {
            "step": self.step, "history": history, "skipped_steps": self.guard.skipped_total,
            "stopped": stopped, "data_wait_fraction": data_wait_fraction, "train_s": self.train_time,
            "ckpt_dir": str(self.run_dir), "best": self.manager.best_metric, "n_params": self.n_params,
            "last_good": str(self.last_good) if self.last_good else None,
        }


def train(res: Resolved, resume: str | None = None, log: Callable[..., None] = print, progress: bool = True,
          stop_at_step: int | None = None, init_from: str | None = None) -> dict:
    """Builds the trainer and runs it; returns its summary (a non-finite stop: "stopped" is "non-finite").

    `stop_at_step` ends the run (with a checkpoint) at that optimizer step as if interrupted: the
    schedule still follows the full run, so a later `resume` continues exactly (tests, benchmarks).
    """
    trainer = CloneTrainer(res, resume, init_from, log)
    try:
        return trainer.fit(progress, stop_at_step)
    except NonFiniteError as e:
        trainer.log(f"error: {e}")
        return trainer._summary("non-finite")
    finally:
        cleanup()


# --------------------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return exit_codes.run_main(lambda: run(args), (UsageError, ConfigError, DataError, CheckpointError,
                                                   VocoderMismatchError), cleanup)


def run(args: argparse.Namespace) -> int:
    """The run the options ask for; failures reach `main` as exceptions (`common.exit_codes.run_main`)."""
    res = resolve_config(args)
    apply_preset(res.cfg, args.preset, CARD_PRESETS)
    data = res.cfg.data  # the prepared folders, never moved aside by --overwrite (a jsonl's folder holds its audio)
    folders = [p if p.is_dir() else p.parent for p in (Path(x) for x in (data.train, data.val) if x)]
    prepare_run_dir(res.cfg.train.checkpoint_dir, None, args.resume, args.overwrite, args.init_from,
                    keep=("features",), run_flag=args.run_flag, inputs={"--train-data / --val-data": folders})
    trainer = CloneTrainer(res, args.resume, args.init_from)
    return exit_code(trainer.fit(progress=sys.stderr.isatty())["stopped"])


if __name__ == "__main__":
    sys.exit(main())
