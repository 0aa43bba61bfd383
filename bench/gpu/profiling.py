"""`make gpu-check` sections 3 and 4: where one vocoder step's time goes (torch.profiler) and what holds its
memory at the peak (the CUDA caching allocator's history).

Section 3 profiles the 5090 config in bf16 (the shapes of section 2's "ours") after warm-up steps: the top
kernels by self CUDA time, the GPU's idle share (1 - the union of kernel / copy intervals over the steps'
wall time), kernels per step, and host syncs per step, counted two ways: the profiler's
cudaStreamSynchronize / cudaDeviceSynchronize / cudaEventSynchronize calls and device-to-host copies inside
the steps, and the warnings of `torch.cuda.set_sync_debug_mode("warn")` over one more step. A step that
syncs leaves the GPU idle while the host catches up; a step of many small kernels is launch-bound.
On the CPU (dry run) the same code profiles CPU ops: top ops by self CPU time, ops per step.

Section 4 records the allocator's history (`torch.cuda.memory._record_memory_history`) over one step of
base_hifi_gpu.yaml in plain 32-true (no autotuning), with TF32 and in IEEE fp32, replays it to the moment
of the peak and lists the largest live allocations with a short stack. The second lent H200 saw 43.9 GiB in
IEEE fp32 against 15.3 GiB in TF32 and blamed cuDNN's heuristic workspaces: this names them. The vocoder's
critic update is one call on cat([real, fake]) (vocoder/train.py has no switch for two), so it is
measured as one call."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from bench.gpu.base import Check, OverBudget, Section
from bench.gpu.trainers import TRAINERS, build

REPO = Path(__file__).resolve().parents[2]
STEP_RANGE = "gpu_check_step"
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
TOP = 15


# ---------------------------------------------------------------------------------------- 3 step profile
def _intervals_union_us(spans: list[tuple[float, float]]) -> float:
    """Total length covered by the (start, end) spans: concurrent kernels count once."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(spans):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def summarize_profile(events, steps: int, wall_s: float, cuda: bool, top: int = TOP) -> dict:
    """Numbers of the profiled steps from the profiler's events (`prof.events()`): see the module docstring.
    Only what happened inside the `STEP_RANGE` ranges counts (the closing sync is outside them)."""
    from torch.autograd import DeviceType

    ranges = [(e.time_range.start, e.time_range.end) for e in events if e.name == STEP_RANGE
              and e.device_type == DeviceType.CPU]

    def inside(e) -> bool:
        return any(s <= e.time_range.start <= t for s, t in ranges)

    if cuda:
        # a record_function range has a device-side twin spanning its kernels: a user annotation, not work
        device = [e for e in events if e.device_type == DeviceType.CUDA and not e.is_user_annotation]
        busy_us = _intervals_union_us([(e.time_range.start, e.time_range.end) for e in device])
        kernels = [e for e in device if not e.name.startswith(("Memcpy", "Memset"))]
        by_name: dict[str, list[float]] = {}
        for e in kernels:
            by_name.setdefault(e.name, []).append(e.time_range.elapsed_us())
        total = sum(sum(v) for v in by_name.values()) or 1.0
        top_rows = [{"name": n[:160], "self_ms_per_step": sum(v) / 1e3 / steps, "share": sum(v) / total,
                     "calls_per_step": len(v) / steps}
                    for n, v in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]]
        syncs = [e for e in events if e.device_type == DeviceType.CPU and e.name in SYNC_CALLS and inside(e)]
        d2h = [e for e in device if e.name.startswith("Memcpy DtoH")]
        return {"what": "CUDA kernels", "top": top_rows, "kernels_per_step": len(kernels) / steps,
                "busy_ms_per_step": busy_us / 1e3 / steps, "wall_ms_per_step": 1e3 * wall_s / steps,
                "gpu_idle_share": max(0.0, 1 - busy_us / 1e6 / wall_s),
                "sync_calls_per_step": len(syncs) / steps, "d2h_copies_per_step": len(d2h) / steps,
                "sync_calls_by_name": {n: sum(e.name == n for e in syncs) / steps for n in SYNC_CALLS}}
    ops = [e for e in events if e.device_type == DeviceType.CPU and e.name != STEP_RANGE and inside(e)]
    by_name = {}
    for e in ops:
        by_name.setdefault(e.name, []).append(e.self_cpu_time_total)
    total = sum(sum(v) for v in by_name.values()) or 1.0
    top_rows = [{"name": n[:160], "self_ms_per_step": sum(v) / 1e3 / steps, "share": sum(v) / total,
                 "calls_per_step": len(v) / steps}
                for n, v in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]]
    return {"what": "CPU ops (CPU dry run)", "top": top_rows, "kernels_per_step": len(ops) / steps,
            "wall_ms_per_step": 1e3 * wall_s / steps, "gpu_idle_share": None, "sync_calls_per_step": None,
            "d2h_copies_per_step": None}


def count_sync_warnings(step: Callable[[], object]) -> int:
    """Synchronizing CUDA calls in one `step()`: `torch.cuda.set_sync_debug_mode("warn")` warns at each."""
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    return sum("synchroniz" in str(w.message).lower() for w in caught)


def section_step_profile(chk: Check, sec: Section) -> None:
    from torch.profiler import ProfilerActivity, profile, record_function

    spec = TRAINERS["vocoder"]
    warmup, steps = (1, 1) if chk.dry else (3, 2)
    with sec.phase("build"):
        st = build(spec, "rtx5090", ["precision=bf16-mixed"], chk.data(spec), chk.run_dir("vocoder_profile"),
                   chk.device, chk.dry)
    with sec.phase("batches"):
        it = st.batches()
        batches = [next(it) for _ in range(warmup + steps + 1)]  # fetched first: no loader wait in the profile
    for i, b in enumerate(batches[:warmup]):  # past the section's budget too: the set-up is paid (MIN_TIMED)
        sec.check_time(f"profile warm-up {i}", finishing=True)
        with sec.phase(f"warm-up step {i}"):
            st.step(b)
            chk.sync()
    sec.check_time("profiled steps", finishing=True)
    cuda = chk.device.type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for b in batches[warmup:warmup + steps]:
            with record_function(STEP_RANGE):
                st.step(b)
        chk.sync()
        wall = time.perf_counter() - t0
    summary = summarize_profile(prof.events(), steps, wall, cuda)
    summary["sync_debug_warnings_per_step"] = (count_sync_warnings(lambda: st.step(batches[-1])) if cuda
                                               else "n/a on CPU: set_sync_debug_mode watches CUDA calls")
    cfg = st.trainer.cfg
    sec.data.update(config=f"{spec.rtx.name} + precision=bf16-mixed", batch=st.batch_size,
                    crop_mel_frames=cfg.crop_mel_frames, warmup=warmup, steps=steps, **summary)
    label = "CPU dry run: CPU ops, tiny sizes (no kernels, no GPU idle time, no syncs on a CPU)" if not cuda else ""
    idle = summary["gpu_idle_share"]
    sec.markdown += [
        f"{spec.rtx.name} in bf16-mixed, batch {st.batch_size} x {cfg.crop_mel_frames} frames; {steps} profiled steps "
        f"after {warmup}, batches fetched beforehand. {label}", "",
        f"- wall per step: {summary['wall_ms_per_step']:.1f} ms" + (
            f"; GPU busy {summary['busy_ms_per_step']:.1f} ms, **idle {100 * idle:.1f} %**" if cuda else ""),
        f"- {'kernels' if cuda else 'CPU ops (kernels = ops on the CPU dry run)'} per step: "
        f"**{summary['kernels_per_step']:.0f}**",
        "- host syncs per step: " + (f"**{summary['sync_calls_per_step']:g}** sync calls "
                                     f"({', '.join(f'{k} {v:g}' for k, v in summary['sync_calls_by_name'].items() if v)}"
                                     f"), {summary['d2h_copies_per_step']:g} device-to-host copies; "
                                     f"set_sync_debug_mode('warn'): {summary['sync_debug_warnings_per_step']} "
                                     "warnings in one more step" if cuda else "n/a on CPU"),
        "", f"| top {'kernel by self CUDA time' if cuda else 'op by self CPU time (CPU dry run)'} | ms / step "
        "| share | calls / step |", "|---|---|---|---|"]
    sec.markdown += [f"| `{r['name'][:100]}` | {r['self_ms_per_step']:.3f} | {100 * r['share']:.1f} % "
                     f"| {r['calls_per_step']:g} |" for r in summary["top"]]


# ---------------------------------------------------------------------------------------- 4 memory at the peak
def _short_stack(frames: list[dict], keep: int = 4) -> str:
    """The innermost frame and the repository's own frames (outside bench/gpu), innermost first."""
    ours = [f for f in frames if str(REPO) in f.get("filename", "") and "/bench/gpu/" not in f["filename"]]
    picked = ([frames[0]] if frames else []) + [f for f in ours[:keep] if not frames or f is not frames[0]]
    return " < ".join(f"{Path(f['filename']).name}:{f['line']} {f['name']}" for f in picked) or "(no Python frame)"


def peak_allocations(trace: list[dict], top: int = 10) -> dict:
    """Replays one device's allocator trace (`torch.cuda.memory._snapshot()["device_traces"][i]`) to the
    moment its live bytes peak; returns that peak (bytes above what was live when recording began) and the
    `top` largest allocations live then, with their stacks. An allocation stays live until its
    `free_completed` (the allocator's own moment of reuse)."""
    live: dict[int, dict] = {}
    now = peak = 0
    at_peak: list[dict] = []
    for e in trace:
        action = e.get("action")
        if action == "alloc":
            live[e["addr"]] = e
            now += e["size"]
            if now > peak:
                peak, at_peak = now, list(live.values())
        elif action == "free_completed" and e["addr"] in live:
            now -= live.pop(e["addr"])["size"]
    biggest = sorted(at_peak, key=lambda a: -a["size"])[:top]
    return {"peak_above_start_bytes": peak, "live_at_peak": len(at_peak),
            "top": [{"mib": a["size"] / 2**20, "stack": _short_stack(a.get("frames") or [])} for a in biggest]}


def memory_row(chk: Check, sec: Section, label: str, overrides: list[str]) -> dict:
    """One step of the vocoder's base config recorded by the allocator (CUDA); on the CPU the same build
    and step, and the replay of an empty trace."""
    spec = TRAINERS["vocoder"]
    sec.check_time(f"memory {label}")
    with sec.phase(f"{label}: build"):
        st = build(spec, "base", [*spec.plain, *overrides], chk.data(spec), chk.run_dir("vocoder_memory"),
                   chk.device, chk.dry)
    it = st.batches()
    with sec.phase(f"{label}: first step"):
        st.step(next(it))  # cuDNN's first calls, the optimizer states
        chk.sync()
    batch = next(it)
    chk.reset_memory()
    if chk.device.type != "cuda":
        st.step(batch)
        return {"skipped": "n/a on CPU: the CUDA caching allocator's history (the step and the replay ran)",
                **peak_allocations([])}
    start = torch.cuda.memory_allocated(chk.device)
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python", max_entries=500_000)
    try:
        st.step(batch)
        chk.sync()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    traces = snapshot.get("device_traces") or [[]]
    found = peak_allocations(traces[chk.device.index or 0])
    found.update(start_gib=start / 2**30, peak_gib=chk.peak_gib(), batch=st.batch_size,
                 replayed_peak_gib=(start + found["peak_above_start_bytes"]) / 2**30,
                 trace_events=len(traces[chk.device.index or 0]))
    return found


MEMORY_ROWS = [("TF32", ["tf32=true"]), ("IEEE fp32", ["tf32=false"])]


def section_vocoder_memory(chk: Check, sec: Section) -> None:
    spec = TRAINERS["vocoder"]
    rows: dict[str, dict] = {}
    sec.data.update(config=f"{spec.base.name}, plain 32-true, no cuDNN autotuning",
                    critic_update="one call on cat([real, fake]): vocoder/train.py has no switch for two calls",
                    rows=rows)
    labels = MEMORY_ROWS if chk.device.type == "cuda" else MEMORY_ROWS[1:]  # TF32: a CUDA math mode
    if chk.device.type != "cuda":
        rows["TF32"] = {"skipped": "n/a on CPU: TF32 is a CUDA tensor-core math mode"}
    for label, overrides in labels:
        try:
            rows[label] = memory_row(chk, sec, label, overrides)
        except OverBudget as e:
            rows[label] = {"skipped": str(e)}
            sec.partial(str(e))
        chk.reset_memory()
        chk.progress()
    sec.markdown += [f"{spec.base.name}, every other speed key off (32-true, no autotuning), one step recorded after "
                     "one; the critic update is one call on cat([real, fake]) (no switch for two in vocoder/train.py). "
                     "Start = live before the step (weights, optimizer states); the largest allocations live at the "
                     "replayed peak, innermost frame first, then ours.", ""]
    for label, r in rows.items():
        if "start_gib" not in r:
            sec.markdown += [f"### {label}", "", r.get("skipped", ""), ""]
            continue
        sec.markdown += [f"### {label}: peak {r['peak_gib']:.2f} GiB (replayed {r['replayed_peak_gib']:.2f}; "
                         f"{r['start_gib']:.2f} before the step), {r['live_at_peak']} allocations live at the peak", "",
                         "| MiB | stack |", "|---|---|"]
        sec.markdown += [f"| {a['mib']:.1f} | {a['stack']} |" for a in r["top"]] + [""]
