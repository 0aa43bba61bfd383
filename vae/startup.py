"""What a VAE run does at start-up: it says what the planned run will do (when the GAN phase begins,
and at which LR), and a resume at another `image_size` starts a new resolution stage.

Why: `disc_start` is a global step, the LR schedule and the run length are planned from the dataset
size, batch and GPU count. latent-diffusion trains at constant LR, so its GAN joins at full strength
whenever it joins; here a decaying schedule or a short plan can start the GAN at a decayed LR, or
never. Nothing in the logs would show that until the run is over, so the trainer prints it first.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from common import distributed
from common.atomic_write import replace
from common.best_by import BestCheckpoints
from common.checkpoint import BEST_DIR, restore_state, save_atomic
from common.config import format_config, save_config
from common.log import RunLogger, report_lr_plan
from common.schedulers import build_scheduler, lr_curve
from common.training import EMA
from vae.config import VAEConfig
from vae.data import TrainData
from vae.losses import VAELoss

LOW_LR_RATIO = 0.5  # below this fraction of the peak LR the start-up report adds a note


def scheduled_lr(schedule: LambdaLR, step: int) -> float:
    """The LR of the first param group at optimizer step `step` (the schedule is a pure function of it)."""
    return schedule.base_lrs[0] * schedule.lr_lambdas[0](step)


def gan_phase_report(loss: VAELoss, schedule: LambdaLR, total_steps: int, steps_per_epoch: int,
                     steps_before_stage: int = 0, first_step: int = 0) -> list[str]:
    """Lines to print at start-up. Local step s of this run (0 ≤ s < total_steps) trains at global step
    `steps_before_stage + s` with the LR `scheduled_lr(schedule, s)`; `first_step` > 0 when resumed.
    A line that starts with "warning:" means the run as planned never trains the GAN."""
    if loss.disc_weight <= 0 or loss.disc_factor <= 0:
        return ["GAN phase: off (disc_weight 0 or disc_factor 0): no discriminator is trained"]
    peak = schedule.base_lrs[0]
    last_global = steps_before_stage + total_steps - 1
    start = max(first_step, loss.disc_start - steps_before_stage)  # first local step with the GAN on
    if start >= total_steps:
        runs = (f"this run's steps are {steps_before_stage + first_step}..{last_global} "
                f"({total_steps} planned, {steps_per_epoch} per epoch)")
        half = steps_before_stage + total_steps // 2
        return [f"warning: the GAN phase never begins: disc_start {loss.disc_start} is after the last step; {runs}. "
                f"Without it reconstructions stay blurrier. Start it earlier (e.g. --disc_start {half}: the second "
                f"half of this run) or plan a longer run (--num_epochs / --max_steps)."]
    lr = scheduled_lr(schedule, start)
    share = (total_steps - start) / total_steps
    if start <= first_step:
        where = f"on from this run's first step (global step {steps_before_stage + first_step} >= disc_start " \
                f"{loss.disc_start})"
    else:
        where = (f"begins at global step {steps_before_stage + start} = step {start} of {total_steps} of this run, "
                 f"in epoch {start // steps_per_epoch + 1} of {-(-total_steps // steps_per_epoch)}")
    rising = scheduled_lr(schedule, start + 1) > lr  # still in the warmup: not a decayed LR
    lines = [f"GAN phase: {where}, at LR {lr:.3g} ({lr / peak:.2f}x the peak {peak:.3g}"
             f"{', rising: in the warmup' if rising else ''}); {total_steps - start} GAN steps ({share:.0%} of the run)"]
    if lr < LOW_LR_RATIO * peak and not rising:
        lines.append(f"note: the LR schedule has decayed to {lr / peak:.2f}x when the GAN joins (latent-diffusion "
                     f"trains at constant LR): consider --set lr_scheduler=constant or an earlier --disc_start")
    return lines


def world_size_note(learning_rate: float, images_per_step: int, world_size: int) -> list[str]:
    """Under torchrun the LR is NOT scaled with the GPU count (latent-diffusion scales its base LR by
    batch × accumulation × GPUs); said once so a multi-GPU user knows what they are running."""
    if world_size <= 1:
        return []
    return [f"note: learning_rate {learning_rate:.3g} is per optimizer step and is not scaled with the {world_size} "
            f"GPUs ({images_per_step} images per step, {world_size}x a single GPU's; steps per epoch and the "
            f"planned steps are {world_size}x fewer). See vae/README.md 'More GPUs'."]


def next_stage(old: dict, extra: dict, image_size: int) -> tuple[dict, list[dict]]:
    """Counters and stage history for a new resolution stage: the step and epoch counts continue
    (checkpoint_epoch_N.pt numbers keep rising, so no stage overwrites another's files and rotation
    keeps the newest), the data position restarts."""
    stage = int(old.get("stage", 1)) + 1
    first_step = int(old.get("steps_before_stage", 0)) + int(old.get("step", 0))
    counters = {"step": 0, "epoch": int(old.get("epoch", 0)), "micro_in_epoch": 0, "stage": stage,
                "steps_before_stage": first_step}
    stages = list(extra.get("stages") or [{"stage": stage - 1, "image_size": old.get("image_size"),
                                             "first_step": first_step - int(old.get("step", 0)), "first_epoch": 0}])
    stages = [s for s in stages if s["stage"] < stage]  # a re-run of this stage replaces its record
    stages.append({"stage": stage, "image_size": image_size, "first_step": first_step, "first_epoch": counters["epoch"]})
    return counters, stages


def keep_stage_files(out_dir: Path, stage: int, image_size: int | None) -> list[str]:
    """At a new stage, the previous stage's `checkpoint_last.pt` and `best.pt` (+ best.json) would be
    overwritten by this stage's (and PSNR at another crop size is not comparable for "best"): they are
    renamed `stage{K}_{size}px_last.pt` / `_best.pt`, outside rotation. An existing name is never
    overwritten: a re-run of the same transition keeps the first copy and leaves the files of the
    interrupted attempt (same resolution as this one) where they are."""
    kept = []
    for name, suffix in (("checkpoint_last.pt", "last.pt"), ("best.pt", "best.pt"), ("best.json", "best.json")):
        src, dst = out_dir / name, out_dir / f"stage{stage}_{image_size}px_{suffix}"
        if name.startswith("best") and (out_dir / BEST_DIR / name).is_file():  # else a run from before checkpoints/
            src = out_dir / BEST_DIR / name
        if src.is_file() and not dst.exists():
            replace(src, dst)
            kept.append(dst.name)
    return [k for k in kept if not k.endswith(".json")]


def report_plan(cfg: VAEConfig, data: TrainData, schedulers: dict[str, LambdaLR], loss: VAELoss, out_dir: Path,
                writer: RunLogger, steps_before_stage: int, first_step: int, world_size: int, device: str) -> None:
    """Rank 0 at start-up: the config (also saved in the run folder), the data and step plan, the LR
    schedule, the GAN phase and, under torchrun, the LR note."""
    out_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out_dir)
    print(format_config(cfg))
    print(f"{len(data.train_files)} training / {len(data.val_files)} validation images, {data.steps_per_epoch} "
          f"steps per epoch, {data.samples_per_step} images per step, {data.total_steps} steps planned, "
          f"device {device}")
    report_lr_plan({f"lr_{k}": lr_curve(v) for k, v in schedulers.items()}, data.total_steps,
                   "learning_rate / lr_scheduler / warmup_steps / min_lr_ratio (or num_epochs, max_steps)",
                   out_dir, writer)
    for line in (gan_phase_report(loss, schedulers["vae"], data.total_steps, data.steps_per_epoch,
                                  steps_before_stage, first_step)
                 + world_size_note(cfg.learning_rate, data.samples_per_step, world_size)):
        print(line)


def start_stage(ckpt: dict, path: Path, models: dict[str, nn.Module], ema: EMA | None, cfg: VAEConfig,
                out_dir: Path, total_steps: int, rank: int, is_main: bool) -> tuple[dict, list[dict]]:
    """Resume at another `image_size`: a new resolution stage. Weights (and EMA) carry over; the
    optimizer and LR schedule stay this run's, planned afresh; the counters continue (`next_stage`).
    Returns (counters, stages)."""
    old = ckpt.get("counters", {})
    models = {k: m for k, m in models.items() if k in ckpt.get("models", {})}
    restore_state(ckpt, models, ema={"vae": ema} if ema and ckpt.get("ema") else None, rank=rank, source=path)
    counters, stages = next_stage(old, ckpt.get("extra", {}), cfg.image_size)
    distributed.barrier()  # every rank has picked and read its checkpoint before rank 0 renames the stage's files
    if is_main:
        kept = keep_stage_files(out_dir, int(old.get("stage", 1)), old.get("image_size"))
        print(f"resume {path.name}: trained at {old.get('image_size')} px, now {cfg.image_size} px -> "
              f"stage {counters['stage']}: weights{' and EMA' if ema else ''} loaded; optimizer "
              f"and LR schedule re-planned for this run ({total_steps} steps, warmup "
              f"{min(cfg.warmup_steps, total_steps - 1)}); epochs continue at "
              f"{counters['epoch'] + 1}, global step at {counters['steps_before_stage']}"
              + (f"; kept the previous stage's {', '.join(kept)}" if kept else ""))
    return counters, stages


def build_lr_schedules(cfg: VAEConfig, optimizers: dict, total_steps: int) -> dict:
    """Each optimizer's LR schedule (by the same name) over a run of `total_steps` optimizer steps."""
    kw = {"warmup_steps": min(cfg.warmup_steps, max(0, total_steps - 1))}
    if cfg.lr_scheduler == "cosine_with_warmup":
        kw.update(total_steps=total_steps, min_ratio=cfg.min_lr_ratio)
    return {name: build_scheduler(opt, cfg.lr_scheduler, **kw) for name, opt in optimizers.items()}


class LastCheckpoint:
    """Where `RunCheckpoints` saves the VAE's run: `checkpoint_last.pt`, refreshed in place (the guide's
    layout); the rotated, ranked files are the per-epoch ones (`epochs`, whose best.pt this ranks by)."""

    def __init__(self, out_dir: Path, epochs: BestCheckpoints, printer: Callable[[str], None]) -> None:
        self.dir, self.epochs, self.printer = out_dir, epochs, printer

    @property
    def best_metric(self) -> float | None:
        return self.epochs.best_metric

    @property
    def best_path(self) -> Path | None:
        return self.epochs.best_path

    @property
    def by(self) -> str:
        return self.epochs.by

    def save(self, state: dict, step: int, metric: float | None = None) -> Path:
        path = save_atomic(state, self.dir / "checkpoint_last.pt")
        self.printer(f"saved {path} at step {step}")
        return path
