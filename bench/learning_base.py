"""What the learning benchmark (bench/learning.py) and its reference comparisons (bench/vits_reference.py,
bench/reference_checks.py) share: the demo data folder, the fixed recipe per trainer, the ``Runner`` of
one setting under test and the stored batch sequence. It imports no other bench module, so those three
import it and never each other in a circle."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "data" / "demo"
# The fixed recipe per trainer: the demo config plus these (fp32: the reference precision).
RECIPE = {
    # Critics from the first step and no frame-energy term, whatever the demo configs (the base) add:
    # the vocoder loop calls train_step without advancing tr.step, so the demo's generator-only warm-up
    # would never end here, and the figures in the README were measured with the critics from step 0
    # and without the energy term (the references have neither).
    "vocoder": ["precision=32-true", "num_valid_plots=0", "volume_aug=false",
                "discriminator_train_start_steps=0", "lab_aux_energyloss=0.0"],
    "vits": ["precision=32-true", "progress_bar=false", "discriminator_train_start_steps=0", "c_energy=0.0"],
    "vae": ["perceptual_weight=0.0", "ema_decay=0.0"],
}


@dataclass
class Runner:
    """One setting under test: ``step(batch)`` trains one step, ``evaluate()`` measures held-out metrics."""

    label: str
    step: Callable[[object], object]
    evaluate: Callable[[], dict]
    times: list[float] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)  # what ``step`` returned, when it returns a float


def take_batches(loader, sampler, steps: int) -> list:
    """The stored sequence: the first ``steps`` batches of the loader over as many epochs as needed."""
    out, epoch = [], 0
    while len(out) < steps:
        sampler.set_epoch(epoch)
        for batch in loader:
            out.append(batch)
            if len(out) == steps:
                break
        epoch += 1
    return out
