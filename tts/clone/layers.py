"""Transformer building blocks shared by the voice-cloning model's encoders and decoder.

Pre-LayerNorm blocks (stable at high learning rates without a long warmup) whose feed-forward
part is a small 1-D convolution, as in FastSpeech: neighbouring symbols / frames matter in speech,
and a kernel of 3 gives that locality for free. The decoder's norms can be *conditional* (scale and
shift predicted from the speaker embedding, "AdaLN"), which is how the reference voice reaches
every decoder layer instead of only its input.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def sinusoid_positions(length: int, dim: int, device: torch.device | None = None) -> torch.Tensor:
    """[length, dim] fixed sinusoidal position table (Vaswani et al.); no parameters, any length."""
    pos = torch.arange(length, device=device, dtype=torch.float32).unsqueeze(1)
    div = torch.exp(torch.arange(0, dim, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim, device=device)
    table[:, 0::2] = torch.sin(pos * div)
    table[:, 1::2] = torch.cos(pos * div[: dim // 2])
    return table


class CondLayerNorm(nn.Module):
    """LayerNorm whose scale/shift come from a condition vector (speaker embedding) when one is given.

    The projection starts at zero, so at initialisation it is an ordinary LayerNorm and the
    speaker pathway opens gradually instead of injecting noise into an untrained decoder.
    """

    def __init__(self, dim: int, cond_dim: int = 0) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.proj = nn.Linear(cond_dim, 2 * dim) if cond_dim > 0 else None
        if self.proj is not None:
            nn.init.zeros_(self.proj.weight)
            nn.init.zeros_(self.proj.bias)

    def forward(self, x: torch.Tensor, cond: torch.Tensor | None = None) -> torch.Tensor:
        x = self.norm(x)
        if self.proj is None or cond is None:
            return x
        scale, shift = self.proj(cond).unsqueeze(1).chunk(2, dim=-1)
        return x * (1 + scale) + shift


class SelfAttention(nn.Module):
    """Multi-head self-attention through F.scaled_dot_product_attention with a key-padding mask."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"attention dim {dim} is not divisible by {heads} heads")
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x [B, T, D]; mask [B, T] bool (True = real position)."""
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attn_mask = mask[:, None, None, :]  # keys only: padded queries are zeroed by the caller
        # No dropout on the attention weights: on the CPU it costs as much as the attention itself
        # (a Bernoulli draw per [B, heads, T, T] entry); residual dropout regularises enough.
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class ConvFeedForward(nn.Module):
    """Conv1d(k) → GELU → Linear: the FastSpeech feed-forward, masked so padding never leaks in.

    The second layer is a Linear on channels-last data rather than a kernel-1 Conv1d: the same
    maths, but one transpose less and measurably faster on the CPU. Dropout lives on the block's
    residual branch only (one Bernoulli draw per sub-layer is enough).
    """

    def __init__(self, dim: int, hidden: int, kernel_size: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(dim, hidden, kernel_size, padding=kernel_size // 2)
        self.proj = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = mask.unsqueeze(-1).to(x.dtype)
        h = self.conv((x * m).transpose(1, 2)).transpose(1, 2)
        return self.proj(F.gelu(h)) * m


class TransformerBlock(nn.Module):
    """Pre-norm block: x + Attn(Norm(x)), then x + FFN(Norm(x)); norms optionally speaker-conditioned."""

    def __init__(self, dim: int, heads: int, ffn_mult: int = 2, kernel_size: int = 3,
                 dropout: float = 0.1, cond_dim: int = 0) -> None:
        super().__init__()
        self.norm1 = CondLayerNorm(dim, cond_dim)
        self.attn = SelfAttention(dim, heads)
        self.norm2 = CondLayerNorm(dim, cond_dim)
        self.ffn = ConvFeedForward(dim, ffn_mult * dim, kernel_size)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cond: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.drop(self.attn(self.norm1(x, cond), mask))
        x = x + self.drop(self.ffn(self.norm2(x, cond), mask))
        return x * mask.unsqueeze(-1).to(x.dtype)


class TransformerStack(nn.Module):
    """N blocks plus sinusoidal positions (scaled by a learned alpha, Transformer-TTS) and a final norm."""

    def __init__(self, dim: int, layers: int, heads: int, ffn_mult: int = 2, kernel_size: int = 3,
                 dropout: float = 0.1, cond_dim: int = 0) -> None:
        super().__init__()
        self.dim = dim
        self.pos_alpha = nn.Parameter(torch.ones(1))
        self.blocks = nn.ModuleList(
            TransformerBlock(dim, heads, ffn_mult, kernel_size, dropout, cond_dim) for _ in range(layers))
        self.norm = CondLayerNorm(dim, cond_dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cond: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.pos_alpha * sinusoid_positions(x.shape[1], self.dim, x.device).to(x.dtype)
        x = x * mask.unsqueeze(-1).to(x.dtype)
        for block in self.blocks:
            x = block(x, mask, cond)
        return self.norm(x, cond) * mask.unsqueeze(-1).to(x.dtype)
