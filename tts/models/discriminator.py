"""VITS' discriminator: HiFi-GAN's multi-period discriminator (periods 2, 3, 5, 7, 11: 2-D convs
over the waveform folded by each period, which catches periodic artefacts) plus one
scale discriminator on the raw waveform (grouped 1-D convs).

``channel_scale`` shrinks every layer for the tiny CPU preset; 1.0 is the paper's size
(46.7 M parameters with the five periods).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import spectral_norm, weight_norm

from tts.models.modules import get_padding

LRELU_SLOPE = 0.1


def _ch(c: int, scale: float) -> int:
    return max(1, int(round(c * scale)))


class DiscriminatorP(nn.Module):
    def __init__(self, period: int, kernel_size: int = 5, stride: int = 3, channel_scale: float = 1.0,
                 use_spectral_norm: bool = False):
        super().__init__()
        self.period = period
        norm = spectral_norm if use_spectral_norm else weight_norm
        chans = [1] + [_ch(c, channel_scale) for c in (32, 128, 512, 1024, 1024)]
        strides = [stride, stride, stride, stride, 1]
        self.convs = nn.ModuleList(
            norm(nn.Conv2d(cin, cout, (kernel_size, 1), (s, 1), padding=(get_padding(kernel_size), 0)))
            for cin, cout, s in zip(chans[:-1], chans[1:], strides))
        self.conv_post = norm(nn.Conv2d(chans[-1], 1, (3, 1), 1, padding=(1, 0)))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        fmap = []
        b, c, t = x.shape
        if t % self.period:  # fold the waveform into [B, C, T / period, period]
            pad = self.period - t % self.period
            x = F.pad(x, (0, pad), "reflect")
            t = t + pad
        x = x.view(b, c, t // self.period, self.period)
        for conv in self.convs:
            x = F.leaky_relu(conv(x), LRELU_SLOPE)
            fmap.append(x)
        x = self.conv_post(x)
        fmap.append(x)
        return torch.flatten(x, 1, -1), fmap


class DiscriminatorS(nn.Module):
    def __init__(self, channel_scale: float = 1.0, use_spectral_norm: bool = False):
        super().__init__()
        norm = spectral_norm if use_spectral_norm else weight_norm
        spec = [(1, 16, 15, 1, 1, 7), (16, 64, 41, 4, 4, 20), (64, 256, 41, 4, 16, 20),
                (256, 1024, 41, 4, 64, 20), (1024, 1024, 41, 4, 256, 20), (1024, 1024, 5, 1, 1, 2)]
        layers = []
        for cin, cout, k, s, groups, pad in spec:
            cin_s, cout_s = (1 if cin == 1 else _ch(cin, channel_scale)), _ch(cout, channel_scale)
            g = max(1, min(_ch(groups, channel_scale), cin_s))
            while cin_s % g or cout_s % g:  # groups must divide both widths
                g -= 1
            layers.append(norm(nn.Conv1d(cin_s, cout_s, k, s, groups=g, padding=pad)))
        self.convs = nn.ModuleList(layers)
        self.conv_post = norm(nn.Conv1d(_ch(1024, channel_scale), 1, 3, 1, padding=1))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        fmap = []
        for conv in self.convs:
            x = F.leaky_relu(conv(x), LRELU_SLOPE)
            fmap.append(x)
        x = self.conv_post(x)
        fmap.append(x)
        return torch.flatten(x, 1, -1), fmap


class MultiPeriodDiscriminator(nn.Module):
    """One scale discriminator + one period discriminator per period (VITS' 'MPD')."""

    def __init__(self, periods: list[int] = (2, 3, 5, 7, 11), channel_scale: float = 1.0,
                 use_spectral_norm: bool = False):
        super().__init__()
        self.discriminators = nn.ModuleList(
            [DiscriminatorS(channel_scale, use_spectral_norm)]
            + [DiscriminatorP(p, channel_scale=channel_scale, use_spectral_norm=use_spectral_norm) for p in periods])

    def score(self, y: torch.Tensor) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
        """One batch [B, 1, T] → (scores, fmaps) of every sub-discriminator (the generator update
        calls this on real and fake apart: common.training.critic_for_generator)."""
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
