"""bench/gpu/peak_flops.py: FLOPs counted against a hand count (grouped convs, whose weight gradient
torch's own formula counts `groups` times too high), the optimizer step and checkpointing's recompute kept
apart from the model's FLOPs, and the peak table picking the right row for each card name."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from bench.gpu.peak_flops import count_flops, peak_tflops
from common.muon import Muon


def _fwd_bwd(conv: nn.Module, x: torch.Tensor) -> None:
    conv(x).sum().backward()


@pytest.mark.parametrize("groups", [1, 16])
@pytest.mark.parametrize("input_grad", [True, False])
def test_grouped_conv1d_forward_and_backward_match_the_hand_count(groups, input_grad):
    n, c_in, c_out, k, length = 2, 32, 64, 5, 40
    conv = nn.Conv1d(c_in, c_out, k, groups=groups, bias=False)
    x = torch.randn(n, c_in, length, requires_grad=input_grad)
    l_out = length - k + 1
    per_pass = 2 * n * c_out * (c_in // groups) * k * l_out  # forward = input grad = weight grad
    passes = 3 if input_grad else 2
    got = count_flops(lambda: _fwd_bwd(conv, x))
    assert got.model == passes * per_pass and got.optimizer == 0 and got.recompute == 0


@pytest.mark.parametrize("groups", [1, 16])
def test_grouped_conv2d_forward_and_backward_match_the_hand_count(groups):
    n, c_in, c_out, k, side = 2, 32, 32, 3, 10  # padding 1: the output is side x side
    conv = nn.Conv2d(c_in, c_out, k, padding=1, groups=groups, bias=False)
    x = torch.randn(n, c_in, side, side, requires_grad=True)
    per_pass = 2 * n * c_out * (c_in // groups) * k * k * side * side
    assert count_flops(lambda: _fwd_bwd(conv, x)).model == 3 * per_pass


@pytest.mark.parametrize("groups", [1, 16])
def test_grouped_transposed_conv1d_matches_the_hand_count(groups):
    n, c_in, c_out, k, length = 2, 32, 64, 4, 20  # each input position meets the whole kernel
    conv = nn.ConvTranspose1d(c_in, c_out, k, stride=2, groups=groups, bias=False)
    x = torch.randn(n, c_in, length, requires_grad=True)
    per_pass = 2 * n * c_in * (c_out // groups) * k * length
    assert count_flops(lambda: _fwd_bwd(conv, x)).model == 3 * per_pass


def test_the_optimizer_step_is_counted_apart_from_the_model():
    """Muon's Newton-Schulz matmuls are the optimizer's FLOPs, not the model's."""
    lin = nn.Linear(16, 32, bias=False)
    opt = Muon([lin.weight], lr=0.02)
    x = torch.randn(8, 16)

    def step() -> None:
        opt.zero_grad()
        lin(x).sum().backward()
        opt.step()

    got = count_flops(step)
    assert got.model == 2 * (2 * 8 * 16 * 32)  # forward + weight gradient (x needs no gradient)
    assert got.optimizer > 0 and got.recompute == 0 and got.total == got.model + got.optimizer


def test_checkpointing_recompute_is_counted_apart_and_the_model_figure_does_not_change():
    """The model's FLOPs with gradient checkpointing equal those without; the second forward is recompute.
    Also through a module that imported `checkpoint` by name (vae.model does). By default torch stops a
    recompute once it has what backward needs (here: before the last Linear, whose output nobody saved)."""
    from vae import model as vae_model

    block = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 16))
    x = torch.randn(8, 16, requires_grad=True)
    forward = 2 * 8 * 16 * 64 * 2
    plain = count_flops(lambda: block(x).sum().backward())
    with torch.utils.checkpoint.set_checkpoint_early_stop(False):
        direct = count_flops(lambda: checkpoint(block, x, use_reentrant=False).sum().backward())
        via_vae = count_flops(lambda: vae_model._run(block, x, use_checkpoint=True).sum().backward())
    early = count_flops(lambda: checkpoint(block, x, use_reentrant=False).sum().backward())
    assert plain.model == 3 * forward and plain.recompute == 0
    for got in (direct, via_vae):
        assert got.model == plain.model and got.recompute == forward and got.optimizer == 0
    assert early.model == plain.model and early.recompute == 2 * 8 * 16 * 64
    assert vae_model.checkpoint is torch.utils.checkpoint.checkpoint  # put back


def test_h200_nvl_and_h200_sxm_pick_different_rows():
    nvl, sxm = peak_tflops("NVIDIA H200 NVL", "bf16"), peak_tflops("NVIDIA H200", "bf16")
    assert nvl == (835.5, "H200 NVL dense bf16 peak 835.5 TFLOP/s")
    assert sxm == (989.4, "H200 dense bf16 peak 989.4 TFLOP/s")
    assert peak_tflops("NVIDIA H200 NVL", "fp32")[0] == 60.0 and peak_tflops("NVIDIA H200", "fp32")[0] == 66.9
    assert peak_tflops("NVIDIA H100 NVL", "tf32")[0] == 417.5
    assert peak_tflops("NVIDIA GeForce RTX 4090", "bf16")[0] == 165.2
