"""The loss: KL reduction, adaptive GAN weight, disc_start gating, LPIPS frozen/eval, backbone errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from vae.losses import (
    FrozenLPIPS,
    PatchDiscriminator,
    PerceptualWeightsError,
    VAELoss,
    adaptive_gan_weight,
    adaptive_weight_max,
    find_backbone_weights,
    hinge_d_loss,
)
from vae.model import DiagonalGaussian


def known_posterior(batch: int = 2) -> DiagonalGaussian:
    mean = torch.full((batch, 4, 2, 2), 1.0)
    logvar = torch.zeros(batch, 4, 2, 2)
    return DiagonalGaussian(torch.cat([mean, logvar], 1))  # KL per element = 0.5 * 1 = 0.5


def test_kl_reduction_is_latent_diffusions():
    post = known_posterior(batch=3)
    x = torch.zeros(3, 3, 8, 8)
    loss_fn = VAELoss(kl_weight=1e-6, perceptual_weight=0.0, disc_weight=0.0)
    loss, logs = loss_fn.generator_loss(x, x.clone(), post, step=0)
    # latent-diffusion: sum over latent elements (4*2*2 = 16 → 8.0), mean over the batch.
    assert logs["kl"].item() == pytest.approx(8.0)
    # our total = LDM total / (C*H*W): rec is 0 here, so loss = kl_weight * kl / 192.
    assert loss.item() == pytest.approx(1e-6 * 8.0 / 192)


def test_reconstruction_terms_and_logvar():
    x = torch.zeros(2, 3, 4, 4)
    rec = torch.full_like(x, 0.5)
    post = known_posterior()
    l1 = VAELoss(kl_weight=0, perceptual_weight=0, disc_weight=0)
    l2 = VAELoss(kl_weight=0, perceptual_weight=0, disc_weight=0, rec_loss="l2")
    assert l1.generator_loss(x, rec, post, 0)[0].item() == pytest.approx(0.5)
    assert l2.generator_loss(x, rec, post, 0)[0].item() == pytest.approx(0.25)
    lv = VAELoss(kl_weight=0, perceptual_weight=0, disc_weight=0, learn_logvar=True, logvar_init=1.0)
    loss, _ = lv.generator_loss(x, rec, post, 0)
    assert loss.item() == pytest.approx(0.5 / torch.e + 1.0, rel=1e-5)  # rec / exp(lv) + lv
    loss.backward()
    assert lv.logvar.logvar.grad is not None


def test_adaptive_weight_is_the_gradient_norm_ratio():
    last = nn.Parameter(torch.randn(3, 3))
    a, b = (last * 2.0).sum(), (last * 0.5).sum()  # gradients 2·1 and 0.5·1 everywhere
    w, ratio = adaptive_gan_weight(a, b, last, pixels=1)
    assert w.item() == ratio.item() == pytest.approx(4.0 * 1.5 / (1.5 + 1e-4), rel=1e-4)
    # The GradScaler's scale cancels out.
    assert adaptive_gan_weight(a, b, last, 1, grad_scale=1024.0)[0].item() == pytest.approx(w.item(), rel=1e-4)
    # Clamped at 1e4 / pixels (the ratio is returned unclamped) and NaN-safe.
    w, ratio = adaptive_gan_weight((last * 1e9).sum(), (last * 1e-9).sum(), last, pixels=4)
    assert w.item() == 2500.0 and ratio.item() > 1e4


def test_clamp_is_latent_diffusions_at_256_and_1024():
    # Their clamp, 1e4 on the loss summed over C·H·W pixel values, carried to our per-pixel mean.
    assert adaptive_weight_max(3 * 256 * 256) == pytest.approx(0.050862630, rel=1e-6)   # 1e4 / 196608
    assert adaptive_weight_max(3 * 1024 * 1024) == pytest.approx(0.0031789144, rel=1e-6)  # 1e4 / 3145728


class ScaledDisc(nn.Module):
    """A PatchGAN whose logits are scaled: a small scale makes ∇g tiny, so the ratio is large."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.disc, self.scale = PatchDiscriminator(3, 8, 2), scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.disc(x) * self.scale


def reference_gan_weight(x: torch.Tensor, rec: torch.Tensor, disc: nn.Module, last: torch.Tensor) -> torch.Tensor:
    """latent-diffusion's formula written out: L1 NLL summed over pixels / batch, ratio of the gradient
    norms at the last layer with +1e-4, clamped to [0, 1e4], times disc_weight 0.5."""
    nll_sum = (x - rec).abs().sum() / x.shape[0]
    g_loss = -disc(rec).mean()
    g_nll = torch.autograd.grad(nll_sum, last, retain_graph=True)[0]
    g_gan = torch.autograd.grad(g_loss, last, retain_graph=True)[0]
    return (g_nll.norm() / (g_gan.norm() + 1e-4)).clamp(0.0, 1e4) * 0.5


@pytest.mark.parametrize("size", [16, 32])
@pytest.mark.parametrize("scale", [1e-4, 1.0])  # clamp binding / not binding
def test_gan_weight_equals_latent_diffusions_on_their_scale(size, scale):
    torch.manual_seed(size)
    last = nn.Parameter(torch.randn(3, 3, 3, 3) * 0.2)
    x = torch.rand(2, 3, size, size) * 2 - 1
    rec = nn.functional.conv2d(x, last, padding=1)
    disc = ScaledDisc(scale)
    pixels = 3 * size * size
    ref = reference_gan_weight(x, rec, disc, last)
    ours = VAELoss(kl_weight=0, perceptual_weight=0, disc_start=0)
    loss, logs = ours.generator_loss(x, rec, known_posterior(), 1, disc, last)
    binding = logs["gan_grad_ratio"].item() > adaptive_weight_max(pixels)
    assert binding == (scale < 1)  # the two cases really are the two regimes
    assert (logs["d_weight"] * pixels).item() == pytest.approx(ref.item(), rel=1e-4)
    # The whole generator loss is latent-diffusion's divided by C·H·W (KL weight 0 here).
    ref_total = (x - rec).abs().sum() / 2 - ref * disc(rec).mean()
    assert (loss * pixels).item() == pytest.approx(ref_total.item(), rel=1e-4)


def test_disc_start_gates_the_gan_terms():
    torch.manual_seed(0)
    disc = PatchDiscriminator(3, 8, 2)
    last = nn.Parameter(torch.randn(3, 3, 3, 3))
    x = torch.randn(2, 3, 32, 32)
    rec = nn.functional.conv2d(x, last, padding=1)
    loss_fn = VAELoss(kl_weight=0, perceptual_weight=0, disc_start=5, disc_weight=0.5)
    post = known_posterior()
    before, logs_b = loss_fn.generator_loss(x, rec, post, 4, disc, last)
    after, logs_a = loss_fn.generator_loss(x, rec, post, 5, disc, last)
    assert "g_loss" not in logs_b and "g_loss" in logs_a and logs_a["d_weight"].item() > 0
    assert after.item() != pytest.approx(before.item())
    d_before, _ = loss_fn.discriminator_loss(disc, x, rec, 4)
    d_after, _ = loss_fn.discriminator_loss(disc, x, rec, 5)
    assert d_before.item() == 0.0 and d_after.item() > 0
    assert not VAELoss(perceptual_weight=0, disc_weight=0.0, disc_start=0).gan_active(100)


def test_hinge_loss_values():
    assert hinge_d_loss(torch.full((4,), 2.0), torch.full((4,), -2.0)).item() == 0.0
    assert hinge_d_loss(torch.zeros(4), torch.zeros(4)).item() == pytest.approx(1.0)


def test_lpips_frozen_eval_and_differentiable():
    lp = FrozenLPIPS("vgg", random_backbone=True)
    assert not any(p.requires_grad for p in lp.parameters())
    lp.train()
    assert not lp.training and not any(m.training for m in lp.modules())
    x = torch.rand(2, 3, 32, 32) * 2 - 1
    y = (x + 0.3 * torch.randn_like(x)).clamp(-1, 1).requires_grad_(True)
    d = lp(y, x)
    assert d.shape == (2, 1, 1, 1) and (d > 0).all()
    assert lp(x, x).abs().max().item() < 1e-6
    d.sum().backward()
    assert y.grad is not None and y.grad.abs().sum() > 0
    loss_fn = VAELoss(perceptual_weight=1.0, perceptual=lp, disc_weight=0)
    _, logs = loss_fn.generator_loss(x, y.detach(), known_posterior(), 0)
    assert logs["lpips"].item() > 0


def test_missing_backbone_says_how_to_provide_it(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    with pytest.raises(PerceptualWeightsError) as err:
        find_backbone_weights("vgg")
    msg = str(err.value)
    assert "vgg16-397923af.pth" in msg and "--perceptual_weights" in msg and "--perceptual_weight 0" in msg
    with pytest.raises(PerceptualWeightsError, match="no such file"):
        find_backbone_weights("vgg", tmp_path / "nope.pth")


def test_backbone_loaded_from_a_torchvision_state_dict(tmp_path):
    # torchvision's vgg16 layout: features.{index}.{weight,bias} (lpips keeps the same indices).
    widths = [(3, 64), (64, 64), (64, 128), (128, 128), (128, 256), (256, 256), (256, 256), (256, 512),
              (512, 512), (512, 512), (512, 512), (512, 512), (512, 512)]
    g = torch.Generator().manual_seed(1)
    sd = {}
    for idx, (cin, cout) in zip((0, 2, 5, 7, 10, 12, 14, 17, 19, 21, 24, 26, 28), widths):
        sd[f"features.{idx}.weight"] = torch.randn(cout, cin, 3, 3, generator=g) * 0.05
        sd[f"features.{idx}.bias"] = torch.randn(cout, generator=g) * 0.05
    sd["classifier.0.weight"] = torch.zeros(2, 2)  # extra keys of a full vgg16 file are ignored
    torch.save(sd, tmp_path / "vgg16-397923af.pth")
    torch.manual_seed(2)
    lp = FrozenLPIPS("vgg", weights_path=tmp_path / "vgg16-397923af.pth")
    assert torch.equal(lp.net.net.slice3.state_dict()["10.weight"], sd["features.10.weight"])
    assert lp.source.endswith("vgg16-397923af.pth")
    torch.save({"features.0.weight": torch.zeros(1)}, tmp_path / "bad.pth")
    with pytest.raises(PerceptualWeightsError, match="not a torchvision"):
        FrozenLPIPS("vgg", weights_path=tmp_path / "bad.pth")
