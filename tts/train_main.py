"""Train the voice-cloning TTS model (text + reference audio → mel + f0), with the fast-convergence options.

    python tts/train_main.py --train-data data/tts_prepared --checkpoint-dir runs/tts_clone \
        --model-size normal [--fast-convergence | --aggressive-lr] [--config tts/configs/clone_base.yaml]

Defaults are the documented "after" values of tts/CLONE.md. Flags override the YAML (`--config`),
`--set key=value` overrides anything. Before training, one block prints the effective
configuration; any option the effective configuration would not use is an error, never silently
ignored. See tts/CLONE.md for the flag table and measured figures.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.optim.lr_scheduler import LambdaLR

from common import exit_codes
from common.checkpoint import (
    CheckpointError,
    CheckpointManager,
    GracefulExit,
    load_checkpoint,
    load_matching,
    make_state,
    resolve_resume,
    restore_state,
)
from common.config import (
    ConfigError,
    add_config_args,
    config_to_dict,
    load_config,
    mark_explicit,
    parse_override,
    read_config_file,
    save_config,
)
from common.data import BucketBatchSampler, make_loader
from common.distributed import all_reduce_mean, cleanup, setup_distributed, wrap_ddp
from common.hardware import OutOfMemory, is_oom, oom_message
from common.log import Progress, RunLogger, plot_alignment, plot_spectrogram, report_lr_plan
from common.muon import build_optimizer
from common.precision import Precision
from common.presets import add_preset_arg, apply_preset
from common.run_dir import add_run_args, prepare_run_dir
from common.schedulers import build_scheduler, lr_curve
from common.training import (
    NonFiniteError,
    NonFiniteGuard,
    apply_optimizer_overrides,
    nonfinite_stop_message,
    optimizer_overrides,
    saving_blocked,
    step_optimizer,
)
from tts.clone_data import (
    BucketCollate,
    CloneDataset,
    DataError,
    build_features,
    feature_stats,
    load_reference,
    resolve_manifests,
)
from tts.clone_presets import cap_gpu_memory, fast_convergence_defaults
from tts.infer_clone import VocoderMismatchError, load_matching_vocoder, synthesize
from tts.models.clone import VoiceCloneTTS, count_parameters
from tts.models.clone_config import SIZES, CloneConfig, SchedulerConfig, TrainConfig
from tts.models.clone_decoder import durations_to_path
from tts.text import SYMBOLS

# flag dest → config key (flags override the YAML; the YAML overrides the defaults)
FLAG_KEYS = {
    "train_data": "data.train", "val_data": "data.val", "checkpoint_dir": "train.checkpoint_dir",
    "epochs": "train.epochs", "batch_size": "train.batch_size", "grad_accum": "train.grad_accum",
    "num_workers": "train.num_workers", "lr": "optim.lr", "model_size": "model.size",
    "scheduler": "scheduler.name", "warmup_steps": "scheduler.warmup_steps",
    "max_gpu_memory": "train.max_gpu_memory", "optimizer": "optim.optimizer", "precision": "train.precision",
}
KEY_FLAGS = {v: "--" + k.replace("_", "-") for k, v in FLAG_KEYS.items()}

AGGRESSIVE_LR_FACTOR = 2.0      # --aggressive-lr: base LR × 2 ...
AGGRESSIVE_WARMUP_FACTOR = 2.0  # ... with a warmup twice as long
PRECISIONS = ("auto", "32-true", "16-mixed", "bf16-mixed")


class UsageError(ValueError):
    """A combination of options that cannot be honoured as given."""


# ---------------------------------------------------------------------------------------------
# Options → effective configuration
# ---------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Train the voice-cloning TTS model (see tts/CLONE.md).")
    p.add_argument("--train-data", help="train.jsonl of tts/prepare_data.py, or the prepared folder")
    p.add_argument("--val-data", help="eval.jsonl (default: the prepared folder's eval.jsonl)")
    p.add_argument("--epochs", type=int, help="passes over the training set (default 1000)")
    p.add_argument("--batch-size", type=int, help="utterances per micro-batch (default 32)")
    p.add_argument("--grad-accum", type=int, help="micro-batches per optimizer step (default 1)")
    p.add_argument("--num-workers", type=int, help="DataLoader worker processes (default 4)")
    p.add_argument("--lr", type=float, help="peak learning rate (default 2e-4)")
    p.add_argument("--model-size", choices=sorted(SIZES), help="tiny | small | normal (default normal)")
    p.add_argument("--scheduler", choices=["noam", "cosine_with_warmup", "exponential", "constant"],
                   help="learning-rate schedule (default cosine_with_warmup)")
    p.add_argument("--warmup-steps", type=int, help="linear warmup in optimizer steps (default 1000)")
    p.add_argument("--aggressive-lr", action="store_true",
                   help=f"{AGGRESSIVE_LR_FACTOR:g}x the base LR with a {AGGRESSIVE_WARMUP_FACTOR:g}x longer warmup")
    p.add_argument("--fast-convergence", action="store_true",
                   help="the guide's preset, as defaults your flags override: LR 1e-4, cosine_with_warmup, "
                        "batch 48 x grad-accum 8, Adam beta2 0.98, eps 1e-9, weight decay 1e-4, clip 0.5, "
                        "16 workers, save every max(2000, 10 x epochs) / validate every max(500, 2 x epochs) "
                        "steps, log every 50")
    p.add_argument("--max-gpu-memory", type=float, metavar="FRACTION",
                   help="cap this process's CUDA memory at FRACTION of the GPU (ignored with a notice on CPU)")
    p.add_argument("--optimizer", choices=["adamw", "muon_adamw"], help="default adamw")
    p.add_argument("--precision", choices=PRECISIONS, help="default auto (bf16-mixed on a bf16 GPU, else 32-true)")
    add_run_args(p, run_aliases=("--checkpoint-dir",), run_dest="checkpoint_dir",
                 run_help="run folder: checkpoints, TensorBoard logs, config.yaml (alias --checkpoint-dir)")
    add_config_args(p)
    add_preset_arg(p)
    return p


@dataclass
class Resolved:
    cfg: CloneConfig
    explicit: dict[str, str]                 # dotted key → where the user set it
    presets: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)


def resolve_config(args: argparse.Namespace) -> Resolved:
    """YAML → --fast-convergence → flags → --set → --aggressive-lr, then the unused-option checks."""
    flags = {key: getattr(args, dest) for dest, key in FLAG_KEYS.items() if getattr(args, dest) is not None}
    sets = dict(parse_override(t) for t in args.overrides)
    explicit: dict[str, str] = {}
    if args.config:  # a YAML key counts as the user's choice when it differs from the default
        data, sources = read_config_file(args.config)
        defaults = config_to_dict(CloneConfig())
        explicit.update({k: str(src) for k, src in sources.items() if _lookup(data, k) != _lookup(defaults, k)})
    explicit.update({k: f"--set {k}" for k in sets})
    explicit.update({k: KEY_FLAGS[k] for k in flags})
    presets: list[str] = []
    notices: list[str] = []
    extra = dict(flags)
    if args.fast_convergence:  # the guide's values as defaults: what the user typed wins (tts/clone_presets.py)
        presets.append("fast-convergence")
        epochs = load_config(args.config, CloneConfig, args.overrides, flags).train.epochs
        preset, notices = fast_convergence_defaults(epochs, {**flags, **sets}, explicit, KEY_FLAGS)
        extra = {**preset, **flags}
    cfg = load_config(args.config, CloneConfig, args.overrides, extra)
    if args.aggressive_lr:
        presets.append("aggressive-lr")
        if cfg.scheduler.name == "constant":
            raise UsageError("--aggressive-lr means 2x the base LR with a longer warmup, but --scheduler constant "
                             "has no warmup: use cosine_with_warmup, noam or exponential, or drop --aggressive-lr")
        if cfg.scheduler.warmup_steps <= 0:
            raise UsageError("--aggressive-lr lengthens the warmup, but warmup_steps is 0: give --warmup-steps > 0")
        cfg.optim.lr *= AGGRESSIVE_LR_FACTOR
        mark_explicit(cfg, "optim.lr", "--aggressive-lr")  # on resume too, the doubled LR is what was asked
        cfg.scheduler.warmup_steps = int(round(cfg.scheduler.warmup_steps * AGGRESSIVE_WARMUP_FACTOR))
    res = Resolved(cfg, explicit, presets, notices)
    check_options(res)
    return res


def check_options(res: Resolved) -> None:
    """Values in range, and no option the effective configuration would not use (→ UsageError)."""
    cfg, explicit = res.cfg, res.explicit

    def where(key: str) -> str:
        return explicit.get(key, key)

    s, t = cfg.scheduler, cfg.train
    if "scheduler.warmup_steps" in explicit and s.name == "constant":
        raise UsageError(f"{where('scheduler.warmup_steps')} (warmup_steps) is not used by --scheduler constant "
                         "(a constant LR has no warmup): drop it, or use --scheduler cosine_with_warmup/noam/exponential")
    if "scheduler.gamma" in explicit and s.name != "exponential":
        raise UsageError(f"scheduler.gamma ({where('scheduler.gamma')}) is only used by --scheduler exponential, "
                         f"not {s.name}: drop it")
    if "scheduler.min_ratio" in explicit and s.name != "cosine_with_warmup":
        raise UsageError(f"scheduler.min_ratio ({where('scheduler.min_ratio')}) is only used by "
                         f"--scheduler cosine_with_warmup, not {s.name}: drop it")
    if s.name == "noam" and s.warmup_steps < 1:
        raise UsageError("--scheduler noam needs --warmup-steps >= 1 (its peak is at the end of the warmup)")
    if "train.epochs" in explicit and t.max_updates > 0:
        raise UsageError(f"{where('train.epochs')} (epochs) is not used: train.max_updates = {t.max_updates} "
                         f"({where('train.max_updates')}) decides the run length; drop one of them")
    if "data.prefetch_factor" in explicit and t.num_workers == 0:
        raise UsageError(f"data.prefetch_factor ({where('data.prefetch_factor')}) is not used with --num-workers 0 "
                         "(prefetching happens in worker processes): drop it or use workers")
    for key, ok, what in (
        ("train.batch_size", t.batch_size >= 1, ">= 1"), ("train.grad_accum", t.grad_accum >= 1, ">= 1"),
        ("train.num_workers", t.num_workers >= 0, ">= 0"), ("optim.lr", cfg.optim.lr > 0, "> 0"),
        ("train.epochs", t.epochs >= 1, ">= 1"), ("train.max_updates", t.max_updates >= 0, ">= 0"),
        ("train.max_minutes", t.max_minutes >= 0, ">= 0 (0 = no time limit)"),
        ("scheduler.warmup_steps", s.warmup_steps >= 0, ">= 0"),
        ("train.max_gpu_memory", 0.0 <= t.max_gpu_memory <= 1.0, "a fraction in (0, 1] (0 = no cap)"),
        ("train.val_check_interval", t.val_check_interval >= 1, ">= 1"),
        ("train.log_interval", t.log_interval >= 1, ">= 1"), ("train.save_interval", t.save_interval >= 1, ">= 1"),
        ("optim.clip_grad_norm", cfg.optim.clip_grad_norm >= 0, ">= 0 (0 = no clipping)"),
        ("data.ref_seconds", cfg.data.ref_seconds > 0, "> 0"),
    ):
        if not ok:
            raise UsageError(f"{KEY_FLAGS.get(key, key)} must be {what} (got {_get(cfg, key)})")
    if t.precision not in PRECISIONS:
        raise UsageError(f"train.precision must be one of {', '.join(PRECISIONS)}, got {t.precision!r}")


def _lookup(d: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def _get(cfg, dotted: str):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"train.device {name} requested but no CUDA device is available")
    return dev


def pick_precision(name: str, device: torch.device) -> str:
    if name != "auto":
        return name
    return "bf16-mixed" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "32-true"


def device_notices(res: Resolved, device: torch.device) -> list[str]:
    """Options meant for a GPU on a CPU run: a notice, not an error (the same YAML serves both)."""
    out = []
    if device.type != "cuda":
        if res.cfg.train.max_gpu_memory > 0:
            out.append(cap_gpu_memory(res.cfg.train.max_gpu_memory, device))
        for key in ("train.tf32", "train.cudnn_benchmark"):
            if key in res.explicit and _get(res.cfg, key):
                out.append(f"{key} ignored: this run is on the CPU")
        if "data.pin_memory" in res.explicit and res.cfg.data.pin_memory:
            out.append("data.pin_memory ignored: this run is on the CPU")
    return out


def effective_block(res: Resolved, device: torch.device, precision: Precision, n_params: int,
                    steps_per_epoch: int, total_steps: int, shapes: list[tuple[int, int]], world: int) -> str:
    cfg = res.cfg
    t, o, s = cfg.train, cfg.optim, cfg.scheduler
    eff = t.batch_size * t.grad_accum * world
    sched = {"cosine_with_warmup": f"cosine_with_warmup (warmup {s.warmup_steps}, floor {s.min_ratio:g}x)",
             "noam": f"noam (peak at step {s.warmup_steps})",
             "exponential": f"exponential (warmup {s.warmup_steps}, gamma {s.gamma:g}/step)",
             "constant": "constant"}[s.name]
    rows = [
        ("presets", ", ".join(res.presets) or "none"),
        ("device", f"{device}" + (f" x {world} ranks" if world > 1 else "")
         + (f" ({torch.get_num_threads()} threads)" if device.type == "cpu" else "")),
        ("model", f"{cfg.model.size} ({n_params / 1e6:.2f} M parameters)"),
        ("batch", f"{t.batch_size} per step"),
        ("grad-accum", f"{t.grad_accum}"),
        ("effective batch", f"{eff} ({t.batch_size} x {t.grad_accum}" + (f" x {world} ranks" if world > 1 else "") + ")"),
        ("LR", f"{o.lr:g}"),
        ("scheduler", sched),
        ("optimizer", f"{o.optimizer} (betas {o.beta1:g}/{o.beta2:g}, eps {o.eps:g}, weight decay {o.weight_decay:g}, "
                      f"clip {o.clip_grad_norm:g})"),
        ("precision", precision.precision + (" + GradScaler" if precision.scaler.is_enabled() else "")),
        ("workers", f"{t.num_workers}" + (f" (prefetch {cfg.data.prefetch_factor})" if t.num_workers else "")),
        ("steps", f"{total_steps} optimizer steps ({steps_per_epoch}/epoch"
                  + (f", max_updates {t.max_updates}" if t.max_updates else f", {t.epochs} epochs")
                  + (f", at most {t.max_minutes:g} min)" if t.max_minutes else ")")),
        ("validation", f"every {t.val_check_interval} steps (checkpoint then too, and every {t.save_interval}; "
                       f"log every {t.log_interval})"),
        ("static shapes", f"{len(shapes)} buckets (text, frames): " + ", ".join(f"{a}x{b}" for a, b in shapes)),
    ]
    if t.max_gpu_memory > 0 and device.type == "cuda":
        rows.append(("GPU memory cap", f"{t.max_gpu_memory:.0%} of the device"))
    width = max(len(k) for k, _ in rows)
    lines = ["=" * 30 + " effective configuration " + "=" * 30]
    lines += [f"  {k.ljust(width)}  {v}" for k, v in rows]
    lines += [f"  note: {n}" for n in precision.report() if n.startswith("not applied")]
    lines += [f"  notice: {n}" for n in res.notices]
    lines.append("=" * 85)
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Plateau detector
# ---------------------------------------------------------------------------------------------
class PlateauDetector:
    """Says when the validation loss stopped improving, and what that suggests.

    A plateau = `patience` validations in a row without a relative improvement of `min_delta`
    over the best value. The suggestion depends on why: an LR already decayed to its floor, a
    training loss that still falls (over-fitting), or both flat (under-fitting / LR too low).
    """

    def __init__(self, patience: int, min_delta: float) -> None:
        self.patience, self.min_delta = patience, min_delta
        self.best = math.inf
        self.best_step = 0
        self.bad = 0
        self.reported = False

    def update(self, metric: float, step: int, lr_ratio: float, train_trend: float | None) -> str | None:
        if metric < self.best * (1.0 - self.min_delta):
            self.best, self.best_step, self.bad, self.reported = metric, step, 0, False
            return None
        self.bad += 1
        if self.bad < self.patience or self.reported:
            return None
        self.reported = True
        head = (f"plateau: validation mel loss has not improved by {self.min_delta:.1%} for {self.bad} validations "
                f"(best {self.best:.4f} at step {self.best_step}).")
        if lr_ratio < 0.2:
            hint = ("The LR schedule is near its floor, so more steps at this LR will not help: stop here, or "
                    "restart the schedule from this checkpoint with more data or a larger --model-size.")
        elif train_trend is not None and train_trend < -0.02:
            hint = ("The training loss still falls while validation does not: over-fitting. Add data "
                    "(more speakers), raise model.dropout, or use a smaller --model-size.")
        else:
            hint = ("Training loss is flat too: the LR may be too low or the batch too noisy. Try --aggressive-lr, "
                    "or a larger effective batch (--grad-accum); check the data-wait fraction and the alignment "
                    "plots in TensorBoard (a broken alignment means bad transcripts).")
        return f"{head} {hint}"

    def state_dict(self) -> dict:
        return {"best": self.best, "best_step": self.best_step, "bad": self.bad, "reported": self.reported}

    def load_state_dict(self, d: dict) -> None:
        self.best, self.best_step, self.bad, self.reported = d["best"], d["best_step"], d["bad"], d["reported"]


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------
def to_device(batch: dict, device: torch.device) -> dict:
    return {k: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}


@torch.no_grad()
def evaluate(model: VoiceCloneTTS, loader, cfg: CloneConfig, precision: Precision, device: torch.device) -> dict:
    """Teacher-forced reconstruction losses on the eval set. `mel_l1` is in log-mel units (post-net
    output, MAS durations): comparable across runs with the same audio settings."""
    was_training = model.training
    model.eval()
    sums: dict[str, float] = {}
    weight = 0.0
    first = None
    for i, batch in enumerate(loader):
        if cfg.val.max_batches and i >= cfg.val.max_batches:
            break
        batch = to_device(batch, device)
        with precision.autocast():
            out = model(batch["text"], batch["text_mask"], batch["mel"], batch["mel_mask"], batch["ref_mel"],
                        batch["ref_mask"])
        losses = model.losses(out, batch, cfg.loss)
        m = batch["mel_mask"].unsqueeze(1)
        recon = model.denorm_mel(out["post_mel"].float())
        n = float(m.sum()) * recon.shape[1]
        losses["mel_l1"] = ((recon - batch["mel"]).abs() * m).sum() / max(n, 1.0)
        for k, v in losses.items():
            sums[k] = sums.get(k, 0.0) + float(v) * n
        weight += n
        if first is None:
            nt, nf = int(batch["text_mask"][0].sum()), int(batch["mel_mask"][0].sum())
            first = {"path": out["path"][0, :nt, :nf].cpu(), "mel": batch["mel"][0, :, :nf].cpu(),
                     "recon": recon[0, :, :nf].cpu()}
    model.train(was_training)
    metrics = {k: v / max(weight, 1.0) for k, v in sums.items()}
    metrics["_first"] = first
    return metrics


def griffin_lim(mel: torch.Tensor, cfg: CloneConfig) -> np.ndarray:
    """Monitoring audio when no vocoder is configured (librosa's mel inversion; not for quality)."""
    import librosa

    a = cfg.audio
    return librosa.feature.inverse.mel_to_audio(
        np.exp(mel.float().cpu().numpy()), sr=a.sample_rate, n_fft=a.n_fft, hop_length=a.hop_length,
        win_length=a.win_length, power=1.0, fmin=a.fmin, fmax=a.fmax, n_iter=16)


def log_validation(logger: RunLogger, model: VoiceCloneTTS, metrics: dict, cfg: CloneConfig, reference,
                   vocoder, step: int) -> None:
    """TensorBoard: losses, the MAS alignment + mel of an eval item, and the fixed sentences spoken
    in the fixed reference voice (audio + mel + duration alignment)."""
    logger.scalars({k: v for k, v in metrics.items() if not k.startswith("_")}, step, "val")
    first = metrics.get("_first")
    if first is not None:
        logger.figure("val/alignment_mas", plot_alignment(first["path"], "MAS path (eval item 0)"), step)
        logger.figure("val/mel_target", plot_spectrogram(first["mel"], "target"), step)
        logger.figure("val/mel_reconstructed", plot_spectrogram(first["recon"], "teacher-forced"), step)
    if reference is None:
        return
    was_training = model.training
    model.eval()
    for i, sentence in enumerate(cfg.val.sentences):
        res = synthesize(model, sentence, reference, vocoder)
        logger.figure(f"synth/{i}/mel", plot_spectrogram(res["mel"].cpu(), sentence[:60]), step)
        path = durations_to_path(res["durations"][None].cpu(), res["mel"].shape[-1])[0]
        logger.figure(f"synth/{i}/alignment", plot_alignment(path, "predicted durations"), step)
        wav = res["wav"] if res["wav"] is not None else griffin_lim(res["mel"], cfg)
        sr = vocoder.sample_rate if vocoder is not None else cfg.audio.sample_rate
        logger.audio(f"synth/{i}/audio" + ("" if vocoder is not None else "_griffinlim"), wav, sr, step)
    model.train(was_training)


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------
def planned_steps(t: TrainConfig, batches_per_epoch: int, n_items: int) -> tuple[int, int]:
    """(optimizer steps per epoch, planned optimizer steps of the run) from this rank's batches per
    epoch: one step is grad_accum batches; the plan is max_updates, or epochs x steps per epoch."""
    steps_per_epoch = batches_per_epoch // t.grad_accum
    if steps_per_epoch < 1:
        raise UsageError(f"{n_items} training utterances give {batches_per_epoch} full batches of "
                         f"{t.batch_size} per epoch (per rank), fewer than --grad-accum {t.grad_accum}: "
                         "lower --batch-size or --grad-accum, or add data")
    return steps_per_epoch, t.max_updates or t.epochs * steps_per_epoch


def build_clone_scheduler(optimizer: torch.optim.Optimizer, s: SchedulerConfig, total_steps: int) -> LambdaLR:
    """The run's LR schedule, stepped once per optimizer update (after `grad_accum` micro-batches):
    cosine_with_warmup warms up linearly over warmup_steps and follows a half cosine to
    min_ratio x lr at `total_steps`, the planned updates of the whole run (max_updates, or epochs x
    optimizer steps per epoch); exponential multiplies by gamma every update after the warmup."""
    sched_kw: dict = {"warmup_steps": 0 if s.name == "constant" else s.warmup_steps}
    if s.name == "cosine_with_warmup":
        if total_steps <= s.warmup_steps:
            raise UsageError(f"the run has {total_steps} optimizer steps but the warmup is {s.warmup_steps}: "
                             "lower --warmup-steps or train longer (--epochs / train.max_updates)")
        sched_kw.update(total_steps=total_steps, min_ratio=s.min_ratio)
    elif s.name == "exponential":
        sched_kw.update(gamma=s.gamma)
    return build_scheduler(optimizer, s.name, **sched_kw)


def train(res: Resolved, resume: str | None = None, log=print, progress: bool = True,
          stop_at_step: int | None = None, init_from: str | None = None) -> dict:
    """Runs training; returns a summary (validation history, skipped steps, throughput, why it stopped).

    `stop_at_step` ends the run (with a checkpoint) at that optimizer step as if interrupted: the
    schedule still follows the full run, so a later `resume` continues exactly (tests, benchmarks).
    """
    cfg = res.cfg
    t = cfg.train
    info = setup_distributed(None if t.device == "auto" else t.device)
    device = pick_device(t.device) if not info.enabled else info.device
    if not info.is_main:
        log = lambda *a, **k: None  # noqa: E731 - rank 0 alone prints
    res.notices.extend(device_notices(res, device))
    cap_gpu_memory(t.max_gpu_memory, device)  # on a CPU run device_notices() above says it is ignored
    torch.manual_seed(t.seed)
    np.random.seed(t.seed)
    ckpt_dir = Path(t.checkpoint_dir)

    # ---- data ------------------------------------------------------------------------------------
    train_jsonl, val_jsonl = resolve_manifests(cfg.data.train, cfg.data.val)
    cache_root = Path(cfg.data.cache_dir) if cfg.data.cache_dir else ckpt_dir / "features"
    feat_workers = max(1, min(t.num_workers, os.cpu_count() or 1))
    train_items = build_features(train_jsonl, cfg.audio, cfg.data, cache_root, feat_workers, log)
    val_items = build_features(val_jsonl, cfg.audio, cfg.data, cache_root, feat_workers, log)
    ref_frames = int(math.ceil(cfg.data.ref_seconds * cfg.audio.sample_rate / cfg.audio.hop_length))
    train_set, val_set = CloneDataset(train_items, ref_frames), CloneDataset(val_items, ref_frames)
    sampler = BucketBatchSampler(train_set.lengths(), t.batch_size, cfg.data.num_buckets, shuffle=True,
                                 seed=t.seed, drop_last=True)
    collate = BucketCollate(train_set.lengths(), [it["n_text"] for it in train_items], sampler.boundaries,
                            ref_frames, cfg.data.frame_multiple, cfg.data.text_multiple)
    val_sampler = BucketBatchSampler(val_set.lengths(), cfg.val.batch_size, cfg.data.num_buckets, shuffle=False,
                                     seed=0, num_replicas=1, rank=0)
    val_collate = BucketCollate(val_set.lengths(), [it["n_text"] for it in val_items], val_sampler.boundaries,
                                ref_frames, cfg.data.frame_multiple, cfg.data.text_multiple)
    loader_kw = dict(num_workers=t.num_workers, prefetch_factor=cfg.data.prefetch_factor,
                     pin_memory=cfg.data.pin_memory and device.type == "cuda", persistent_workers=False)
    val_loader = make_loader(val_set, batch_sampler=val_sampler, collate_fn=val_collate, seed=0,
                             **{**loader_kw, "num_workers": min(t.num_workers, 2)})
    steps_per_epoch, total_steps = planned_steps(t, len(sampler), len(train_items))

    # ---- model, optimizer, schedule ---------------------------------------------------------------
    model = VoiceCloneTTS(cfg.model, len(SYMBOLS), cfg.audio.n_mels).to(device)
    on_cuda = device.type == "cuda"  # tf32 / cudnn.benchmark are CUDA settings (device_notices says so)
    precision = Precision(pick_precision(t.precision, device), device, tf32=t.tf32 and on_cuda,
                          cudnn_benchmark=t.cudnn_benchmark and on_cuda, compile=t.compile)
    o = cfg.optim
    optimizer = build_optimizer({"adamw": "AdamW", "muon_adamw": "MuonAdamW"}[o.optimizer], model, lr=o.lr,
                                betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay)
    scheduler = build_clone_scheduler(optimizer, cfg.scheduler, total_steps)
    guard = NonFiniteGuard(t.max_nonfinite)
    plateau = PlateauDetector(cfg.val.plateau_patience, cfg.val.plateau_min_delta)
    manager = CheckpointManager(ckpt_dir, keep_last=t.save_n_checkpoints, save_best_after=t.save_best_after,
                                mode="min", prefix="clone")
    counters = {"step": 0, "epoch": 0, "batch_in_epoch": 0, "train_s": 0.0}
    history: list[dict] = []
    resume_path = resolve_resume(resume, ckpt_dir, manager)
    if resume_path is not None:
        ckpt = load_checkpoint(resume_path)
        try:
            counters = restore_state(ckpt, {"model": model}, {"optimizer": optimizer}, {"scheduler": scheduler},
                                     precision.scaler, rank=info.rank)
        except (RuntimeError, ValueError, KeyError) as e:
            raise CheckpointError(f"{resume_path} does not fit this configuration (model size, optimizer or "
                                  f"audio settings changed?): {str(e).splitlines()[0]}") from None
        extra = ckpt.get("extra", {})
        guard.load_state_dict(extra["guard"])
        plateau.load_state_dict(extra["plateau"])
        history = list(extra["history"])
        log(f"resumed from {resume_path} at step {counters['step']} (epoch {counters['epoch']}, "
            f"batch {counters['batch_in_epoch']})")
        spec = {"optimizer": {"lr": (("optim.lr",), o.lr), "betas": (("optim.beta1", "optim.beta2"), (o.beta1, o.beta2)),
                              "eps": (("optim.eps",), o.eps), "weight_decay": (("optim.weight_decay",), o.weight_decay)}}
        changed = apply_optimizer_overrides({"optimizer": optimizer}, {"optimizer": scheduler},
                                            optimizer_overrides(cfg, spec))
        if changed:
            log(changed)
    else:
        model.set_stats(*feature_stats(train_items, cfg.data.stats_items))
        if init_from:  # weights only: a new run (fine-tuning), mismatched layers re-initialised and listed
            weights = load_checkpoint(init_from).get("models", {}).get("model")
            if weights is None:
                raise CheckpointError(f"--init_from {init_from}: no 'model' weights (not a tts/train_main.py checkpoint)")
            log(str(load_matching(model, weights)))
    n_params = count_parameters(model)
    net = wrap_ddp(precision.prepare_model(model), info)

    # ---- fixed reference voice and vocoder for the validation audio -------------------------------
    ref_path = cfg.val.reference or val_items[0]["wav"]
    reference = load_reference(ref_path, cfg.audio, cfg.data)
    vocoder = load_matching_vocoder(cfg.vocoder.path, cfg.audio, device) if cfg.vocoder.path else None

    if info.is_main:
        save_config(cfg, ckpt_dir)
    log(effective_block(res, device, precision, n_params, steps_per_epoch, total_steps, collate.shapes(),
                        info.world_size))
    logger = RunLogger(ckpt_dir / "logs", enabled=info.is_main)
    if info.is_main:
        report_lr_plan({"lr": lr_curve(scheduler)}, total_steps, "--lr / --scheduler / --warmup-steps "
                       "(scheduler.*) or --epochs / train.max_updates", ckpt_dir, logger, log)

    last_good = resume_path  # the newest checkpoint known to hold a good state

    def save(step: int, metric: float | None = None) -> None:
        nonlocal last_good
        if saving_blocked(guard):
            log(f"step {step}: no checkpoint while steps are non-finite (last good: {last_good or 'none'})")
            return
        counters["train_s"] = train_time
        state = make_state({"model": model}, {"optimizer": optimizer}, {"scheduler": scheduler}, precision.scaler,
                           counters=dict(counters), config=config_to_dict(cfg),
                           extra={"guard": guard.state_dict(), "plateau": plateau.state_dict(), "history": history})
        if info.is_main:
            last_good = manager.save(state, step, metric)

    train_time = float(counters.get("train_s", 0.0))  # wall time spent training (not validating) so far
    recent: list[float] = []  # train losses at log points, for the plateau's trend

    def validate(step: int) -> float:
        metrics = evaluate(model, val_loader, cfg, precision, device)
        val = float(metrics["mel_l1"])
        lr_ratio = scheduler.get_last_lr()[-1] / max(o.lr, 1e-30)
        trend = (recent[-1] - recent[0]) / max(abs(recent[0]), 1e-8) if len(recent) >= 2 else None
        history.append({"step": step, "mel_l1": val, "loss": float(metrics["loss"]), "train_s": train_time,
                        "skipped": guard.skipped_total})
        if info.is_main:
            log_validation(logger, model, metrics, cfg, reference, vocoder, step)
            logger.flush()
        log(f"step {step}: validation mel L1 {val:.4f} (loss {metrics['loss']:.4f})")
        note = plateau.update(val, step, lr_ratio, trend)
        if note:
            log(note)
            logger.text("plateau", note, step)
        recent.clear()
        return val

    if counters["step"] == 0 and not history and cfg.val.at_start:
        validate(0)

    # ---- the loop -----------------------------------------------------------------------------------
    bar = Progress(total_steps, counters["step"], t.batch_size * t.grad_accum * info.world_size,
                   enabled=progress and info.is_main)
    stop_reason = "finished"
    acc: dict[str, torch.Tensor] = {}
    n_acc = 0
    t_last = t_start = time.perf_counter()
    time_up = False
    net.train()
    try:
        with GracefulExit() as interrupt:
            while counters["step"] < total_steps:
                sampler.set_epoch(counters["epoch"])
                sampler.skip(counters["batch_in_epoch"])
                loader = make_loader(train_set, batch_sampler=sampler, collate_fn=collate,
                                     seed=t.seed + counters["epoch"], **loader_kw)
                it = iter(loader)
                while counters["batch_in_epoch"] + t.grad_accum <= steps_per_epoch * t.grad_accum:
                    data_s = 0.0
                    t0 = time.perf_counter()
                    for micro in range(t.grad_accum):
                        td = time.perf_counter()
                        batch = to_device(next(it), device)
                        data_s += time.perf_counter() - td
                        sync = contextlib.nullcontext() if (micro == t.grad_accum - 1 or not info.enabled) \
                            else net.no_sync()
                        with sync:
                            with precision.autocast():
                                out = net(batch["text"], batch["text_mask"], batch["mel"], batch["mel_mask"],
                                          batch["ref_mel"], batch["ref_mask"])
                            losses = model.losses(out, batch, cfg.loss)
                            loss = losses["loss"] / t.grad_accum
                            if precision.scaler.is_enabled():
                                precision.scaler.scale(loss).backward()
                            else:
                                loss.backward()
                        for k, v in losses.items():
                            acc[k] = acc.get(k, 0.0) + v.detach() / t.grad_accum
                    grad_norm, stepped = step_optimizer(None, optimizer, model.parameters(), precision.scaler,
                                                        o.clip_grad_norm or None, guard)
                    precision.scaler.update()
                    scheduler.step()
                    n_acc += 1
                    counters["step"] += 1
                    counters["batch_in_epoch"] += t.grad_accum
                    step = counters["step"]
                    now = time.perf_counter()
                    step_s = now - t0 - data_s
                    train_time += now - t_last
                    t_last = now
                    bar.update(step, data_s, step_s)
                    time_up = bool(t.max_minutes) and time.perf_counter() - t_start > 60.0 * t.max_minutes
                    last = step >= total_steps or time_up
                    if step % t.log_interval == 0 or last:
                        means = {k: all_reduce_mean(v / n_acc) for k, v in acc.items()}
                        logger.scalars(means, step, "train")
                        loss_now = float(means["loss"])
                        recent.append(loss_now)
                        logger.scalars({"lr": scheduler.get_last_lr()[-1], "grad_norm": float(grad_norm),
                                        "skipped_steps": guard.skipped_total,
                                        "data_wait_fraction": bar.data_wait_fraction,
                                        "samples_per_s": bar.samples_per_second() or 0.0}, step, "train")
                        if not progress:
                            log(f"step {step}: loss {loss_now:.4f} (skipped {guard.skipped_total})")
                        acc, n_acc = {}, 0
                    if not stepped:
                        logger.scalar("train/skipped_steps", guard.skipped_total, step)
                    if step % t.val_check_interval == 0 or last:
                        val = validate(step)
                        save(step, val)
                        t_last = time.perf_counter()
                    elif step % t.save_interval == 0:
                        save(step)
                        t_last = time.perf_counter()
                    if interrupt.requested or step == stop_at_step or last:
                        break
                if interrupt.requested or counters["step"] == stop_at_step:
                    stop_reason = "interrupted" if interrupt.requested else "stop_at_step"
                    if not history or history[-1]["step"] != counters["step"]:
                        save(counters["step"])
                    break
                if counters["step"] >= total_steps or time_up:
                    stop_reason = "time limit" if time_up and counters["step"] < total_steps else stop_reason
                    break
                counters["epoch"] += 1
                counters["batch_in_epoch"] = 0
    except NonFiniteError as e:
        stop_reason = "non-finite"
        log(f"error: {e}")
        log(nonfinite_stop_message(last_good, "--lr <lower>"))
    except RuntimeError as e:
        if is_oom(e):
            raise OutOfMemory(oom_message("voice-cloning training", t.batch_size, {
                "batch_key": "train.batch_size", "accum_key": "train.grad_accum", "accumulation": t.grad_accum,
                "precision_key": "train.precision", "precision": precision.precision})) from None
        raise
    finally:
        bar.close()
        logger.close()
    summary = {
        "step": counters["step"], "history": history, "skipped_steps": guard.skipped_total, "stop": stop_reason,
        "data_wait_fraction": bar.data_wait_fraction, "train_s": train_time, "ckpt_dir": str(ckpt_dir),
        "best": manager.best_metric, "n_params": n_params, "last_good": str(last_good) if last_good else None,
    }
    if history:
        log(f"validation mel L1: step {history[0]['step']} {history[0]['mel_l1']:.4f} -> "
            f"step {history[-1]['step']} {history[-1]['mel_l1']:.4f}; skipped non-finite steps: {guard.skipped_total}")
    cleanup()
    return summary


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        res = resolve_config(args)
        apply_preset(res.cfg, args.preset, "tts_clone")
        prepare_run_dir(res.cfg.train.checkpoint_dir, None, args.resume, args.overwrite, args.init_from,
                        keep=("features",))
        summary = train(res, args.resume, progress=sys.stderr.isatty(), init_from=args.init_from)
    except (UsageError, ConfigError, DataError, CheckpointError, VocoderMismatchError) as e:
        print(f"error: {e}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    except OutOfMemory as e:
        print(f"error: {e}", file=sys.stderr)
        return exit_codes.OUT_OF_MEMORY
    return {"non-finite": exit_codes.NON_FINITE, "interrupted": exit_codes.INTERRUPTED}.get(summary["stop"],
                                                                                          exit_codes.OK)


if __name__ == "__main__":
    sys.exit(main())
