"""How close a training step comes to the card's peak: FLOPs counted by `torch.utils.flop_counter`,
divided by the step's compute time and by the card's dense peak for the precision the step runs in.

The peaks are the vendors' datasheet figures for DENSE math (no 2:4 sparsity), tensor cores with fp32
accumulation where the datasheet separates it (GeForce cards run fp16/bf16 with fp32 accumulation at
half their fp16-accumulate rate). A mixed-precision step still runs some work in fp32 (losses, norms,
the optimizer), so its fraction of the bf16/fp16 peak is a lower bound of how well the matmuls and
convs use the card. FlopCounterMode counts matmuls and convolutions (forward and backward), not
elementwise work.

Two corrections to what `FlopCounterMode` reports on its own (`count_flops`):

- a grouped convolution's weight gradient: torch's `conv_backward_flop` counts it as if the conv were
  dense, `groups` times too much (PyTorch issues #166510, #183405); the critics' groups=16 Conv1d made
  the vocoder's step look 1.48x larger than it is. `conv_backward_flop_grouped` replaces it.
- what is not the model's math: the optimizer step (Muon's Newton-Schulz matmuls) and the forwards that
  gradient checkpointing runs again inside backward are counted apart (`StepFlops`), so "% of peak" is
  the model's forward and backward only, the figure other trainers' MFU means.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from math import prod

import torch
import torch.utils.checkpoint
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils.flop_counter import FlopCounterMode

# Card name fragment -> dense TFLOP/s per math mode. First match wins, so a longer name comes before the
# shorter one it contains ("H200 NVL" before "H200"). The names are what CUDA reports
# (torch.cuda.get_device_name): "NVIDIA H100 80GB HBM3" (SXM5), "NVIDIA H100 PCIe", "NVIDIA H100 NVL",
# "NVIDIA H200" (SXM), "NVIDIA H200 NVL", "NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 5090".
# Sources (tensor-core figures in the datasheets are "with sparsity": the dense figure is half):
# - H100 SXM5 / PCIe: NVIDIA H100 Tensor Core GPU Architecture whitepaper, dense table (SXM5 66.9 fp32,
#   494.7 TF32, 989.4 bf16/fp16; PCIe 51.2, 378, 756).
# - H100 NVL: H100 datasheet, NVL column: fp32 60, TF32 835*, bf16/fp16 1,671* -> 417.5 / 835.5 dense.
# - H200 SXM: H200 datasheet (nvidia.com/en-us/data-center/h200): fp32 67, TF32 989*, bf16/fp16 1,979*:
#   the H100 SXM5's GH100 at the same clocks, so the whitepaper's dense 66.9 / 494.7 / 989.4.
# - H200 NVL: the same datasheet, NVL column (a 600 W PCIe card, lower clocks): fp32 60, TF32 835*,
#   bf16/fp16 1,671* -> 417.5 / 835.5 dense (the H100 NVL's figures).
# - RTX 4090: NVIDIA Ada GPU Architecture whitepaper, appendix: fp32 82.6, TF32 tensor 82.6, fp16/bf16
#   tensor with fp32 accumulate 165.2 (dense).
# - RTX 5090: NVIDIA RTX Blackwell GPU Architecture whitepaper: fp32 104.8, TF32 tensor 104.8, fp16/bf16
#   tensor with fp32 accumulate 209.5 (dense).
# - A100 (SXM4 / PCIe): A100 whitepaper: fp32 19.5, TF32 156, bf16/fp16 312 (dense).
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100 PCIe": {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0},
    "H100 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
    "H100": {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},  # SXM5 ("NVIDIA H100 80GB HBM3")
    "H200 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
    "H200": {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},  # SXM ("NVIDIA H200")
    "A100": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
    "RTX 5090": {"fp32": 104.8, "tf32": 104.8, "bf16": 209.5, "fp16": 209.5},
    "RTX 4090": {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2},
}


def math_mode(precision: str, tf32: bool) -> str:
    """The peak column a step of `precision` is compared with."""
    if precision == "bf16-mixed":
        return "bf16"
    if precision == "16-mixed":
        return "fp16"
    return "tf32" if tf32 else "fp32"


def peak_tflops(card: str, mode: str) -> tuple[float | None, str]:
    """(peak TFLOP/s or None, a sentence naming the figure used) for a card name as CUDA reports it."""
    for fragment, peaks in PEAK_TFLOPS.items():
        if fragment.lower() in card.lower():
            return peaks[mode], f"{fragment} dense {mode} peak {peaks[mode]:g} TFLOP/s"
    return None, f"no peak known for '{card}' (known: {', '.join(PEAK_TFLOPS)}): fraction not computed"


# ------------------------------------------------------------------------------------ counting
def conv_flops_per_pass(x_shape: list[int], w_shape: list[int], out_shape: list[int], transposed: bool) -> int:
    """2 x multiply-adds of one pass of a convolution (forward, input gradient or weight gradient: each is
    the same multiply-adds): 2 * N * C_out * (C_in / groups) * prod(kernel) * prod(the direct conv's output
    positions). The weight already has C_in / groups input channels (C_out / groups for a transposed conv),
    so the groups need no factor here; the "direct" side is the output, or the input of a transposed conv."""
    spatial = x_shape[2:] if transposed else out_shape[2:]
    return 2 * x_shape[0] * prod(w_shape) * prod(spatial)


def conv_backward_flop_grouped(grad_out_shape: list[int], x_shape: list[int], w_shape: list[int], _bias,
                               _stride, _padding, _dilation, transposed: bool, _output_padding, _groups: int,
                               output_mask: list[bool], out_shape=None, **_kwargs) -> int:
    """`aten.convolution_backward` as FlopCounterMode's `custom_mapping` formula (shapes, as torch's own
    `conv_backward_flop` takes them). torch's formula counts the weight gradient as a dense conv of the
    input with grad_out, `groups` times the real work; each gradient is one pass of the same conv."""
    one = conv_flops_per_pass(list(x_shape), list(w_shape), list(grad_out_shape), transposed)
    return one * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


CUSTOM_MAPPING = {torch.ops.aten.convolution_backward: conv_backward_flop_grouped}


@dataclass(frozen=True)
class StepFlops:
    """One training step's FLOPs in three parts. `model`: the forward and backward of every network and
    loss, each forward counted once (the figure "% of peak" uses); `optimizer`: inside `optimizer.step()`
    (Muon's Newton-Schulz matmuls; AdamW adds none that the counter sees); `recompute`: the forwards that
    gradient checkpointing runs a second time inside backward (work the step does, not the model's math)."""

    model: int
    optimizer: int = 0
    recompute: int = 0

    @property
    def total(self) -> int:
        return self.model + self.optimizer + self.recompute

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class _Apart:
    """FLOPs counted while a phase is open, by phase; the outermost phase takes all (a checkpoint nested
    in a checkpoint's recompute is counted once)."""

    def __init__(self, counter: FlopCounterMode) -> None:
        self.counter = counter
        self.flops = {"optimizer": 0, "recompute": 0}
        self._open: tuple[str, int] | None = None

    def start(self, phase: str) -> bool:
        if self._open is not None:
            return False
        self._open = (phase, self.counter.get_total_flops())
        return True

    def stop(self, phase: str) -> None:
        if self._open is not None and self._open[0] == phase:
            self.flops[phase] += self.counter.get_total_flops() - self._open[1]
            self._open = None

    @contextlib.contextmanager
    def phase(self, phase: str) -> Iterator[None]:
        mine = self.start(phase)
        try:
            yield
        finally:
            if mine:
                self.stop(phase)


@contextlib.contextmanager
def _checkpoint_recompute_apart(apart: _Apart) -> Iterator[None]:
    """`torch.utils.checkpoint.checkpoint` (and every module's name bound to it, e.g. vae.model's
    `from torch.utils.checkpoint import checkpoint`) runs its function once in forward and again in
    backward: the first call is the model's forward, every later call is recomputation."""
    real = torch.utils.checkpoint.checkpoint

    def counted(function: Callable, *args, **kwargs):
        calls = 0

        def run(*a, **k):
            nonlocal calls
            calls += 1
            if calls == 1:
                return function(*a, **k)
            with apart.phase("recompute"):
                return function(*a, **k)

        return real(run, *args, **kwargs)

    bound = [(m, name) for m in list(sys.modules.values()) if m is not None
             for name, v in list(vars(m).items()) if v is real]
    for m, name in bound:
        setattr(m, name, counted)
    try:
        yield
    finally:
        for m, name in bound:
            setattr(m, name, real)


def count_flops(fn: Callable[[], object]) -> StepFlops:
    """FLOPs (matmul and conv, forward and backward; grouped conv backward counted right) of one call of
    `fn`, split into the model's, the optimizer step's and checkpointing's recompute (`StepFlops`)."""
    counter = FlopCounterMode(display=False, custom_mapping=CUSTOM_MAPPING)
    apart = _Apart(counter)

    def step_starts(*_args) -> None:
        apart.start("optimizer")

    def step_ends(*_args) -> None:
        apart.stop("optimizer")

    # every torch.optim.Optimizer subclass's step() calls these (MuonAdamW's too, and through a GradScaler)
    pre, post = register_optimizer_step_pre_hook(step_starts), register_optimizer_step_post_hook(step_ends)
    try:
        with _checkpoint_recompute_apart(apart), counter:
            fn()
    finally:
        pre.remove()
        post.remove()
    total = int(counter.get_total_flops())
    return StepFlops(model=total - apart.flops["optimizer"] - apart.flops["recompute"],
                     optimizer=apart.flops["optimizer"], recompute=apart.flops["recompute"])
