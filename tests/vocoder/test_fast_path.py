"""The vocoder's fast-path keys on the CPU: `mpd_channels_last` gives the contiguous MPD's numbers in fp32
and is refused where there is no MPD; `compile` wraps the generator and the critics and trains under bf16
autocast.

Compiling is slow here even without Inductor (Dynamo traces the generator and three critic graphs: the D
update, the G update's fake and its no-grad real; 17-80 s on this shared 2-core machine), so the two steps compiled
are opt-in: `RUN_COMPILE_TESTS=1 python -m pytest tests/vocoder/test_fast_path.py`. They use the
"aot_eager" backend (Dynamo's capture and AOT autograd, where wiring and autocast break, without Inductor's
C++ build); tests/cuda/test_cuda_training.py compiles with Inductor on a GPU. The default suite checks only
that both networks are handed to torch.compile."""

from __future__ import annotations

import copy
import functools
import os

import pytest
import torch

from common.config import ConfigError
from common.precision import compile_unavailable
from vocoder.build import build_discriminator
from vocoder.discriminators import PeriodDiscriminator
from vocoder.train import VocoderTrainer

from .conftest import tiny_config

QUIET = dict(device="cpu", log=lambda *a, **k: None)


def _scores_and_grads(critic: PeriodDiscriminator, y: torch.Tensor) -> tuple[torch.Tensor, list, list]:
    critic.zero_grad()
    score, fmap = critic(y)
    (score.sum() + sum(f.square().mean() for f in fmap)).backward()
    return score.detach(), [f.detach() for f in fmap], [p.grad.clone() for p in critic.parameters()]


def test_mpd_channels_last_gives_the_contiguous_numbers_in_fp32():
    torch.manual_seed(0)
    plain = PeriodDiscriminator(3, channels=(8, 16, 32, 32, 32))
    nhwc = copy.deepcopy(plain)
    nhwc.channels_last = True
    y = torch.randn(2, 1, 1200)
    s0, f0, g0 = _scores_and_grads(plain, y)
    s1, f1, g1 = _scores_and_grads(nhwc, y)
    # the activations really are NHWC (all but conv_post's one-channel output, which is both layouts)
    assert all(f.is_contiguous(memory_format=torch.channels_last) and not f.is_contiguous() for f in f1[:-1])
    torch.testing.assert_close(s1, s0, rtol=1e-5, atol=1e-6)
    for a, b in zip(f1, f0, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(g1, g0, strict=True):  # another summation order in the weight gradients' reductions
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_mpd_channels_last_key_reaches_every_period_critic_and_needs_an_mpd():
    cfg = tiny_config("model_args.discriminators=[mpd,fast_mpd]", "mpd_channels_last=true")
    critics = build_discriminator(cfg)
    assert [d.channels_last for d in critics["mpd"].discriminators] == [True, True]
    assert not any(d.channels_last for d in build_discriminator(tiny_config("model_args.discriminators=[mpd]"))
                   ["mpd"].discriminators)
    with pytest.raises((ConfigError, ValueError), match="mpd_channels_last"):  # fast_mpd only: it would do nothing
        tiny_config("mpd_channels_last=true")


def test_cuda_graphs_on_a_cpu_or_with_pc_aug_is_one_line_naming_the_key(tiny_data, tmp_path, capsys):
    """On the CPU `cuda_graphs` would change nothing: the command stops with exit 2 and one line, before any
    data is read; with pc_aug (the generator several times a step) the config refuses it."""
    from vocoder.train import main as train_main

    from .conftest import TINY_YAML

    argv = ["--config", str(TINY_YAML), "--data_dir", str(tiny_data), "--run_dir", str(tmp_path / "run"),
            "--device", "cpu", "--set", "max_updates=1", "--set", "compile=true", "--set", "cuda_graphs=true"]
    assert train_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert any(line.endswith("cuda_graphs: CUDA graphs need a CUDA device and this run is on cpu; drop cuda_graphs "
                             "(compile alone works here)") for line in err), err
    assert not (tmp_path / "run" / "checkpoints").exists()
    with pytest.raises((ConfigError, ValueError), match="cuda_graphs with pc_aug"):
        tiny_config("cuda_graphs=true", "pc_aug=true", "model_args.mini_nsf=true")


def test_cuda_graphs_under_torchrun_is_refused(tiny_data, tmp_path, monkeypatch):
    from common import distributed
    from common.distributed import DistInfo

    two = DistInfo(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"), enabled=True)
    monkeypatch.setattr(distributed, "setup_distributed", lambda device=None: two)
    with pytest.raises(ConfigError, match="cuda_graphs under torchrun is not supported yet"):
        VocoderTrainer(tiny_config("compile=true", "cuda_graphs=true"), tiny_data, tmp_path, **QUIET)


NO_COMPILE = pytest.mark.skipif(compile_unavailable(torch.device("cpu")) is not None,
                                reason="torch.compile unavailable here (no C++ compiler)")


def _compiled_trainer(data, run_dir) -> VocoderTrainer:
    tr = VocoderTrainer(tiny_config("compile=true", "precision=bf16-mixed"), data, run_dir, **QUIET)
    compiled = torch._dynamo.eval_frame.OptimizedModule
    assert isinstance(tr.generator_ddp, compiled) and isinstance(tr.discriminator_ddp, compiled)
    assert tr._critics is tr.discriminator_ddp  # one process: the G update calls the same compiled critics
    assert tr.generator_ddp._orig_mod is tr.generator and tr.discriminator_ddp._orig_mod is tr.discriminator
    return tr


@NO_COMPILE
def test_compile_is_asked_for_the_generator_and_the_critics(tiny_data, tmp_path, monkeypatch):
    """The wiring alone: the first real torch.compile call costs its imports, 15-30 s on this machine."""
    asked: list = []
    monkeypatch.setattr(torch, "compile", lambda model, **kw: asked.append(model) or model)
    tr = VocoderTrainer(tiny_config("compile=true", "precision=bf16-mixed"), tiny_data, tmp_path, **QUIET)
    assert asked == [tr.generator, tr.discriminator]


@NO_COMPILE
@pytest.mark.skipif(not os.environ.get("RUN_COMPILE_TESTS"), reason="slow (17-80 s here): set RUN_COMPILE_TESTS=1")
def test_compiled_generator_and_critics_train_two_steps_in_bf16(tiny_data, tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    torch._dynamo.reset()
    tr = _compiled_trainer(tiny_data, tmp_path)
    before = {name: [p.detach().clone() for p in m.parameters()] for name, m in tr.models.items()}
    tr.sampler.set_epoch(0)
    batches = iter(tr.loader)
    for _ in range(2):
        logs = tr.train_step(next(batches))
        assert all(torch.isfinite(torch.as_tensor(logs[k])) for k in ("loss_g", "loss_d"))
    for name, m in tr.models.items():  # both networks stepped
        assert any(not torch.equal(a, b) for a, b in zip(m.parameters(), before[name], strict=True)), name
    torch._dynamo.reset()
