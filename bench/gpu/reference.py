"""`make gpu-check` section 7: openvpi/SingingVocoders' own generator + critic step beside ours on the
same card, batches, shapes and precision: the anchor our vocoder's users compare against.

Both sides are the vocoder's base GPU config (base_hifi_gpu.yaml: 512 channels, batch 16, full NSF
source, MPD + MSD) with every speed key off (fp32, no TF32, no cuDNN autotuning) and the reference
recipe of bench/vocoder_reference.py (AdamW, no STFT loss, no clipping), so the step does the same math
on both sides. Their networks, losses and step order come from the checkout (`--reference-dir`, never
committed: fetch it into the ignored `.ref/SingingVocoders` and carry it to the GPU machine)."""

from __future__ import annotations

import time

import torch

from bench.gpu.base import Check, Section, fmt
from bench.gpu.trainers import TRAINERS, build


def _timed(chk: Check, step, batch: dict) -> tuple[float, float | None]:
    """Seconds of one synchronised step and its peak memory (GiB, None on the CPU)."""
    if chk.device.type == "cuda":  # the peak only: emptying the cache would time cudaMalloc too
        torch.cuda.reset_peak_memory_stats(chk.device)
    chk.sync()
    t0 = time.perf_counter()
    step(batch)
    chk.sync()
    return time.perf_counter() - t0, chk.peak_gib()


# (label, overrides on top of plain): the math both sides share, set globally by our trainer's build
MATH = [("fp32 (IEEE)", []), ("TF32", ["tf32=true"])]


def side_by_side(chk: Check, sec: Section, extra: list[str]) -> dict:
    """Ours and theirs built from one config (+ `extra`), stepped alternately on the same batches."""
    from bench.vocoder_reference import REFERENCE_RECIPE, ReferenceTrainer, import_reference, parameter_counts

    steps, warmup = (2, 1) if chk.dry else (10, 3)
    spec = TRAINERS["vocoder"]
    # the reference recipe, at the base config's own width (the recipe's 128 channels are the CPU demo's)
    recipe = [o for o in REFERENCE_RECIPE if not o.startswith("model_args.upsample_initial_channel=")]
    st = build(spec, "base", [*spec.plain, *recipe, *extra], chk.data(spec), chk.run_dir("vocoder_reference"),
               chk.device, chk.dry)
    cfg = st.trainer.cfg
    ref = ReferenceTrainer(import_reference(chk.reference_dir), cfg, cfg.seed)
    for module in (ref.generator, ref.discriminator, ref.mix_loss):
        module.to(chk.device)  # parameters keep their identity: the optimizers built on the CPU still hold them

    def theirs(batch: dict) -> None:  # host-to-device copies inside the step on both sides
        ref.reference_step({k: batch[k].to(chk.device, non_blocking=True) for k in ("mel", "f0", "audio")})

    it = st.batches()
    sides = {"ours": st.step, "SingingVocoders": theirs}
    times: dict[str, list[float]] = {k: [] for k in sides}
    peaks: dict[str, float | None] = {k: None for k in sides}
    for i in range(warmup + steps):
        sec.check_time(f"reference step {i}")
        batch = next(it)
        for name, step in sides.items():  # interleaved, the same batch: drift in the card's clocks hits both
            seconds, peak = _timed(chk, step, batch)
            if i >= warmup:
                times[name].append(seconds)
                peaks[name] = peak if peaks[name] is None else max(peaks[name], peak)
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    return {"batch": cfg.batch_size, "crop_mel_frames": cfg.crop_mel_frames, "precision": cfg.precision,
            "params": parameter_counts(st.trainer, ref), "steps": steps, "warmup": warmup, "step_s": med,
            "peak_gib": peaks, "theirs_over_ours": med["SingingVocoders"] / med["ours"]}


def section_reference(chk: Check, sec: Section) -> None:
    spec = TRAINERS["vocoder"]
    rows: dict[str, dict] = {}
    sec.data.update({"config": f"{spec.base.name} + plain + the reference recipe", "rows": rows})
    for label, extra in MATH:
        if chk.device.type != "cuda" and extra:
            rows[label] = {"skipped": "n/a on CPU: TF32 is a CUDA tensor-core math mode"}
            continue
        rows[label] = side_by_side(chk, sec, extra)
        chk.progress()
    done = [r for r in rows.values() if "step_s" in r]
    first = done[0]
    sec.markdown[:] = [
        f"{spec.base.name}, every other speed key off, batch {first['batch']} x {first['crop_mel_frames']} mel "
        f"frames, the reference recipe (AdamW, no STFT loss, no clipping); median of {first['steps']} interleaved "
        f"steps each after {first['warmup']}, the same batches. Parameters: {first['params']}."
        + (" DRY RUN: tiny sizes on the CPU." if chk.dry else ""), "",
        "| math | ours step s | SingingVocoders step s | theirs / ours | ours peak GiB | theirs peak GiB |",
        "|---|---|---|---|---|---|"]
    for label, r in rows.items():
        if "skipped" in r:
            sec.markdown.append(f"| {label} | {r['skipped']} ||||| ")
            continue
        t, m = r["step_s"], r["peak_gib"]
        sec.markdown.append(f"| {label} | {t['ours']:.4f} | {t['SingingVocoders']:.4f} | {r['theirs_over_ours']:.2f} "
                            f"| {fmt(m['ours'], '.2f')} | {fmt(m['SingingVocoders'], '.2f')} |")
    sec.markdown += ["", "theirs / ours above 1: ours is faster."]
