"""VITS losses (all computed in fp32): least-squares GAN losses, feature matching, and the KL
between the posterior (pushed through the flow) and the text-conditioned prior."""

from __future__ import annotations

import torch


def discriminator_loss(real: list[torch.Tensor], fake: list[torch.Tensor]) -> torch.Tensor:
    return sum(torch.mean((1 - r.float()) ** 2) + torch.mean(g.float() ** 2) for r, g in zip(real, fake))


def generator_loss(fake: list[torch.Tensor]) -> torch.Tensor:
    return sum(torch.mean((1 - g.float()) ** 2) for g in fake)


def feature_loss(fmap_r: list[list[torch.Tensor]], fmap_g: list[list[torch.Tensor]]) -> torch.Tensor:
    """L1 between the discriminators' hidden features of real and generated audio (×2 as in HiFi-GAN)."""
    loss = sum(torch.mean(torch.abs(r.detach().float() - g.float())) for dr, dg in zip(fmap_r, fmap_g)
               for r, g in zip(dr, dg))
    return loss * 2


def kl_loss(z_p: torch.Tensor, logs_q: torch.Tensor, m_p: torch.Tensor, logs_p: torch.Tensor,
            z_mask: torch.Tensor) -> torch.Tensor:
    """KL(q(z|x) || p(z|c)) estimated at the sampled z_p (all [B, C, T], mask [B, 1, T])."""
    z_p, logs_q, m_p, logs_p, z_mask = (t.float() for t in (z_p, logs_q, m_p, logs_p, z_mask))
    kl = logs_p - logs_q - 0.5 + 0.5 * (z_p - m_p) ** 2 * torch.exp(-2.0 * logs_p)
    return torch.sum(kl * z_mask) / torch.sum(z_mask)
