"""VITS losses (all computed in fp32): least-squares GAN losses and feature matching (the
vocoder's, ``vocoder.losses``, over VITS' flat list of sub-critics), and the KL between the
posterior (pushed through the flow) and the text-conditioned prior."""

from __future__ import annotations

import torch

from vocoder.losses import feature_matching as feature_loss
from vocoder.losses import lsgan_loss

__all__ = ["discriminator_loss", "feature_loss", "generator_loss", "kl_loss"]


def discriminator_loss(real: list[torch.Tensor], fake: list[torch.Tensor]) -> torch.Tensor:
    return lsgan_loss(real, 1.0) + lsgan_loss(fake, 0.0)


def generator_loss(fake: list[torch.Tensor]) -> torch.Tensor:
    return lsgan_loss(fake, 1.0)


def kl_loss(z_p: torch.Tensor, logs_q: torch.Tensor, m_p: torch.Tensor, logs_p: torch.Tensor,
            z_mask: torch.Tensor) -> torch.Tensor:
    """KL(q(z|x) || p(z|c)) estimated at the sampled z_p (all [B, C, T], mask [B, 1, T])."""
    z_p, logs_q, m_p, logs_p, z_mask = (t.float() for t in (z_p, logs_q, m_p, logs_p, z_mask))
    kl = logs_p - logs_q - 0.5 + 0.5 * (z_p - m_p) ** 2 * torch.exp(-2.0 * logs_p)
    return torch.sum(kl * z_mask) / torch.sum(z_mask)
