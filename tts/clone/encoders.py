"""The two encoders of the voice-cloning model: text (what is said) and reference audio (who says it)."""

from __future__ import annotations

import torch
from torch import nn

from tts.clone.layers import TransformerStack


class TextEncoder(nn.Module):
    """Transformer over the normalised Uzbek symbol ids → one hidden vector per symbol.

    Speaker-independent on purpose: the content representation is shared by all voices, and the
    speaker enters afterwards (aligner, duration predictor, decoder), so a new voice needs no
    retraining of the text side.
    """

    def __init__(self, n_vocab: int, dim: int, layers: int, heads: int, ffn_mult: int,
                 kernel_size: int, dropout: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(n_vocab, dim, padding_idx=0)
        nn.init.normal_(self.embed.weight, 0.0, dim ** -0.5)
        self.scale = dim ** 0.5
        self.stack = TransformerStack(dim, layers, heads, ffn_mult, kernel_size, dropout)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """ids [B, T_text] long, mask [B, T_text] bool → [B, T_text, dim]."""
        return self.stack(self.embed(ids) * self.scale, mask)


class ReferenceEncoder(nn.Module):
    """Transformer over a reference mel (a few seconds of any speaker) → one speaker/style vector.

    Masked mean pooling over time makes the embedding independent of the reference length, so a
    3-second training crop and a 10-second user clip land in the same space.
    """

    def __init__(self, n_mels: int, dim: int, layers: int, heads: int, ffn_mult: int,
                 kernel_size: int, dropout: float) -> None:
        super().__init__()
        self.prenet = nn.Sequential(nn.Linear(n_mels, dim), nn.GELU(), nn.Linear(dim, dim))
        self.stack = TransformerStack(dim, layers, heads, ffn_mult, kernel_size, dropout)
        self.out = nn.Linear(dim, dim)
        self.dim = dim

    def forward(self, mel: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """mel [B, n_mels, T] (normalised), mask [B, T] bool → [B, dim]."""
        h = self.stack(self.prenet(mel.transpose(1, 2)), mask)
        m = mask.unsqueeze(-1).to(h.dtype)
        pooled = (h * m).sum(1) / m.sum(1).clamp_min(1.0)
        return self.out(pooled)
