"""``pc_aug``: the pitch-shift consistency augmentation of the seeds' NSF-HiFiGAN tasks.

Part of the batch is generated at a shifted pitch c, its mel re-analysed and shifted back
(c + (-c) = 0), and a two-hop shift a then c - a is compared with the direct shift c
(a + b = c). Kept out of ``train.py``: it is one optional idea, and the step stays readable.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

PC_WAVE_WEIGHT = 30.0  # L1 weight of the pitch-shift consistency term (the seeds' value)


def generate(g: Callable, analyse: Callable, mel: torch.Tensor, f0: torch.Tensor, rate: float, max_key: float,
             max_f0: float) -> tuple[torch.Tensor, dict]:
    """G forward with the cycle on ``ceil(B * rate)`` items (``g``: the generator, ``analyse``: wave ->
    input mel). Returns (fake [B', 1, T]: the first B align with the batch, extras for ``losses``)."""
    b = mel.shape[0]
    n = math.ceil(b * rate)
    if n == 0:
        return g(mel, f0), {}
    key_c = (2 * torch.rand(n, 1, device=f0.device) - 1) * max_key
    f0_c = (f0[:n] * 2 ** (key_c / 12)).clamp(max=max_f0)
    mixed = g(mel, torch.cat([f0_c, f0[n:]]))
    wav_c, wav_rest = mixed[:n], mixed[n:]
    wav_back = g(analyse(wav_c.squeeze(1)).to(mel.dtype), f0[:n])
    lo = -max_key + key_c.clamp(min=0)
    hi = max_key + key_c.clamp(max=0)
    key_a = lo + (hi - lo) * torch.rand(n, 1, device=f0.device)
    wav_a = g(mel[:n], (f0[:n] * 2 ** (key_a / 12)).clamp(max=max_f0))
    wav_ab = g(analyse(wav_a.squeeze(1)).to(mel.dtype), f0_c)
    fake = torch.cat([wav_back, wav_rest, wav_c, wav_a, wav_ab])
    return fake, {"wav_c": wav_c, "wav_ab": wav_ab}


def losses(extras: dict, mel_loss: Callable, mel_weight: float) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Wave L1 and mel distance of the two-hop shift against the direct one, and their logs."""
    pc = F.l1_loss(extras["wav_ab"].float(), extras["wav_c"].float()) * PC_WAVE_WEIGHT
    pc_mel = mel_loss(extras["wav_ab"], extras["wav_c"].detach()) * mel_weight
    return pc, pc_mel, {"loss_pc_wave": pc.detach(), "loss_pc_mel": pc_mel.detach()}
