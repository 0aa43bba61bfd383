"""VITS' G update calls the frozen discriminator on real (no grad) and fake (with grad) apart
(common.training.critic_outputs_for_generator): the generator's gradient equals the former single call on
cat([real, fake]), with spectral norm too, and the power iteration runs once, as before."""

import pytest
import torch

from common.training import critic_outputs_for_generator
from tts.vits.discriminator import MultiPeriodDiscriminator
from tts.vits.losses import feature_loss, generator_loss


@pytest.mark.parametrize("spectral", [False, True])
def test_split_call_gives_the_concatenated_calls_gradient(spectral):
    torch.manual_seed(0)
    disc = MultiPeriodDiscriminator((2, 3), channel_scale=0.125, use_spectral_norm=spectral)
    disc.requires_grad_(False)
    y = torch.randn(2, 1, 1024) * 0.3
    y_hat = (torch.randn(2, 1, 1024) * 0.3).requires_grad_(True)
    state = {k: v.clone() for k, v in disc.state_dict().items()}

    _, y_d_g, fmap_r, fmap_g = disc(y, y_hat)
    (old,) = torch.autograd.grad(generator_loss(y_d_g) + feature_loss(fmap_r, fmap_g), y_hat)
    after_old = {k: v.clone() for k, v in disc.state_dict().items()}

    disc.load_state_dict(state)
    (_, fmap_r), (y_d_g, fmap_g) = critic_outputs_for_generator(disc.score, y, y_hat)
    assert all(not f.requires_grad for fm in fmap_r for f in fm)  # the real half kept no graph
    (new,) = torch.autograd.grad(generator_loss(y_d_g) + feature_loss(fmap_r, fmap_g), y_hat)

    torch.testing.assert_close(new, old, rtol=1e-4, atol=1e-5 * old.abs().max().item())
    for k, v in disc.state_dict().items():
        torch.testing.assert_close(v, after_old[k])
