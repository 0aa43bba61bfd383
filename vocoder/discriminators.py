"""The GAN critics: multi-period (MPD), fast strided multi-period (fast MPD), multi-resolution
(MRD) and multi-scale (MSD) discriminators.

Every discriminator maps a waveform batch [B, 1, T] to ``(logits, fmaps)``: ``logits`` is a
list with one [B, N] tensor per sub-discriminator and ``fmaps`` a list (one per
sub-discriminator) of lists of intermediate activations for the feature-matching loss.
``Discriminators`` bundles the ones a config enables and returns ``{name: (logits, fmaps)}``.

Which ones run is config (``model_args.discriminators``); the defaults follow the two seed
tasks: ``nsf_HiFigan_task`` = MPD + MSD (jik876 HiFi-GAN), ``nsf_HiFigan_fast_task`` = fast MPD +
MRD (cheap per-period blocks that fold samples into channels instead of running 1024-channel
2-D convs, and a spectrogram critic).

The VITS critic (``tts/vits/discriminator.py``) is built from ``PeriodDiscriminator`` and
``ScaleDiscriminator`` (narrower layers, optional spectral norm).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import spectral_norm, weight_norm

from speech.audio import magnitude
from vocoder.model import get_padding, leaky_relu_fresh

DISCRIMINATOR_NAMES = ("mpd", "fast_mpd", "mrd", "msd")

Output = tuple[list[torch.Tensor], list[list[torch.Tensor]]]


def conv_stack(convs: nn.ModuleList, conv_post: nn.Module, x: torch.Tensor,
               memory_format: torch.memory_format | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The HiFi-GAN critics' forward: leaky-ReLU convs, then ``conv_post``; returns (flattened
    logits, every layer's output for feature matching). The leaky ReLU runs in place on the conv's
    output (`vocoder.model.leaky_relu_fresh`): the feature map and the next conv's input are that one tensor.
    ``memory_format`` (channels_last): each conv's output in that layout. Converting the input is not enough:
    with one input channel a [B, 1, H, W] tensor is contiguous in both layouts and the conv answers in the
    default one; from the first output on (32 channels) each conv keeps its input's layout, so only the
    first conversion copies."""
    fmap = []
    for conv in convs:
        x = conv(x)
        if memory_format is not None:
            x = x.contiguous(memory_format=memory_format)
        x = leaky_relu_fresh(x)
        fmap.append(x)
    x = conv_post(x)
    fmap.append(x)
    return x.flatten(1), fmap


class PeriodDiscriminator(nn.Module):
    """HiFi-GAN period critic: the waveform folded to [T/p, p] and scanned by (k, 1) 2-D convs,
    so each column sees every p-th sample (periodic structure of that period)."""

    def __init__(self, period: int, kernel_size: int = 5, stride: int = 3,
                 channels: tuple[int, ...] = (32, 128, 512, 1024, 1024), use_spectral_norm: bool = False,
                 channels_last: bool = False):
        super().__init__()
        self.period = period
        # The 2-D convs' activations in channels_last (NHWC) memory, so they run their NHWC kernels (the
        # vocoder's key `mpd_channels_last`). Weights stay as they are: weight norm recomputes each weight
        # per call as a new contiguous tensor whatever the layout of its parameters, and the conv backends
        # (oneDNN, cuDNN) reorder weights to the input's layout themselves.
        self.channels_last = channels_last
        norm = spectral_norm if use_spectral_norm else weight_norm
        pad = get_padding(kernel_size)
        chans = (1, *channels)
        layers = []
        for i in range(len(channels)):
            s = stride if i < len(channels) - 1 else 1
            layers.append(norm(nn.Conv2d(chans[i], chans[i + 1], (kernel_size, 1), (s, 1), padding=(pad, 0))))
        self.convs = nn.ModuleList(layers)
        self.conv_post = norm(nn.Conv2d(chans[-1], 1, (3, 1), 1, padding=(1, 0)))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        b, c, t = x.shape
        if t % self.period:
            x = F.pad(x, (0, self.period - t % self.period), mode="reflect")
        x = x.view(b, c, -1, self.period)
        return conv_stack(self.convs, self.conv_post, x, torch.channels_last if self.channels_last else None)


class MultiPeriodDiscriminator(nn.Module):
    def __init__(self, periods: list[int], channels_last: bool = False):
        super().__init__()
        self.periods = list(periods)
        self.discriminators = nn.ModuleList(PeriodDiscriminator(p, channels_last=channels_last) for p in periods)

    def forward(self, y: torch.Tensor) -> Output:
        outs = [d(y) for d in self.discriminators]
        return [o[0] for o in outs], [o[1] for o in outs]


class FoldBlock(nn.Module):
    """Residual block of the fast period critic: depthwise conv along time, then a gated
    pointwise MLP. RMS-normalised input keeps it stable without weight norm."""

    def __init__(self, dim: int, kernel_size: int, depthwise: bool):
        super().__init__()
        self.dw = nn.Conv1d(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim if depthwise else 1)
        self.pw_in = nn.Conv1d(dim, 2 * dim, 1)
        self.pw_out = nn.Conv1d(dim, dim, 1)

    def forward(self, x: torch.Tensor, normed: torch.Tensor) -> torch.Tensor:
        h, gate = self.pw_in(self.dw(normed)).chunk(2, dim=1)
        return x + self.pw_out(h * torch.sigmoid(gate))


def _rms_norm_channels(x: torch.Tensor) -> torch.Tensor:
    """RMS norm over the channel axis of [N, C, L]."""
    return x * torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True) + 1e-6)


class FastPeriodDiscriminator(nn.Module):
    """Strided period critic. The waveform is folded by period p into p sequences, then stage by
    stage ``stride`` neighbouring steps are folded into channels (space-to-depth) and mixed by a
    light residual block. Cost is linear in T with small widths (init_channel * prod(strides)),
    instead of the 1024-channel 2-D convs of the classic MPD."""

    def __init__(self, period: int, strides: list[int], kernel_size: int = 11, init_channel: int = 8):
        super().__init__()
        self.period = period
        self.strides = list(strides)
        self.hop = period * math.prod(strides)
        self.pre = nn.Conv1d(strides[0], init_channel * strides[0], 1)
        dims = [init_channel * math.prod(strides[: i + 1]) for i in range(len(strides))]
        self.blocks = nn.ModuleList(FoldBlock(d, kernel_size, depthwise=i > 0) for i, d in enumerate(dims))
        self.post = nn.Conv1d(dims[-1], 1, 1)

    @staticmethod
    def _fold(x: torch.Tensor, s: int) -> torch.Tensor:
        """[N, C, L] -> [N, C*s, L/s]: each new step holds s consecutive old steps."""
        n, c, length = x.shape
        return x.view(n, c, length // s, s).permute(0, 1, 3, 2).reshape(n, c * s, length // s)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        b, _, t = x.shape
        usable = (t // self.hop) * self.hop
        if usable == 0:
            raise ValueError(f"fast MPD (period {self.period}) needs at least {self.hop} samples, got {t}")
        x = x[..., :usable].reshape(b, -1, self.period).transpose(1, 2)  # [B, p, T/p]
        x = x.reshape(b * self.period, 1, -1)
        x = F.gelu(self.pre(self._fold(x, self.strides[0])))
        fmap = []
        for i, block in enumerate(self.blocks):
            if i > 0:
                x = self._fold(x, self.strides[i])
            normed = _rms_norm_channels(x)
            if i > 0:
                fmap.append(normed.reshape(b, -1))
            x = block(x, normed)
        x = self.post(_rms_norm_channels(x))
        return x.reshape(b, -1), fmap


class FastMultiPeriodDiscriminator(nn.Module):
    def __init__(self, periods: list[int], strides: list[int], kernel_size: int = 11, init_channel: int = 8):
        super().__init__()
        self.periods = list(periods)
        self.discriminators = nn.ModuleList(
            FastPeriodDiscriminator(p, strides, kernel_size, init_channel) for p in periods
        )

    def forward(self, y: torch.Tensor) -> Output:
        outs = [d(y) for d in self.discriminators]
        return [o[0] for o in outs], [o[1] for o in outs]


class ResolutionDiscriminator(nn.Module):
    """UnivNet-style spectrogram critic: 2-D convs over one STFT magnitude (computed in fp32)."""

    def __init__(self, n_fft: int, hop: int, win: int, channels: int = 32):
        super().__init__()
        self.n_fft, self.hop, self.win = n_fft, hop, win
        self.register_buffer("window", torch.hann_window(win), persistent=False)
        self.convs = nn.ModuleList([
            weight_norm(nn.Conv2d(1, channels, (3, 9), padding=(1, 4))),
            weight_norm(nn.Conv2d(channels, channels, (3, 9), stride=(1, 2), padding=(1, 4))),
            weight_norm(nn.Conv2d(channels, channels, (3, 9), stride=(1, 2), padding=(1, 4))),
            weight_norm(nn.Conv2d(channels, channels, (3, 9), stride=(1, 2), padding=(1, 4))),
            weight_norm(nn.Conv2d(channels, channels, (3, 3), padding=(1, 1))),
        ])
        self.conv_post = weight_norm(nn.Conv2d(channels, 1, (3, 3), padding=(1, 1)))

    def spectrogram(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=x.device.type, enabled=False):
            x = x.float().squeeze(1)
            pad = (self.n_fft - self.hop) // 2
            x = F.pad(x[:, None], (pad, pad), mode="reflect").squeeze(1)
            spec = torch.stft(x, self.n_fft, self.hop, self.win, self.window, center=False, return_complex=True)
            mag = magnitude(spec)
        return mag.transpose(1, 2).unsqueeze(1)  # [B, 1, frames, freq]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        x = self.spectrogram(x)
        return conv_stack(self.convs, self.conv_post, x)


class MultiResolutionDiscriminator(nn.Module):
    def __init__(self, fft_sizes: list[int], hop_sizes: list[int], win_lengths: list[int], channels: int = 32):
        super().__init__()
        if not len(fft_sizes) == len(hop_sizes) == len(win_lengths):
            raise ValueError("model_args.mrd_fft_sizes, mrd_hop_sizes and mrd_win_lengths must have equal length")
        self.discriminators = nn.ModuleList(
            ResolutionDiscriminator(n, h, w, channels) for n, h, w in zip(fft_sizes, hop_sizes, win_lengths)
        )

    def forward(self, y: torch.Tensor) -> Output:
        outs = [d(y) for d in self.discriminators]
        return [o[0] for o in outs], [o[1] for o in outs]


# (in, out, kernel, stride, groups, padding) of each conv of HiFi-GAN's scale critic.
HIFIGAN_SCALE_LAYERS = ((1, 128, 15, 1, 1, 7), (128, 128, 41, 2, 4, 20), (128, 256, 41, 2, 16, 20),
                        (256, 512, 41, 4, 16, 20), (512, 1024, 41, 4, 16, 20), (1024, 1024, 41, 1, 16, 20),
                        (1024, 1024, 5, 1, 1, 2))


class ScaleDiscriminator(nn.Module):
    """HiFi-GAN / MelGAN scale critic: grouped strided 1-D convs over the raw waveform.
    ``layers``: one (in, out, kernel, stride, groups, padding) per conv (VITS uses MelGAN's)."""

    def __init__(self, use_spectral_norm: bool = False,
                 layers: tuple[tuple[int, int, int, int, int, int], ...] = HIFIGAN_SCALE_LAYERS):
        super().__init__()
        norm = spectral_norm if use_spectral_norm else weight_norm
        self.convs = nn.ModuleList(
            norm(nn.Conv1d(i, o, k, s, groups=g, padding=p)) for i, o, k, s, g, p in layers
        )
        self.conv_post = norm(nn.Conv1d(layers[-1][1], 1, 3, 1, padding=1))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        return conv_stack(self.convs, self.conv_post, x)


class MultiScaleDiscriminator(nn.Module):
    """Three scale critics on the waveform at 1x, 1/2x and 1/4x (average-pooled)."""

    def __init__(self):
        super().__init__()
        self.discriminators = nn.ModuleList(
            [ScaleDiscriminator(use_spectral_norm=True), ScaleDiscriminator(), ScaleDiscriminator()]
        )
        self.meanpools = nn.ModuleList([nn.AvgPool1d(4, 2, padding=2), nn.AvgPool1d(4, 2, padding=2)])

    def forward(self, y: torch.Tensor) -> Output:
        logits, fmaps = [], []
        for i, d in enumerate(self.discriminators):
            if i > 0:
                y = self.meanpools[i - 1](y)
            out, fmap = d(y)
            logits.append(out)
            fmaps.append(fmap)
        return logits, fmaps


class Discriminators(nn.ModuleDict):
    """The enabled critics as one module (one optimizer, one DDP wrapper):
    ``forward(y) -> {name: (logits, fmaps)}``."""

    def forward(self, y: torch.Tensor) -> dict[str, Output]:
        return {name: d(y) for name, d in self.items()}


def build_discriminators(names: list[str], periods: list[int], fast_mpd_strides: list[int],
                         fast_mpd_kernel_size: int, fast_mpd_init_channel: int,
                         mrd_fft_sizes: list[int], mrd_hop_sizes: list[int],
                         mrd_win_lengths: list[int], mrd_channels: int = 32,
                         mpd_channels_last: bool = False) -> Discriminators:
    """The critics ``names`` lists, in that order. ``mpd_channels_last``: the MPD's 2-D convs on NHWC
    activations (`PeriodDiscriminator`'s ``channels_last``)."""
    unknown = [n for n in names if n not in DISCRIMINATOR_NAMES]
    if unknown or not names:
        raise ValueError(f"model_args.discriminators: {unknown or 'empty list'} not valid; "
                         f"choose from {list(DISCRIMINATOR_NAMES)}")
    parts: dict[str, nn.Module] = {}
    for name in names:
        if name == "mpd":
            parts[name] = MultiPeriodDiscriminator(periods, channels_last=mpd_channels_last)
        elif name == "fast_mpd":
            parts[name] = FastMultiPeriodDiscriminator(periods, fast_mpd_strides, fast_mpd_kernel_size,
                                                       fast_mpd_init_channel)
        elif name == "mrd":
            parts[name] = MultiResolutionDiscriminator(mrd_fft_sizes, mrd_hop_sizes, mrd_win_lengths, mrd_channels)
        else:
            parts[name] = MultiScaleDiscriminator()
    return Discriminators(parts)


def split_outputs(out: dict[str, Output], b: int) -> tuple[dict[str, Output], dict[str, Output]]:
    """Critic outputs on ``cat([real, fake])`` -> (real part, fake part): one critic call per update."""
    real = {k: ([x[:b] for x in logits], [[f[:b] for f in fm] for fm in fmaps]) for k, (logits, fmaps) in out.items()}
    fake = {k: ([x[b:] for x in logits], [[f[b:] for f in fm] for fm in fmaps]) for k, (logits, fmaps) in out.items()}
    return real, fake


def head_outputs(out: dict[str, Output], b: int) -> dict[str, Output]:
    """The first b items of a critic output (the fakes that align with the real batch)."""
    return {k: ([x[:b] for x in logits], [[f[:b] for f in fm] for fm in fmaps]) for k, (logits, fmaps) in out.items()}
