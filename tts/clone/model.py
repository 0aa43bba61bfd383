"""The voice-cloning TTS model: text + a few seconds of reference audio → mel + f0 (→ NSF vocoder).

    text ids ──TextEncoder──► h_text ──AlignerPrior(+spk)──► mu ─┐
                                 │                              ├─ MAS (tts.alignment) ─► path, durations
    target mel ─────────────────────────────────────────────────┘
    reference mel ──ReferenceEncoder──► spk
    h_text ──expand(path)──► MelDecoder(AdaLN spk) ──► mel, log-f0, voiced ──PostNet──► mel
    h_text.detach() ──DurationPredictor(+spk)──► log-durations (used instead of MAS at inference)

Durations come from monotonic alignment search over the Gaussian prior (Glow-TTS), so they are
learned without an external aligner and cannot collapse the way decoder attention does; the
duration predictor is trained on them with a stopped gradient, so it cannot disturb the encoder.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from common.training import count_parameters
from tts.alignment import maximum_path
from tts.clone.config import DURATION_HIDDEN, POSTNET, SIZES, LossConfig, ModelConfig
from tts.clone.decoder import (
    AlignerPrior,
    DurationPredictor,
    MelDecoder,
    PostNet,
    durations_to_path,
    expand,
)
from tts.clone.encoders import ReferenceEncoder, TextEncoder


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over the positions where mask (broadcastable to x) is true."""
    mask = mask.expand_as(x).to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp_min(1.0)


class VoiceCloneTTS(nn.Module):
    """Text encoder + reference encoder + non-autoregressive decoder with MAS durations, f0 head, post-net."""

    def __init__(self, cfg: ModelConfig, n_vocab: int, n_mels: int) -> None:
        super().__init__()
        if cfg.size not in SIZES:
            raise ValueError(f"model.size {cfg.size!r} is not one of {sorted(SIZES)}")
        (td, tl, th), (ad, al, ah), (dd, dl, dh) = (SIZES[cfg.size][k] for k in ("text", "audio", "decoder"))
        self.cfg, self.n_mels = cfg, n_mels
        common = dict(ffn_mult=cfg.ffn_mult, kernel_size=cfg.kernel_size, dropout=cfg.dropout)
        self.text_encoder = TextEncoder(n_vocab, td, tl, th, **common)
        self.ref_encoder = ReferenceEncoder(n_mels, ad, al, ah, **common)
        self.prior = AlignerPrior(td, ad, n_mels)
        self.duration_predictor = DurationPredictor(td, ad, DURATION_HIDDEN[cfg.size], cfg.dropout)
        self.decoder = MelDecoder(td, ad, dd, dl, dh, n_mels, **common)
        self.postnet = PostNet(n_mels, *POSTNET[cfg.size], cfg.dropout)
        # Data statistics, set once from the training set (train_main) and saved with the weights,
        # so inference needs nothing but the checkpoint.
        self.register_buffer("mel_mean", torch.zeros(n_mels))
        self.register_buffer("mel_std", torch.ones(n_mels))
        self.register_buffer("logf0_mean", torch.tensor(math.log(150.0)))
        self.register_buffer("logf0_std", torch.tensor(0.5))

    # ---- normalisation ------------------------------------------------------------------------
    def set_stats(self, mel_mean: torch.Tensor, mel_std: torch.Tensor, logf0_mean: float, logf0_std: float) -> None:
        self.mel_mean.copy_(mel_mean)
        self.mel_std.copy_(mel_std.clamp_min(1e-3))
        self.logf0_mean.fill_(logf0_mean)
        self.logf0_std.fill_(max(logf0_std, 1e-3))

    def norm_mel(self, mel: torch.Tensor) -> torch.Tensor:
        return (mel - self.mel_mean[:, None]) / self.mel_std[:, None]

    def denorm_mel(self, mel: torch.Tensor) -> torch.Tensor:
        return mel * self.mel_std[:, None] + self.mel_mean[:, None]

    # ---- parts ----------------------------------------------------------------------------------
    def speaker_embedding(self, ref_mel: torch.Tensor, ref_mask: torch.Tensor) -> torch.Tensor:
        """Reference log-mel [B, n_mels, T] (raw, as MelSpectrogram gives it) → speaker vector [B, dim]."""
        return self.ref_encoder(self.norm_mel(ref_mel) * ref_mask.unsqueeze(1), ref_mask)

    @torch.no_grad()
    def align(self, mu: torch.Tensor, x: torch.Tensor, text_mask: torch.Tensor,
              mel_mask: torch.Tensor) -> torch.Tensor:
        """MAS path [B, T_text, T_frames] maximising sum log N(x_t; mu_i, I) (fp32, no autocast).
        Under torch.compile `maximum_path` itself runs eagerly, between the compiled graphs."""
        with torch.autocast(mu.device.type, enabled=False):
            mu, x = mu.float(), x.float()
            # -0.5 * ||x_t - mu_i||^2 expanded, so the [B, T_text, T_frames] matrix is one bmm
            neg_cent = (torch.bmm(mu.transpose(1, 2), x) - 0.5 * (mu ** 2).sum(1).unsqueeze(-1)
                        - 0.5 * (x ** 2).sum(1).unsqueeze(1))
            attn_mask = text_mask.unsqueeze(-1) & mel_mask.unsqueeze(1)
            path = maximum_path(neg_cent, attn_mask)
        return path.to(device=mu.device, dtype=torch.float32)

    # ---- training forward -----------------------------------------------------------------------
    def forward(self, text: torch.Tensor, text_mask: torch.Tensor, mel: torch.Tensor, mel_mask: torch.Tensor,
                ref_mel: torch.Tensor, ref_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """Teacher-forced pass: durations from MAS on the target mel. All masks are bool, True = real."""
        x = self.norm_mel(mel) * mel_mask.unsqueeze(1)
        h = self.text_encoder(text, text_mask)
        spk = self.speaker_embedding(ref_mel, ref_mask)
        mu = self.prior(h, spk, text_mask)
        path = self.align(mu.detach(), x, text_mask, mel_mask)
        durations = path.sum(-1)
        log_dur = self.duration_predictor(h.detach(), spk, text_mask)
        dec_mel, logf0, vuv = self.decoder(expand(h, path), spk, mel_mask)
        post_mel = self.postnet(dec_mel, mel_mask)
        mu_frames = torch.bmm(mu.float(), path)  # [B, n_mels, T_frames], the prior under the path
        return dict(x=x, mu_frames=mu_frames, path=path, durations=durations, log_dur=log_dur,
                    dec_mel=dec_mel, post_mel=post_mel, logf0=logf0, vuv=vuv, spk=spk)

    def losses(self, out: dict[str, torch.Tensor], batch: dict[str, torch.Tensor],
               weights: LossConfig) -> dict[str, torch.Tensor]:
        """All loss terms in fp32 (autocast-safe) plus their weighted sum under 'loss'."""
        mel_mask, text_mask = batch["mel_mask"].unsqueeze(1), batch["text_mask"]
        x = out["x"].float()
        mel_l1 = masked_mean((out["dec_mel"].float() - x).abs(), mel_mask)
        post_l1 = masked_mean((out["post_mel"].float() - x).abs(), mel_mask)
        prior = 0.5 * masked_mean((x - out["mu_frames"]) ** 2, mel_mask)
        dur_target = torch.log1p(out["durations"])
        duration = masked_mean((out["log_dur"].float() - dur_target) ** 2, text_mask)
        fmask = batch["mel_mask"]
        logf0_target = (torch.log(batch["f0"].clamp_min(1.0)) - self.logf0_mean) / self.logf0_std
        f0 = masked_mean((out["logf0"].float() - logf0_target).abs(), fmask)
        voiced = F.binary_cross_entropy_with_logits(out["vuv"].float(), batch["voiced"].float(), reduction="none")
        voiced = masked_mean(voiced, fmask)
        total = (weights.mel * (mel_l1 + post_l1) + weights.prior * prior + weights.duration * duration
                 + weights.f0 * f0 + weights.voiced * voiced)
        return dict(loss=total, mel=mel_l1, postnet=post_l1, prior=prior, duration=duration, f0=f0, voiced=voiced)

    # ---- inference ------------------------------------------------------------------------------
    @torch.no_grad()
    def infer(self, text: torch.Tensor, text_mask: torch.Tensor, ref_mel: torch.Tensor, ref_mask: torch.Tensor,
              length_scale: float = 1.0, zero_unvoiced: bool = False) -> dict[str, torch.Tensor]:
        """Predicted durations → mel (raw log-mel, the vocoder's units) [B, n_mels, T] and f0 in Hz [B, T].

        `zero_unvoiced` sets unvoiced frames to 0 Hz; by default the f0 track stays continuous,
        the convention of `speech.f0.extract_f0` that the NSF vocoder is trained on.
        """
        h = self.text_encoder(text, text_mask)
        spk = self.speaker_embedding(ref_mel, ref_mask)
        log_dur = self.duration_predictor(h, spk, text_mask).clamp(max=self.cfg.max_log_duration)
        # exp - 1 rather than expm1: ONNX has no expm1 (the difference vanishes in the rounding)
        durations = torch.round((torch.exp(log_dur) - 1).clamp_min(0) * length_scale).clamp_min(1)
        durations = (durations * text_mask).long()
        n_frames = durations.sum(1).max()  # a tensor, not an int: an ONNX trace keeps the length dynamic
        path = durations_to_path(durations, n_frames)
        mel_mask = path.sum(1) > 0
        dec_mel, logf0, vuv = self.decoder(expand(h, path), spk, mel_mask)
        post_mel = self.postnet(dec_mel, mel_mask).float()
        f0 = torch.exp(logf0.float() * self.logf0_std + self.logf0_mean) * mel_mask
        voiced = (vuv.float() > 0) & mel_mask
        if zero_unvoiced:
            f0 = f0 * voiced
        mel = self.denorm_mel(post_mel) * mel_mask.unsqueeze(1)
        # padded frames get the log floor, not 0 (0 would be loud in log-mel units)
        mel = torch.where(mel_mask.unsqueeze(1), mel, torch.full_like(mel, math.log(1e-5)))
        return dict(mel=mel, f0=f0, voiced=voiced, durations=durations, mel_mask=mel_mask, path=path, spk=spk)


def parameter_counts(size: str, n_vocab: int = 64, n_mels: int = 128) -> dict[str, int]:
    """Parameter counts per part for a size, built on the meta device: no memory, no forward."""
    with torch.device("meta"):
        model = VoiceCloneTTS(ModelConfig(size=size), n_vocab, n_mels)
    parts = {name: count_parameters(child) for name, child in model.named_children()}
    parts["total"] = count_parameters(model)
    return parts
