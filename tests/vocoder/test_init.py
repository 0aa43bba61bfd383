"""The vocoder's *effective* initialisation follows the intended rule (vocoder/model.py, the comment
above INIT_STD): PyTorch's default weights everywhere, N(0, 0.01) biases on the weight-normed
ups / resblocks / conv_post and N(0, 0.01) weight and bias on the plain mini-NSF source_conv, as the
reference generators end up after their init_weights runs behind the old hook weight_norm."""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils import parametrize

from tests.init_rules import check_model
from vocoder.discriminators import build_discriminators
from vocoder.model import INIT_STD, Generator, GeneratorArgs

BIAS_INIT = ("ups.", "resblocks.", "conv_post", "source_conv")


def _generator(mini_nsf: bool, resblock: str = "1") -> Generator:
    return Generator(GeneratorArgs(sampling_rate=22050, num_mels=40, hop_size=256, upsample_rates=[8, 8, 2, 2],
                                   upsample_kernel_sizes=[16, 16, 4, 4], upsample_initial_channel=128,
                                   resblock=resblock, resblock_kernel_sizes=[3, 7], mini_nsf=mini_nsf,
                                   resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5]]))


def generator_rule(name: str, param: str):
    if name.startswith("source_conv"):
        return ("normal", INIT_STD)
    if param == "bias" and name.startswith(BIAS_INIT):
        return ("normal", INIT_STD)
    return "default"


@pytest.mark.parametrize("mini_nsf,resblock", [(False, "1"), (True, "2")])
def test_generator_effective_init(mini_nsf, resblock):
    torch.manual_seed(0)
    g = _generator(mini_nsf, resblock)
    problems, checked = check_model(g, generator_rule)
    assert checked > 20
    assert not problems, "\n".join(problems)


def test_old_init_is_caught():
    """Weights really drawn N(0, 0.01) under weight norm (the pre-issue-10 init) break the rule."""
    torch.manual_seed(0)
    g = _generator(False)
    with torch.no_grad():
        for m in g.modules():
            if parametrize.is_parametrized(m, "weight"):
                v = torch.randn_like(m.parametrizations.weight.original1) * INIT_STD
                m.parametrizations.weight.original1.copy_(v)
                m.parametrizations.weight.original0.copy_(v.flatten(1).norm(dim=1).view_as(
                    m.parametrizations.weight.original0))
    problems, _ = check_model(g, generator_rule)
    assert len(problems) > 10


def test_critics_effective_init():
    """Every weight-normed or plain critic layer keeps PyTorch's default init (as jik876's critics);
    the spectral-norm MSD sub-critic divides by sigma and is not checked."""
    torch.manual_seed(0)
    d = build_discriminators(["mpd", "fast_mpd", "mrd", "msd"], [2, 3], [4, 4], 11, 8,
                             [512, 1024], [128, 256], [512, 1024])
    problems, checked = check_model(d, lambda n, p: None if n.startswith("msd.discriminators.0.") else "default")
    assert checked > 50
    assert not problems, "\n".join(problems)
