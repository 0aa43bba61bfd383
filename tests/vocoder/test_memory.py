"""The vocoder step's memory fixes: per audio sample, one training step (critic update + generator
update) holds at most 0.65x of main's bytes for backward and at most 0.65x of main's peak live tensor
bytes, with gradients bitwise main's.

"main's" is computed here, not recorded: `bench.vocoder_memory.main_behaviour` runs this code as main ran
it (every leaky ReLU out of place, the critic update's outputs held to the step's end); run on main's code
itself, the bench's figures equal that emulation's byte for byte. How the bytes are counted (a
TorchDispatchMode over every op's new storages, saved_tensors_hooks for backward) is in
bench/vocoder_memory.py. The slope over two batch sizes removes what does not grow with the batch
(weights, gradients, optimizer state).

The critics are base_hifi_gpu.yaml's (MPD over its 7 periods + MSD) at 1/16 of their width, as the tiny
type-1 generator (two convs per residual pair, 32 channels) is at 1/16 of its 512, plus a narrow MRD: every
leaky-ReLU conv stack, weight and spectral norm, at a fraction of a second per step. Measured at this size (the bench's base_hifi_gpu.yaml figures are in bench/README.md):
saved 0.56x, peak 0.57x.
"""

from __future__ import annotations

import copy

import pytest
import torch

import vocoder.model
import vocoder.train
from bench.vocoder_memory import main_behaviour, measure
from tts.vits.hifigan import Generator as VitsDecoder
from vocoder.discriminators import (
    Discriminators,
    MultiPeriodDiscriminator,
    MultiResolutionDiscriminator,
    MultiScaleDiscriminator,
    PeriodDiscriminator,
    ScaleDiscriminator,
)
from vocoder.train import VocoderTrainer

from .conftest import tiny_config

TYPE_1 = ("model_args.resblock='1'", "model_args.resblock_kernel_sizes=[3]",
          "model_args.resblock_dilation_sizes=[[1,3,5]]")
BASE_PERIODS = [3, 5, 7, 11, 17, 23, 37]  # base_hifi_gpu.yaml's
# vocoder.discriminators.HIFIGAN_SCALE_LAYERS and PeriodDiscriminator's channels at 1/16 of their width
NARROW_SCALE = ((1, 8, 15, 1, 1, 7), (8, 8, 41, 2, 4, 20), (8, 16, 41, 2, 8, 20), (16, 32, 41, 4, 16, 20),
                (32, 64, 41, 4, 16, 20), (64, 64, 41, 1, 16, 20), (64, 64, 5, 1, 1, 2))
NARROW_PERIOD = (2, 8, 32, 64, 64)


def narrow_critics(cfg) -> Discriminators:
    """base_hifi_gpu.yaml's critics (MPD over its 7 periods + MSD) at 1/16 of their width, as the tiny
    generator (32 channels) is at 1/16 of its 512, plus a narrow MRD (its leaky-ReLU stack too)."""
    mpd = MultiPeriodDiscriminator(BASE_PERIODS)
    mpd.discriminators = torch.nn.ModuleList(PeriodDiscriminator(p, channels=NARROW_PERIOD) for p in BASE_PERIODS)
    msd = MultiScaleDiscriminator()
    msd.discriminators = torch.nn.ModuleList(
        [ScaleDiscriminator(True, NARROW_SCALE), ScaleDiscriminator(False, NARROW_SCALE),
         ScaleDiscriminator(False, NARROW_SCALE)])
    mrd = MultiResolutionDiscriminator([128, 256], [32, 64], [128, 256], channels=4)
    return Discriminators({"mpd": mpd, "msd": msd, "mrd": mrd})


@pytest.fixture(scope="module")
def trainer(tiny_data, tmp_path_factory) -> VocoderTrainer:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(vocoder.train, "build_discriminator", narrow_critics)
        torch.manual_seed(0)
        tr = VocoderTrainer(tiny_config(*TYPE_1), tiny_data, tmp_path_factory.mktemp("memory"), device="cpu",
                            log=lambda *a, **k: None)
    tr.sampler.set_epoch(0)
    return tr


def _batch(tr: VocoderTrainer) -> dict:
    return next(iter(tr.loader))


def test_step_holds_at_most_065x_of_mains_bytes_per_sample(trainer):
    batch = _batch(trainer)
    main_saved, main_peak = measure(trainer, batch, "main")
    saved, peak = measure(trainer, batch, "after", warm_up=False)  # the optimizers' moments exist already
    assert main_saved.slope > 0 and main_peak.slope > 0
    assert saved.slope <= 0.65 * main_saved.slope, (saved.slope, main_saved.slope)
    assert peak.slope <= 0.65 * main_peak.slope, (peak.slope, main_peak.slope)


def _state(tr: VocoderTrainer) -> dict:
    """Everything a step reads and changes: weights, optimizer moments, LR schedules."""
    return copy.deepcopy({name: part.state_dict() for name, part in _parts(tr).items()})


def _parts(tr: VocoderTrainer) -> dict:
    return {"g": tr.generator, "d": tr.discriminator, "g_opt": tr.g_opt, "d_opt": tr.d_opt,
            "g_sched": tr.g_sched, "d_sched": tr.d_sched}


def _step_grads(tr: VocoderTrainer, batch: dict, state: dict, as_main: bool) -> tuple[dict, dict]:
    """(every parameter's gradient as accumulated, every parameter after) of one step from ``state``."""
    for name, part in _parts(tr).items():
        part.load_state_dict(copy.deepcopy(state[name]))
    grads: dict = {}
    params = dict(tr.generator.named_parameters(prefix="g")) | dict(tr.discriminator.named_parameters(prefix="d"))
    handles = [p.register_post_accumulate_grad_hook(lambda p, n=n: grads.__setitem__(n, p.grad.clone()))
               for n, p in params.items()]
    torch.manual_seed(1)
    with main_behaviour(tr, out_of_place=as_main, hold_critic_outputs=as_main):
        tr.train_step(batch)
    for h in handles:
        h.remove()
    return grads, {n: p.detach().clone() for n, p in params.items()}


def test_gradients_are_bitwise_mains(trainer):
    batch = _batch(trainer)
    state = _state(trainer)
    want_grads, want_after = _step_grads(trainer, batch, state, as_main=True)
    got_grads, got_after = _step_grads(trainer, batch, state, as_main=False)
    assert got_grads.keys() == want_grads.keys() and len(got_grads) == len(dict(trainer.generator.named_parameters())) \
        + len(dict(trainer.discriminator.named_parameters()))
    for name, grad in want_grads.items():
        assert torch.equal(got_grads[name], grad), name
    for name, weight in want_after.items():
        assert torch.equal(got_after[name], weight), name


@pytest.mark.parametrize("masked", [False, True])
def test_vits_decoder_gradients_are_bitwise_the_out_of_place_ones(masked, monkeypatch):
    torch.manual_seed(0)
    dec = VitsDecoder(8, "1", [3], [[1, 3, 5]], [4, 4], 16, [8, 8], gin_channels=4)
    z, g = torch.randn(2, 8, 6, requires_grad=True), torch.randn(2, 4, 1)
    mask = torch.tensor([[1.0] * 6, [1.0] * 4 + [0.0] * 2])[:, None] if masked else None

    def grads(inplace: bool) -> list[torch.Tensor]:
        monkeypatch.setattr(vocoder.model, "INPLACE_LEAKY_RELU", inplace)
        dec.zero_grad(set_to_none=True)
        z.grad = None
        out = dec(z, g, mask)
        (out * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
        return [out.detach(), z.grad, *(p.grad for p in dec.parameters())]

    before, after = grads(False), grads(True)
    assert all(torch.equal(a, b) for a, b in zip(after, before))
