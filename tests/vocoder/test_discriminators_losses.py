import math

import pytest
import torch

from speech.audio import MelSpectrogram
from vocoder.discriminators import (
    FastMultiPeriodDiscriminator,
    MultiPeriodDiscriminator,
    MultiResolutionDiscriminator,
    MultiScaleDiscriminator,
    build_discriminators,
)
from vocoder.losses import (
    MelLoss,
    MultiResolutionSTFTLoss,
    discriminator_loss,
    feature_matching_loss,
    frame_energy_loss,
    generator_adv_loss,
)

T = 4096


def _check_output(out, n_sub, batch):
    logits, fmaps = out
    assert isinstance(logits, list) and isinstance(fmaps, list)
    assert len(logits) == n_sub and len(fmaps) == n_sub
    for lg, fm in zip(logits, fmaps):
        assert lg.dim() == 2 and lg.shape[0] == batch and lg.shape[1] > 0
        assert isinstance(fm, list) and len(fm) >= 2
        assert all(f.shape[0] == batch for f in fm)


@pytest.mark.parametrize(
    "make,n_sub",
    [
        (lambda: MultiPeriodDiscriminator([2, 3, 5]), 3),
        (lambda: FastMultiPeriodDiscriminator([2, 3], [4, 4, 4], kernel_size=11, init_channel=4), 2),
        (lambda: MultiResolutionDiscriminator([256, 512], [64, 128], [256, 512], channels=8), 2),
        (lambda: MultiScaleDiscriminator(), 3),
    ],
)
def test_each_discriminator_output_structure_and_grad(make, n_sub):
    d = make()
    y = torch.randn(3, 1, T, requires_grad=True)
    out = d(y)
    _check_output(out, n_sub, 3)
    sum(x.sum() for x in out[0]).backward()
    assert y.grad is not None and torch.isfinite(y.grad).all()
    assert all(p.grad is not None for p in d.parameters() if p.requires_grad)


def test_fast_mpd_uses_strides_and_kernel():
    d = FastMultiPeriodDiscriminator([3], [4, 2], kernel_size=7, init_channel=4).discriminators[0]
    assert d.hop == 3 * 8
    assert d.blocks[1].dw.kernel_size == (7,) and d.blocks[1].dw.groups == 32  # depthwise after stage 0
    logits, fmap = d(torch.randn(2, 1, 24 * 10))
    assert logits.shape == (2, 30)  # 3 period rows x (240 / 3 / 4 / 2 = 10) folded positions


def test_build_discriminators_selects_and_validates():
    d = build_discriminators(["fast_mpd", "mrd"], [2, 3], [4, 4], 5, 2, [256], [64], [256], 8)
    assert list(d.keys()) == ["fast_mpd", "mrd"]
    out = d(torch.randn(2, 1, 2048))
    assert set(out) == {"fast_mpd", "mrd"}
    with pytest.raises(ValueError, match="discriminators"):
        build_discriminators(["wavenet"], [2], [4], 5, 2, [256], [64], [256])


def test_lsgan_and_feature_matching_values():
    ones = {"x": ([torch.ones(2, 4)], [[torch.ones(2, 3)]])}
    zeros = {"x": ([torch.zeros(2, 4)], [[torch.zeros(2, 3)]])}
    loss_d, _ = discriminator_loss(real=ones, fake=zeros)
    assert loss_d.item() == 0.0  # a perfect critic
    loss_d, _ = discriminator_loss(real=zeros, fake=ones)
    assert loss_d.item() == pytest.approx(2.0)
    assert generator_adv_loss(ones)[0].item() == 0.0
    assert generator_adv_loss(zeros)[0].item() == pytest.approx(1.0)
    fm, _ = feature_matching_loss(ones, zeros)
    assert fm.item() == pytest.approx(2.0)  # 2 x mean |1 - 0|


def test_losses_are_fp32_under_bf16_autocast():
    torch.manual_seed(0)
    real_wav, fake_wav = torch.randn(2, 1, T), torch.randn(2, 1, T)
    stft = MultiResolutionSTFTLoss([256, 512], [64, 128], [256, 512])
    d = MultiPeriodDiscriminator([2, 3])
    with torch.no_grad():
        ref_out = d(torch.cat([real_wav, fake_wav]))
    ref_real = {"mpd": ([x[:2] for x in ref_out[0]], [[f[:2] for f in m] for m in ref_out[1]])}
    ref_fake = {"mpd": ([x[2:] for x in ref_out[0]], [[f[2:] for f in m] for m in ref_out[1]])}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        half = {k: ([x.bfloat16() for x in v[0]], [[f.bfloat16() for f in m] for m in v[1]])
                for k, v in ref_real.items()}
        half_fake = {k: ([x.bfloat16() for x in v[0]], [[f.bfloat16() for f in m] for m in v[1]])
                     for k, v in ref_fake.items()}
        ld, _ = discriminator_loss(half, half_fake)
        lg, _ = generator_adv_loss(half_fake)
        lf, _ = feature_matching_loss(half, half_fake)
        sc, mag = stft(fake_wav.bfloat16(), real_wav.bfloat16())
    for v in (ld, lg, lf, sc, mag):
        assert v.dtype == torch.float32
    sc32, mag32 = stft(fake_wav.bfloat16().float(), real_wav.bfloat16().float())
    torch.testing.assert_close(sc, sc32)
    torch.testing.assert_close(mag, mag32)


def test_mrstft_distance_is_zero_for_identical_and_grows_with_noise():
    stft = MultiResolutionSTFTLoss([256, 512], [64, 128], [256, 512])
    x = torch.randn(1, T)
    assert stft.distance(x, x).item() < 1e-5
    near = stft.distance(x + 0.01 * torch.randn_like(x), x).item()
    far = stft.distance(x + 0.5 * torch.randn_like(x), x).item()
    assert 0 < near < far


def test_frame_energy_loss_sees_the_level_and_not_where_the_energy_sits():
    """The frame-energy term is 0 for the same power spread differently over the bins (a smeared
    harmonic), and grows with a level error: log-power units, 6 dB = ln(10^0.6) ≈ 1.38."""
    mel = torch.full((1, 8, 5), -6.0)
    peaky, spread = mel.clone(), mel.clone()
    peaky[:, 2] = 0.0
    spread[:, 1:4] = 0.5 * math.log((math.exp(0.0) + 2 * math.exp(-12.0)) / 3)  # same power per frame
    assert frame_energy_loss(spread, peaky).item() < 1e-5
    quiet = peaky - 0.5 * math.log(10 ** 0.6)  # 6 dB lower magnitude² in every bin
    assert frame_energy_loss(quiet, peaky).item() == pytest.approx(math.log(10 ** 0.6), rel=1e-4)
    assert frame_energy_loss(quiet.bfloat16(), peaky.bfloat16()).dtype == torch.float32


def test_mel_loss_with_energy_matches_its_parts():
    mel = MelSpectrogram(sample_rate=16000, n_fft=256, win_length=256, hop_length=64, n_mels=20, fmin=0, fmax=8000)
    loss = MelLoss(mel)
    fake, real = 0.1 * torch.randn(2, T), 0.3 * torch.randn(2, T)
    l1, energy = loss.with_energy(fake, real)
    assert l1.item() == pytest.approx(loss(fake, real).item())
    assert energy.item() == pytest.approx(frame_energy_loss(mel(fake), mel(real)).item(), rel=1e-5)
    assert energy.item() > 1.0  # ~9.5 dB quieter
    assert loss.with_energy(fake, real, energy=False)[1] is None
