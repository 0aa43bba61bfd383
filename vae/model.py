"""An SD/FLUX-style KL autoencoder: a convolutional encoder/decoder with a diagonal Gaussian latent.

The layout follows the latent-diffusion `AutoencoderKL` (and diffusers' port of it) so trained weights
drop into a diffusion pipeline (see `vae/diffusers_io.py`): `len(channels)` resolution levels, each
with `layers_per_block` residual blocks, a stride-2 downsample between levels (4 levels → ×8), and
self-attention only in the middle block, where the feature map is smallest. Why only there: attention
is quadratic in pixels, and at 1/8 resolution it is affordable even for 2048-px crops.

Module names are our own (CompVis-like: `down.{level}.blocks.{i}`); the decoder's `up.{level}` is
indexed by resolution (0 = full resolution), as in latent-diffusion, not by execution order.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


def _norm(channels: int, groups: int) -> nn.GroupNorm:
    # eps 1e-6 as in latent-diffusion / diffusers: exported weights must see the same normalisation.
    return nn.GroupNorm(num_groups=groups, num_channels=channels, eps=1e-6, affine=True)


class ResBlock(nn.Module):
    """GroupNorm → SiLU → conv, twice, plus a 1×1 skip projection when the width changes."""

    def __init__(self, in_ch: int, out_ch: int, groups: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.norm1 = _norm(in_ch, groups)
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, padding=1)
        self.norm2 = _norm(out_ch, groups)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1)
        self.skip = nn.Conv2d(in_ch, out_ch, 1) if in_ch != out_ch else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(self.dropout(F.silu(self.norm2(h))))
        return self.skip(x) + h


class Attention(nn.Module):
    """Single-head self-attention over all pixels of the (1/8-resolution) middle feature map."""

    def __init__(self, channels: int, groups: int) -> None:
        super().__init__()
        self.norm = _norm(channels, groups)
        # Linear layers (not 1×1 convs) so the weights have diffusers' `to_q/to_k/to_v/to_out` shapes.
        self.q = nn.Linear(channels, channels)
        self.k = nn.Linear(channels, channels)
        self.v = nn.Linear(channels, channels)
        self.proj = nn.Linear(channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        tokens = self.norm(x).flatten(2).transpose(1, 2)  # [B, HW, C]
        q, k, v = (layer(tokens).unsqueeze(1) for layer in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v).squeeze(1)
        out = self.proj(out).transpose(1, 2).reshape(b, c, h, w)
        return x + out


class Downsample(nn.Module):
    """Stride-2 3×3 conv with asymmetric (right/bottom) zero padding, as the SD VAE does."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample(nn.Module):
    """Nearest-neighbour ×2 then a 3×3 conv (no checkerboard artefacts of transposed convs)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Level(nn.Module):
    """One resolution level: residual blocks, then an optional resampler."""

    def __init__(self, blocks: list[nn.Module], resample: nn.Module | None, name: str) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        if resample is not None:
            self.add_module(name, resample)
        self.resample_name = name if resample is not None else None


class MidBlock(nn.Module):
    def __init__(self, channels: int, groups: int, attention: bool, dropout: float) -> None:
        super().__init__()
        self.block_1 = ResBlock(channels, channels, groups, dropout)
        self.attn = Attention(channels, groups) if attention else nn.Identity()
        self.block_2 = ResBlock(channels, channels, groups, dropout)


def _run(module: nn.Module, x: torch.Tensor, use_checkpoint: bool) -> torch.Tensor:
    # Gradient checkpointing recomputes each block in backward: ~30 % slower, far less activation
    # memory, which is what lets 2048-px crops fit on one 32 GB card.
    if use_checkpoint and torch.is_grad_enabled():
        return checkpoint(module, x, use_reentrant=False)
    return module(x)


class Encoder(nn.Module):
    def __init__(self, in_channels: int, channels: Sequence[int], layers_per_block: int, z_channels: int,
                 groups: int, attention: bool, dropout: float) -> None:
        super().__init__()
        self.conv_in = nn.Conv2d(in_channels, channels[0], 3, padding=1)
        self.down = nn.ModuleList()
        prev = channels[0]
        for i, ch in enumerate(channels):
            blocks = [ResBlock(prev if j == 0 else ch, ch, groups, dropout) for j in range(layers_per_block)]
            last = i == len(channels) - 1
            self.down.append(Level(blocks, None if last else Downsample(ch), "downsample"))
            prev = ch
        self.mid = MidBlock(channels[-1], groups, attention, dropout)
        self.norm_out = _norm(channels[-1], groups)
        self.conv_out = nn.Conv2d(channels[-1], 2 * z_channels, 3, padding=1)  # mean and log-variance
        self.gradient_checkpointing = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ckpt = self.gradient_checkpointing
        h = self.conv_in(x)
        for level in self.down:
            for block in level.blocks:
                h = _run(block, h, ckpt)
            if level.resample_name:
                h = getattr(level, level.resample_name)(h)
        h = _run(self.mid.block_1, h, ckpt)
        h = _run(self.mid.attn, h, ckpt)
        h = _run(self.mid.block_2, h, ckpt)
        return self.conv_out(F.silu(self.norm_out(h)))


class Decoder(nn.Module):
    def __init__(self, out_channels: int, channels: Sequence[int], layers_per_block: int, z_channels: int,
                 groups: int, attention: bool, dropout: float) -> None:
        super().__init__()
        self.conv_in = nn.Conv2d(z_channels, channels[-1], 3, padding=1)
        self.mid = MidBlock(channels[-1], groups, attention, dropout)
        # Built from the lowest resolution up, stored by resolution index (up[0] = full resolution).
        levels: list[Level] = []
        prev = channels[-1]
        for i in reversed(range(len(channels))):
            ch = channels[i]
            # One block more than the encoder, as in latent-diffusion.
            blocks = [ResBlock(prev if j == 0 else ch, ch, groups, dropout) for j in range(layers_per_block + 1)]
            levels.insert(0, Level(blocks, Upsample(ch) if i > 0 else None, "upsample"))
            prev = ch
        self.up = nn.ModuleList(levels)
        self.norm_out = _norm(channels[0], groups)
        self.conv_out = nn.Conv2d(channels[0], out_channels, 3, padding=1)
        self.gradient_checkpointing = False

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        ckpt = self.gradient_checkpointing
        h = self.conv_in(z)
        h = _run(self.mid.block_1, h, ckpt)
        h = _run(self.mid.attn, h, ckpt)
        h = _run(self.mid.block_2, h, ckpt)
        for level in reversed(self.up):
            for block in level.blocks:
                h = _run(block, h, ckpt)
            if level.resample_name:
                h = getattr(level, level.resample_name)(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class DiagonalGaussian:
    """q(z|x) = N(mean, exp(logvar)) per latent element; KL is against N(0, I)."""

    def __init__(self, moments: torch.Tensor) -> None:
        self.mean, logvar = moments.float().chunk(2, dim=1)
        # Clamp as latent-diffusion does: an early huge/small log-variance must not overflow exp().
        self.logvar = logvar.clamp(-30.0, 20.0)
        self.std = torch.exp(0.5 * self.logvar)
        self.var = torch.exp(self.logvar)

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        noise = torch.randn(self.mean.shape, generator=generator, device=self.mean.device, dtype=self.mean.dtype)
        return self.mean + self.std * noise

    def mode(self) -> torch.Tensor:
        return self.mean

    def kl(self) -> torch.Tensor:
        """KL(q || N(0, I)) summed over each sample's latent elements → shape [B]."""
        return 0.5 * torch.sum(self.mean.pow(2) + self.var - 1.0 - self.logvar, dim=(1, 2, 3))


class AutoencoderKL(nn.Module):
    """Encoder → (quant_conv) → Gaussian posterior → (post_quant_conv) → Decoder."""

    # State-dict prefixes of the part a decoder-only fine-tune trains (`freeze_encoder`).
    DECODER_SIDE = ("post_quant_conv.", "decoder.")

    def __init__(self, channels: Sequence[int] = (128, 256, 512, 512), z_channels: int = 16,
                 layers_per_block: int = 2, in_channels: int = 3, out_channels: int = 3,
                 norm_num_groups: int = 32, mid_attention: bool = True, use_quant_conv: bool = True,
                 dropout: float = 0.0) -> None:
        super().__init__()
        channels = list(channels)
        if not channels:
            raise ValueError("channels must list at least one width, e.g. [128, 256, 512, 512]")
        if layers_per_block < 1 or z_channels < 1:
            raise ValueError(f"layers_per_block and z_channels must be >= 1, got {layers_per_block}, {z_channels}")
        bad = [c for c in channels if c % norm_num_groups]
        if bad:
            raise ValueError(f"every entry of channels must be divisible by norm_num_groups={norm_num_groups}; "
                             f"{bad} is not (use multiples of {norm_num_groups} or lower norm_num_groups)")
        self.channels = channels
        self.z_channels = z_channels
        self.layers_per_block = layers_per_block
        self.norm_num_groups = norm_num_groups
        self.mid_attention = mid_attention
        self.use_quant_conv = use_quant_conv
        self.in_channels, self.out_channels = in_channels, out_channels
        self.downsample_factor = 2 ** (len(channels) - 1)
        self.encoder = Encoder(in_channels, channels, layers_per_block, z_channels, norm_num_groups, mid_attention, dropout)
        self.decoder = Decoder(out_channels, channels, layers_per_block, z_channels, norm_num_groups, mid_attention, dropout)
        # FLUX drops the 1×1 quant convs; SD keeps them. Both layouts export to diffusers.
        self.quant_conv = nn.Conv2d(2 * z_channels, 2 * z_channels, 1) if use_quant_conv else nn.Identity()
        self.post_quant_conv = nn.Conv2d(z_channels, z_channels, 1) if use_quant_conv else nn.Identity()
        self.encoder_frozen = False

    def arch(self) -> dict:
        """Everything needed to rebuild this model (stored in checkpoints and used by diffusers export)."""
        return {"channels": list(self.channels), "z_channels": self.z_channels,
                "layers_per_block": self.layers_per_block, "in_channels": self.in_channels,
                "out_channels": self.out_channels, "norm_num_groups": self.norm_num_groups,
                "mid_attention": self.mid_attention, "use_quant_conv": self.use_quant_conv}

    def set_gradient_checkpointing(self, enabled: bool) -> None:
        self.encoder.gradient_checkpointing = enabled
        self.decoder.gradient_checkpointing = enabled

    def freeze_encoder(self) -> None:
        """Decoder-only fine-tuning (sd-vae-ft-mse, `train_decoder_only`): the encoder and quant_conv keep
        their weights and stay in eval mode whatever `.train()` is called later, so the latent space, and
        with it every diffusion model trained on it, stays the init's. `encode` then builds no graph."""
        self.encoder_frozen = True
        self.encoder.requires_grad_(False)
        self.quant_conv.requires_grad_(False)
        self.train(self.training)

    def train(self, mode: bool = True) -> AutoencoderKL:
        super().train(mode)
        if self.encoder_frozen:
            self.encoder.eval()
            self.quant_conv.eval()
        return self

    @property
    def last_layer(self) -> torch.Tensor:
        """The decoder's output conv weight: the GAN's adaptive weight compares gradient norms here."""
        return self.decoder.conv_out.weight

    def encode(self, x: torch.Tensor) -> DiagonalGaussian:
        f = self.downsample_factor
        if x.shape[-1] % f or x.shape[-2] % f:
            raise ValueError(f"image size {tuple(x.shape[-2:])} must be a multiple of {f} for this model")
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.encoder_frozen):
            return DiagonalGaussian(self.quant_conv(self.encoder(x)))

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.post_quant_conv(z))

    def forward(self, x: torch.Tensor, sample_posterior: bool = True,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, DiagonalGaussian]:
        posterior = self.encode(x)
        z = posterior.sample(generator) if sample_posterior else posterior.mode()
        return self.decode(z.to(x.dtype) if not torch.is_autocast_enabled() else z), posterior


def build_vae(arch: dict) -> AutoencoderKL:
    """From an `arch()` dict (checkpoint) or config fields of the same names."""
    keys = ("channels", "z_channels", "layers_per_block", "in_channels", "out_channels", "norm_num_groups",
            "mid_attention", "use_quant_conv", "dropout")
    return AutoencoderKL(**{k: arch[k] for k in keys if k in arch})

