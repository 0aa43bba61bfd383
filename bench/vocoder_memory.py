"""The vocoder training step's tensor memory on the CPU, before and after the memory fixes, in one run.

    python -m bench.vocoder_memory                 # base_hifi_gpu.yaml's model (MPD + MSD), batch 1 and 2 x 8 frames
    python -m bench.vocoder_memory --frames 16 --config vocoder/configs/base_hifi_gpu.yaml

One step = `VocoderTrainer.train_step` (critic update, then generator update), measured at two batch
sizes; the difference between them is the memory one more item costs (weights, gradients and optimizer
state are the same at both sizes, so they drop out). Reported per audio sample of the batch (items x
samples), and projected to the issue's size, batch 16 x 24576 samples (base_hifi_gpu.yaml's 48 frames),
as intercept + slope x samples:

* **saved for backward**: the most bytes autograd holds for backward at once during the step, counted by `torch.autograd.graph.saved_tensors_hooks` over the
  distinct storages of the saved tensors (a storage saved by several ops counts once) from the op that
  saves them until autograd lets them go;
* **peak live**: the most bytes of tensor storage created in the step and alive at once. Counted by a
  `TorchDispatchMode` that sees every op's output (forward, backward and optimizer): a storage no input of
  the op owns is new and counts from then until its last reference goes (a weakref finalizer). Memory an
  op allocates inside its kernel and frees before returning (convolution scratch, the CUDA side's cuDNN
  workspace) is not a tensor and is not counted.

Rows: "main" is the step as main had it (commit c1789c4), reproduced from this code by two switches
(`main_behaviour`): every leaky ReLU out of place (``vocoder.model.INPLACE_LEAKY_RELU = False``) and the
critic update's outputs held until the step ends (main's ``train_step`` kept ``out`` in scope); "outputs
dropped" switches back only the leaky ReLUs; "after" is this code. Run on main's code itself, this
script's "after" row equals its "main" row here byte for byte (checked when it was written).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import tempfile
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import vocoder.model
from common.config import load_config
from vocoder.config import VocoderConfig

REPO = Path(__file__).resolve().parents[1]
BASE_YAML = REPO / "vocoder" / "configs" / "base_hifi_gpu.yaml"
ISSUE_BATCH, ISSUE_SAMPLES = 16, 24576  # base_hifi_gpu.yaml: batch 16 x 48 frames x hop 512
GIB = 2 ** 30


def _storages(obj) -> dict[int, torch.UntypedStorage]:
    """The storages of every tensor in ``obj`` (nested args/outputs), by their C++ identity."""
    return {t.untyped_storage()._cdata: t.untyped_storage() for t in tree_leaves(obj) if isinstance(t, torch.Tensor)}


class _Saved:
    """What the pack hook hands autograd for one saved tensor: the tensor, and a count of its storage
    that drops when autograd lets go (after the backward that used it, or with its graph)."""

    __slots__ = ("tensor", "key", "memory")

    def __init__(self, tensor: torch.Tensor, memory: TensorMemory) -> None:
        self.tensor, self.memory = tensor, memory
        storage = tensor.untyped_storage()
        self.key = storage._cdata
        memory._saved_held(self.key, storage.nbytes(), +1)

    def __del__(self) -> None:
        self.memory._saved_held(self.key, 0, -1)


class TensorMemory(TorchDispatchMode):
    """Peak bytes of the tensor storages created while active (``peak``) and peak bytes of the distinct
    storages autograd holds for backward (``saved``); see the module docstring for what is counted.
    Use as ``with TensorMemory() as mem: ...``."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.saved_now = self.saved = 0
        self._tracked: set[int] = set()
        self._held: dict[int, list[int]] = {}  # storage -> [nbytes, saved tensors on it]
        self._hooks = torch.autograd.graph.saved_tensors_hooks(lambda t: _Saved(t, self), lambda s: s.tensor)

    def __enter__(self) -> TensorMemory:
        self._hooks.__enter__()
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        self._hooks.__exit__(*exc)

    def _saved_held(self, key: int, nbytes: int, change: int) -> None:
        """A storage that autograd holds is alive, so its key names one storage while it is held."""
        entry = self._held.setdefault(key, [nbytes, 0])
        entry[1] += change
        if change > 0 and entry[1] == 1:
            self.saved_now += nbytes
            self.saved = max(self.saved, self.saved_now)
        elif entry[1] == 0:
            self.saved_now -= entry[0]
            del self._held[key]

    def _free(self, key: int, nbytes: int) -> None:
        self._tracked.discard(key)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = _storages((args, kwargs))
        for key, st in _storages(out).items():
            if key in inputs or key in self._tracked:
                continue  # a view, an in-place or out= result: no new memory
            self._tracked.add(key)
            self.live += st.nbytes()
            self.peak = max(self.peak, self.live)
            weakref.finalize(st, self._free, key, st.nbytes())
        return out


# What each measured variant switches back to main's behaviour: (leaky ReLUs out of place, the critic
# update's outputs held to the step's end).
VARIANTS = {"main": (True, True), "outputs dropped": (True, False), "after": (False, False)}


@contextlib.contextmanager
def main_behaviour(trainer, out_of_place: bool = True, hold_critic_outputs: bool = True) -> Iterator[list]:
    """The step as main had it: leaky ReLUs out of place (``vocoder.model.INPLACE_LEAKY_RELU = False``),
    and the critic update's outputs alive to the step's end (a forward hook keeps the first critic call's
    output of each step in the list it yields; the caller clears it after the step, as main's ``out`` went
    out of scope when ``train_step`` returned)."""
    held: list = []

    def hold_first(module, args, output):
        if not held:
            held.append(output)

    handle = trainer.discriminator_ddp.register_forward_hook(hold_first) if hold_critic_outputs else None
    before = vocoder.model.INPLACE_LEAKY_RELU
    vocoder.model.INPLACE_LEAKY_RELU = not out_of_place and before
    try:
        yield held
    finally:
        vocoder.model.INPLACE_LEAKY_RELU = before
        if handle is not None:
            handle.remove()


@dataclass
class StepMemory:
    saved: int  # peak bytes held for backward in the step
    peak: int  # peak live bytes of the step's tensors


def measure_step(trainer, batch: dict, variant: str = "after") -> StepMemory:
    """One ``trainer.train_step(batch)`` under `TensorMemory`, as ``variant`` (`VARIANTS`) has it."""
    with main_behaviour(trainer, *VARIANTS[variant]) as held:
        with TensorMemory() as mem:
            trainer.train_step(batch)
            held.clear()
    return StepMemory(mem.saved, mem.peak)


def repeat_batch(batch: dict, items: int) -> dict:
    """``items`` items made of the batch's first one (memory depends on shapes, not values)."""
    return {k: (v[:1].repeat_interleave(items, 0) if isinstance(v, torch.Tensor) else v[:1] * items)
            for k, v in batch.items()}


@dataclass
class PerSample:
    """Bytes per audio sample of the batch (items x samples) and the intercept at zero samples."""

    slope: float
    intercept: float

    def at(self, samples: int) -> float:
        return self.intercept + self.slope * samples


def per_sample(small: StepMemory, large: StepMemory, samples_small: int, samples_large: int
               ) -> tuple[PerSample, PerSample]:
    """(saved for backward, peak live) as lines through the two measured sizes."""
    lines = []
    for a, b in ((small.saved, large.saved), (small.peak, large.peak)):
        slope = (b - a) / (samples_large - samples_small)
        lines.append(PerSample(slope, a - slope * samples_small))
    return lines[0], lines[1]


def measure(trainer, batch: dict, variant: str = "after", items: tuple[int, int] = (1, 2), warm_up: bool = True
            ) -> tuple[PerSample, PerSample]:
    """Per-sample (saved, peak) of ``trainer``'s step at ``items`` batch sizes made from ``batch``.
    ``warm_up``: one untracked step first, so one-off state (the optimizers' moments) exists before
    either measured step (not needed on a trainer that has stepped)."""
    results, samples = [], []
    if warm_up:
        trainer.train_step(repeat_batch(batch, items[0]))
    for n in items:
        b = repeat_batch(batch, n)
        results.append(measure_step(trainer, b, variant))
        samples.append(b["audio"].numel())
    return per_sample(results[0], results[1], samples[0], samples[1])


def build_trainer(config: Path, frames: int, run_dir: Path, *overrides: str):
    """A CPU trainer over synthetic tones prepared with base_hifi_gpu.yaml's audio settings (``config``
    must share them: base_hifi_gpu.yaml, base_hifi_rtx5090_optimized.yaml)."""
    from bench.bench_vocoder import make_dataset
    from vocoder.train import VocoderTrainer

    sets = (f"crop_mel_frames={frames}", "batch_size=1", "num_workers=0", "precision=32-true",
            "discriminator_train_start_steps=0", "num_sanity_val_steps=0", "val_num=1", *overrides)
    cfg = load_config(config, VocoderConfig, sets)
    data = make_dataset(run_dir / "data", n=3)
    return VocoderTrainer(cfg, data, run_dir / "run", device="cpu", log=lambda *a, **k: None)


def first_batch(trainer) -> dict:
    trainer.sampler.set_epoch(0)
    return next(iter(trainer.loader))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=BASE_YAML)
    p.add_argument("--frames", type=int, default=8, help="training crop (mel frames) of both measured sizes")
    p.add_argument("--set", action="append", default=[], help="config override key=value (repeatable)")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_trainer(args.config, args.frames, Path(tmp), *args.set)
        batch = first_batch(trainer)
        state = copy.deepcopy({"g": trainer.generator.state_dict(), "d": trainer.discriminator.state_dict()})
        rows = {}
        for variant in VARIANTS:
            trainer.generator.load_state_dict(state["g"])
            trainer.discriminator.load_state_dict(state["d"])
            rows[variant] = measure(trainer, batch, variant, warm_up=not rows)
    samples = batch["audio"].shape[-1]
    big = ISSUE_BATCH * ISSUE_SAMPLES
    print(f"{args.config.name} {' '.join(args.set)}: batch 1 and 2 x {samples} samples; per audio sample of the "
          f"batch, and projected to batch {ISSUE_BATCH} x {ISSUE_SAMPLES} samples (intercept + slope x samples)")
    print(f"{'':16}{'saved B/sample':>16}{'peak B/sample':>15}{'saved GiB @b16':>16}{'peak GiB @b16':>15}")
    for name, (saved, peak) in rows.items():
        print(f"{name:16}{saved.slope:16.1f}{peak.slope:15.1f}{saved.at(big) / GIB:16.2f}{peak.at(big) / GIB:15.2f}")
    (s0, p0), (s1, p1) = rows["main"], rows["after"]
    print(f"{'after / main':16}{s1.slope / s0.slope:16.3f}{p1.slope / p0.slope:15.3f}"
          f"{s1.at(big) / s0.at(big):16.3f}{p1.at(big) / p0.at(big):15.3f}")


if __name__ == "__main__":
    main()
