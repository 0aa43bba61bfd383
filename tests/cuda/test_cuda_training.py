"""On a CUDA GPU: the four trainers' tiny trainings in every precision (compile on for the vocoder),
a bitwise-exact resume with deterministic algorithms, channels_last (VAE, vocoder critics) and
pinned-memory loading with workers. Skipped without CUDA; `make gpu-check` runs them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.gpu.trainers import TRAINERS, build, cli
from common.checkpoint import load_checkpoint
from tests.cuda.conftest import CUDA_ONLY

pytestmark = CUDA_ONLY
CUDA = torch.device("cuda")
PRECISION_KEY = {"vocoder": "precision", "vits": "precision", "clone": "train.precision", "vae": "precision"}


def train(trainer: str, data: Path, run: Path, *overrides: str, steps: int = 3, extra: tuple[str, ...] = ()) -> int:
    """The trainer's own CLI on its base config at the tests' tiny size, on CUDA."""
    main, argv = cli(TRAINERS[trainer], "base", list(overrides), data, run, CUDA, dry=True, steps=steps)
    return main([*argv, *extra])


def checkpoint_models(run: Path) -> list[dict]:
    paths = sorted(p for p in run.rglob("*.pt"))
    assert paths, f"no checkpoint written under {run}"
    return [load_checkpoint(p)["models"] for p in paths]


def all_finite(models: dict) -> bool:
    return all(torch.isfinite(t).all() for state in models.values() for t in state.values()
               if isinstance(t, torch.Tensor) and t.is_floating_point())


@pytest.mark.parametrize("precision", ["32-true", "16-mixed", "bf16-mixed"])
@pytest.mark.parametrize("trainer", list(TRAINERS))
def test_tiny_training_in_each_precision(trainer, precision, tiny_data, tmp_path):
    assert train(trainer, tiny_data(trainer), tmp_path / "run", f"{PRECISION_KEY[trainer]}={precision}") == 0
    assert all(all_finite(m) for m in checkpoint_models(tmp_path / "run"))


def test_vocoder_compiled_bf16(tiny_data, tmp_path):
    """torch.compile on the fixed-shape vocoder crops (generator and critics), bf16 autocast."""
    assert train("vocoder", tiny_data("vocoder"), tmp_path / "run", "compile=true", "precision=bf16-mixed") == 0
    assert all(all_finite(m) for m in checkpoint_models(tmp_path / "run"))


def test_vocoder_cuda_graphs_bf16(tiny_data, tmp_path):
    """compile + cuda_graphs (torch.compile's reduce-overhead mode): six steps (a warm-up run, the recording,
    replays across steps), finite weights, and no compiled graph of the run ran without CUDA graphs."""
    from torch._dynamo.utils import counters

    counters["inductor"]["cudagraph_skips"] = 0
    assert train("vocoder", tiny_data("vocoder"), tmp_path / "run", "compile=true", "cuda_graphs=true",
                 "precision=bf16-mixed", steps=6) == 0
    assert counters["inductor"]["cudagraph_skips"] == 0
    assert all(all_finite(m) for m in checkpoint_models(tmp_path / "run"))


def _states(ckpt: Path) -> dict:
    c = load_checkpoint(ckpt)
    return {"models": c["models"], "optimizers": c["optimizers"], "counters": c["counters"]}


def test_vits_resume_is_bitwise_exact_with_deterministic_algorithms(tiny_data, tmp_path):
    """4 steps straight == 2 steps, stop, `--resume auto`, 2 more: weights, optimizer moments, counters."""
    from tests.tts.test_vits_train import _equal

    data, keys = tiny_data("vits"), ("deterministic=true", "cudnn_benchmark=false", "save_step=2")
    try:
        assert train("vits", data, tmp_path / "straight", *keys, steps=4) == 0
        assert train("vits", data, tmp_path / "resumed", *keys, steps=2) == 0
        assert train("vits", data, tmp_path / "resumed", *keys, steps=4, extra=("--resume", "auto")) == 0
    finally:
        torch.use_deterministic_algorithms(False)
    a = _states(tmp_path / "straight" / "checkpoints" / "vits_00000004.pt")
    b = _states(tmp_path / "resumed" / "checkpoints" / "vits_00000004.pt")
    assert a["counters"]["step"] == 4
    assert _equal(a, b)


def test_vae_channels_last_trains_with_channels_last_weights(tiny_data, tmp_path):
    st = build(TRAINERS["vae"], "base", ["channels_last=true", "precision=bf16-mixed"], tiny_data("vae"),
               tmp_path / "run", CUDA, dry=True)
    batches = st.batches()
    for _ in range(2):
        st.step(next(batches))
    convs = [m for m in st.trainer.vae.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs and all(c.weight.is_contiguous(memory_format=torch.channels_last) for c in convs)
    assert all(torch.isfinite(p).all() for p in st.trainer.vae.parameters())


def test_vocoder_period_critics_channels_last_match_contiguous():
    """The vocoder's only 4-D convs (MPD): channels_last gives the contiguous scores and gradients."""
    from vocoder.discriminators import PeriodDiscriminator

    precision = torch.backends.cudnn.conv.fp32_precision
    torch.backends.cudnn.conv.fp32_precision = "ieee"  # compare fp32 with fp32, not TF32
    try:
        torch.manual_seed(0)
        critic = PeriodDiscriminator(3).to(CUDA)
        y = torch.randn(2, 1, 8192, device=CUDA)
        outs = []
        for fmt in (torch.contiguous_format, torch.channels_last):
            critic.to(memory_format=fmt)
            critic.zero_grad()
            score, fmap = critic(y)
            (score.sum() + sum(f.sum() for f in fmap)).backward()
            outs.append((score.detach().clone(), [p.grad.clone() for p in critic.parameters()]))
    finally:
        torch.backends.cudnn.conv.fp32_precision = precision
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-4, atol=1e-5)
    for g0, g1 in zip(outs[0][1], outs[1][1], strict=True):
        # a weight gradient sums thousands of products, in another order per layout's kernel: its rounding
        # scales with the tensor, not the element (the H200 saw 2.7e-4 on one element of 0.11; a layout bug is O(1))
        torch.testing.assert_close(g0, g1, rtol=1e-3, atol=1e-3 * g0.abs().max().item())


def test_vae_pinned_memory_loading_with_workers(tiny_data, tmp_path):
    st = build(TRAINERS["vae"], "base", ["num_workers=2", "pin_memory=true"], tiny_data("vae"), tmp_path / "run",
               CUDA, dry=True)
    batch = next(st.batches())
    assert batch.is_pinned()
    st.step(batch)


@pytest.mark.parametrize("trainer,keys", [
    ("vocoder", ("num_workers=2",)),  # pins on CUDA by itself
    ("vits", ("num_workers=2", "pin_memory=true", "persistent_workers=true")),
    ("clone", ("train.num_workers=2", "data.pin_memory=true")),
    ("vae", ("num_workers=2", "pin_memory=true", "persistent_workers=true")),
])
def test_training_with_pinned_memory_and_workers(trainer, keys, tiny_data, tmp_path):
    assert train(trainer, tiny_data(trainer), tmp_path / "run", *keys) == 0


@pytest.mark.parametrize("trainer", list(TRAINERS))
def test_base_configs_train_convs_and_matmuls_in_tf32(trainer, tiny_data, tmp_path):
    """TF32 is PyTorch's own default for convolutions: IEEE fp32 made the vocoder's base config 2.55x
    slower on an H200 (bench/README.md). Every trainer's base config keeps TF32; `tf32 false` is IEEE."""
    torch.backends.cudnn.conv.fp32_precision = torch.backends.cuda.matmul.fp32_precision = "ieee"
    build(TRAINERS[trainer], "base", [], tiny_data(trainer), tmp_path / "run", CUDA, dry=True)
    assert torch.backends.cudnn.conv.fp32_precision == torch.backends.cuda.matmul.fp32_precision == "tf32"
    off = next(o for o in TRAINERS[trainer].plain if "tf32" in o)
    build(TRAINERS[trainer], "base", [off], tiny_data(trainer), tmp_path / "run_off", CUDA, dry=True)
    assert torch.backends.cudnn.conv.fp32_precision == "ieee"


def test_batch_finder_on_cuda_searches_without_autotuning_and_restores_it():
    """A real search on the card: each trial is a new shape, so cuDNN autotuning stays off during it."""
    from common.hardware import find_batch_size

    net = torch.nn.Sequential(torch.nn.Conv1d(8, 64, 7, padding=3), torch.nn.ReLU(), torch.nn.Conv1d(64, 8, 7, padding=3)).to(CUDA)
    seen = []

    def try_batch(b: int) -> None:
        seen.append(torch.backends.cudnn.benchmark)
        net(torch.randn(b, 8, 4096, device=CUDA)).square().mean().backward()
        torch.cuda.synchronize()

    torch.backends.cudnn.benchmark = True
    try:
        assert find_batch_size(try_batch, start=1, limit=64) >= 32
        assert seen and not any(seen) and torch.backends.cudnn.benchmark is True
    finally:
        torch.backends.cudnn.benchmark = False
