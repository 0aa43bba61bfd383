"""`make gpu-check` section 6: the VAE at its real 1024-px profile (standard_1024.yaml, the default 5090
profile: bf16, TF32, cudnn_benchmark, channels_last, gradient checkpointing, GAN and LPIPS), with and
without channels_last and gradient checkpointing.

Why both keys: PyTorch's CUDA GroupNorm returns channels-first output for channels_last input
(pytorch#111824), so every GroupNorm of the VAE converts the layout back and forth and channels_last can be
a loss (0.87x alone in fp32 on the second lent H200); checkpointing trades recompute for memory, which at
1024 px decides the batch. All four rows run at one batch (`BATCH`, not the profile's 16, which the trainer
lowers to what fits) on one batch of the trainer's loader (1152-px PNGs cropped to 1024), so step times
compare; peak memory says what each key buys."""

from __future__ import annotations

import time

import torch

from bench.gpu.base import MIN_TIMED, Check, OverBudget, Section, fmt
from bench.gpu.trainers import TRAINERS, build

BATCH = 2
ROWS = [("as shipped (channels_last, checkpointing)", []),
        ("channels_last off", ["channels_last=false"]),
        ("checkpointing off", ["gradient_checkpointing=false"]),
        ("both off", ["channels_last=false", "gradient_checkpointing=false"])]


def vae_row(chk: Check, sec: Section, label: str, overrides: list[str], warmup: int, steps: int) -> dict:
    spec = TRAINERS["vae"]
    sec.check_time(f"VAE 1024 {label}")
    size = [] if chk.dry else [f"batch_size={BATCH}", "num_workers=2"]  # the loader feeds one batch only
    with sec.phase(f"{label}: build"):
        st = build(spec, "rtx5090", [*size, *overrides], chk.data(spec), chk.run_dir("vae_1024"), chk.device,
                   chk.dry)
        batch = next(st.batches())
    with sec.phase(f"{label}: warm-up"):
        for _ in range(warmup):
            st.step(batch)
        chk.sync()
    chk.reset_memory()
    times = []
    for i in range(steps):  # past the section's budget too once built (MIN_TIMED)
        sec.check_time(f"VAE 1024 {label} step {i}", finishing=i < MIN_TIMED)
        t0 = time.perf_counter()
        st.step(batch)
        chk.sync()
        times.append(time.perf_counter() - t0)
    cfg = st.trainer.cfg if hasattr(st.trainer, "cfg") else None
    step_s = sorted(times)[len(times) // 2]
    return {"batch": st.batch_size, "image_size": getattr(cfg, "image_size", None), "precision": st.precision,
            "step_s": step_s, "images_per_s": st.samples / step_s, "peak_gib": chk.peak_gib()}


def section_vae_1024(chk: Check, sec: Section) -> None:
    spec = TRAINERS["vae"]
    warmup, steps = (1, 1) if chk.dry else (2, 3)
    rows: dict[str, dict] = {}
    sec.data.update(config=spec.rtx.name, rows=rows)
    for label, overrides in ROWS:
        try:
            rows[label] = vae_row(chk, sec, label, overrides, warmup, steps)
        except OverBudget as e:
            rows[label] = {"skipped": str(e)}
            sec.partial(str(e))
        except torch.cuda.OutOfMemoryError:
            rows[label] = {"skipped": f"out of memory at batch {BATCH}"}
            chk.error(f"VAE 1024 {label}")
        chk.reset_memory()
        chk.progress()
    shipped = rows[ROWS[0][0]].get("step_s")
    first = next((r for r in rows.values() if "step_s" in r), {})
    sec.markdown += [f"{spec.rtx.name} ({first.get('precision', '?')}), {first.get('image_size', '?')}-px crops, batch "
                     f"{first.get('batch', '?')}, {steps} timed steps after {warmup} on one batch; x shipped = shipped "
                     "step time / row step time." + (" DRY RUN: tiny sizes on the CPU." if chk.dry else ""), "",
                     "| row | step s | images/s | x shipped | peak GiB |", "|---|---|---|---|---|"]
    for label, r in rows.items():
        if "step_s" not in r:
            sec.markdown.append(f"| {label} | {r['skipped']} |||| ")
            continue
        ratio = f"{shipped / r['step_s']:.2f}" if shipped else "-"
        sec.markdown.append(f"| {label} | {r['step_s']:.4f} | {r['images_per_s']:.2f} | {ratio} "
                            f"| {fmt(r['peak_gib'], '.2f')} |")
