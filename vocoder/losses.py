"""GAN vocoder losses: LSGAN adversarial, feature matching, mel L1, frame energy and multi-resolution STFT.

All of them run in fp32 even inside an autocast region: a log-spectrum or a squared logit in
fp16 loses exactly the small differences the losses exist to measure (and overflows), so each
function disables autocast and upcasts its inputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from common.precision import no_autocast
from speech.audio import MelSpectrogram, frame_log_power, magnitude

Output = tuple[list[torch.Tensor], list[list[torch.Tensor]]]


def lsgan_loss(logits: list[torch.Tensor], target: float) -> torch.Tensor:
    """Least-squares GAN term: the sum over sub-critics of mean((target - logit)^2), in fp32.
    Critic: real -> 1, fake -> 0; generator: fake -> 1. (VITS uses it too: tts.vits.losses.)"""
    return sum(torch.mean((target - x.float()) ** 2) for x in logits)


def feature_matching(real_fmaps: list[list[torch.Tensor]], fake_fmaps: list[list[torch.Tensor]]) -> torch.Tensor:
    """L1 between the critics' hidden activations on real and generated audio, summed over every
    sub-critic and layer, x2 (HiFi-GAN). Real features are constants (detached)."""
    loss = sum(torch.mean(torch.abs(r.detach().float() - g.float()))
               for r_maps, g_maps in zip(real_fmaps, fake_fmaps) for r, g in zip(r_maps, g_maps))
    return 2 * loss


def discriminator_loss(real: dict[str, Output], fake: dict[str, Output]) -> tuple[torch.Tensor, dict]:
    """LSGAN critic loss: real logits -> 1, fake logits -> 0, summed over every sub-critic.
    Returns (loss, per-critic {name/real, name/fake} tensors for logging)."""
    device = next(iter(real.values()))[0][0].device
    with no_autocast(device.type):
        total = torch.zeros((), device=device)
        logs = {}
        for name in real:
            r_loss, f_loss = lsgan_loss(real[name][0], 1.0), lsgan_loss(fake[name][0], 0.0)
            total = total + r_loss + f_loss
            logs[f"D_{name}_real"] = r_loss.detach()
            logs[f"D_{name}_fake"] = f_loss.detach()
    return total, logs


def generator_adv_loss(fake: dict[str, Output]) -> tuple[torch.Tensor, dict]:
    """LSGAN generator loss: push every fake logit towards 1."""
    device = next(iter(fake.values()))[0][0].device
    with no_autocast(device.type):
        total = torch.zeros((), device=device)
        logs = {}
        for name, (logits, _) in fake.items():
            loss = lsgan_loss(logits, 1.0)
            total = total + loss
            logs[f"G_{name}_adv"] = loss.detach()
    return total, logs


def feature_matching_loss(real: dict[str, Output], fake: dict[str, Output]) -> tuple[torch.Tensor, dict]:
    """``feature_matching`` per critic, summed; returns (loss, per-critic tensors for logging)."""
    device = next(iter(fake.values()))[0][0].device
    with no_autocast(device.type):
        total = torch.zeros((), device=device)
        logs = {}
        for name in fake:
            loss = feature_matching(real[name][1], fake[name][1])
            total = total + loss
            logs[f"G_{name}_fm"] = loss.detach()
    return total, logs


def frame_energy_loss(fake_log_mel: torch.Tensor, real_log_mel: torch.Tensor) -> torch.Tensor:
    """L1 between the log power of each frame (`speech.audio.frame_log_power`) of two natural-log mels.

    Why: while a young generator cannot yet place the harmonics, the log-mel L1 (the median of each
    bin) and the spectral convergence (shrinkage towards an uncertain shape) both reward an output
    that is too quiet, most for high voices, whose harmonics are far apart. A frame's total power
    does not depend on where in the frame its energy sits, so this term asks for the level alone."""
    return F.l1_loss(frame_log_power(fake_log_mel), frame_log_power(real_log_mel))


class MelLoss(nn.Module):
    """L1 between log-mels of generated and real audio (mel settings of the data, fmax_for_loss)."""

    def __init__(self, mel: MelSpectrogram):
        super().__init__()
        self.mel = mel

    def forward(self, fake: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        return self.with_energy(fake, real, energy=False)[0]

    def with_energy(self, fake: torch.Tensor, real: torch.Tensor, energy: bool = True
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(mel L1, `frame_energy_loss` or None) from one pair of mels."""
        with no_autocast(fake.device.type):
            m_fake, m_real = self.mel(fake.float().flatten(1)), self.mel(real.float().flatten(1))
            return F.l1_loss(m_fake, m_real), (frame_energy_loss(m_fake, m_real) if energy else None)


class MultiResolutionSTFTLoss(nn.Module):
    """Parallel WaveGAN's multi-resolution STFT loss: for each (fft, hop, win), spectral
    convergence ||S_r - S_g||_F / ||S_r||_F plus L1 of log magnitudes; averaged over resolutions.

    The same quantity (without gradients) is the held-out "MR-STFT distance" that validation
    reports and the demo tracks.
    """

    def __init__(self, fft_sizes: list[int], hop_sizes: list[int], win_lengths: list[int]):
        super().__init__()
        if not len(fft_sizes) == len(hop_sizes) == len(win_lengths) or not fft_sizes:
            raise ValueError("loss_fft_sizes, loss_hop_sizes and loss_win_lengths must be non-empty and of equal length")
        for n, w in zip(fft_sizes, win_lengths):
            if w > n:
                raise ValueError(f"loss_win_lengths entry {w} is larger than its loss_fft_sizes entry {n}")
        self.resolutions = list(zip(fft_sizes, hop_sizes, win_lengths))
        for i, (_, _, w) in enumerate(self.resolutions):
            self.register_buffer(f"window_{i}", torch.hann_window(w), persistent=False)

    def _magnitude(self, x: torch.Tensor, i: int) -> torch.Tensor:
        n_fft, hop, win = self.resolutions[i]
        spec = torch.stft(x, n_fft, hop, win, getattr(self, f"window_{i}"), center=True, return_complex=True)
        return magnitude(spec)

    def forward(self, fake: torch.Tensor, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """fake, real: [B, T] or [B, 1, T] -> (spectral convergence, log-magnitude L1), each the
        mean over resolutions."""
        with no_autocast(fake.device.type):
            fake, real = fake.float().flatten(1), real.float().flatten(1)
            sc = torch.zeros((), device=fake.device)
            mag = torch.zeros((), device=fake.device)
            for i in range(len(self.resolutions)):
                g, r = self._magnitude(fake, i), self._magnitude(real, i)
                sc = sc + torch.linalg.norm(r - g) / torch.linalg.norm(r).clamp(min=1e-7)
                mag = mag + F.l1_loss(torch.log(g), torch.log(r))
            n = len(self.resolutions)
            return sc / n, mag / n

    def distance(self, fake: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        sc, mag = self(fake, real)
        return sc + mag
