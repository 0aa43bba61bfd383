"""HiFi-GAN generator (Kong et al. 2020) as the VITS decoder: latent z [B, C, T] → waveform.

Transposed-convolution upsampling by ``prod(upsample_rates)`` (= the hop length), each stage
followed by a multi-receptive-field fusion of residual blocks (type "1": two convolutions
per dilation; type "2": one, lighter, as Piper's medium/x_low). Weight-normed throughout;
``remove_weight_norm`` (tts.models.modules) folds it for inference.

Effective init: PyTorch's default for every weight and bias, as in jaywalnut310/vits (its init_weights
runs after weight_norm and never reaches the weight a forward uses); tested in tests/tts/test_vits_init.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from tts.models.modules import get_padding

LRELU_SLOPE = 0.1


def masked(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Zero what lies past each item's length before a convolution reads it (no-op without a mask)."""
    return x if mask is None else x * mask


class ResBlock1(nn.Module):
    def __init__(self, channels: int, kernel_size: int = 3, dilation: tuple[int, ...] = (1, 3, 5)):
        super().__init__()
        self.convs1 = nn.ModuleList(
            weight_norm(nn.Conv1d(channels, channels, kernel_size, dilation=d, padding=get_padding(kernel_size, d)))
            for d in dilation)
        self.convs2 = nn.ModuleList(
            weight_norm(nn.Conv1d(channels, channels, kernel_size, padding=get_padding(kernel_size)))
            for _ in dilation)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        for c1, c2 in zip(self.convs1, self.convs2):
            x = x + c2(masked(F.leaky_relu(c1(masked(F.leaky_relu(x, LRELU_SLOPE), mask)), LRELU_SLOPE), mask))
        return x


class ResBlock2(nn.Module):
    def __init__(self, channels: int, kernel_size: int = 3, dilation: tuple[int, ...] = (1, 3)):
        super().__init__()
        self.convs = nn.ModuleList(
            weight_norm(nn.Conv1d(channels, channels, kernel_size, dilation=d, padding=get_padding(kernel_size, d)))
            for d in dilation)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        for c in self.convs:
            x = x + c(masked(F.leaky_relu(x, LRELU_SLOPE), mask))
        return x


class Generator(nn.Module):
    def __init__(self, in_channels: int, resblock: str, resblock_kernel_sizes: list[int],
                 resblock_dilation_sizes: list[list[int]], upsample_rates: list[int],
                 upsample_initial_channel: int, upsample_kernel_sizes: list[int], gin_channels: int = 0):
        super().__init__()
        self.num_kernels = len(resblock_kernel_sizes)
        self.upsample_rates = list(upsample_rates)
        self.conv_pre = nn.Conv1d(in_channels, upsample_initial_channel, 7, padding=3)
        block = ResBlock1 if str(resblock) == "1" else ResBlock2
        self.ups = nn.ModuleList()
        self.resblocks = nn.ModuleList()
        ch = upsample_initial_channel
        for u, k in zip(upsample_rates, upsample_kernel_sizes):
            self.ups.append(weight_norm(nn.ConvTranspose1d(ch, ch // 2, k, u, padding=(k - u) // 2)))
            ch //= 2
            for rk, rd in zip(resblock_kernel_sizes, resblock_dilation_sizes):
                self.resblocks.append(block(ch, rk, tuple(rd)))
        self.conv_post = nn.Conv1d(ch, 1, 7, padding=3, bias=False)
        if gin_channels:
            self.cond = nn.Conv1d(gin_channels, upsample_initial_channel, 1)

    def forward(self, x: torch.Tensor, g: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """z [B, C, T] → waveform [B, 1, T · hop]. ``mask`` [B, 1, T] (padded batches): every conv
        input is zeroed past each item's length, so each item decodes exactly as it would alone
        (a conv's zero padding at the end of a lone item = zeros here). None (training crops,
        single items, ONNX export): no masking, no cost."""
        x = self.conv_pre(masked(x, mask))
        if g is not None and hasattr(self, "cond"):
            x = x + self.cond(g)
        for i, (up, rate) in enumerate(zip(self.ups, self.upsample_rates)):
            x = up(masked(F.leaky_relu(x, LRELU_SLOPE), mask))
            mask = None if mask is None else mask.repeat_interleave(rate, dim=-1)
            xs = sum(self.resblocks[i * self.num_kernels + j](x, mask) for j in range(self.num_kernels))
            x = xs / self.num_kernels
        x = self.conv_post(masked(F.leaky_relu(x), mask))  # default slope 0.01 here, as in HiFi-GAN
        return torch.tanh(x)
