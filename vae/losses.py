"""The VAE objective: reconstruction + LPIPS + KL, and an optional hinge PatchGAN.

Scale convention (read this before changing a weight): latent-diffusion sums the per-pixel
reconstruction/NLL over pixels and the KL over latent elements, and divides both by the batch size;
`kl_weight=1e-6` and `disc_weight=0.5` are tuned for that. We divide that whole objective by the
number of pixel values per image (C·H·W). Every relative weight is therefore exactly
latent-diffusion's (`--kl_weight 1e-6` means what users expect), while the loss stays a per-pixel
mean: readable in TensorBoard, independent of the crop size, and on the scale `clip_grad_norm`
(`--gradient_clip`) expects. The logged `kl` is latent-diffusion's value (sum over latent elements / batch size).

The one constant that does not survive that division by itself is the adaptive GAN weight's clamp:
taming/latent-diffusion clamp ||∇nll|| / ||∇g|| at 1e4 on THEIR (summed) scale, where the ratio is
C·H·W times ours. `adaptive_weight_max` therefore divides the clamp by C·H·W too (≈0.05 at 256²,
≈0.003 at 1024²), so the GAN term is exactly as strong as latent-diffusion's at every crop size.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from common.checkpoint import CheckpointError, load_checkpoint
from common.errors import UserError
from vae.model import DiagonalGaussian

# torchvision's cache names for the LPIPS backbones (ImageNet weights).
BACKBONE_FILES = {"vgg": "vgg16-397923af.pth", "alex": "alexnet-owt-7be5be79.pth"}


class PerceptualWeightsError(UserError, RuntimeError):
    """LPIPS backbone weights are not available offline; the message says how to provide them."""


def backbone_cache_path(net: str = "vgg") -> Path:
    return Path(torch.hub.get_dir()) / "checkpoints" / BACKBONE_FILES[net]


def find_backbone_weights(net: str = "vgg", weights_path: str | Path | None = None) -> Path:
    """The backbone file to use: `--perceptual_weights PATH`, else the torchvision cache. Never downloads."""
    if net not in BACKBONE_FILES:
        raise ValueError(f"perceptual_net must be one of {sorted(BACKBONE_FILES)}, got {net!r}")
    if weights_path:
        path = Path(weights_path).expanduser()
        if not path.is_file():
            raise PerceptualWeightsError(f"--perceptual_weights {weights_path}: no such file")
        return path
    path = backbone_cache_path(net)
    if path.is_file():
        return path
    name = BACKBONE_FILES[net]
    raise PerceptualWeightsError(
        f"LPIPS needs the ImageNet {net} backbone ({name}) and it is not in the torchvision cache "
        f"({path}). This trainer never downloads at run time. Provide it in one of these ways:\n"
        f"  1. on a machine with internet run: python -c \"import torchvision; "
        f"torchvision.models.{'vgg16' if net == 'vgg' else 'alexnet'}(weights='IMAGENET1K_V1')\" "
        f"and copy ~/.cache/torch/hub/checkpoints/{name} to {path.parent}/\n"
        f"  2. pass --perceptual_weights /path/to/{name}\n"
        f"  3. train without the perceptual term: --perceptual_weight 0")


class FrozenLPIPS(nn.Module):
    """LPIPS (the `lpips` package) that never trains: no parameter needs grad and it stays in eval
    mode even when the owner calls `.train()` (dropout in its linear heads must stay off)."""

    def __init__(self, net: str = "vgg", weights_path: str | Path | None = None, random_backbone: bool = False) -> None:
        super().__init__()
        import lpips

        with warnings.catch_warnings():  # torchvision's `pretrained=` deprecation inside lpips
            warnings.simplefilter("ignore")
            # pnet_rand=True: build the backbone without touching torchvision's downloader; the real
            # ImageNet weights are loaded below from a local file. lpips' own linear-layer weights
            # ship inside the lpips package.
            self.net = lpips.LPIPS(net=net, pnet_rand=True, pretrained=True, verbose=False)
        self.random_backbone = random_backbone
        self.source = "random backbone (tests only)"
        if not random_backbone:
            path = find_backbone_weights(net, weights_path)
            self._load_backbone(path)
            self.source = str(path)
        self.net.eval()
        self.net.requires_grad_(False)

    def _load_backbone(self, path: Path) -> None:
        try:
            sd = load_checkpoint(path)
        except CheckpointError as exc:
            raise PerceptualWeightsError(f"LPIPS backbone {path}: {exc}") from None
        sd = sd.get("state_dict", sd)
        own = self.net.net.state_dict()  # keys like slice1.0.weight: the index is torchvision's features index
        mapped = {}
        for key in own:
            _, idx, param = key.split(".")
            src = f"features.{idx}.{param}"
            if src not in sd or sd[src].shape != own[key].shape:
                raise PerceptualWeightsError(f"{path}: not a torchvision {self.net.pnet_type} state dict "
                                             f"(missing or mis-shaped '{src}')")
            mapped[key] = sd[src]
        self.net.net.load_state_dict(mapped)

    def train(self, mode: bool = True) -> FrozenLPIPS:  # noqa: ARG002 - always eval, by design
        return super().train(False)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """x, y in [-1, 1] → [B, 1, 1, 1] perceptual distance."""
        return self.net(x, y)


def lpips_or_random(net: str = "vgg", weights_path: str | None = None, random_backbone: bool = False, *,
                    note: str = "LPIPS backbone not cached; a random-weight backbone instead (same compute and memory)"
                    ) -> FrozenLPIPS:
    """FrozenLPIPS with the real backbone when it is there, else with random weights and one `note:` line:
    what measures memory or speed (not quality) on a machine with no torchvision cache (`--profile_memory`,
    the GPU check). Training itself never falls back: it stops and says how to provide the backbone."""
    try:
        return FrozenLPIPS(net, weights_path, random_backbone)
    except PerceptualWeightsError:
        print(f"note: {note}", flush=True)
        return FrozenLPIPS(net, random_backbone=True)


class LogVar(nn.Module):
    """The (optionally learnable) output log-variance of latent-diffusion's Gaussian NLL:
    nll = rec / exp(logvar) + logvar. Fixed at 0 it is the plain reconstruction loss."""

    def __init__(self, init: float = 0.0, learnable: bool = False) -> None:
        super().__init__()
        self.logvar = nn.Parameter(torch.tensor(float(init)), requires_grad=learnable)


class PatchDiscriminator(nn.Module):
    """pix2pix/taming PatchGAN: a stack of stride-2 4×4 convs that scores overlapping patches."""

    def __init__(self, in_channels: int = 3, channels: int = 64, n_layers: int = 3) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(in_channels, channels, 4, 2, 1), nn.LeakyReLU(0.2, True)]
        mult = 1
        for n in range(1, n_layers + 1):
            prev, mult = mult, min(2 ** n, 8)
            stride = 2 if n < n_layers else 1
            layers += [nn.Conv2d(channels * prev, channels * mult, 4, stride, 1, bias=False),
                       nn.BatchNorm2d(channels * mult), nn.LeakyReLU(0.2, True)]
        layers.append(nn.Conv2d(channels * mult, 1, 4, 1, 1))
        self.main = nn.Sequential(*layers)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.normal_(m.weight, 0.0, 0.02)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.normal_(m.weight, 1.0, 0.02)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.main(x)


def hinge_d_loss(logits_real: torch.Tensor, logits_fake: torch.Tensor) -> torch.Tensor:
    return 0.5 * (F.relu(1.0 - logits_real).mean() + F.relu(1.0 + logits_fake).mean())


# taming/latent-diffusion's clamp of the adaptive weight, on their summed (× C·H·W) loss scale.
REFERENCE_WEIGHT_MAX = 1e4


def adaptive_weight_max(pixels: int) -> float:
    """The largest adaptive GAN weight (before × disc_weight) for images of `pixels` = C·H·W values.

    latent-diffusion's ratio is computed on a loss summed over pixels, i.e. C·H·W times ours, and
    clamped at 1e4 there; the same clamp on our per-pixel-mean scale is 1e4 / (C·H·W)."""
    return REFERENCE_WEIGHT_MAX / pixels


def gradient_norm_ratio(nll: torch.Tensor, g_loss: torch.Tensor, last_layer: torch.Tensor,
                        grad_scale: float = 1.0) -> torch.Tensor:
    """||∇ nll|| / (||∇ g_loss|| + 1e-4) at the decoder's last layer (taming-transformers), unclamped,
    0 where it is not finite. `grad_scale` (the GradScaler's scale) keeps fp16 gradients from
    underflowing; it cancels out."""
    nll_grad = torch.autograd.grad(nll * grad_scale, last_layer, retain_graph=True)[0]
    g_grad = torch.autograd.grad(g_loss * grad_scale, last_layer, retain_graph=True)[0]
    ratio = nll_grad.float().norm() / (g_grad.float().norm() + 1e-4 * grad_scale)
    return torch.nan_to_num(ratio, nan=0.0, posinf=0.0).detach()


def adaptive_gan_weight(nll: torch.Tensor, g_loss: torch.Tensor, last_layer: torch.Tensor, pixels: int,
                        grad_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(the GAN term's weight, the unclamped ratio): rescaled so its gradient at the decoder's last layer
    is as large as the reconstruction's, whatever their raw scales, clamped to
    [0, `adaptive_weight_max(pixels)`]. The ratio is logged: it shows whether the clamp binds."""
    ratio = gradient_norm_ratio(nll, g_loss, last_layer, grad_scale)
    return ratio.clamp(0.0, adaptive_weight_max(pixels)), ratio


class VAELoss(nn.Module):
    """Generator-side loss (rec + LPIPS + KL + adaptive GAN) and the discriminator's hinge loss."""

    def __init__(self, kl_weight: float = 1e-6, perceptual_weight: float = 1.0, perceptual: FrozenLPIPS | None = None,
                 rec_loss: str = "l1", learn_logvar: bool = False, logvar_init: float = 0.0,
                 disc_start: int = 50001, disc_weight: float = 0.5, disc_factor: float = 1.0) -> None:
        super().__init__()
        if rec_loss not in ("l1", "l2"):
            raise ValueError(f"rec_loss must be 'l1' or 'l2', got {rec_loss!r}")
        if perceptual_weight > 0 and perceptual is None:
            raise ValueError("perceptual_weight > 0 needs an LPIPS module (FrozenLPIPS)")
        self.kl_weight = kl_weight
        self.perceptual_weight = perceptual_weight
        self.perceptual = perceptual if perceptual_weight > 0 else None
        self.rec_loss = rec_loss
        self.logvar = LogVar(logvar_init, learn_logvar)
        self.disc_start = disc_start
        self.disc_weight = disc_weight
        self.disc_factor = disc_factor

    def gan_active(self, step: int) -> bool:
        """The discriminator joins at `disc_start` (the autoencoder first learns to reconstruct)."""
        return self.disc_weight > 0 and self.disc_factor > 0 and step >= self.disc_start

    def generator_loss(self, x: torch.Tensor, x_rec: torch.Tensor, posterior: DiagonalGaussian, step: int,
                       disc: nn.Module | None = None, last_layer: torch.Tensor | None = None,
                       grad_scale: float = 1.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        x, x_rec_f = x.float(), x_rec.float()
        diff = x - x_rec_f
        rec = diff.abs() if self.rec_loss == "l1" else diff.pow(2)
        logs: dict[str, torch.Tensor] = {f"rec_{self.rec_loss}": rec.mean().detach()}
        if self.perceptual is not None:
            p = self.perceptual(x_rec, x.to(x_rec.dtype)).float()  # [B,1,1,1], broadcast to every pixel
            logs["lpips"] = p.mean().detach()
            rec = rec + self.perceptual_weight * p
        logvar = self.logvar.logvar
        nll = (rec / torch.exp(logvar) + logvar).mean()
        kl = posterior.kl().mean()  # latent-diffusion's reduction: sum over latent elements / batch
        pixels = x[0].numel()
        loss = nll + self.kl_weight * kl / pixels
        logs.update(nll=nll.detach(), kl=kl.detach(), logvar=logvar.detach())
        if disc is not None and self.gan_active(step):
            g_loss = -disc(x_rec).float().mean()
            if torch.is_grad_enabled() and last_layer is not None:
                weight, logs["gan_grad_ratio"] = adaptive_gan_weight(nll, g_loss, last_layer, pixels, grad_scale)
                d_weight = weight * self.disc_weight
            else:
                d_weight = torch.zeros((), device=x.device)
            loss = loss + d_weight * self.disc_factor * g_loss
            logs.update(g_loss=g_loss.detach(), d_weight=d_weight)
        logs["total"] = loss.detach()
        return loss, logs

    def discriminator_loss(self, disc: nn.Module, x: torch.Tensor, x_rec: torch.Tensor,
                           step: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        logits_real = disc(x.detach()).float()
        logits_fake = disc(x_rec.detach()).float()
        factor = self.disc_factor if self.gan_active(step) else 0.0
        d_loss = factor * hinge_d_loss(logits_real, logits_fake)
        return d_loss, {"d_loss": d_loss.detach(), "logits_real": logits_real.mean().detach(),
                        "logits_fake": logits_fake.mean().detach()}
