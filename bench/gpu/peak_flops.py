"""How close a training step comes to the card's peak: FLOPs counted by `torch.utils.flop_counter`,
divided by the step time and by the card's dense peak for the precision the step runs in.

The peaks are the vendors' datasheet figures for DENSE math (no 2:4 sparsity), tensor cores with fp32
accumulation where the datasheet separates it (GeForce cards run fp16/bf16 with fp32 accumulation at
half their fp16-accumulate rate). A mixed-precision step still runs some work in fp32 (losses, norms,
the optimizer), so its fraction of the bf16/fp16 peak is a lower bound of how well the matmuls and
convs use the card. FlopCounterMode counts matmuls and convolutions (forward and backward), not
elementwise work.
"""

from __future__ import annotations

from collections.abc import Callable

from torch.utils.flop_counter import FlopCounterMode

# card name fragment (first match wins: the longer names first) -> TFLOP/s per math mode
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100 PCIe": {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0},
    "H100 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.0, "fp16": 835.0},
    "H100": {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},  # SXM5 (H100 80GB HBM3)
    "H200": {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},  # SXM, same compute as H100 SXM
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


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs (matmul and conv, forward and backward) of one call of `fn`."""
    counter = FlopCounterMode(display=False)
    with counter:
        fn()
    return int(counter.get_total_flops())
