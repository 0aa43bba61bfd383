"""What the 4090 guide's VITS speed keys do here, measured (tts/README.md quotes the output):

1. Bucket shapes (``cudnn_benchmark`` on CUDA, ``compile``): over one epoch of a synthetic corpus
   (10,000 utterances, log-normal durations, median 5 s, 0.5-15 s; ~14 letters/s, blanks doubling
   the tokens), batch 64, ``data.num_buckets`` 8: how many distinct (text, frames) batch shapes
   cudnn.benchmark would autotune (or torch.compile would compile), and the padded fraction of the
   frames, with padding to the longest item (no bucket shapes) vs to the bucket's fixed shape.
2. ``channels_last`` on the period critics (the only 4-D convs in VITS): forward + backward time of
   the vits_base critics on one 32-frame crop (8192 samples), contiguous vs channels_last,
   interleaved repeats, median.
3. With ``--demo_eval`` (after ``make tts-demo``): evaluation of the demo checkpoint's held-out items
   one by one vs in one batch (``eval_batch_size``): time (best of 2) and whether the metrics agree.

    python -m bench.bench_vits_rtx [--repeats 5] [--device cpu|cuda] [--demo_eval]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from common.data import BucketBatchSampler, BucketShapes


def shape_counts(n: int = 10_000, batch: int = 64, buckets: int = 8, hop: int = 256, sr: int = 22050) -> dict:
    rng = np.random.default_rng(0)
    seconds = np.clip(rng.lognormal(np.log(5.0), 0.5, n), 0.5, 15.0)
    frames = (seconds * sr / hop).astype(int).tolist()
    tokens = (2 * np.maximum(2, seconds * rng.normal(14, 2, n)) + 1).astype(int).tolist()
    sampler = BucketBatchSampler(frames, batch, buckets, shuffle=True, seed=0, num_replicas=1, rank=0, drop_last=True)
    shapes = BucketShapes(frames, tokens, sampler.boundaries)
    exact, bucketed = set(), set()
    real = pad_exact = pad_bucket = 0
    for keys in sampler:
        idx = [k[0] for k in keys]
        f, t = max(frames[i] for i in idx), max(tokens[i] for i in idx)
        exact.add((t, f))
        bt, bf = shapes.shape_for(f, t)
        bucketed.add((bt, bf))
        real += sum(frames[i] for i in idx)
        pad_exact += f * len(idx)
        pad_bucket += bf * len(idx)
    return {"batches": len(sampler), "shapes_exact": len(exact), "shapes_bucketed": len(bucketed),
            "padding_exact": 1 - real / pad_exact, "padding_bucketed": 1 - real / pad_bucket}


def channels_last_times(device: torch.device, repeats: int) -> dict:
    from vocoder.discriminators import PeriodDiscriminator

    torch.manual_seed(0)
    critics = [PeriodDiscriminator(p).to(device) for p in (2, 3, 5, 7, 11)]
    y = torch.randn(1, 1, 32 * 256, device=device)

    def step() -> float:
        t = time.perf_counter()
        for c in critics:
            score, fmap = c(y)
            (score.sum() + sum(f.sum() for f in fmap)).backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t

    out: dict[str, list[float]] = {"contiguous": [], "channels_last": []}
    step()  # warm-up
    for _ in range(repeats):
        for layout in out:
            fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
            for c in critics:
                c.to(memory_format=fmt)
            out[layout].append(step())
    return {k: statistics.median(v) for k, v in out.items()}


def demo_eval_batching(device: torch.device, data: str = "data/demo/tts_prepared",
                       ckpt_dir: str = "runs/tts_demo/checkpoints") -> None:
    from pathlib import Path

    from common.checkpoint import load_checkpoint
    from common.config import load_config
    from tts.vits.config import TrainConfig
    from tts.vits.data import VitsDataset, read_speakers
    from tts.vits.evaluation import evaluate
    from tts.vits.train import build_mel, build_models

    cfg = load_config("tts/vits/configs/demo.yaml", TrainConfig)
    ds = VitsDataset(data, "eval", cfg.audio)
    gen, _ = build_models(cfg, len(read_speakers(data)))
    ckpt = sorted(Path(ckpt_dir).glob("vits_*.pt"))[-1]
    gen.load_state_dict(load_checkpoint(ckpt)["models"]["generator"])
    gen.to(device)
    times: dict[int, list[float]] = {1: [], len(ds): []}
    metrics = {}
    for _ in range(2):
        for bs in times:
            t = time.perf_counter()
            metrics[bs] = evaluate(gen, ds, build_mel(cfg), device, 32, batch_size=bs)
            times[bs].append(time.perf_counter() - t)
    same = all(abs(metrics[1][k] - metrics[len(ds)][k]) < 1e-4 for k in metrics[1])
    print(f"evaluation of {len(ds)} held-out items ({ckpt.name}) on {device}: one by one {min(times[1]):.2f} s, "
          f"batch {len(ds)} {min(times[len(ds)]):.2f} s; metrics equal within 1e-4: {same}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--demo_eval", action="store_true", help="also time batched evaluation on the demo checkpoint")
    a = p.parse_args(argv)
    s = shape_counts()
    print(f"bucket shapes, one epoch of {s['batches']} batches of 64: distinct shapes {s['shapes_exact']} padded to "
          f"the longest item vs {s['shapes_bucketed']} padded to the bucket shape; padded frames "
          f"{100 * s['padding_exact']:.1f} % vs {100 * s['padding_bucketed']:.1f} %")
    t = channels_last_times(torch.device(a.device), a.repeats)
    print(f"period critics (vits_base) fwd+bwd on {a.device} ({torch.get_num_threads()} threads): contiguous "
          f"{1e3 * t['contiguous']:.0f} ms, channels_last {1e3 * t['channels_last']:.0f} ms "
          f"({t['contiguous'] / t['channels_last']:.2f}x)")
    if a.demo_eval:
        demo_eval_batching(torch.device(a.device))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
