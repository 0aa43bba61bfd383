"""VITS checkpoints written before the HiFi-GAN parts moved to vocoder/ (issue 11) still load: the
decoder and critic keep the state-dict keys of the old tts/models/hifigan.py and discriminator.py (now in tts/vits/),
in the same order (optimizer state is stored by parameter position). The old key lists below are a
frozen copy taken from those files at small sizes; the mapping from old to new names is the identity."""

from __future__ import annotations

import pytest
import torch

from common.checkpoint import load_matching
from tts.vits.discriminator import MultiPeriodDiscriminator
from tts.vits.hifigan import Generator

PLAIN = ("weight", "bias")
WN = ("bias", "parametrizations.weight.original0", "parametrizations.weight.original1")
SN = ("bias", "parametrizations.weight.original", "parametrizations.weight.0._u", "parametrizations.weight.0._v")


def _keys(layers: list[tuple[str, tuple[str, ...]]]) -> list[str]:
    return [f"{name}.{suffix}" for name, suffixes in layers for suffix in suffixes]


# Generator(4, resblock, [3], [[1, 3]], [2, 2], 8, [4, 4], gin_channels=2) before the move.
_RES = {"1": [f"resblocks.{i}.{c}.{j}" for i in (0, 1) for c in ("convs1", "convs2") for j in (0, 1)],
        "2": [f"resblocks.{i}.convs.{j}" for i in (0, 1) for j in (0, 1)]}
OLD_DECODER = {rb: _keys([("conv_pre", PLAIN), ("ups.0", WN), ("ups.1", WN)] + [(r, WN) for r in res]
                         + [("conv_post", ("weight",)), ("cond", PLAIN)]) for rb, res in _RES.items()}


def _old_critic(norm: tuple[str, ...]) -> list[str]:
    """MultiPeriodDiscriminator((2,), channel_scale=1/64, use_spectral_norm=norm is SN) before the move."""
    scale = [f"discriminators.0.convs.{i}" for i in range(6)] + ["discriminators.0.conv_post"]
    period = [f"discriminators.1.convs.{i}" for i in range(5)] + ["discriminators.1.conv_post"]
    return _keys([(name, norm) for name in scale + period])


def _load_old_layout(build, old_keys: list[str]) -> None:
    model = build()
    assert list(model.state_dict()) == old_keys  # names and order
    torch.manual_seed(1)
    old = dict(zip(old_keys, (torch.randn_like(t) for t in build().state_dict().values())))
    result = model.load_state_dict(old, strict=True)
    assert result.missing_keys == [] and result.unexpected_keys == []
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, old[name], rtol=0, atol=0)
    report = load_matching(build(), old)  # --init_from path: nothing re-initialised or unused
    assert not (report.missing or report.unexpected or report.mismatched)


@pytest.mark.parametrize("resblock", ["1", "2"])
def test_old_decoder_checkpoint_loads(resblock):
    _load_old_layout(lambda: Generator(4, resblock, [3], [[1, 3]], [2, 2], 8, [4, 4], gin_channels=2),
                     OLD_DECODER[resblock])


@pytest.mark.parametrize("spectral", [False, True])
def test_old_critic_checkpoint_loads(spectral):
    _load_old_layout(lambda: MultiPeriodDiscriminator((2,), channel_scale=1 / 64, use_spectral_norm=spectral),
                     _old_critic(SN if spectral else WN))
