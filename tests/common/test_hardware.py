"""Hardware report, presets, batch-size finders (find_batch_size, fit_batch_size) and OOM handling,
all on the CPU."""

import subprocess
import sys

import pytest
import torch

from common import hardware
from common.hardware import (
    CARDS,
    arch_support,
    cuda_memory_stats,
    find_batch_size,
    fit_batch_size,
    hardware_report,
    is_oom,
    oom_message,
    preset_name,
)
from common.presets import CardPresets, registered_presets

CUDA = torch.cuda.is_available()


def fake_trainer(threshold, calls):
    """try_batch that 'runs out of memory' above `threshold`, recording every size it saw."""
    def try_batch(b):
        calls.append(b)
        if b > threshold:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {b} MiB")
    return try_batch


def test_find_batch_size_search():
    calls = []
    got = find_batch_size(fake_trainer(37, calls), start=1, limit=4096, headroom=0.9, cuda_available=True)
    assert got == int(37 * 0.9) == 33
    assert max(calls) <= 4096
    assert 37 in calls and 38 in calls  # the boundary was actually located
    assert calls[:7] == [1, 2, 4, 8, 16, 32, 64]  # doubling first


def test_find_batch_size_respects_limit_and_start():
    calls = []
    assert find_batch_size(fake_trainer(10**6, calls), start=3, limit=20, headroom=1.0,
                           cuda_available=True) == 20
    assert max(calls) == 20 and calls[0] == 3
    calls = []  # start already too big: search below it
    assert find_batch_size(fake_trainer(5, calls), start=16, headroom=1.0, cuda_available=True) == 5
    assert max(calls) == 16
    assert find_batch_size(fake_trainer(1, []), start=1, headroom=0.5, cuda_available=True) == 1
    with pytest.raises(RuntimeError, match="even batch size 1"):
        find_batch_size(fake_trainer(0, []), cuda_available=True)


def test_find_batch_size_other_errors_propagate_and_cpu_returns_start(capsys):
    def broken(b):
        raise ValueError("shape mismatch")
    with pytest.raises(ValueError, match="shape mismatch"):
        find_batch_size(broken, cuda_available=True)
    calls = []
    assert find_batch_size(fake_trainer(37, calls), start=4, cuda_available=False) == 4
    assert calls == [] and "cannot measure" in capsys.readouterr().out


def test_is_oom():
    assert is_oom(torch.OutOfMemoryError("x"))
    assert is_oom(RuntimeError("CUDA error: out of memory"))
    assert not is_oom(RuntimeError("size mismatch"))
    assert not is_oom(ValueError("out of memory"))  # only runtime errors come from the allocator


def test_oom_message_gives_next_settings():
    msg = oom_message("vocoder train step", 16, {"accumulation": 2, "precision": "32-true",
                                                  "checkpointing_key": "model.checkpointing",
                                                  "crop_key": "crop_mel_frames", "crop": 64})
    assert "batch_size=8" in msg and "accumulate_grad_batches=4" in msg
    assert "bf16-mixed" in msg and "model.checkpointing=true" in msg and "crop_mel_frames=32" in msg
    plain = oom_message("vae step", 1, {"precision": "bf16-mixed"})
    assert "batch_size=0" not in plain and "bf16-mixed" not in plain and "crop" not in plain


def test_cuda_memory_stats_shape():
    stats = cuda_memory_stats()
    assert (stats == {}) if not CUDA else {"allocated_gib", "reserved_gib", "peak_gib"} <= set(stats)


def test_arch_support():
    archs = ["sm_80", "sm_86", "sm_90", "sm_90a", "compute_90"]
    assert arch_support((8, 6), archs)[0]
    assert arch_support((8, 9), archs) == (True, "yes (sm_86 kernels run on sm_89)")
    assert "PTX" in arch_support((12, 0), archs)[1]
    assert not arch_support((12, 0), ["sm_80", "sm_90"])[0]
    assert not arch_support((7, 0), archs)[0]
    assert not arch_support((12, 0), [])[0]


@pytest.mark.skipif(CUDA, reason="checks the CPU-only wording")
def test_hardware_report_on_cpu():
    text = hardware_report()
    assert "CPU-only" in text and "sm_120" in text
    assert f"torch       {torch.__version__}" in text
    has = "sm_120" in torch.cuda.get_arch_list()
    assert ("this torch has it" in text) == has
    assert text.splitlines()[-1].startswith("Verdict")


def test_presets_and_resolve(capsys):
    tables = {p.trainer: p for p in registered_presets()}  # each trainer's own (common/ holds none)
    assert set(tables) == {"vocoder", "tts", "tts_clone", "vae"}
    for presets in tables.values():
        assert set(presets.values) == set(CARDS)
        for s in presets.values.values():
            assert {"batch_size", "num_workers", "precision"} <= set(s)
    vocoder, vae, tts = tables["vocoder"], tables["vae"], tables["tts"]
    assert vocoder.values["rtx5090"]["batch_size"] > vocoder.values["rtx4090"]["batch_size"]
    got = vocoder.resolve("rtx5090")
    got["batch_size"] = -1  # a copy: the table is not modified
    assert vocoder.values["rtx5090"]["batch_size"] == 32
    assert vae.resolve("auto", vram_gb=32.6) == vae.values["rtx5090"]
    assert tts.resolve("auto", vram_gb=25.3) == tts.values["rtx4090"]
    assert "rtx4090" in capsys.readouterr().out
    if not CUDA:
        assert tts.resolve("auto") == tts.values["cpu"]
        assert "'cpu'" in capsys.readouterr().out
    assert preset_name("RTX4090") == "rtx4090"
    with pytest.raises(ValueError, match="valid presets are auto, rtx4090, rtx5090, cpu"):
        preset_name("a100")
    with pytest.raises(ValueError, match=r"need exactly \['rtx4090', 'rtx5090', 'cpu'\]"):
        CardPresets("x", "x.py", object, {"rtx4090": {}})
    with pytest.raises(ValueError, match="unknown settings"):
        CardPresets("x", "x.py", object, {card: {"batch": 1} for card in CARDS})
    assert hardware._preset_for_vram(None) == "cpu"


def test_check_module_exits_zero():
    out = subprocess.run([sys.executable, "-m", "common.check"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Verdict" in out.stdout and "sm_120" in out.stdout


def test_oom_message_without_accumulation():
    msg = oom_message("VITS training", 32, {"accum_key": None, "precision": "32-true",
                                            "crop_key": "model_args.segment_frames", "crop": 32,
                                            "resume": "--resume auto"})
    assert "--set batch_size=16   (half the batch)" in msg and "accumulate" not in msg
    assert "--set precision=bf16-mixed" in msg and "model_args.segment_frames=16" in msg
    assert msg.endswith("Then --resume auto continues from the last checkpoint.")


def test_fit_batch_size_keeps_a_fitting_batch_and_lowers_one_that_does_not():
    tried: list[int] = []
    assert fit_batch_size(fake_trainer(64, tried), 24, 1, cuda_available=True)[:2] == (24, 1)
    assert tried == [24]  # one trial step when the profile's batch fits
    tried.clear()
    batch, accum, line = fit_batch_size(fake_trainer(5, tried), 24, 1, cuda_available=True)
    assert (batch, accum) == (4, 6) and tried == [24, 12, 8, 6, 4]  # divisors, largest first
    assert "batch_size 24 does not fit: using batch_size 4 x accumulation_steps 6" in line and "24 images" in line
    with pytest.raises(RuntimeError, match="even batch size 1"):
        fit_batch_size(fake_trainer(0, []), 4, 2, cuda_available=True)
    with pytest.raises(ValueError, match="not OOM"):
        fit_batch_size(lambda b: (_ for _ in ()).throw(ValueError("not OOM")), 4, cuda_available=True)
    tried.clear()
    batch, accum, line = fit_batch_size(fake_trainer(0, tried), 16, 1, cuda_available=False)
    assert (batch, accum) == (16, 1) and tried == [] and "cannot be measured" in line


def test_a_tensor_past_a_kernels_int32_limit_is_a_batch_too_large():
    """Seen on an H200 (VAE, 2048 px, batch 8, channels_last): not memory, but the same remedy as an OOM."""
    from common.hardware import OutOfMemory, exceeds_int32_indexing, explain_oom, is_oom

    err = RuntimeError("upsample_nearest_nhwc only supports grad_output tensors with less than INT_MAX elements, "
                       "but got [8, 256, 1024, 1024]")
    assert is_oom(err) and exceeds_int32_indexing(err)
    assert not exceeds_int32_indexing(RuntimeError("CUDA out of memory")) and not is_oom(RuntimeError("shape mismatch"))
    with pytest.raises(OutOfMemory) as caught:
        with explain_oom("the VAE step", 8):
            raise err
    said = str(caught.value)
    assert said.startswith("A tensor too large for a CUDA kernel (2^31 elements or more) in the VAE step at batch_size=8")
    assert "Try, in this order:" in said and "--set batch_size=4" in said


@pytest.mark.parametrize("benchmark", [True, False])
def test_find_batch_size_searches_without_cudnn_autotuning_and_restores_it(benchmark, monkeypatch):
    """Each trial is a new shape: with cudnn.benchmark on, cuDNN would autotune every convolution at
    every trial (minutes for the vocoder on an H200). The search runs on heuristics, then puts the
    user's setting back, also when the search fails."""
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", benchmark)
    seen = []

    def try_batch(b: int) -> None:
        seen.append(torch.backends.cudnn.benchmark)
        if b > 6:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB")

    assert find_batch_size(try_batch, cuda_available=True, headroom=1.0) == 6
    assert seen and not any(seen)
    assert torch.backends.cudnn.benchmark is benchmark

    def never(_b: int) -> None:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory.")

    with pytest.raises(RuntimeError, match="even batch size 1"):
        find_batch_size(never, cuda_available=True)
    assert torch.backends.cudnn.benchmark is benchmark
