"""What machine are we on, what will fit on it, and what to do when it does not.

- `hardware_report()` answers "will this torch run on my GPU?" before a long job starts
  (RTX 50xx cards need a torch built for sm_120; older wheels import fine and then fail on the
  first kernel, which is the most common first-day problem).
- `preset_name()` picks the card preset (`rtx4090 | rtx5090 | cpu`, or `auto` by the detected GPU);
  what each preset sets lives with each trainer (`common.presets.CardPresets`, applied by `--preset`).
- `find_batch_size()` measures the largest batch that fits instead of guessing.
- `is_oom()` / `oom_message()` turn a CUDA OOM traceback into the next settings to try.
"""

from __future__ import annotations

import contextlib
import gc
import os
import platform
import re
import shutil
import sys
from collections.abc import Callable, Iterator

import torch

GIB = 1024**3

# The card presets: settings a trainer keeps per card for them (`common.presets.CardPresets`, with its
# reasons). `auto` picks one of them by GPU memory (`preset_name`).
CARDS = ("rtx4090", "rtx5090", "cpu")  # rtx4090: 24 GB, Ada, sm_89; rtx5090: 32 GB, Blackwell, sm_120


# ----------------------------------------------------------------------------- detection


def _gpu_vram_gb(device: int = 0) -> float | None:
    """Total memory of one CUDA device in GB (10^9, as cards are sold), or None without CUDA."""
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(device).total_memory / 1e9


def _sm(capability: tuple[int, int]) -> str:
    return f"sm_{capability[0]}{capability[1]}"


def arch_support(capability: tuple[int, int], arch_list: list[str] | None = None) -> tuple[bool, str]:
    """Is this torch built for a GPU of `capability`? Returns (usable, explanation).

    CUDA binaries run on the same major architecture with an equal or higher minor number
    (sm_80 code runs on sm_86), and PTX (`compute_XY`) can be JIT-compiled for newer cards.
    """
    archs = torch.cuda.get_arch_list() if arch_list is None else arch_list
    want = _sm(capability)
    if not archs:
        return False, "this torch has no CUDA kernels (CPU-only build)"
    if want in archs:
        return True, f"yes ({want} kernels built in)"
    major, minor = capability
    parsed = [(a, m) for a in archs if (m := re.fullmatch(r"(sm|compute)_(\d+)", a))]  # skip sm_90a etc.
    same_major = [a for a, m in parsed
                  if m[1] == "sm" and int(m[2]) // 10 == major and int(m[2]) % 10 <= minor]
    if same_major:
        return True, f"yes ({same_major[-1]} kernels run on {want})"
    ptx = [a for a, m in parsed if m[1] == "compute" and int(m[2]) <= major * 10 + minor]
    if ptx:
        return True, f"only through PTX JIT ({ptx[-1]}): slow first start, consider a wheel with {want}"
    return False, f"NO: this torch has {', '.join(archs)} but not {want}"


def _cudnn_version() -> str | None:
    """cuDNN's integer version as text: 92400 -> 9.24.0 (cuDNN < 9 used major*1000)."""
    v = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    if not v:
        return None
    major, rest = (v // 10000, v % 10000) if v >= 90000 else (v // 1000, v % 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def _cpu_bf16() -> tuple[bool, str]:
    """Does the CPU do bf16 natively (AVX512-BF16 / AMX)? Without it bf16 is emulated and slow."""
    capability = torch.backends.cpu.get_cpu_capability()
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    native = sorted(flags & {"avx512_bf16", "amx_bf16"})
    if native:
        return True, f"native ({', '.join(native)}; torch kernels: {capability})"
    if not flags:  # not Linux: ask oneDNN (a private helper, hence guarded)
        try:
            if torch.ops.mkldnn._is_mkldnn_bf16_supported():
                return True, f"native per oneDNN (torch kernels: {capability})"
        except Exception:
            pass
    return False, f"emulated, slow (torch kernels: {capability}, no AVX512-BF16/AMX)"


def hardware_report() -> str:
    """A human-readable report of versions, GPUs, compatibility, CPU, disk and a verdict."""
    import torchvision  # imported here so `import common.hardware` stays light

    lines = [
        f"Python      {platform.python_version()} ({sys.executable})",
        f"torch       {torch.__version__}",
        f"torchvision {torchvision.__version__}",
    ]
    cuda_build = torch.version.cuda
    archs = torch.cuda.get_arch_list() if cuda_build else []
    if cuda_build:
        cudnn = _cudnn_version()
        lines.append(f"CUDA        {cuda_build} (build)   cuDNN {cudnn or 'not available'}")
        lines.append(f"GPU archs   {' '.join(archs) or 'none'}")
    else:
        lines.append("CUDA        CPU-only build of torch (no CUDA kernels at all)")
    sm120 = "has it" if "sm_120" in archs else "does NOT have it"
    lines.append(f"RTX 50xx    needs sm_120 (Blackwell): this torch {sm120}")

    problems: list[str] = []
    n_gpu = torch.cuda.device_count() if cuda_build and torch.cuda.is_available() else 0
    if n_gpu == 0:
        lines.append("GPUs        no CUDA device found: CPU-only machine" if cuda_build
                     else "GPUs        none usable (CPU-only build)")
    for i in range(n_gpu):
        p = torch.cuda.get_device_properties(i)
        cap = (p.major, p.minor)
        ok, why = arch_support(cap, archs)
        if not ok:
            problems.append(f"GPU {i} ({p.name}, {_sm(cap)}) is not supported by this torch")
        lines.append(f"GPU {i}       {p.name}  {p.total_memory / GIB:.1f} GiB  {_sm(cap)}  "
                     f"built for it: {why}")
    if n_gpu:
        try:  # may launch a tiny kernel, which fails on a GPU this torch was not built for
            bf16 = "supported" if torch.cuda.is_bf16_supported(including_emulation=False) else "NOT supported"
        except Exception as exc:
            bf16 = f"unknown ({type(exc).__name__})"
        lines.append(f"bf16        {bf16} on the GPU")
    cpu_bf16, why = _cpu_bf16()
    lines.append(f"CPU bf16    {why}")

    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    lines.append(f"CPUs        {os.cpu_count()} logical, {usable} usable by this process "
                 f"(torch threads: {torch.get_num_threads()})")
    du = shutil.disk_usage(os.getcwd())
    lines.append(f"Disk        {du.free / GIB:.1f} GiB free of {du.total / GIB:.1f} GiB in {os.getcwd()}")

    if problems:
        verdict = ("NOT READY: " + "; ".join(problems)
                   + ". Install a torch wheel built for your GPU (RTX 50xx: CUDA 12.8+ wheels with sm_120).")
    elif n_gpu:
        name = _preset_for_vram(_gpu_vram_gb(0))
        verdict = f"ready: {n_gpu} GPU(s) usable; `--preset auto` would pick '{name}'."
    else:
        verdict = ("CPU-only: no CUDA GPU, so training runs on the CPU (slowly) - fine for the tests and "
                   f"the demo, not for real training. `--preset auto` picks 'cpu'"
                   f"{'; bf16-mixed is fast on this CPU' if cpu_bf16 else ''}.")
    lines.append(f"Verdict     {verdict}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- presets


def _preset_for_vram(vram_gb: float | None) -> str:
    if vram_gb is None:
        return "cpu"
    if vram_gb >= 30:
        return "rtx5090"
    return "rtx4090"  # below 20 GB too, with a warning from preset_name


def preset_name(name: str, vram_gb: float | None = None, say: Callable[[str], None] = print) -> str:
    """`rtx4090 | rtx5090 | cpu` for `name`; `auto` picks by GPU memory (>= 30 GB -> rtx5090,
    otherwise rtx4090 with a warning below 20 GB, no CUDA -> cpu) and says what it picked.
    `vram_gb` overrides detection (tests, or planning for another machine)."""
    key = str(name).strip().lower()
    if key == "auto":
        vram = _gpu_vram_gb() if vram_gb is None else vram_gb
        key = _preset_for_vram(vram)
        if vram is None:
            say("[preset] auto: no CUDA GPU found, so the 'cpu' preset (small batches, fp32); training "
                "on the CPU is slow. `make check` says why no GPU is usable.")
        else:
            say(f"[preset] auto -> '{key}' (GPU with {vram:.0f} GB)")
        if vram is not None and vram < 20:
            say(f"[preset] warning: {vram:.0f} GB is less than the 24 GB preset assumes; if it runs out "
                "of memory, lower batch_size or use common.hardware.find_batch_size")
    if key not in CARDS:
        raise ValueError(f"unknown preset '{name}': valid presets are {', '.join(['auto', *CARDS])}")
    return key


# ----------------------------------------------------------------------------- OOM


def is_oom(exc: BaseException) -> bool:
    """True for a CUDA (or other accelerator) out-of-memory error, and for a tensor past a kernel's 2^31-element
    limit (`exceeds_int32_indexing`): a batch too large either way, with the same remedy."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    msg = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in msg or "cublas_status_alloc_failed" in msg
                                              or exceeds_int32_indexing(exc))


def exceeds_int32_indexing(exc: BaseException) -> bool:
    """A CUDA kernel that indexes with 32 bits refused a tensor of 2^31 elements or more (seen on an H200:
    "upsample_nearest_nhwc only supports grad_output tensors with less than INT_MAX elements" at 2048 px,
    batch 8, channels_last): memory would have fitted, the batch does not."""
    return isinstance(exc, RuntimeError) and "int_max" in str(exc).lower()


def cuda_memory_stats(device: int | torch.device | None = None) -> dict:
    """Allocated / reserved / peak / total GiB of a CUDA device; {} without CUDA. Does not sync."""
    if not torch.cuda.is_available():
        return {}
    return {
        "allocated_gib": torch.cuda.memory_allocated(device) / GIB,
        "reserved_gib": torch.cuda.memory_reserved(device) / GIB,
        "peak_gib": torch.cuda.max_memory_allocated(device) / GIB,
        "total_gib": torch.cuda.get_device_properties(device or 0).total_memory / GIB,
    }


class OutOfMemory(RuntimeError):
    """CUDA ran out of memory; the message (from `oom_message`) says what to lower. Exit code 4."""


def oom_message(what: str, batch_size: int, hints: dict | None = None, cause: BaseException | None = None) -> str:
    """Explain an OOM and list concrete next settings as `--set` overrides; every trainer prints it.
    `cause`: the error itself, where it was a kernel's 2^31-element limit rather than memory.

    `hints` (all optional) describes what the trainer can do:
      batch_key ("batch_size"), accum_key ("accumulate_grad_batches"; None: the trainer has no
      gradient accumulation, so only the batch is halved), accumulation (current, 1),
      precision_key ("precision"), precision (current; bf16 suggested unless already mixed),
      checkpointing_key (config key that enables gradient checkpointing, if the model has it),
      crop_key + crop (config key and current value of the training crop, if it has one),
      resume (the flag that continues the run afterwards, e.g. "--resume auto").
    """
    h = hints or {}
    batch_key = h.get("batch_key", "batch_size")
    accum_key = h.get("accum_key", "accumulate_grad_batches")
    accum = int(h.get("accumulation", 1))
    lines = [f"CUDA out of memory in {what} at {batch_key}={batch_size}."]
    if cause is not None and exceeds_int32_indexing(cause):
        lines = [f"A tensor too large for a CUDA kernel (2^31 elements or more) in {what} at {batch_key}={batch_size}: "
                 f"{str(cause).splitlines()[0]}. Memory may fit; this batch does not."]
    stats = cuda_memory_stats()
    if stats:
        lines.append(f"Peak allocated {stats['peak_gib']:.2f} GiB, reserved {stats['reserved_gib']:.2f} GiB "
                     f"of {stats['total_gib']:.1f} GiB.")
    lines.append("Try, in this order:")
    if batch_size > 1 and accum_key:
        lines.append(f"  --set {batch_key}={batch_size // 2} --set {accum_key}={accum * 2}   "
                     "(half the batch, twice the accumulation: same effective batch)")
    elif batch_size > 1:
        lines.append(f"  --set {batch_key}={batch_size // 2}   (half the batch)")
    precision = h.get("precision")
    if precision is None or "mixed" not in str(precision):
        lines.append(f"  --set {h.get('precision_key', 'precision')}=bf16-mixed   (half-precision activations take half the memory)")
    if h.get("checkpointing_key"):
        lines.append(f"  --set {h['checkpointing_key']}=true   (gradient checkpointing: recompute activations)")
    if h.get("crop_key") and h.get("crop"):
        lines.append(f"  --set {h['crop_key']}={max(1, int(h['crop']) // 2)}   (a smaller training crop)")
    lines.append("Or measure what fits: common.hardware.find_batch_size. Close other programs using the GPU.")
    if h.get("resume"):
        lines.append(f"Then {h['resume']} continues from the last checkpoint.")
    return "\n".join(lines)


@contextlib.contextmanager
def explain_oom(what: str, batch_size: int, hints: dict | None = None) -> Iterator[None]:
    """Inside the block a CUDA out-of-memory error becomes `OutOfMemory` with `oom_message`'s advice,
    which `common.exit_codes.run_main` prints and turns into exit code 4; other errors pass through."""
    try:
        yield
    except RuntimeError as e:
        if isinstance(e, OutOfMemory) or not is_oom(e):
            raise
        raise OutOfMemory(oom_message(what, batch_size, hints, e)) from e


def _free_cuda() -> None:
    """Give the failed try's memory back before the next one (cycles first, then the cache)."""
    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _runs(try_batch: Callable[[int], None], b: int) -> bool:
    """True when `try_batch(b)` ran, False when it ran out of memory (anything else propagates); the
    try's memory is given back either way."""
    oom = False
    try:
        try_batch(b)
    except Exception as exc:
        if not is_oom(exc):
            raise
        oom = True  # leave the except block first so the traceback (and its tensors) is freed
    _free_cuda()
    return not oom


def fit_batch_size(
    try_batch: Callable[[int], None],
    batch_size: int,
    accumulation: int = 1,
    cuda_available: bool | None = None,
) -> tuple[int, int, str]:
    """Keep a configured batch when it fits; otherwise lower it. Returns (batch, accumulation, line).

    For profiles whose batch comes from a guide: the batch x accumulation product is the run's
    effective batch (its LR and GAN plan assume it), so a batch that does not fit is lowered to the
    largest DIVISOR of it that fits and the accumulation is raised by the same factor - the effective
    batch stays exact. The configured batch is tried first (one step when it fits), then the divisors
    from the largest down. Without CUDA nothing can be measured: the configured value is kept and the
    line says so plainly. `try_batch(b)` runs one full training step at batch b (OOM = does not fit).
    """
    if batch_size < 1 or accumulation < 1:
        raise ValueError(f"fit_batch_size needs batch_size >= 1 and accumulation >= 1, got {batch_size}, {accumulation}")
    if not (torch.cuda.is_available() if cuda_available is None else cuda_available):
        return batch_size, accumulation, (f"batch_size {batch_size} kept as configured: no CUDA device, so GPU "
                                          "memory cannot be measured here")
    for b in [d for d in range(batch_size, 0, -1) if batch_size % d == 0]:
        if _runs(try_batch, b):
            if b == batch_size:
                return b, accumulation, f"batch_size {b} fits (measured one training step)"
            factor = batch_size // b
            return b, accumulation * factor, (
                f"batch_size {batch_size} does not fit: using batch_size {b} x accumulation_steps "
                f"{accumulation * factor} (was {accumulation}), the same {batch_size * accumulation} images per step")
    raise RuntimeError(f"fit_batch_size: even batch size 1 runs out of memory.\n{oom_message('fit_batch_size', 1)}")


def find_batch_size(
    try_batch: Callable[[int], None],
    start: int = 1,
    limit: int = 4096,
    headroom: float = 0.9,
    cuda_available: bool | None = None,
) -> int:
    """Largest batch size that fits, times `headroom` (at least 1).

    `try_batch(b)` must run one full training step (forward, backward, optimizer) at batch b;
    anything it raises that is not an OOM propagates. Doubles from `start` until an OOM or
    `limit`, then binary-searches between the last fit and the first OOM. The headroom leaves
    room for longer samples and allocator fragmentation later in training.
    On a machine without CUDA nothing can be measured: returns `start` and says so.
    `cuda_available` overrides detection (tests drive the search with a fake try_batch).
    """
    if start < 1 or limit < start:
        raise ValueError(f"find_batch_size needs 1 <= start <= limit, got start={start}, limit={limit}")
    if not 0 < headroom <= 1:
        raise ValueError(f"find_batch_size headroom must be in (0, 1], got {headroom}")
    if not (torch.cuda.is_available() if cuda_available is None else cuda_available):
        print(f"[find_batch_size] no CUDA device: cannot measure memory, using batch_size={start}")
        return start

    def fits(b: int) -> bool:
        ok = _runs(try_batch, b)
        print(f"[find_batch_size] batch {b}: {'fits' if ok else 'OOM'}")
        return ok

    # Every trial is a new shape: with cudnn.benchmark on, cuDNN would autotune each convolution at each
    # one (on a lent H200 one trainer's search spent 176 s on batches 1 to 8). Memory, not speed, is
    # measured here, so the search runs on cuDNN's heuristics; the headroom covers autotuned workspaces.
    benchmark = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False
    try:
        lo, hi = 0, limit + 1  # largest known fit, smallest known failure
        b = start
        while True:
            if fits(b):
                lo = b
                if b >= limit:
                    break
                b = min(2 * b, limit)
            else:
                hi = b
                break
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
        if lo == 0:
            raise RuntimeError(f"find_batch_size: even batch size 1 runs out of memory.\n"
                               f"{oom_message('find_batch_size', 1)}")
    finally:
        torch.backends.cudnn.benchmark = benchmark
    best = max(1, int(lo * headroom))
    print(f"[find_batch_size] largest fit {lo}, using {best} ({headroom:.0%} headroom)")
    return best
