import math

import pytest
import torch
from torch.nn.utils import parametrize

from vocoder.model import Generator, GeneratorArgs, remove_all_weight_norm, sine_phase


def _args(**kw) -> GeneratorArgs:
    base = dict(sampling_rate=22050, num_mels=20, hop_size=256, upsample_rates=[8, 8, 2, 2],
                upsample_kernel_sizes=[16, 16, 4, 4], upsample_initial_channel=32, resblock="1",
                resblock_kernel_sizes=[3, 5], resblock_dilation_sizes=[[1, 3], [1, 3]])
    base.update(kw)
    return GeneratorArgs(**base)


@pytest.mark.parametrize("mini_nsf", [False, True])
@pytest.mark.parametrize("resblock", ["1", "2"])
def test_generator_shapes(mini_nsf, resblock):
    g = Generator(_args(mini_nsf=mini_nsf, resblock=resblock))
    mel = torch.randn(3, 20, 7)
    f0 = torch.full((3, 7), 150.0)
    y = g(mel, f0)
    assert y.shape == (3, 1, 7 * 256)
    assert y.abs().max() <= 1.0  # tanh output
    y.sum().backward()
    assert g.conv_pre.parametrizations.weight.original1.grad is not None


def test_weight_norm_removal_keeps_output():
    torch.manual_seed(0)
    g = Generator(_args()).eval()
    mel, f0 = torch.randn(2, 20, 6), torch.full((2, 6), 210.0)
    torch.manual_seed(1)
    before = g(mel, f0)
    n = remove_all_weight_norm(g)
    assert n > 10
    assert not any(parametrize.is_parametrized(m) for m in g.modules())
    torch.manual_seed(1)  # the full NSF source draws noise and phases
    after = g(mel, f0)
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-4)


def test_mini_nsf_structure_and_source():
    g = Generator(_args(mini_nsf=True))
    assert hasattr(g, "source_conv") and not hasattr(g, "m_source") and not hasattr(g, "noise_convs")
    assert g.upp == 64 and g.source_sr == 22050 / 4
    full = Generator(_args(mini_nsf=False))
    assert full.m_source.l_linear.in_features == 9 and len(full.noise_convs) == 4
    # The mini source is a single sine at f0 at the rate after the 2nd upsampling layer.
    f0 = torch.full((1, 40), 300.0)
    src = g.source(f0)[0, 0]
    assert src.shape[0] == 40 * 64
    spec = torch.fft.rfft(src * torch.hann_window(len(src)))
    peak_hz = spec.abs().argmax().item() * g.source_sr / len(src)
    assert abs(peak_hz - 300.0) < 3.0


def test_sine_phase_is_continuous_and_exact():
    sr, upp = 8000.0, 50
    f0 = torch.full((1, 30), 123.0)
    phase = sine_phase(f0, upp, sr)[0]
    n = torch.arange(1, phase.shape[0] + 1, dtype=torch.float64)
    expected = torch.remainder(n * 123.0 / sr, 1.0)
    wrapped = torch.remainder(phase.double() - expected + 0.5, 1.0) - 0.5
    assert wrapped.abs().max() < 1e-5
    # A pitch glide changes frequency smoothly: no phase jump bigger than the max increment.
    glide = torch.linspace(100, 400, 30)[None]
    d = torch.remainder(torch.diff(sine_phase(glide, upp, sr)[0]), 1.0)
    assert d.max() <= 400 / sr + 1e-4 and d.min() >= 100 / sr - 1e-4


def test_f0_above_nyquist_is_clamped_not_aliased():
    g = Generator(_args(mini_nsf=True))
    src = g.source(torch.full((1, 10), 1e5))
    assert torch.isfinite(src).all()


def test_bad_hop_names_the_keys():
    with pytest.raises(ValueError, match="upsample_rates"):
        Generator(_args(hop_size=300))
    with pytest.raises(ValueError, match="frames"):
        Generator(_args())(torch.randn(1, 20, 5), torch.full((1, 6), 100.0))


def test_mel_f0_frame_mismatch_and_autocast_source_fp32():
    g = Generator(_args(mini_nsf=True))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = g(torch.randn(1, 20, 4), torch.full((1, 4), 220.0))
    assert y.shape == (1, 1, 1024) and math.isfinite(y.float().sum().item())
