"""HiFi-GAN generator (Kong et al. 2020) as the VITS decoder: latent z [B, C, T] → waveform.

Built from the vocoder's HiFi-GAN parts (``vocoder.model``: the upsampling stack of transposed
convolutions, each stage followed by a multi-receptive-field fusion of residual blocks; type "1":
two convolutions per dilation, type "2": one, lighter, as Piper's medium/x_low). What is VITS' own:
no pitch source, a plain ``conv_pre`` and bias-free ``conv_post``, an optional speaker input ``g``,
and a ``mask`` so padded batches decode like lone items. ``vocoder.model.remove_all_weight_norm``
folds the weight norm for inference. Parameter names are those of jaywalnut310/vits.

Effective init: PyTorch's default for every weight and bias, as in jaywalnut310/vits (its init_weights
runs after weight_norm and never reaches the weight a forward uses); tested in tests/tts/test_vits_init.py.
"""

from __future__ import annotations

import torch
from torch import nn

from vocoder.model import UpsamplingStack, leaky_relu_fresh, masked


class Generator(UpsamplingStack):
    def __init__(self, in_channels: int, resblock: str, resblock_kernel_sizes: list[int],
                 resblock_dilation_sizes: list[list[int]], upsample_rates: list[int],
                 upsample_initial_channel: int, upsample_kernel_sizes: list[int], gin_channels: int = 0):
        super().__init__()
        self.conv_pre = nn.Conv1d(in_channels, upsample_initial_channel, 7, padding=3)
        ch = self.build_stack(upsample_initial_channel, upsample_rates, upsample_kernel_sizes, resblock,
                              resblock_kernel_sizes, resblock_dilation_sizes, bias_std=None)
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
            x = up(masked(leaky_relu_fresh(x), mask))  # in place: x is conv_pre's (+ cond) or the fusion's output
            mask = None if mask is None else mask.repeat_interleave(rate, dim=-1)
            x = self.fuse(i, x, mask)
        x = self.conv_post(masked(leaky_relu_fresh(x, 0.01), mask))  # default slope 0.01 here, as in HiFi-GAN
        return torch.tanh(x)
