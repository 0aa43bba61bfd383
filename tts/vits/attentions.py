"""The VITS text encoder's transformer: multi-head self-attention with relative positions
(Shaw et al. 2018, windowed as in Glow-TTS/VITS), a convolutional feed-forward, post-norm.

Relative positions instead of absolute ones because utterances vary from a few tokens to
hundreds: a learned embedding per offset in [-window, window] generalises across lengths,
and offsets beyond the window contribute nothing. The offset ↔ absolute conversions are
gathers over a precomputed index (exact, and they export to ONNX).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class LayerNorm(nn.Module):
    """LayerNorm over the channel axis of [B, C, T] tensors."""

    def __init__(self, channels: int, eps: float = 1e-5):
        super().__init__()
        self.channels = channels
        self.gamma = nn.Parameter(torch.ones(channels))
        self.beta = nn.Parameter(torch.zeros(channels))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.layer_norm(x.transpose(1, -1), (self.channels,), self.gamma, self.beta, self.eps)
        return x.transpose(1, -1)


def _relative_index(length: int, window: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """offset[i, j] = j - i + window into the 2w+1 embeddings, and whether |j - i| <= window."""
    pos = torch.arange(length, device=device)
    rel = pos[None, :] - pos[:, None]
    valid = rel.abs() <= window
    return (rel.clamp(-window, window) + window), valid


class MultiHeadAttention(nn.Module):
    def __init__(self, channels: int, n_heads: int, p_dropout: float = 0.0, window_size: int | None = 4):
        super().__init__()
        if channels % n_heads:
            raise ValueError(f"hidden_channels ({channels}) must be divisible by n_heads ({n_heads})")
        self.n_heads = n_heads
        self.k_channels = channels // n_heads
        self.window_size = window_size
        self.conv_q = nn.Conv1d(channels, channels, 1)
        self.conv_k = nn.Conv1d(channels, channels, 1)
        self.conv_v = nn.Conv1d(channels, channels, 1)
        self.conv_o = nn.Conv1d(channels, channels, 1)
        self.drop = nn.Dropout(p_dropout)
        if window_size:
            std = self.k_channels**-0.5  # one table shared by all heads
            self.emb_rel_k = nn.Parameter(torch.randn(2 * window_size + 1, self.k_channels) * std)
            self.emb_rel_v = nn.Parameter(torch.randn(2 * window_size + 1, self.k_channels) * std)
        for conv in (self.conv_q, self.conv_k, self.conv_v):
            nn.init.xavier_uniform_(conv.weight)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x [B, C, T], mask [B, 1, T, T] (1 = attend)."""
        b, c, t = x.shape
        q = self.conv_q(x).view(b, self.n_heads, self.k_channels, t).transpose(2, 3)  # [B, H, T, D]
        k = self.conv_k(x).view(b, self.n_heads, self.k_channels, t).transpose(2, 3)
        v = self.conv_v(x).view(b, self.n_heads, self.k_channels, t).transpose(2, 3)
        q = q / math.sqrt(self.k_channels)
        scores = q @ k.transpose(-2, -1)  # [B, H, T, T]
        if self.window_size:
            index, valid = _relative_index(t, self.window_size, x.device)
            rel_logits = q @ self.emb_rel_k.to(q.dtype).t()  # [B, H, T, 2w+1]: query i vs offset
            rel_abs = torch.gather(rel_logits, 3, index.expand(b, self.n_heads, t, t))
            scores = scores + rel_abs * valid.to(scores.dtype)
        scores = scores.masked_fill(mask == 0, -1e4)
        p = self.drop(F.softmax(scores, dim=-1))
        out = p @ v
        if self.window_size:
            # weight of each offset: p_rel[.., i, k] = p[.., i, i + k - w] (0 outside the sequence)
            w = self.window_size
            pos = torch.arange(t, device=x.device)
            col = pos[:, None] + torch.arange(-w, w + 1, device=x.device)[None, :]  # [T, 2w+1]
            inside = (col >= 0) & (col < t)
            p_rel = torch.gather(p, 3, col.clamp(0, t - 1).expand(b, self.n_heads, t, 2 * w + 1))
            out = out + (p_rel * inside.to(p.dtype)) @ self.emb_rel_v.to(p.dtype)
        out = out.transpose(2, 3).reshape(b, c, t)
        return self.conv_o(out)


class FFN(nn.Module):
    """Two convolutions (kernel_size 3 in VITS) with ReLU: the 'feed-forward' sees neighbours."""

    def __init__(self, channels: int, filter_channels: int, kernel_size: int, p_dropout: float = 0.0):
        super().__init__()
        self.conv_1 = nn.Conv1d(channels, filter_channels, kernel_size, padding=kernel_size // 2)
        self.conv_2 = nn.Conv1d(filter_channels, channels, kernel_size, padding=kernel_size // 2)
        self.drop = nn.Dropout(p_dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.drop(torch.relu(self.conv_1(x * mask)))
        return self.conv_2(x * mask) * mask


class Encoder(nn.Module):
    """n_layers × (self-attention, FFN), each residual + post-LayerNorm."""

    def __init__(self, hidden_channels: int, filter_channels: int, n_heads: int, n_layers: int,
                 kernel_size: int = 1, p_dropout: float = 0.0, window_size: int = 4):
        super().__init__()
        self.drop = nn.Dropout(p_dropout)
        self.attn_layers = nn.ModuleList(
            MultiHeadAttention(hidden_channels, n_heads, p_dropout, window_size) for _ in range(n_layers))
        self.norm_layers_1 = nn.ModuleList(LayerNorm(hidden_channels) for _ in range(n_layers))
        self.ffn_layers = nn.ModuleList(
            FFN(hidden_channels, filter_channels, kernel_size, p_dropout) for _ in range(n_layers))
        self.norm_layers_2 = nn.ModuleList(LayerNorm(hidden_channels) for _ in range(n_layers))

    def forward(self, x: torch.Tensor, x_mask: torch.Tensor) -> torch.Tensor:
        attn_mask = x_mask.unsqueeze(2) * x_mask.unsqueeze(-1)  # [B, 1, T, T]
        x = x * x_mask
        for attn, n1, ffn, n2 in zip(self.attn_layers, self.norm_layers_1, self.ffn_layers, self.norm_layers_2):
            x = n1(x + self.drop(attn(x, attn_mask)))
            x = n2(x + self.drop(ffn(x, x_mask)))
        return x * x_mask
