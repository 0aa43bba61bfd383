"""`make gpu-check` section 5: the monotonic alignment search's share of a VITS training step at realistic
lengths (8-second items; the step tables' synthetic corpus has 2-second ones, where MAS is cheap).

`tts.vits.model.maximum_path` is wrapped for the timed steps: on CUDA two CUDA events around each call (the
GPU time from the stream reaching the call to its last kernel, no extra host sync: `maximum_path_torch`
runs on the device), on the CPU the call's wall time (numba). Share = MAS time / the step's wall time
(synchronised at its end). The config is uzbek_vits.yaml as shipped (bf16, cudnn_benchmark); the batch is
one batch of the trainer's own loader over 8-s items, repeated to the config's batch size (`tile_batch`)."""

from __future__ import annotations

import time
from unittest import mock

import torch

from bench.gpu.base import Check, Section
from bench.gpu.trainers import TRAINERS, build, tile_batch

ITEM_SECONDS = 8.0
# ~13 letters a second, a realistic speaking rate (prepare_data drops items under 4)
TEXT = " ".join(["bugun havo juda yaxshi edi"] * 4)


class MasTimer:
    """Wraps `maximum_path`: per-call time in ms once `collect()` runs after the step's sync."""

    def __init__(self, fn, cuda: bool) -> None:
        self.fn, self.cuda = fn, cuda
        self.pending: list = []
        self.calls_ms: list[float] = []
        self.shapes: list[tuple[int, ...]] = []

    def __call__(self, neg_cent: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        self.shapes.append(tuple(neg_cent.shape))
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = self.fn(neg_cent, mask)
            end.record()
            self.pending.append((start, end))
            return out
        t0 = time.perf_counter()
        out = self.fn(neg_cent, mask)
        self.calls_ms.append(1e3 * (time.perf_counter() - t0))
        return out

    def collect(self) -> float:
        """ms spent in MAS since the last collect (after a sync on CUDA)."""
        self.calls_ms += [s.elapsed_time(e) for s, e in self.pending]
        self.pending.clear()
        ms, self.calls_ms = sum(self.calls_ms), []
        return ms


def section_vits_mas(chk: Check, sec: Section) -> None:
    from bench.bench_tts import synthetic_corpus
    from tts import alignment
    from tts.vits import model as vits_model

    spec = TRAINERS["vits"]
    warmup, steps, items = (1, 1, 4) if chk.dry else (2, 4, 18)
    root = chk.tmp / "data_vits_8s"
    data = root / "p" if (root / "p").is_dir() else synthetic_corpus(root, items, seconds=ITEM_SECONDS, text=TEXT)
    sec.check_time("VITS build")
    loader_batch = 2 if chk.dry else 8  # the loader's batch (few 8-s items); tiled to the config's batch below
    with sec.phase("build"):
        st = build(spec, "base", [f"batch_size={loader_batch}"], data, chk.run_dir("vits_mas"), chk.device, chk.dry)
    size = 2 if chk.dry else spec._config(spec.base, [], data, chk.tmp).batch_size  # the shipped batch (64)
    batch = tile_batch(next(st.batches()), size)
    impl = alignment.implementation_for(chk.device).__name__
    timer = MasTimer(vits_model.maximum_path, chk.device.type == "cuda")
    step_s, mas_ms = [], []
    with mock.patch.object(vits_model, "maximum_path", timer):
        for i in range(warmup + steps):
            done = sec.timed_steps_left(i, warmup, steps, "VITS step")
            if done is not None:
                steps = done
                break
            chk.sync()
            t0 = time.perf_counter()
            st.step(batch)
            chk.sync()
            seconds, ms = time.perf_counter() - t0, timer.collect()
            if i >= warmup:
                step_s.append(seconds)
                mas_ms.append(ms)
            chk.progress()
    med = sorted(range(steps), key=lambda k: step_s[k])[steps // 2]
    share = sum(mas_ms) / 1e3 / sum(step_s)
    frames = batch["spec"].shape[-1]
    sec.data.update(config=spec.base.name, precision=st.precision, batch=size, item_seconds=ITEM_SECONDS,
                    text_len=int(batch["ids"].shape[-1]), frames=int(frames), implementation=impl,
                    mas_shape=list(timer.shapes[-1]) if timer.shapes else None, steps=steps, warmup=warmup,
                    step_s=step_s, mas_ms=mas_ms, median_step_s=step_s[med], mas_ms_at_median=mas_ms[med],
                    mas_share=share)
    sec.markdown += [
        f"{spec.base.name} as shipped ({st.precision}), batch {size} of {ITEM_SECONDS:g}-s items ({frames} spectrogram "
        f"frames, {batch['ids'].shape[-1]} symbols); {steps} timed steps after {warmup}. MAS: `{impl}` "
        + ("(CUDA events around each call)" if chk.device.type == "cuda" else "(wall time around each call; the CPU "
           "dry run at tiny sizes)"), "",
        "| median step s | MAS ms in that step | MAS share of the steps' time |", "|---|---|---|",
        f"| {step_s[med]:.4f} | {mas_ms[med]:.1f} | **{100 * share:.1f} %** |"]
