"""Monotonic alignment search: numba (item by item on the CPU) against the batched PyTorch version,
side by side in one process, at VITS / cloning batch sizes (tts/alignment.py; bench/README.md has the table).

For each (tokens x frames) size, batch 64 by default, each item's lengths drawn between 80 % and 100 % of
the padded size (a length bucket): ms per call of `maximum_path_numba` and of `maximum_path_torch` (float64,
the default, and float32), and numba / torch (above 1: torch is faster). On CUDA numba's time includes
the copies to the host and back, and the wait for the GPU, as the training step pays it. Each size also
checks that the two paths are equal (float64), and counts the ops one torch call dispatches: on a GPU each is
a kernel launch, and a loop of small launches is bound by them, not by the arithmetic (the CPU's time says
little about the GPU's there).

    python -m bench.bench_mas [--batch 64] [--sizes 60x172,100x344,200x688,300x1034] [--repeats 3]
                              [--device cpu|cuda|all] [--threads 1]
"""

from __future__ import annotations

import argparse

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bench.timing import seconds_per_step
from tts.alignment import implementation_for, maximum_path_numba, maximum_path_torch

SIZES = "60x172,100x344,200x688,300x1034"


def batch_at(batch: int, n_text: int, n_frames: int, device: torch.device,
             seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random log-likelihoods [B, n_text, n_frames] and a 0/1 mask with per-item lengths 80-100 % of the size."""
    g = torch.Generator().manual_seed(seed)
    value = torch.randn(batch, n_text, n_frames, generator=g) * 10
    t_frames = (n_frames * (0.8 + 0.2 * torch.rand(batch, generator=g))).long().clamp(1, n_frames)
    t_text = torch.minimum((n_text * (0.8 + 0.2 * torch.rand(batch, generator=g))).long().clamp(1, n_text), t_frames)
    mask = (torch.arange(n_text)[None, :, None] < t_text[:, None, None]) & (
        torch.arange(n_frames)[None, None, :] < t_frames[:, None, None])
    return value.to(device), mask.float().to(device)


class OpCount(TorchDispatchMode):
    """Counts the ATen ops dispatched inside it: all of them (`dispatches`: each costs the host a few µs,
    which bounds a loop of small ops) and those that compute (`ops`: about one kernel launch each on a GPU;
    views such as slices and permutes launch nothing)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = self.dispatches = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.dispatches += 1
        self.ops += not func.is_view
        return func(*args, **(kwargs or {}))


def op_count(fn, *args) -> OpCount:
    """The ops one call of `fn` dispatches."""
    with OpCount() as count:
        fn(*args)
    return count


def measure(device: torch.device, sizes: list[tuple[int, int]], batch: int, repeats: int) -> list[dict]:
    rows = []
    for n_text, n_frames in sizes:
        value, mask = batch_at(batch, n_text, n_frames, device)
        same = torch.equal(maximum_path_numba(value, mask), maximum_path_torch(value, mask))
        ms = {name: 1000 * seconds_per_step(lambda fn=fn, v=value, m=mask: fn(v, m), repeats, device)
              for name, fn in (("numba", maximum_path_numba), ("torch_fp64", maximum_path_torch),
                               ("torch_fp32", lambda v, m: maximum_path_torch(v, m, dtype=torch.float32)))}
        count = op_count(maximum_path_torch, value, mask)
        rows.append({"device": device.type, "size": f"{n_text}x{n_frames}", "same": same, "ops": count.ops,
                     "dispatches": count.dispatches, **ms})
        print(f"{device.type} {n_text}x{n_frames}: numba {ms['numba']:.1f} ms, torch fp64 {ms['torch_fp64']:.1f} ms, "
              f"fp32 {ms['torch_fp32']:.1f} ms, torch {count.ops} kernels / {count.dispatches} dispatches a call, "
              f"same path {same}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--sizes", default=SIZES, help="tokens x frames, comma separated")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per measurement, after one warm-up")
    ap.add_argument("--device", choices=("cpu", "cuda", "all"), default="all", help="all: the CPU, and CUDA if present")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (numba's MAS uses one)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    sizes = [tuple(int(n) for n in s.split("x")) for s in args.sizes.split(",")]
    devices = [torch.device("cpu")] if args.device in ("cpu", "all") else []
    if args.device == "cuda" or (args.device == "all" and torch.cuda.is_available()):
        devices.append(torch.device("cuda"))
    rows = [row for device in devices for row in measure(device, sizes, args.batch, args.repeats)]
    print(f"\nbatch {args.batch}, ms per call (mean of {args.repeats} after one warm-up), torch threads {args.threads}; "
          "ratio = numba / torch fp64 (above 1: torch faster)")
    print("| device | tokens x frames | numba | torch fp64 | torch fp32 | numba / torch "
          "| torch kernels / dispatches a call | same path | maximum_path uses |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        used = implementation_for(torch.device(r["device"])).__name__
        print(f"| {r['device']} | {r['size']} | {r['numba']:.1f} | {r['torch_fp64']:.1f} | {r['torch_fp32']:.1f} | "
              f"{r['numba'] / r['torch_fp64']:.2f}x | {r['ops']} / {r['dispatches']} | {'yes' if r['same'] else 'NO'} | {used} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
