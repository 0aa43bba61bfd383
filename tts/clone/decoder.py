"""Everything after the text encoder: aligner prior, duration predictor, length regulation,
the non-autoregressive mel decoder with its f0 head, and the post-net.

Non-autoregressive with hard durations (FastSpeech / Glow-TTS style) instead of encoder-decoder
attention: the decoder never has to *find* the alignment, so there is no attention collapse, no
skipped or repeated words, and one forward pass produces the whole utterance.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tts.clone.layers import TransformerStack


class ChannelNorm(nn.Module):
    """LayerNorm over the channel axis of a [B, C, T] tensor (padding-safe, unlike BatchNorm)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.transpose(1, 2)).transpose(1, 2)


class AlignerPrior(nn.Module):
    """Text hidden (+ speaker) → a per-symbol mean mel, the Gaussian whose likelihood MAS maximises.

    The prior is speaker-dependent (a speaker bias is added) because the same symbol has a very
    different mel for a low male and a high female voice; without it MAS would align on timbre.
    """

    def __init__(self, text_dim: int, spk_dim: int, n_mels: int) -> None:
        super().__init__()
        self.spk = nn.Linear(spk_dim, text_dim)
        self.net = nn.Sequential(nn.Conv1d(text_dim, text_dim, 3, padding=1), nn.GELU(),
                                 nn.Conv1d(text_dim, n_mels, 1))

    def forward(self, h: torch.Tensor, spk: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """h [B, T, D], spk [B, S], mask [B, T] → mu [B, n_mels, T]."""
        x = (h + self.spk(spk).unsqueeze(1)).transpose(1, 2)
        return self.net(x) * mask.unsqueeze(1).to(x.dtype)


class DurationPredictor(nn.Module):
    """Two conv layers → log-duration (frames) per symbol; trained on MAS durations, gradient-stopped."""

    def __init__(self, text_dim: int, spk_dim: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.spk = nn.Linear(spk_dim, text_dim)
        self.conv1 = nn.Conv1d(text_dim, hidden, 3, padding=1)
        self.norm1 = ChannelNorm(hidden)
        self.conv2 = nn.Conv1d(hidden, hidden, 3, padding=1)
        self.norm2 = ChannelNorm(hidden)
        self.out = nn.Conv1d(hidden, 1, 1)
        self.drop = nn.Dropout(dropout)

    def forward(self, h: torch.Tensor, spk: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """h [B, T, D] (already detached by the caller), spk [B, S], mask [B, T] → log_dur [B, T]."""
        m = mask.unsqueeze(1).to(h.dtype)
        x = (h + self.spk(spk).unsqueeze(1)).transpose(1, 2) * m
        x = self.drop(self.norm1(F.relu(self.conv1(x))))
        x = self.drop(self.norm2(F.relu(self.conv2(x * m))))
        return (self.out(x * m) * m).squeeze(1)


def durations_to_path(durations: torch.Tensor, n_frames: int | torch.Tensor) -> torch.Tensor:
    """Integer durations [B, T_text] → hard monotonic path [B, T_text, n_frames] (0/1).

    Symbol i owns frames [cumsum_{i-1}, cumsum_i); frames past the total stay unassigned, which is
    how a static (bucket-padded) frame length and a shorter real utterance coexist.
    """
    ends = torch.cumsum(durations, dim=1)
    starts = ends - durations
    frames = torch.arange(n_frames, device=durations.device).view(1, 1, -1)
    return ((frames >= starts.unsqueeze(-1)) & (frames < ends.unsqueeze(-1))).to(torch.float32)


def expand(h: torch.Tensor, path: torch.Tensor) -> torch.Tensor:
    """Length regulation: h [B, T_text, D] and path [B, T_text, T_frames] → [B, T_frames, D]."""
    return torch.bmm(path.transpose(1, 2).to(h.dtype), h)


class MelDecoder(nn.Module):
    """Transformer over frame-expanded text states, speaker-conditioned in every norm (AdaLN).

    Outputs the (normalised) mel and two f0 channels per frame: normalised log-f0 and a voiced
    logit, because the NSF vocoder needs an explicit f0 track to drive its harmonic source.
    """

    def __init__(self, text_dim: int, spk_dim: int, dim: int, layers: int, heads: int, n_mels: int,
                 ffn_mult: int, kernel_size: int, dropout: float) -> None:
        super().__init__()
        self.inp = nn.Linear(text_dim, dim)
        self.spk = nn.Linear(spk_dim, dim)
        self.stack = TransformerStack(dim, layers, heads, ffn_mult, kernel_size, dropout, cond_dim=spk_dim)
        self.mel = nn.Linear(dim, n_mels)
        self.f0 = nn.Sequential(nn.Linear(dim, dim // 2), nn.GELU(), nn.Linear(dim // 2, 2))

    def forward(self, x: torch.Tensor, spk: torch.Tensor, mask: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, text_dim], spk [B, S], mask [B, T] → mel [B, n_mels, T], logf0 [B, T], voiced logit [B, T]."""
        h = self.stack(self.inp(x) + self.spk(spk).unsqueeze(1), mask, spk)
        m = mask.to(h.dtype)
        f0 = self.f0(h) * m.unsqueeze(-1)
        return self.mel(h).transpose(1, 2) * m.unsqueeze(1), f0[..., 0], f0[..., 1]


class PostNet(nn.Module):
    """Residual conv stack (Tacotron 2) that sharpens the decoder mel; channel LayerNorm, not BatchNorm."""

    def __init__(self, n_mels: int, channels: int, layers: int, dropout: float) -> None:
        super().__init__()
        dims = [n_mels] + [channels] * (layers - 1) + [n_mels]
        self.convs = nn.ModuleList(nn.Conv1d(a, b, 5, padding=2) for a, b in zip(dims[:-1], dims[1:]))
        self.norms = nn.ModuleList(ChannelNorm(c) for c in dims[1:-1])
        self.drop = nn.Dropout(dropout)

    def forward(self, mel: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = mask.unsqueeze(1).to(mel.dtype)
        x = mel
        for conv, norm in zip(self.convs[:-1], self.norms):
            x = self.drop(torch.tanh(norm(conv(x * m))))
        return (mel + self.convs[-1](x * m)) * m
