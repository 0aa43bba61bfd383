"""The options of tts/train_main.py → one effective configuration, read once.

Where a value comes from, lowest first (the one precedence rule of the cloning trainer):

1. the schema's defaults (`tts/clone/config.py`: the documented "after" values of tts/CLONE.md);
2. the YAML file (`--config`, with its `base_config:` chain);
3. a card preset (`--preset rtx5090 …`, `common.presets.apply_preset`, applied by `main` after the
   checks below);
4. `--fast-convergence` (the guide's values, data in `tts/clone/presets.py`);
5. the trainer's flags (`--batch-size`, `--lr`, … : `FLAGS`);
6. `--set KEY=VALUE`;
then `--aggressive-lr` scales what resolved (LR x 2, warmup x 2).

Layers 1, 2, 5 and 6 are one `common.config.load_config` call, which also records where each key was
set (`explicit_keys`: the command line; `config_sources`: the command line and the files). Both
presets follow `common.presets.apply_settings`: a preset fills every key the user did not type
(a flag, `--set`, or an earlier, higher preset) and replaces YAML values; what the user typed beats
it, and `--fast-convergence` says so in one notice per replaced value (shown in the effective
configuration block). A key counts as the user's choice — so an option the effective
configuration would not use is an error, never silently ignored — when it was typed, or set in the
YAML to something other than its default (restating a default, as the shipped recipes do, chooses
nothing).
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field

import torch

from common.best_by import best_by_help
from common.cli import FlagParser
from common.config import add_config_args, config_sources, explicit_keys, load_config, mark_explicit
from common.errors import UserError
from common.log import LOGGER_HELP
from common.precision import PRECISIONS as PRECISION_NAMES
from common.precision import Precision
from common.presets import add_preset_arg, apply_settings, get_key
from common.run_dir import add_run_args
from tts.clone.config import SIZES, VALIDATES, CloneConfig
from tts.clone.presets import FAST_CONVERGENCE, cap_gpu_memory, fast_convergence_schedule

AGGRESSIVE_LR_FACTOR = 2.0      # --aggressive-lr: base LR × 2 ...
AGGRESSIVE_WARMUP_FACTOR = 2.0  # ... with a warmup twice as long
PRECISIONS = ("auto", *PRECISION_NAMES)  # what --precision accepts: common.precision reads each

# The trainer's own flags: flag → (config key, argparse keywords). The parser, the flag → key map and
# the flag names in messages all come from this one table.
FLAGS: dict[str, tuple[str, dict]] = {
    "--train-data": ("data.train", dict(help="train.jsonl of tts/prepare_data.py, or the prepared folder")),
    "--val-data": ("data.val", dict(help="eval.jsonl (default: the prepared folder's eval.jsonl)")),
    "--epochs": ("train.epochs", dict(type=int, help="passes over the training set (default 1000)")),
    "--batch-size": ("train.batch_size", dict(type=int, help="utterances per micro-batch (default 32)")),
    "--grad-accum": ("train.grad_accum", dict(type=int, help="micro-batches per optimizer step (default 1)")),
    "--num-workers": ("train.num_workers", dict(type=int, help="DataLoader worker processes (default 4)")),
    "--lr": ("optim.lr", dict(type=float, help="peak learning rate (default 2e-4)")),
    "--model-size": ("model.size", dict(choices=sorted(SIZES), help="tiny | small | normal (default normal)")),
    "--scheduler": ("scheduler.name", dict(choices=["noam", "cosine_with_warmup", "exponential", "constant"],
                                           help="learning-rate schedule (default cosine_with_warmup)")),
    "--warmup-steps": ("scheduler.warmup_steps", dict(type=int, help="linear warmup in optimizer steps (default 1000)")),
    "--max-gpu-memory": ("train.max_gpu_memory", dict(
        type=float, metavar="FRACTION",
        help="cap this process's CUDA memory at FRACTION of the GPU (ignored with a notice on CPU)")),
    "--optimizer": ("optim.optimizer", dict(choices=["adamw", "muon_adamw"], help="default adamw")),
    "--precision": ("train.precision", dict(choices=PRECISIONS,
                                            help="default auto (bf16-mixed on a bf16 GPU, else 32-true)")),
    "--logger": ("train.logger", dict(metavar="NAMES", help=LOGGER_HELP)),
    "--best_by": ("train.best_by", dict(metavar="METRIC", help=best_by_help(VALIDATES, CloneConfig().train.best_by))),
}
RUN_DIR_FLAG = "--checkpoint-dir"  # common.run_dir's --run_dir, under the guide's name
KEY_FLAGS = {key: flag for flag, (key, _) in FLAGS.items()} | {"train.checkpoint_dir": RUN_DIR_FLAG}
FLAG_KEYS = {flag[2:].replace("-", "_"): key for key, flag in KEY_FLAGS.items()}  # argparse dest → key


class UsageError(UserError, ValueError):
    """A combination of options that cannot be honoured as given."""


def build_parser() -> argparse.ArgumentParser:
    p = FlagParser(description="Train the voice-cloning TTS model (see tts/CLONE.md).")
    for flag, (_, kwargs) in FLAGS.items():
        p.add_argument(flag, **kwargs)
    p.add_argument("--aggressive-lr", action="store_true",
                   help=f"{AGGRESSIVE_LR_FACTOR:g}x the base LR with a {AGGRESSIVE_WARMUP_FACTOR:g}x longer warmup")
    p.add_argument("--fast-convergence", action="store_true",
                   help="the guide's preset, as defaults your flags override: LR 1e-4, cosine_with_warmup, "
                        "batch 48 x grad-accum 8, Adam beta2 0.98, eps 1e-9, weight decay 1e-4, clip 0.5, "
                        "16 workers, save every max(2000, 10 x epochs) / validate every max(500, 2 x epochs) "
                        "steps, log every 50")
    add_run_args(p, run_aliases=(RUN_DIR_FLAG,), run_dest="checkpoint_dir",
                 run_help="run folder: checkpoints, TensorBoard logs, config.yaml (alias --checkpoint-dir)")
    add_config_args(p, set_example="train.batch_size=16")
    add_preset_arg(p)
    return p


@dataclass
class Resolved:
    cfg: CloneConfig
    explicit: dict[str, str]                 # dotted key → where the user chose it (see the module docstring)
    presets: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)


def resolve_config(args: argparse.Namespace) -> Resolved:
    """The effective configuration of `args`, by the precedence rule of the module docstring, then
    the unused-option checks (→ UsageError)."""
    flags = {key: getattr(args, dest) for dest, key in FLAG_KEYS.items() if getattr(args, dest) is not None}
    cfg = load_config(args.config, CloneConfig, args.overrides, flags, KEY_FLAGS)
    res = Resolved(cfg, user_choices(cfg))
    if args.fast_convergence:
        res.presets.append("fast-convergence")
        res.notices += apply_fast_convergence(cfg, res.explicit)
    if args.aggressive_lr:
        res.presets.append("aggressive-lr")
        if cfg.scheduler.name == "constant":
            raise UsageError("--aggressive-lr means 2x the base LR with a longer warmup, but --scheduler constant "
                             "has no warmup: use cosine_with_warmup, noam or exponential, or drop --aggressive-lr")
        if cfg.scheduler.warmup_steps <= 0:
            raise UsageError("--aggressive-lr lengthens the warmup, but warmup_steps is 0: give --warmup-steps > 0")
        cfg.optim.lr *= AGGRESSIVE_LR_FACTOR
        mark_explicit(cfg, "optim.lr", "--aggressive-lr")  # on resume too, the doubled LR is what was asked
        cfg.scheduler.warmup_steps = int(round(cfg.scheduler.warmup_steps * AGGRESSIVE_WARMUP_FACTOR))
    check_options(res)
    return res


def user_choices(cfg: CloneConfig) -> dict[str, str]:
    """Dotted key → where (its flag, `--set KEY`, or the file): every key typed on the command line,
    and every YAML key whose value is not the default."""
    typed = {k: f"--set {k}" if src.startswith("--set ") else src for k, src in explicit_keys(cfg).items()}
    defaults = CloneConfig()
    from_files = {k: src for k, src in config_sources(cfg).items()
                  if k not in typed and not dataclasses.is_dataclass(value := get_key(cfg, k))
                  and value != get_key(defaults, k)}
    return {**from_files, **typed}


def apply_fast_convergence(cfg: CloneConfig, chosen: dict[str, str]) -> list[str]:
    """Applies the guide's values (the schedule from the run's epochs) as a preset; returns one notice
    per value the user typed differently, and per YAML value the preset replaced."""
    values = {**FAST_CONVERGENCE, **fast_convergence_schedule(cfg.train.epochs)}
    done = apply_settings(cfg, {key: {key: value} for key, value in values.items()}, "--fast-convergence")
    notices = []
    for key, value in values.items():
        if key in done.kept:
            now, _, src = done.kept[key]
            if now != value:
                typed_as = src if src in KEY_FLAGS.values() else f"--set {key}"
                notices.append(f"{typed_as} {now} replaces the --fast-convergence value {value}")
        elif key in chosen:
            notices.append(f"--fast-convergence sets {KEY_FLAGS.get(key, key)} = {value} over {chosen[key]}")
    return notices


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
    if t.precision not in PRECISIONS:
        raise UsageError(f"train.precision must be one of {', '.join(PRECISIONS)}, got {t.precision!r}")


def device_notices(res: Resolved, device: torch.device) -> list[str]:
    """Options meant for a GPU on a CPU run: a notice, not an error (the same YAML serves both)."""
    out = []
    if device.type != "cuda":
        if res.cfg.train.max_gpu_memory > 0:
            out.append(cap_gpu_memory(res.cfg.train.max_gpu_memory, device))
        for key in ("train.tf32", "train.cudnn_benchmark"):
            if key in res.explicit and get_key(res.cfg, key):
                out.append(f"{key} ignored: this run is on the CPU")
        if "data.pin_memory" in res.explicit and res.cfg.data.pin_memory:
            out.append("data.pin_memory ignored: this run is on the CPU")
    return out


def effective_block(res: Resolved, device: torch.device, precision: Precision, n_params: int,
                    steps_per_epoch: int, total_steps: int, shapes: list[tuple[int, int]], world: int) -> str:
    """The block printed before training: every value the run uses, and the notices."""
    cfg = res.cfg
    t, o, s = cfg.train, cfg.optim, cfg.scheduler
    eff = t.batch_size * t.grad_accum * world
    ranks = f" x {world} ranks" if world > 1 else ""
    sched = {"cosine_with_warmup": f"cosine_with_warmup (warmup {s.warmup_steps}, floor {s.min_ratio:g}x)",
             "noam": f"noam (peak at step {s.warmup_steps})",
             "exponential": f"exponential (warmup {s.warmup_steps}, gamma {s.gamma:g}/step)",
             "constant": "constant"}[s.name]
    rows = [
        ("presets", ", ".join(res.presets) or "none"),
        ("device", f"{device}{ranks}" + (f" ({torch.get_num_threads()} threads)" if device.type == "cpu" else "")),
        ("model", f"{cfg.model.size} ({n_params / 1e6:.2f} M parameters)"),
        ("batch", f"{t.batch_size} per step"),
        ("grad-accum", f"{t.grad_accum}"),
        ("effective batch", f"{eff} ({t.batch_size} x {t.grad_accum}{ranks})"),
        ("LR", f"{o.lr:g}"),
        ("scheduler", sched),
        ("optimizer", f"{o.optimizer} (betas {o.beta1:g}/{o.beta2:g}, eps {o.eps:g}, weight decay {o.weight_decay:g}, "
                      f"clip {o.clip_grad_norm:g})"),
        ("precision", precision.precision + (" + GradScaler" if precision.scaler.is_enabled() else "")),
        ("workers", f"{t.num_workers}" + (f" (prefetch {cfg.data.prefetch_factor})" if t.num_workers else "")),
        ("steps", f"{total_steps} optimizer steps ({steps_per_epoch}/epoch"
                  + (f", max_updates {t.max_updates}" if t.max_updates else f", {t.epochs} epochs")
                  + (f", at most {t.max_minutes:g} min)" if t.max_minutes else ")")),
        ("validation", f"every {t.validate_every} steps (checkpoint then too, and every {t.save_every}; "
                       f"log every {t.log_every})"),
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
