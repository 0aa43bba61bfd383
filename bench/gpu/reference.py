"""`make gpu-check` section 2: openvpi/SingingVocoders at its own defaults beside our fastest shipped vocoder
config, on identical batches, in audio-seconds per second: the denominator of "2× SingingVocoders".

Theirs: their `Generator` / MSD / MPD / `HiFiloss` and step order (bench/vocoder_reference.py, from the
checkout `--reference-dir`, never committed) at the base width (base_hifi_gpu.yaml + the reference recipe:
AdamW, no STFT loss, no clipping), in THEIR defaults: `32-true` (Lightning's plain fp32), TF32 convolutions
and IEEE fp32 matmuls (PyTorch's own defaults, which SingingVocoders never changes) and no cuDNN autotuning.
Ours: the RTX 5090 config as shipped (16-mixed, batch 32 x 80 frames, 1024-channel generator, Muon, TF32,
cudnn_benchmark), our fastest shipped config. Both sides take the same batch tensors from our 5090 config's
loader, one after the other, and each runs under its own backend flags (they are process-global: our build
sets ours, `their_flags` sets theirs around their step and puts ours back).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch

from bench.gpu.base import Check, Section, fmt
from bench.gpu.trainers import TRAINERS, build

# PyTorch's defaults, as SingingVocoders trains (it sets none of these): TF32 convs, IEEE matmuls, no autotuning
THEIR_DEFAULTS = {"precision": "32-true", "conv": "tf32", "matmul": "ieee", "cudnn_benchmark": False}
TARGET = 2.0  # the goal: our fastest shipped config at 2x their audio-seconds per second


def _flags() -> dict:
    return {"conv": torch.backends.cudnn.conv.fp32_precision, "matmul": torch.backends.cuda.matmul.fp32_precision,
            "cudnn_benchmark": torch.backends.cudnn.benchmark}


def _set(flags: dict) -> None:
    # only the fp32_precision setters: mixing them with the legacy allow_tf32 getters raises (DESIGN.md)
    torch.backends.cudnn.conv.fp32_precision = flags["conv"]
    torch.backends.cuda.matmul.fp32_precision = flags["matmul"]
    torch.backends.cudnn.benchmark = flags["cudnn_benchmark"]


@contextlib.contextmanager
def their_flags() -> Iterator[None]:
    """SingingVocoders' math around their step, ours restored after it."""
    ours = _flags()
    _set(THEIR_DEFAULTS)
    try:
        yield
    finally:
        _set(ours)


def _timed(chk: Check, step, batch: dict) -> tuple[float, float | None]:
    """Seconds of one synchronised step and its peak memory (GiB, None on the CPU)."""
    if chk.device.type == "cuda":  # the peak only: emptying the cache would time cudaMalloc too
        torch.cuda.reset_peak_memory_stats(chk.device)
    chk.sync()
    t0 = time.perf_counter()
    step(batch)
    chk.sync()
    return time.perf_counter() - t0, chk.peak_gib()


def section_reference(chk: Check, sec: Section) -> None:
    from bench.vocoder_reference import REFERENCE_RECIPE, ReferenceTrainer, import_reference, reference_config

    steps, warmup = (2, 1) if chk.dry else (10, 3)
    spec = TRAINERS["vocoder"]
    with sec.phase("data"):
        data = chk.data(spec)
    with sec.phase("build ours"):
        ours = build(spec, "rtx5090", [], data, chk.run_dir("vocoder_ours_5090"), chk.device, chk.dry)
    # theirs at the base width (the recipe's 128 channels are the CPU demo's), built from the base config
    recipe = [o for o in REFERENCE_RECIPE if not o.startswith("model_args.upsample_initial_channel=")]
    base_cfg = spec._config(spec.base, [*spec.tiny(), *recipe] if chk.dry else recipe)
    with sec.phase("build theirs"):
        ref = ReferenceTrainer(import_reference(chk.reference_dir), base_cfg, base_cfg.seed)
        for module in (ref.generator, ref.discriminator, ref.mix_loss):
            module.to(chk.device)  # parameters keep their identity: the optimizers built on the CPU still hold them
    same = {k: v for k, v in reference_config(ours.trainer.cfg).items() if k.startswith(("audio_", "hop", "fft", "win"))}
    if same != {k: v for k, v in reference_config(base_cfg).items() if k in same}:
        raise RuntimeError(f"the 5090 and base configs differ in audio settings: {same}")

    def theirs(batch: dict) -> None:  # host-to-device copies inside the step on both sides
        with their_flags():
            ref.reference_step({k: batch[k].to(chk.device, non_blocking=True) for k in ("mel", "f0", "audio")})

    it = ours.batches()
    sides = {"ours (5090 config as shipped)": ours.step, "SingingVocoders (its defaults)": theirs}
    times: dict[str, list[float]] = {k: [] for k in sides}
    peaks: dict[str, float | None] = {k: None for k in sides}
    audio_s = 0.0
    sr = ours.trainer.cfg.audio.sample_rate
    for i in range(warmup + steps):
        done = sec.timed_steps_left(i, warmup, steps, "reference step")
        if done is not None:
            steps = done
            break
        batch = next(it)
        for name, step in sides.items():  # interleaved, the same batch: drift in the card's clocks hits both
            seconds, peak = _timed(chk, step, batch)
            if i == 0:  # cuDNN's first calls (ours autotunes every conv), the optimizer states
                sec.record_phase(f"first step {name.split(' (')[0]}", seconds)
            if i >= warmup:
                times[name].append(seconds)
                peaks[name] = peak if peaks[name] is None else max(peaks[name], peak)
        if i >= warmup:
            audio_s += batch["audio"].numel() / sr  # [B, 1, samples] or [B, samples]: every sample is audio
        chk.progress()
    rows = {}
    for name, t in times.items():
        rows[name] = {"median_step_s": sorted(t)[len(t) // 2], "audio_s_per_s": audio_s / sum(t),
                      "peak_gib": peaks[name]}
    o, t = rows["ours (5090 config as shipped)"], rows["SingingVocoders (its defaults)"]
    ratio = o["audio_s_per_s"] / t["audio_s_per_s"]
    cfg = ours.trainer.cfg
    sec.data.update({
        "ours": {"config": spec.rtx.name, "precision": cfg.precision, "tf32": cfg.tf32,
                 "cudnn_benchmark": cfg.cudnn_benchmark, "generator_channels": cfg.model_args.upsample_initial_channel},
        "theirs": {"config": f"{spec.base.name} + the reference recipe", **THEIR_DEFAULTS,
                   "generator_channels": base_cfg.model_args.upsample_initial_channel},
        "batch": ours.batch_size, "crop_mel_frames": cfg.crop_mel_frames, "audio_s_per_step": audio_s / steps,
        "steps": steps, "warmup": warmup, "rows": rows, "ours_over_theirs": ratio, "target": TARGET,
        "denominator_audio_s_per_s": t["audio_s_per_s"]})
    sec.markdown[:] = [
        f"The same batches ({ours.batch_size} x {cfg.crop_mel_frames} mel frames = {audio_s / steps:.2f} s of audio a "
        f"step, from our 5090 config's loader) through both steps, alternating; {steps} timed steps each after "
        f"{warmup}. Ours: {spec.rtx.name} as shipped ({cfg.precision}, TF32 {cfg.tf32}, cudnn_benchmark "
        f"{cfg.cudnn_benchmark}, {cfg.model_args.upsample_initial_channel}-channel generator). SingingVocoders: its "
        f"networks, losses and step order at {base_cfg.model_args.upsample_initial_channel} channels, in its "
        "defaults: 32-true, TF32 convs, IEEE matmuls, no cuDNN autotuning."
        + (" DRY RUN: tiny sizes on the CPU (no TF32 there); the numbers say nothing about a GPU." if chk.dry else ""),
        "", "| side | median step s | audio s / s | peak GiB |", "|---|---|---|---|"]
    for name, r in rows.items():
        sec.markdown.append(f"| {name} | {r['median_step_s']:.4f} | {r['audio_s_per_s']:.3g} | {fmt(r['peak_gib'], '.2f')} |")
    sec.markdown += ["", f"**Ours / theirs: {ratio:.2f}x** in audio-seconds per second (the issue's target: "
                     f"{TARGET:g}x, i.e. {TARGET * t['audio_s_per_s']:.3g} audio s / s on this card)."]
