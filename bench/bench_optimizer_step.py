"""One optimizer step of the vocoder's base generator and critics (base_hifi_gpu.yaml) on this machine:
MuonAdamW with Newton–Schulz one weight at a time vs batched over the weights of one shape
(`batched_ns`), and torch's AdamW per-tensor (the CPU default) vs foreach vs fused, with and without the
device-side skip of `common.training.step_if_finite`. Gradients are random and fixed; only the optimizer's
step is timed (bench/timing.py's rule). Results: bench/README.md, "Optimizer step".

    python -m bench.bench_optimizer_step [--threads 2] [--steps 5] [--device cpu]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

from bench.timing import seconds_per_step
from common.config import load_config
from common.muon import MuonAdamW
from common.training import step_if_finite
from vocoder.build import build_discriminator, build_generator
from vocoder.config import VocoderConfig


def _with_grads(model: torch.nn.Module) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(0)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen).to(p.device) * 1e-3
    return model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    from bench.bench_vocoder import BASE

    cfg = load_config(BASE, VocoderConfig)
    models = {"generator": build_generator(cfg).to(device), "critics": build_discriminator(cfg).to(device)}
    finite = torch.ones((), dtype=torch.bool, device=device)
    for name, model in models.items():
        _with_grads(model)
        n = sum(p.numel() for p in model.parameters()) / 1e6
        rows: dict[str, Callable[[], None]] = {}
        for batched in (False, True):
            opt = MuonAdamW(model, lr=1e-4, batched_ns=batched, fused=False)
            rows[f"MuonAdamW, NS {'batched by shape' if batched else 'one weight at a time'}"] = \
                lambda opt=opt: step_if_finite(opt, finite)
        params = list(model.parameters())
        for label, kw in (("per-tensor", {"foreach": False}), ("foreach", {"foreach": True}), ("fused", {"fused": True})):
            opt = torch.optim.AdamW(params, lr=1e-4, **kw)
            rows[f"AdamW {label}, plain step"] = opt.step
            opt2 = torch.optim.AdamW(params, lr=1e-4, **kw)
            rows[f"AdamW {label}, device-side skip"] = lambda opt2=opt2: step_if_finite(opt2, finite)
        for label, step in rows.items():
            ms = 1e3 * seconds_per_step(step, args.steps, device, warmup=2)
            print(f"{name} ({n:.1f} M parameters) | {label} | {ms:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
