"""The 4090 guide's VITS speed keys do what they say: gradient_clip_val (alias of grad_clip),
cudnn_benchmark / compile → batches padded to a few bucket shapes, compile → decoder and critics
compiled in place (checkpoint keys unchanged), channels_last → the period critics' Conv2d (and says
the 1-D convs cannot), deterministic → deterministic algorithms; and the recipes' run names say the card."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from common.checkpoint import load_checkpoint
from common.config import ConfigError, load_config
from common.distributed import setup_distributed
from tests.tts.test_vits_train import FAST, _corpus
from tts.vits import train as train_mod
from tts.vits.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]


def test_gradient_clip_val_is_grad_clip(tmp_path):
    assert load_config(None, TrainConfig, ["gradient_clip_val=0.5"]).grad_clip == 0.5
    # --set items are layers: the later one wins whichever spelling it uses
    assert load_config(None, TrainConfig, ["gradient_clip_val=0.5", "grad_clip=1.0"]).grad_clip == 1.0
    both = tmp_path / "both.yaml"
    both.write_text("gradient_clip_val: 0.5\ngrad_clip: 1.0\n")
    with pytest.raises(ConfigError, match="twice"):  # one file giving both spellings is ambiguous
        load_config(both, TrainConfig)


def test_recipes_name_their_card_and_enable_cudnn_benchmark():
    r4090 = load_config(ROOT / "tts/vits/configs/uzbek_vits.yaml", TrainConfig)
    r5090 = load_config(ROOT / "tts/vits/configs/uzbek_vits_rtx5090.yaml", TrainConfig)
    assert "rtx4090" in r4090.run_name and "rtx5090" in r5090.run_name
    assert r4090.cudnn_benchmark and r5090.cudnn_benchmark


@pytest.fixture()
def eager_compile(monkeypatch):
    """torch.compile with dynamo's 'eager' backend: the graph capture of our modules is tested,
    inductor's code generation (minutes on this CPU) is not."""
    real = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: real(self, backend="eager"))


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return _corpus(tmp_path_factory.mktemp("rtx"), ["anna"])


def test_compile_channels_last_deterministic_one_run(data, tmp_path, eager_compile, capsys):
    sets = [*FAST, "max_steps=1", "compile=true", "channels_last=true", "deterministic=true",
            "data.num_buckets=2", "batch_size=1"]
    cfg = load_config(None, TrainConfig, sets, extra={"data_dir": str(data), "run_dir": str(tmp_path / "run")})
    try:
        trainer = train_mod.VitsTrainer(cfg, setup_distributed("cpu"))
        out = capsys.readouterr().out
        assert torch.are_deterministic_algorithms_enabled()
        assert "applied: deterministic algorithms on" in out
        # channels_last: the period critics' 4-D weights; the 1-D convs are named as not applicable
        assert "channels_last on the period critics' " in out and "1-D convs" in out
        conv2d = next(m for m in trainer.discriminator.modules() if isinstance(m, torch.nn.Conv2d))
        assert conv2d.parametrizations.weight.original1.is_contiguous(memory_format=torch.channels_last)
        # compile: in place on the decoder and every critic
        assert trainer.generator.dec._compiled_call_impl is not None
        assert all(d._compiled_call_impl is not None for d in trainer.discriminator.discriminators)
        # compile → bucket shapes: every batch of an epoch has one of the few allowed shapes
        allowed = set(trainer.shapes.shapes())
        assert 1 <= len(allowed) <= 2 and "bucket shapes" in out
        trainer.sampler.set_epoch(0)
        for batch in trainer.loader:
            assert (batch["ids"].size(1), batch["spec"].size(2)) in allowed
            assert int(batch["spec_len"].max()) <= batch["spec"].size(2)
        trainer.fit()
        assert trainer.step == 1
    finally:
        torch.use_deterministic_algorithms(False)
    # checkpoint keys are the plain ones: a fresh, uncompiled model loads them strictly
    ckpt = load_checkpoint(sorted((tmp_path / "run" / "checkpoints").glob("vits_*.pt"))[-1])
    gen, disc = train_mod.build_models(cfg, 1)
    gen.load_state_dict(ckpt["models"]["generator"])
    disc.load_state_dict(ckpt["models"]["discriminator"])


def test_without_compile_or_cuda_benchmark_batches_pad_to_the_longest(data, tmp_path):
    cfg = load_config(None, TrainConfig, [*FAST, "cudnn_benchmark=true"],
                      extra={"data_dir": str(data), "run_dir": str(tmp_path / "run")})
    trainer = train_mod.VitsTrainer(cfg, setup_distributed("cpu"))
    assert trainer.shapes is None  # cudnn.benchmark is a CUDA setting: on the CPU nothing to tune
    assert any("cudnn_benchmark requested but this is not a CUDA device" in n for n in trainer.precision.notes)
