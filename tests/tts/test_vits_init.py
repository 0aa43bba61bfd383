"""VITS' *effective* initialisation follows jaywalnut310/vits (the rule in tts/vits/model.py's
docstring): PyTorch's default for every weight-normed and plain layer, token embedding
N(0, hidden^-0.5), speaker embedding N(0, 1), attention q/k/v Xavier-uniform, zeros for the last layer
of each coupling / ConvFlow."""

from __future__ import annotations

import math

import pytest
import torch

from tests.init_rules import check_model
from tts.text import SYMBOLS
from tts.vits.config import model_args
from tts.vits.discriminator import MultiPeriodDiscriminator
from tts.vits.model import VITS


def vits_rule(model: VITS):
    hidden = model.args.hidden_channels

    def rule(name: str, param: str):
        if name == "enc_p.emb":
            return ("normal", hidden**-0.5)
        if name == "emb_g":
            return ("normal", 1.0)
        if name.rsplit(".", 1)[-1] in ("conv_q", "conv_k", "conv_v") and param == "weight":
            return ("uniform", math.sqrt(6 / (2 * hidden)))  # Xavier-uniform, fan_in = fan_out = hidden
        if name.startswith("flow.flows.") and name.endswith(".post"):
            return "zeros"
        if name.startswith(("dp.flows.", "dp.post_flows.")) and name.endswith(".proj"):
            return "zeros"
        return "default"
    return rule


@pytest.mark.parametrize("use_sdp", [True, False])
def test_vits_effective_init(use_sdp):
    torch.manual_seed(0)
    args = model_args("tiny", {"use_sdp": use_sdp, "hidden_channels": 64, "inter_channels": 64,
                               "upsample_initial_channel": 64})
    model = VITS(len(SYMBOLS), 513, 2, args, 256)
    problems, checked = check_model(model, vits_rule(model))
    assert checked > 40
    assert not problems, "\n".join(problems)


def test_decoder_old_style_init_is_caught():
    """A decoder whose weights really are N(0, 0.01) (init_weights before weight_norm) breaks the rule."""
    torch.manual_seed(0)
    model = VITS(len(SYMBOLS), 513, 1, model_args("tiny"), 256)
    with torch.no_grad():
        for m in model.dec.ups:
            w = m.parametrizations.weight
            w.original1.normal_(0, 0.01)
            w.original0.copy_(w.original1.flatten(1).norm(dim=1).view_as(w.original0))
    problems, _ = check_model(model, vits_rule(model))
    assert any(p.startswith("dec.ups.") for p in problems)


def test_discriminator_effective_init():
    torch.manual_seed(0)
    d = MultiPeriodDiscriminator(channel_scale=0.25)
    problems, checked = check_model(d, lambda n, p: "default")
    assert checked > 30
    assert not problems, "\n".join(problems)
