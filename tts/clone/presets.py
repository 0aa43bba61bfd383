"""The voice-cloning trainer's presets: what `--preset {rtx4090,rtx5090,cpu}` sets (`CARD_PRESETS`), and
the guide's performance flags of tts/train_main.py: `--fast-convergence`, `--max-gpu-memory`.

Card presets (`common.presets` applies them, into the keys `CloneConfig.PRESET_KEYS` names:
train.batch_size, train.num_workers, data.ref_seconds, train.precision): the transformer text +
reference -> mel model trains on full-length mel targets, so a smaller batch than VITS; the crop is the
3-second reference clip of the recipe. The CPU preset: tiny settings so tests and the demo finish.

The guide ("Fast Convergence Optimizations for MyXTTS Training", the page these users arrive with)
lists its "after" values: LR 1e-4 with cosine_with_warmup, batch 48 x grad-accum 8, Adam beta2
0.98 / eps 1e-9, weight decay 1e-4, clip 0.5, 16 data workers, and the training schedule
``save_step = max(2000, epochs * 10)``, ``val_step = max(500, epochs * 2)``, ``log_step = 50``.
Its "Maximum Performance Mode" then adds ``--batch-size 64 --lr 2e-4`` on top of the preset, so
a preset can only be a set of *defaults*: a value the user typed (a flag or ``--set``) wins, and
one line says which preset value it replaced. The preset still wins over a YAML file (the flag
is the newer, more specific request), also with one line per replaced value. Here it is data only:
`tts.clone.options` applies it with `common.presets.apply_settings`, the rule every preset follows.
"""

from __future__ import annotations

import torch

from common.presets import CardPresets
from tts.clone.config import CloneConfig

CARD_PRESETS = CardPresets(
    trainer="tts_clone", script="tts/train_main.py", schema=CloneConfig,
    values={  # crop: reference seconds
        "rtx4090": {"batch_size": 32, "num_workers": 6, "precision": "bf16-mixed", "crop": 3.0},
        "rtx5090": {"batch_size": 48, "num_workers": 12, "precision": "bf16-mixed", "crop": 3.0},
        "cpu": {"batch_size": 4, "num_workers": 0, "precision": "32-true", "crop": 2.0},
    },
)

# dotted config key → the guide's "after" value (the schedule keys are computed from the epochs)
FAST_CONVERGENCE: dict[str, object] = {
    "optim.lr": 1e-4,
    "scheduler.name": "cosine_with_warmup",
    "train.batch_size": 48,
    "train.grad_accum": 8,
    "optim.beta2": 0.98,
    "optim.eps": 1e-9,
    "optim.weight_decay": 1e-4,
    "optim.clip_grad_norm": 0.5,
    "train.num_workers": 16,
    "train.log_every": 50,
}


def fast_convergence_schedule(epochs: int) -> dict[str, int]:
    """The guide's save/validation schedule, in optimizer steps, from the run's planned epochs."""
    return {"train.save_every": max(2000, epochs * 10), "train.validate_every": max(500, epochs * 2)}


def cap_gpu_memory(fraction: float, device: torch.device) -> str | None:
    """`--max-gpu-memory`: caps this process's CUDA caching allocator at `fraction` of the device
    (an allocation beyond it raises CUDA OOM, which the trainer turns into its OOM advice), so
    other processes keep the rest. 0 = no cap. On a CPU run it returns a one-line notice instead."""
    if fraction <= 0:
        return None
    if device.type != "cuda":
        where = "the CPU" if device.type == "cpu" else device.type
        return f"--max-gpu-memory {fraction:g} ignored: this run is on {where} (it caps CUDA memory only)"
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return None
