"""VITS' discriminator: HiFi-GAN's multi-period discriminator (periods 2, 3, 5, 7, 11: 2-D convs
over the waveform folded by each period, which catches periodic artefacts) plus one MelGAN-style
scale discriminator on the raw waveform (grouped 1-D convs).

The sub-critics are the vocoder's (``vocoder.discriminators.PeriodDiscriminator`` and
``ScaleDiscriminator``); what is VITS' own is their sizes, the one list holding them (parameter
names ``discriminators.{i}.convs.*`` / ``conv_post`` as jaywalnut310/vits and checkpoints written
before) and the call on real and generated audio in one batch. ``channel_scale`` shrinks every
layer for the tiny CPU preset; 1.0 is the paper's size (46.7 M parameters with the five periods).
"""

from __future__ import annotations

import torch
from torch import nn

from vocoder.discriminators import PeriodDiscriminator, ScaleDiscriminator

PERIOD_CHANNELS = (32, 128, 512, 1024, 1024)
# (in, out, kernel, stride, groups, padding): VITS' scale critic (MelGAN's sizes, not HiFi-GAN's).
SCALE_LAYERS = ((1, 16, 15, 1, 1, 7), (16, 64, 41, 4, 4, 20), (64, 256, 41, 4, 16, 20),
                (256, 1024, 41, 4, 64, 20), (1024, 1024, 41, 4, 256, 20), (1024, 1024, 5, 1, 1, 2))


def _ch(c: int, scale: float) -> int:
    return max(1, int(round(c * scale)))


def scaled_scale_layers(channel_scale: float) -> tuple[tuple[int, int, int, int, int, int], ...]:
    """SCALE_LAYERS with every width times ``channel_scale`` (the waveform input stays 1 channel;
    groups shrink with the widths and always divide both)."""
    layers = []
    for cin, cout, k, s, groups, pad in SCALE_LAYERS:
        cin_s, cout_s = (1 if cin == 1 else _ch(cin, channel_scale)), _ch(cout, channel_scale)
        g = max(1, min(_ch(groups, channel_scale), cin_s))
        while cin_s % g or cout_s % g:
            g -= 1
        layers.append((cin_s, cout_s, k, s, g, pad))
    return tuple(layers)


class MultiPeriodDiscriminator(nn.Module):
    """One scale discriminator + one period discriminator per period (VITS' 'MPD')."""

    def __init__(self, periods: list[int] = (2, 3, 5, 7, 11), channel_scale: float = 1.0,
                 use_spectral_norm: bool = False):
        super().__init__()
        channels = tuple(_ch(c, channel_scale) for c in PERIOD_CHANNELS)
        self.discriminators = nn.ModuleList(
            [ScaleDiscriminator(use_spectral_norm, scaled_scale_layers(channel_scale))]
            + [PeriodDiscriminator(p, channels=channels, use_spectral_norm=use_spectral_norm) for p in periods])

    def score(self, y: torch.Tensor) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
        """One batch [B, 1, T] → (scores, fmaps) of every sub-discriminator (the generator update
        calls this on real and fake apart: common.training.critic_outputs_for_generator)."""
        outs = [d(y) for d in self.discriminators]
        return [o[0] for o in outs], [o[1] for o in outs]

    def forward(self, y: torch.Tensor, y_hat: torch.Tensor):
        """Real and generated [B, 1, T] → (real scores, fake scores, real fmaps, fake fmaps).
        Both go through each discriminator in one batch (one kernel launch per layer)."""
        y_d_rs, y_d_gs, fmap_rs, fmap_gs = [], [], [], []
        both = torch.cat([y, y_hat], 0)
        n = y.size(0)
        for d in self.discriminators:
            score, fmap = d(both)
            y_d_rs.append(score[:n])
            y_d_gs.append(score[n:])
            fmap_rs.append([f[:n] for f in fmap])
            fmap_gs.append([f[n:] for f in fmap])
        return y_d_rs, y_d_gs, fmap_rs, fmap_gs
