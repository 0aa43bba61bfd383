"""NSF-HiFiGAN generator: mel + f0 -> waveform.

A HiFi-GAN upsampling stack (transposed convs + multi-receptive-field residual blocks) that is
told the pitch explicitly: a harmonic *source* signal built from f0 (sines + noise, the
"neural source-filter" idea) is added into the stack, so the network only has to shape the
spectrum instead of inventing periodicity. Two source variants, both from the seed recipes:

* full NSF (``mini_nsf: false``): 9 harmonics at the output sample rate, merged by a linear
  layer + tanh, then fed into *every* upsampling stage through a strided conv;
* mini NSF (``mini_nsf: true``): one sine at the rate reached after the first two upsampling
  layers, injected once through a 1x1 conv. Cheaper, and required for ``pc_aug``.

Parameter names (``conv_pre``, ``ups``, ``resblocks.*.convs1``, ``noise_convs``,
``m_source.l_linear``, ``source_conv``, ``conv_post``) match the DiffSinger / OpenUtau
generator so ``vocoder/export.py`` can write a checkpoint those tools load directly.

The HiFi-GAN parts (``ResBlock1/2``, ``UpsamplingStack``, ``get_padding``, ``remove_all_weight_norm``,
``LRELU_SLOPE``) live here once; the VITS decoder (``tts/vits/hifigan.py``) is built from them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import weight_norm

LRELU_SLOPE = 0.1
# Leaky ReLU in place where its input is a fresh result nothing else reads (a conv's output, a sum):
# the values and gradients are bitwise the same (with a positive slope the output has the input's sign,
# which is all the backward needs), and autograd keeps one tensor where it kept two (the input for
# the leaky ReLU's backward and the output for the next conv's). False: every call out of place, as
# before; bench/vocoder_memory.py and tests/vocoder/test_memory.py switch it off to measure the saving.
INPLACE_LEAKY_RELU = True


@dataclass
class GeneratorArgs:
    """Everything needed to rebuild a generator (also written to an export's config.json)."""

    sampling_rate: int = 44100
    num_mels: int = 128
    hop_size: int = 512
    upsample_rates: list[int] = field(default_factory=lambda: [8, 8, 2, 2, 2])
    upsample_kernel_sizes: list[int] = field(default_factory=lambda: [16, 16, 4, 4, 4])
    upsample_initial_channel: int = 512
    resblock: str = "1"
    resblock_kernel_sizes: list[int] = field(default_factory=lambda: [3, 7, 11])
    resblock_dilation_sizes: list[list[int]] = field(default_factory=lambda: [[1, 3, 5]] * 3)
    mini_nsf: bool = False
    noise_sigma: float = 0.0
    harmonic_num: int = 8

    def validate(self) -> None:
        """Fail early with the key to fix: a mismatch here would otherwise surface as a shape
        error deep inside a training step."""
        hop = math.prod(self.upsample_rates)
        if hop != self.hop_size:
            raise ValueError(
                f"model_args.upsample_rates {self.upsample_rates} multiply to {hop}, but hop_size is "
                f"{self.hop_size}; they must be equal (one mel frame = hop_size samples)."
            )
        if len(self.upsample_kernel_sizes) != len(self.upsample_rates):
            raise ValueError("model_args.upsample_kernel_sizes must have one entry per upsample_rates entry.")
        for u, k in zip(self.upsample_rates, self.upsample_kernel_sizes):
            if k < u or (k - u) % 2:
                raise ValueError(
                    f"model_args.upsample_kernel_sizes: kernel {k} for rate {u} must be >= the rate and "
                    "differ from it by an even number (usually kernel = 2 * rate)."
                )
        if len(self.resblock_kernel_sizes) != len(self.resblock_dilation_sizes):
            raise ValueError("model_args.resblock_kernel_sizes and resblock_dilation_sizes must have equal length.")
        if str(self.resblock) not in ("1", "2"):
            raise ValueError(f"model_args.resblock must be \"1\" or \"2\", got {self.resblock!r}.")
        if self.upsample_initial_channel % (2 ** len(self.upsample_rates)):
            raise ValueError("model_args.upsample_initial_channel must be divisible by 2**len(upsample_rates).")
        if self.mini_nsf and len(self.upsample_rates) < 3:
            raise ValueError("model_args.mini_nsf needs at least 3 upsample_rates (the source enters after the 2nd).")

    @property
    def max_f0(self) -> float:
        """Highest f0 the source can represent without aliasing (Nyquist of the source rate)."""
        return source_rate(self) / 2


def source_rate(args: GeneratorArgs) -> float:
    if args.mini_nsf:
        return args.sampling_rate / math.prod(args.upsample_rates[2:])
    return float(args.sampling_rate)


def leaky_relu_fresh(x: torch.Tensor, slope: float = LRELU_SLOPE) -> torch.Tensor:
    """Leaky ReLU of ``x``, in place (``INPLACE_LEAKY_RELU``): only for an ``x`` that nothing else
    reads afterwards and that autograd does not keep (a conv's or a sum's output; never a residual
    branch's input, a leaf or a caller's tensor)."""
    return F.leaky_relu(x, slope, inplace=INPLACE_LEAKY_RELU)


def get_padding(kernel_size: int, dilation: int = 1) -> int:
    """'Same' padding of a stride-1 conv (odd kernel)."""
    return (kernel_size * dilation - dilation) // 2


# Effective init, on purpose (tests/vocoder/test_init.py): as SingingVocoders / jik876 HiFi-GAN, whose
# N(0, 0.01) init_weights runs after the old hook weight_norm and never reaches the weight a forward uses,
# every weight keeps PyTorch's default U(+-1/sqrt(fan_in)); biases of ups/resblocks/conv_post and the
# plain mini-NSF source_conv are N(0, 0.01). A weight really drawn N(0, 0.01) learns slower per step.
# The VITS decoder builds the same blocks with ``bias_std=None``: jaywalnut310/vits keeps default biases.
INIT_STD = 0.01


def _init_bias(m: nn.Module, std: float | None = INIT_STD) -> nn.Module:
    """N(0, std) bias, default-init weight: the reference's *effective* init of a weight-normed conv
    (``std=None``: PyTorch's default bias too)."""
    if m.bias is not None and std is not None:
        nn.init.normal_(m.bias, 0.0, std)
    return m


def _init(m: nn.Module, std: float = INIT_STD) -> nn.Module:
    """N(0, std) weight and bias: the reference's init of a plain (not weight-normed) conv."""
    nn.init.normal_(m.weight, 0.0, std)
    return _init_bias(m, std)


def _wn_conv(*args, bias_std: float | None = INIT_STD, **kwargs) -> nn.Module:
    return weight_norm(_init_bias(nn.Conv1d(*args, **kwargs), bias_std))


def remove_all_weight_norm(module: nn.Module) -> int:
    """Fold every weight-norm parametrisation back into a plain weight (for inference and ONNX
    export); returns how many were removed. Output is unchanged up to float rounding."""
    n = 0
    for m in module.modules():
        if parametrize.is_parametrized(m, "weight"):
            parametrize.remove_parametrizations(m, "weight", leave_parametrized=True)
            n += 1
    return n


def masked(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Zero what lies past each item's length before a convolution reads it (no-op without a mask)."""
    return x if mask is None else x * mask


def _dilated_convs(channels: int, kernel_size: int, dilations: tuple[int, ...],
                   bias_std: float | None) -> nn.ModuleList:
    """One weight-normed, length-preserving conv per dilation."""
    return nn.ModuleList(
        _wn_conv(channels, channels, kernel_size, 1, dilation=d, padding=get_padding(kernel_size, d),
                 bias_std=bias_std)
        for d in dilations
    )


class ResBlock1(nn.Module):
    """HiFi-GAN V1 block: pairs of (dilated conv, conv) with a residual around each pair.
    ``mask`` [B, 1, T] (padded batches) zeroes every conv input past each item's length."""

    def __init__(self, channels: int, kernel_size: int = 3, dilation: tuple[int, ...] = (1, 3, 5),
                 bias_std: float | None = INIT_STD):
        super().__init__()
        self.convs1 = _dilated_convs(channels, kernel_size, dilation, bias_std)
        self.convs2 = _dilated_convs(channels, kernel_size, (1,) * len(dilation), bias_std)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        for c1, c2 in zip(self.convs1, self.convs2):
            y = c1(masked(F.leaky_relu(x, LRELU_SLOPE), mask))  # out of place: x is the residual
            y = c2(masked(leaky_relu_fresh(y), mask))
            x = x + y
        return x


class ResBlock2(nn.Module):
    """HiFi-GAN V3 block: one dilated conv per residual (cheaper)."""

    def __init__(self, channels: int, kernel_size: int = 3, dilation: tuple[int, ...] = (1, 3),
                 bias_std: float | None = INIT_STD):
        super().__init__()
        self.convs = _dilated_convs(channels, kernel_size, dilation, bias_std)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        for c in self.convs:
            x = x + c(masked(F.leaky_relu(x, LRELU_SLOPE), mask))  # out of place: x is the residual
        return x


class UpsamplingStack(nn.Module):
    """HiFi-GAN's upsampling stack, shared by the NSF vocoder and the VITS decoder: per stage a
    weight-normed transposed conv (``ups``) halving the channels, then the multi-receptive-field
    fusion (the mean of that stage's ``resblocks``). A generator subclasses it and adds its own
    input, conditioning and output layers around it. ``ups`` and ``resblocks`` are attributes of
    the generator itself, so parameter names stay those of the reference generators (their published
    checkpoints load by name)."""

    def build_stack(self, channels: int, upsample_rates: list[int], upsample_kernel_sizes: list[int],
                    resblock: str, resblock_kernel_sizes: list[int], resblock_dilation_sizes: list[list[int]],
                    bias_std: float | None = INIT_STD) -> int:
        """Build ``ups`` and ``resblocks`` for ``channels`` input channels; returns the output channels.
        ``stage_built`` runs after each stage, so a generator's per-stage layers (the NSF source convs)
        are created in the reference's order: layers draw their initial weights from the global RNG in
        creation order, so the same seed gives the reference's weights (and ours stay bitwise)."""
        block = ResBlock1 if str(resblock) == "1" else ResBlock2
        self.num_kernels = len(resblock_kernel_sizes)
        self.upsample_rates = list(upsample_rates)
        self.ups = nn.ModuleList()
        self.resblocks = nn.ModuleList()
        ch = channels
        for i, (u, k) in enumerate(zip(upsample_rates, upsample_kernel_sizes)):
            ch //= 2
            self.ups.append(weight_norm(_init_bias(nn.ConvTranspose1d(2 * ch, ch, k, u, padding=(k - u) // 2),
                                                   bias_std)))
            for rk, rd in zip(resblock_kernel_sizes, resblock_dilation_sizes):
                self.resblocks.append(block(ch, rk, tuple(rd), bias_std))
            self.stage_built(i, ch)
        return ch

    def stage_built(self, i: int, channels: int) -> None:
        """Hook: add layers that belong to stage ``i`` (``channels`` wide). Default: none."""

    def fuse(self, i: int, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Multi-receptive-field fusion of stage ``i``: the mean of its residual blocks."""
        first = i * self.num_kernels
        xs = self.resblocks[first](x, mask)
        for j in range(1, self.num_kernels):
            xs = xs + self.resblocks[first + j](x, mask)
        return xs / self.num_kernels


def sine_phase(f0: torch.Tensor, upp: int, sample_rate: float) -> torch.Tensor:
    """Phase (in cycles, in [0, 1)) of a sine following ``f0`` [B, T] (Hz, one value per frame),
    sampled ``upp`` times per frame -> [B, T*upp].

    Within a frame the frequency moves linearly towards the next frame's f0 (a chirp), so the
    excitation has no frequency steps at frame borders. The running phase is accumulated per
    frame in float64 and wrapped, so a long file does not lose precision the way a float32
    cumulative sum over every sample does.
    """
    inc = f0.double() / sample_rate  # cycles per sample at each frame start
    d_inc = F.pad(inc[:, 1:] - inc[:, :-1], (0, 1))  # change of increment over one frame
    n = torch.arange(1, upp + 1, device=f0.device, dtype=torch.float64)
    within = inc[..., None] * n + 0.5 * d_inc[..., None] * n * (n - 1) / upp  # [B, T, upp]
    frame_total = within[..., -1]  # phase advanced over each full frame
    start = torch.cumsum(torch.remainder(frame_total, 1.0), dim=1)
    start = torch.remainder(F.pad(start[:, :-1], (1, 0)), 1.0)
    phase = torch.remainder(start[..., None] + within, 1.0)
    return phase.reshape(f0.shape[0], -1).float()


class SourceModuleHnNSF(nn.Module):
    """Harmonic-plus-noise source (full NSF): harmonics 1..harmonic_num+1 of f0 with random
    initial phases, plus Gaussian noise (louder where unvoiced), merged to one channel."""

    def __init__(self, sampling_rate: float, harmonic_num: int = 8, sine_amp: float = 0.1,
                 noise_std: float = 0.003, voiced_threshold: float = 0.0):
        super().__init__()
        self.sampling_rate = sampling_rate
        self.harmonic_num = harmonic_num
        self.sine_amp = sine_amp
        self.noise_std = noise_std
        self.voiced_threshold = voiced_threshold
        self.l_linear = nn.Linear(harmonic_num + 1, 1)

    def forward(self, f0: torch.Tensor, upp: int) -> torch.Tensor:
        """f0 [B, T] -> excitation [B, 1, T*upp]."""
        with torch.no_grad():
            phase = sine_phase(f0, upp, self.sampling_rate)[..., None]  # [B, N, 1]
            k = torch.arange(1, self.harmonic_num + 2, device=f0.device, dtype=phase.dtype)
            init = torch.rand(1, 1, self.harmonic_num + 1, device=f0.device)
            init[..., 0] = 0.0  # the fundamental starts at phase 0, overtones at random phases
            sines = torch.sin(2 * math.pi * torch.remainder(phase * k + init, 1.0)) * self.sine_amp
            uv = (f0 > self.voiced_threshold).float().repeat_interleave(upp, dim=1)[..., None]
            noise_amp = uv * self.noise_std + (1 - uv) * self.sine_amp / 3
            excitation = sines * uv + noise_amp * torch.randn_like(sines)
        return torch.tanh(self.l_linear(excitation)).transpose(1, 2)


class Generator(UpsamplingStack):
    """NSF-HiFiGAN generator. ``forward(mel [B, num_mels, T], f0 [B, T] Hz) -> wav [B, 1, T*hop]``."""

    def __init__(self, args: GeneratorArgs):
        super().__init__()
        args.validate()
        self.args = args
        self.num_upsamples = len(args.upsample_rates)
        self.mini_nsf = args.mini_nsf
        self.noise_sigma = args.noise_sigma
        self.source_sr = source_rate(args)
        if args.mini_nsf:
            self.upp = math.prod(args.upsample_rates[:2])
        else:
            self.upp = math.prod(args.upsample_rates)
            self.m_source = SourceModuleHnNSF(args.sampling_rate, harmonic_num=args.harmonic_num)
            self.noise_convs = nn.ModuleList()

        self.conv_pre = weight_norm(nn.Conv1d(args.num_mels, args.upsample_initial_channel, 7, 1, padding=3))
        ch = self.build_stack(args.upsample_initial_channel, args.upsample_rates, args.upsample_kernel_sizes,
                              args.resblock, args.resblock_kernel_sizes, args.resblock_dilation_sizes)
        self.conv_post = weight_norm(_init_bias(nn.Conv1d(ch, 1, 7, 1, padding=3)))

    def stage_built(self, i: int, channels: int) -> None:
        """Where the source enters stage ``i``: full NSF brings the full-rate source down to this
        stage's rate with a strided conv; mini NSF adds it once, after the 2nd stage."""
        if not self.mini_nsf:
            if i + 1 < self.num_upsamples:
                stride = math.prod(self.args.upsample_rates[i + 1:])
                self.noise_convs.append(nn.Conv1d(1, channels, stride * 2, stride, padding=(stride + 1) // 2))
            else:
                self.noise_convs.append(nn.Conv1d(1, channels, 1))
        elif i == 1:
            self.source_conv = _init(nn.Conv1d(1, channels, 1))

    def source(self, f0: torch.Tensor) -> torch.Tensor:
        """The excitation signal for ``f0`` [B, T], at the rate where it enters the stack."""
        f0 = f0.float().clamp(min=0.0, max=self.source_sr / 2 - 1.0)  # above Nyquist would alias
        if self.mini_nsf:
            return torch.sin(2 * math.pi * sine_phase(f0, self.upp, self.source_sr))[:, None, :]
        return self.m_source(f0, self.upp)

    def forward(self, mel: torch.Tensor, f0: torch.Tensor) -> torch.Tensor:
        if not torch.jit.is_tracing() and mel.shape[-1] != f0.shape[-1]:
            raise ValueError(f"mel has {mel.shape[-1]} frames but f0 has {f0.shape[-1]}; they must match.")
        # The source is built in float32 even under autocast: phases need the precision.
        with torch.autocast(device_type=mel.device.type, enabled=False):
            har = self.source(f0)
        har = har.to(mel.dtype) if not torch.is_autocast_enabled(mel.device.type) else har
        x = self.conv_pre(mel)
        if self.training and self.noise_sigma > 0:
            # Regulariser on the mel embedding; training only, so inference stays deterministic.
            x = x + self.noise_sigma * torch.randn_like(x)
        for i in range(self.num_upsamples):
            x = self.ups[i](leaky_relu_fresh(x))  # x: conv_pre's output or the last fusion's mean
            if not self.mini_nsf:
                x = x + self.noise_convs[i](har)
            elif i == 1:
                x = x + self.source_conv(har)
            x = self.fuse(i, x)
        x = self.conv_post(leaky_relu_fresh(x, 0.01))  # default slope 0.01 here, as in HiFi-GAN
        return torch.tanh(x)

    def remove_weight_norm(self) -> None:
        remove_all_weight_norm(self)
