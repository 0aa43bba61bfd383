"""Convolutional building blocks shared by the VITS parts: the WaveNet-style stack (posterior
encoder and coupling layers) and the dilated depth-separable stack (duration predictors).

Weight norm is ``torch.nn.utils.parametrizations.weight_norm`` (the parametrization API;
its magnitude is ``parametrizations.weight.original0``). ``vocoder.model.remove_all_weight_norm``
folds it back into a plain ``weight`` for inference and ONNX export; ``get_padding`` comes from
there too (the HiFi-GAN parts live once, in vocoder/).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from tts.vits.attentions import LayerNorm
from vocoder.model import get_padding


def sequence_mask(lengths: torch.Tensor, max_length: int | None = None) -> torch.Tensor:
    """[B] lengths → [B, T] bool mask (T = longest, kept a tensor so ONNX export stays dynamic)."""
    max_length = lengths.max() if max_length is None else max_length
    return torch.arange(max_length, device=lengths.device)[None, :] < lengths[:, None]


def fused_add_tanh_sigmoid_multiply(x: torch.Tensor, cond: torch.Tensor, channels: int) -> torch.Tensor:
    z = x + cond
    return torch.tanh(z[:, :channels]) * torch.sigmoid(z[:, channels:])


class WN(nn.Module):
    """Non-causal WaveNet: gated dilated convolutions with residual and skip outputs, optionally
    conditioned on a global (speaker) vector ``g`` [B, gin, 1]."""

    def __init__(self, hidden_channels: int, kernel_size: int, dilation_rate: int, n_layers: int,
                 gin_channels: int = 0, p_dropout: float = 0.0):
        super().__init__()
        self.hidden_channels = hidden_channels
        self.n_layers = n_layers
        self.drop = nn.Dropout(p_dropout)
        self.in_layers = nn.ModuleList()
        self.res_skip_layers = nn.ModuleList()
        if gin_channels:
            self.cond_layer = weight_norm(nn.Conv1d(gin_channels, 2 * hidden_channels * n_layers, 1))
        for i in range(n_layers):
            d = dilation_rate**i
            self.in_layers.append(weight_norm(nn.Conv1d(hidden_channels, 2 * hidden_channels, kernel_size,
                                                        dilation=d, padding=get_padding(kernel_size, d))))
            out = 2 * hidden_channels if i < n_layers - 1 else hidden_channels
            self.res_skip_layers.append(weight_norm(nn.Conv1d(hidden_channels, out, 1)))

    def forward(self, x: torch.Tensor, x_mask: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        output = torch.zeros_like(x)
        h = self.hidden_channels
        g_all = self.cond_layer(g) if g is not None and hasattr(self, "cond_layer") else None
        for i, (inp, res_skip) in enumerate(zip(self.in_layers, self.res_skip_layers)):
            x_in = inp(x)
            cond = g_all[:, i * 2 * h : (i + 1) * 2 * h] if g_all is not None else torch.zeros_like(x_in)
            acts = self.drop(fused_add_tanh_sigmoid_multiply(x_in, cond, h))
            rs = res_skip(acts)
            if i < self.n_layers - 1:
                x = (x + rs[:, :h]) * x_mask
                output = output + rs[:, h:]
            else:
                output = output + rs
        return output * x_mask


class DDSConv(nn.Module):
    """Dilated depth-separable convolutions (kernel_size**i dilation), residual, LayerNorm + GELU."""

    def __init__(self, channels: int, kernel_size: int, n_layers: int, p_dropout: float = 0.0):
        super().__init__()
        self.drop = nn.Dropout(p_dropout)
        self.convs_sep = nn.ModuleList()
        self.convs_1x1 = nn.ModuleList()
        self.norms_1 = nn.ModuleList()
        self.norms_2 = nn.ModuleList()
        for i in range(n_layers):
            d = kernel_size**i
            self.convs_sep.append(nn.Conv1d(channels, channels, kernel_size, groups=channels, dilation=d,
                                            padding=get_padding(kernel_size, d)))
            self.convs_1x1.append(nn.Conv1d(channels, channels, 1))
            self.norms_1.append(LayerNorm(channels))
            self.norms_2.append(LayerNorm(channels))

    def forward(self, x: torch.Tensor, x_mask: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        if g is not None:
            x = x + g
        for sep, one, n1, n2 in zip(self.convs_sep, self.convs_1x1, self.norms_1, self.norms_2):
            y = F.gelu(n1(sep(x * x_mask)))
            y = self.drop(F.gelu(n2(one(y))))
            x = x + y
        return x * x_mask
