"""Train the voice-cloning TTS model (text + reference audio → mel + f0), with the fast-convergence options.

    python tts/train_main.py --train-data data/tts_prepared --checkpoint-dir runs/tts_clone \
        --model-size normal [--fast-convergence | --aggressive-lr] [--config tts/clone/configs/clone_base.yaml]

Defaults are the documented "after" values of tts/CLONE.md. Flags override the YAML (`--config`),
`--set key=value` overrides anything (the whole rule: `tts/clone/options.py`). Before training, one
block prints the effective configuration; any option the effective configuration would not use is
an error, never silently ignored. See tts/CLONE.md for the flag table and measured figures.

The loop: `grad_accum` bucketed micro-batches -> forward + losses (MAS alignment inside the model)
-> one optimizer step through `common.training.step_optimizer` (unscale, clip, skip a non-finite
step) -> log -> every `validate_every` steps: teacher-forced validation, the fixed sentences
in TensorBoard (`tts/clone/evaluation.py`), checkpoint (last `save_n_checkpoints` kept + best by
validation mel L1). Ctrl-C / SIGTERM saves and exits; `--resume auto` continues bit-exactly. The cadence keys
(`train.log_every`, `validate_every`, `save_every`, `max_minutes`, `stop_at_step`) are every trainer's.
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
from common.best_by import BestCheckpoints
from common.checkpoint import (
    BEST_DIR,
    CheckpointError,
    RunCheckpoints,
    load_checkpoint,
    load_matching,
    refuse_other_kind,
    resolve_resume,
)
from common.config import print_config_if_asked, save_config
from common.distributed import all_reduce_mean, cleanup, no_sync, setup_distributed
from common.guards import DivergenceGuard, NonFiniteError, NonFiniteGuard
from common.log import Printer, Progress, RunLogger, report_lr_plan
from common.loop import Cadence, RunResult
from common.model_card import DATA_SOURCE, read_data_source
from common.precision import Precision
from common.presets import apply_preset
from common.run_dir import prepare_run_dir, tensorboard_dir
from common.schedulers import lr_curve
from common.stopping import RunStop, exit_code
from common.training import backward, count_parameters, step_optimizer, step_schedules
from speech.speaker_similarity import load_speaker_encoder
from tts.clone.build import build_clone_optimizer, build_clone_scheduler, pick_device, planned_steps
from tts.clone.data import CloneData, feature_stats, load_reference
from tts.clone.evaluation import PlateauDetector, evaluate, log_validation, synthesis_metrics, to_device
from tts.clone.infer import load_matching_vocoder
from tts.clone.model import VoiceCloneTTS
from tts.clone.options import (
    Resolved,
    build_parser,
    device_notices,
    effective_block,
    resolve_config,
)
from tts.clone.presets import CARD_PRESETS, cap_gpu_memory
from tts.text import SYMBOLS


# --------------------------------------------------------------------------------------- trainer
class CloneTrainer:
    """Everything a run needs, built from the resolved options in the one build order (per-rank seed, model,
    channels_last / DDP / compile, optimizer); `fit()` runs `common.loop.fit`."""

    def __init__(self, res: Resolved, resume: str | None = None, init_from: str | None = None,
                 log: Callable[..., None] = print, show_progress: bool = True) -> None:
        self.res, self.cfg = res, res.cfg
        cfg, t = res.cfg, res.cfg.train
        self.info = setup_distributed(None if t.device == "auto" else t.device)
        self.device = device = pick_device(t.device) if not self.info.enabled else self.info.device
        self.printer = Printer(self.info.is_main, log)
        self.show_progress = show_progress
        res.notices.extend(device_notices(res, device))
        cap_gpu_memory(t.max_gpu_memory, device)  # on a CPU run device_notices() above says it is ignored
        torch.manual_seed(t.seed + self.info.rank)
        np.random.seed(t.seed + self.info.rank)
        self.run_dir = Path(t.checkpoint_dir)

        # ---- data; the model and where it starts (resume: exact; a new run: feature statistics, --init_from)
        self.data = CloneData(cfg, device, self.run_dir, self.printer)
        self.data_source = read_data_source(cfg.data.train)  # of the prepared data (common.model_card)
        self.steps_per_epoch, self.total_steps = planned_steps(t, len(self.data.sampler), len(self.data.train_items))
        self.model = VoiceCloneTTS(cfg.model, len(SYMBOLS), cfg.audio.n_mels).to(device)
        self.models = {"model": self.model}
        on_cuda = device.type == "cuda"  # tf32 / cudnn.benchmark are CUDA settings (device_notices says so)
        self.precision = Precision(t.precision, device, tf32=t.tf32 and on_cuda,
                                   cudnn_benchmark=t.cudnn_benchmark and on_cuda, compile=t.compile)
        store = BestCheckpoints(self.run_dir, t.best_by, "mel_l1", self.printer, keep_last=t.save_n_checkpoints,
                                save_best_after=t.save_best_after, prefix="clone",
                                best_dir=self.run_dir / BEST_DIR)  # best.pt where every trainer puts it
        resume_path = resolve_resume(resume, self.run_dir, store)
        if resume_path is None:
            self.model.set_stats(*feature_stats(self.data.train_items, cfg.data.stats_items))
            if init_from:  # weights only: a new run (fine-tuning), mismatched layers re-initialised and listed
                ckpt = load_checkpoint(init_from)
                refuse_other_kind(init_from, ckpt, "clone")
                weights = ckpt.get("models", {}).get("model")
                if weights is None:
                    raise CheckpointError(f"--init_from {init_from}: no 'model' weights (not a tts/train_main.py checkpoint)")
                self.printer(str(load_matching(self.model, weights, source=init_from, ckpt=ckpt)))
        self.n_params = count_parameters(self.model)
        self.model_ddp = self.precision.prepare_model(self.model, self.info)

        # ---- optimizer, schedule, guards
        self.optimizer = build_clone_optimizer(cfg, self.model)
        self.scheduler = build_clone_scheduler(self.optimizer, cfg.scheduler, self.total_steps)
        self.optimizers, self.schedulers = {"optimizer": self.optimizer}, {"optimizer": self.scheduler}
        self.guards = {"optimizer": NonFiniteGuard(t.max_nonfinite)}  # by optimizer name
        self.divergence = DivergenceGuard(self.model.parameters(), t.max_nonfinite)
        self.plateau = PlateauDetector(cfg.val.plateau_patience, cfg.val.plateau_min_delta)

        # ---- position, then resume
        self.step = self.epoch = self.batch_in_epoch = 0  # batch_in_epoch counts micro-batches
        self.train_time = 0.0  # wall time spent in training steps (not validating or saving)
        self.history: list[dict] = []
        self.trackers: dict = {}  # the W&B / MLflow run ids a resumed checkpoint holds
        o = cfg.optim
        spec = {"optimizer": {"lr": (("optim.lr",), o.lr), "betas": (("optim.beta1", "optim.beta2"), (o.beta1, o.beta2)),
                              "eps": (("optim.eps",), o.eps), "weight_decay": (("optim.weight_decay",), o.weight_decay)}}
        self.checkpoints = RunCheckpoints(self, store, "clone", optimizer_spec=spec)
        if resume_path is not None:
            self.checkpoints.resume(resume_path)

        # ---- fixed reference voice and vocoder for the validation audio
        self.reference = load_reference(cfg.val.reference or self.data.val_items[0]["wav"], cfg.audio, cfg.data)
        self.vocoder = load_matching_vocoder(cfg.vocoder.path, cfg.audio, device) if cfg.vocoder.path else None
        self.writer = RunLogger(tensorboard_dir(self.run_dir), enabled=self.info.is_main, purge_step=self.step,
                                trackers=t.logger, resume=self.trackers, project="clone")
        self.recent: list[float] = []  # train losses at log points, for the plateau's trend
        self._acc: dict[str, torch.Tensor] = {}  # loss sums since the last log point
        self._n_acc = 0

    # ------------------------------------------------------------------ checkpoint: this trainer's part
    def state(self) -> dict:
        return {"plateau": self.plateau.state_dict(), "history": self.history, "train_s": self.train_time,
                **({DATA_SOURCE: self.data_source} if self.data_source else {})}

    def load_state(self, ckpt: dict) -> None:
        extra = ckpt.get("extra", {})
        self.plateau.load_state_dict(extra["plateau"])
        self.history = list(extra["history"])
        self.data_source = self.data_source or extra.get(DATA_SOURCE)
        self.train_time = float(extra.get("train_s", ckpt.get("counters", {}).get("train_s", 0.0)))

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
        grad_norm, _ = step_optimizer(None, self.optimizer, self.model.parameters(), self.precision.scaler,
                                      cfg.optim.clip_grad_norm or None, self.guards["optimizer"])
        self.precision.scaler.update()
        step_schedules(self.scheduler)
        self._n_acc += 1
        self.train_time += time.perf_counter() - t_start  # training time: validation and saving excluded
        return {"grad_norm": grad_norm, "data_wait_s": data_s, "samples": samples * self.info.world_size}

    def log(self, logs: dict, bar: Progress) -> dict:
        """The means since the last log point (over ranks) and the step's health, to TensorBoard."""
        means = {k: all_reduce_mean(v / self._n_acc) for k, v in self._acc.items()}
        self.writer.scalars(means, self.step, "train")
        loss_now = float(means["loss"])
        self.recent.append(loss_now)
        self.writer.scalars({**logs, "grad_norm": float(logs["grad_norm"])}, self.step, "train")
        if not self.show_progress:  # no progress bar: one line per log point
            self.printer(f"step {self.step}: loss {loss_now:.4f} (skipped {logs['skipped_steps']})")
        self._acc, self._n_acc = {}, 0
        return {}

    def validate(self) -> dict:
        """Teacher-forced held-out mel L1 (`tts.clone.evaluation`), the fixed sentences in TensorBoard, the
        plateau note; kept in the run's history. Returns the metrics (best.pt's by `train.best_by`; mel L1 by default)."""
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
                             "skipped": self.guards["optimizer"].skipped_total, **synth})
        if self.info.is_main:
            log_validation(self.writer, self.model, metrics, self.cfg, self.reference, self.vocoder, step)
            self.writer.flush()
        self.printer(f"step {step}: validation mel L1 {val:.4f} (loss {metrics['loss']:.4f})"
                 + "".join(f", {k} {v:.3f}" for k, v in synth.items()))
        note = self.plateau.update(val, step, lr_ratio, trend)
        if note:
            self.printer(note)
            self.writer.text("plateau", note, step)
        recent.clear()
        return {k: v for k, v in metrics.items() if not k.startswith("_")}  # "_first": the pictures' tensors

    @functools.cached_property
    def _speaker_encoder(self):
        """`val.speaker_encoder`'s network for speaker_sim, loaded at the first validation (None: off, said once)."""
        path = self.cfg.val.speaker_encoder
        return load_speaker_encoder(path, self.device, say=self.printer) if path and self.cfg.val.synth_items else None

    # ------------------------------------------------------------------ the loop
    def fit(self) -> RunResult:
        """The effective configuration and the "before" validation, then `common.loop.fit`. A non-finite stop
        raises `NonFiniteError` naming the last good checkpoint."""
        cfg, t, info = self.cfg, self.cfg.train, self.info
        if info.is_main:
            save_config(cfg, self.run_dir)
        self.printer(effective_block(self.res, self.device, self.precision, self.n_params, self.steps_per_epoch,
                                     self.total_steps, self.data.collate.shapes(), info.world_size))
        if info.is_main:
            report_lr_plan({"lr": lr_curve(self.scheduler)}, self.total_steps, "--lr / --scheduler / --warmup-steps "
                           "(scheduler.*) or --epochs / train.max_updates", self.run_dir, self.writer, self.printer)
        if self.step == 0 and not self.history and cfg.val.at_start:
            self.validate()
        self.model_ddp.train()
        stop = RunStop.of(t, cfg, "voice-cloning training", last_good=lambda: self.checkpoints.last_good,
                          lr_hint="--lr <lower>")
        cadence = Cadence.of(t, self.total_steps, steps_per_epoch=self.steps_per_epoch, batches_per_step=t.grad_accum)
        return loop.fit(self, cadence, stop, self.checkpoints, best_by=t.best_by,
                        samples_per_step=t.batch_size * t.grad_accum * info.world_size,
                        show_progress=self.show_progress, desc="clone", run_end=self._validation_summary)

    def _validation_summary(self, reason: str | None) -> None:
        """Hook at the run's end, before the closing line (which stays the last): how the validation mel L1 moved."""
        if self.history:
            first, last = self.history[0], self.history[-1]
            self.printer(f"validation mel L1: step {first['step']} {first['mel_l1']:.4f} -> step {last['step']} "
                         f"{last['mel_l1']:.4f}; skipped non-finite steps: {self.guards['optimizer'].skipped_total}")

    def batches(self) -> Iterator[Iterator[dict]]:
        """The current epoch's optimizer steps from the run's position, each a lazy run of `grad_accum`
        micro-batches (fetched by `train_step` one at a time, as before the loop was shared)."""
        accum = self.cfg.train.grad_accum
        it = iter(self.data.epoch_loader(self.epoch, self.batch_in_epoch, self.cfg.train.seed))
        while self.batch_in_epoch + accum <= self.steps_per_epoch * accum:
            yield islice(it, accum)


def train(res: Resolved, resume: str | None = None, log: Callable[..., None] = print, progress: bool = True,
          stop_at_step: int | None = None, init_from: str | None = None) -> dict:
    """Builds the trainer and runs it; returns its result as a dict with the validation history, the
    throughput and the parameter count (a non-finite stop: "stopped" is "non-finite").

    `stop_at_step` ends the run (with a checkpoint) at that optimizer step as if interrupted: the
    schedule still follows the full run, so a later `resume` continues exactly (tests, benchmarks).
    """
    if stop_at_step:
        res.cfg.train.stop_at_step = stop_at_step
    trainer = CloneTrainer(res, resume, init_from, log, show_progress=progress)
    try:
        result = trainer.fit().to_dict()
    except NonFiniteError as e:
        trainer.printer(f"error: {e}")
        good = trainer.checkpoints.last_good
        result = RunResult(trainer.step, "non-finite", skipped={"steps": trainer.guards["optimizer"].skipped_total},
                           last_good=str(good) if good else None).to_dict()
    finally:
        cleanup()
    return {**result, "history": trainer.history, "train_s": trainer.train_time, "n_params": trainer.n_params,
            "ckpt_dir": str(trainer.run_dir)}


# --------------------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return exit_codes.run_main(lambda: run(args), cleanup=cleanup)


def run(args: argparse.Namespace) -> int:
    """The run the options ask for; failures reach `main` as exceptions (`common.exit_codes.run_main`)."""
    res = resolve_config(args)
    apply_preset(res.cfg, args.preset, CARD_PRESETS)
    print_config_if_asked(args, res.cfg)
    data = res.cfg.data  # the prepared folders, never moved aside by --overwrite (a jsonl's folder holds its audio)
    folders = [p if p.is_dir() else p.parent for p in (Path(x) for x in (data.train, data.val) if x)]
    prepare_run_dir(res.cfg.train.checkpoint_dir, None, args.resume, args.overwrite, args.init_from,
                    keep=("features",), run_flag=args.run_flag, inputs={"--train-data / --val-data": folders})
    trainer = CloneTrainer(res, args.resume, args.init_from, show_progress=sys.stderr.isatty())
    return exit_code(trainer.fit().stopped)


if __name__ == "__main__":
    sys.exit(main())
