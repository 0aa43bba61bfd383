"""VITS (Kim et al. 2021): a conditional VAE with a normalising-flow prior, adversarial
HiFi-GAN decoder and monotonic alignment search, trained end to end from text to waveform.

Parts, named as in the paper:
- ``enc_p`` TextEncoder: tokens → hidden states and the prior's mean/log-std per token;
- ``enc_q`` PosteriorEncoder: linear spectrogram → latent z (training only);
- ``flow``: z ↔ z_p, so the prior can stay a simple per-token Gaussian;
- MAS aligns z_p to the tokens (tts.alignment) → durations;
- ``dp``: stochastic (or deterministic) duration predictor, trained on those durations;
- ``dec``: HiFi-GAN generator decoding random windows of z to waveform;
- ``emb_g``: speaker embedding (multi-speaker), conditioning enc_q, flow, dp and dec.

Effective init as jaywalnut310/vits, on purpose (tests/tts/test_vits_init.py): PyTorch's default for every
layer, weight-normed or plain, except token embedding N(0, 1/sqrt(hidden)), attention q/k/v Xavier-uniform,
and zeros for the last layer of each coupling / ConvFlow (each flow starts as the identity).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from tts.alignment import maximum_path
from tts.vits.attentions import Encoder
from tts.vits.config import VitsArgs
from tts.vits.flows import DurationPredictor, ResidualCouplingBlock, StochasticDurationPredictor
from tts.vits.hifigan import Generator
from tts.vits.modules import WN, sequence_mask
from vocoder.model import remove_all_weight_norm


class TextEncoder(nn.Module):
    def __init__(self, n_vocab: int, out_channels: int, hidden_channels: int, filter_channels: int, n_heads: int,
                 n_layers: int, kernel_size: int, p_dropout: float, window_size: int = 4):
        super().__init__()
        self.hidden_channels = hidden_channels
        self.out_channels = out_channels
        self.emb = nn.Embedding(n_vocab, hidden_channels)
        nn.init.normal_(self.emb.weight, 0.0, hidden_channels**-0.5)
        self.encoder = Encoder(hidden_channels, filter_channels, n_heads, n_layers, kernel_size, p_dropout,
                               window_size)
        self.proj = nn.Conv1d(hidden_channels, out_channels * 2, 1)

    def forward(self, x: torch.Tensor, x_lengths: torch.Tensor):
        """ids [B, T] → hidden [B, H, T], prior mean/log-std [B, C, T] each, mask [B, 1, T]."""
        h = self.emb(x) * math.sqrt(self.hidden_channels)
        h = h.transpose(1, 2)
        x_mask = sequence_mask(x_lengths, x.size(1)).unsqueeze(1).to(h.dtype)
        h = self.encoder(h * x_mask, x_mask)
        stats = self.proj(h) * x_mask
        m, logs = stats[:, : self.out_channels], stats[:, self.out_channels :]
        return h, m, logs, x_mask


class PosteriorEncoder(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, hidden_channels: int, kernel_size: int,
                 dilation_rate: int, n_layers: int, gin_channels: int = 0):
        super().__init__()
        self.out_channels = out_channels
        self.pre = nn.Conv1d(in_channels, hidden_channels, 1)
        self.enc = WN(hidden_channels, kernel_size, dilation_rate, n_layers, gin_channels=gin_channels)
        self.proj = nn.Conv1d(hidden_channels, out_channels * 2, 1)

    def forward(self, y: torch.Tensor, y_lengths: torch.Tensor, g: torch.Tensor | None = None):
        y_mask = sequence_mask(y_lengths, y.size(2)).unsqueeze(1).to(y.dtype)
        h = self.enc(self.pre(y) * y_mask, y_mask, g=g)
        stats = (self.proj(h) * y_mask).float()
        m, logs = stats[:, : self.out_channels], stats[:, self.out_channels :]
        z = (m + torch.randn_like(m) * torch.exp(logs)) * y_mask
        return z, m, logs, y_mask


def slice_segments(x: torch.Tensor, starts: torch.Tensor, size: int) -> torch.Tensor:
    """x [B, C, T] → [B, C, size] windows starting at ``starts`` [B] (gather, no Python loop)."""
    idx = starts[:, None] + torch.arange(size, device=x.device)[None, :]
    return torch.gather(x, 2, idx[:, None, :].expand(x.size(0), x.size(1), size))


def rand_slice_segments(x: torch.Tensor, lengths: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random window of ``size`` frames inside each item's valid length (global torch RNG)."""
    max_start = (lengths - size).clamp_min(0)
    starts = (torch.rand(x.size(0), device=x.device) * (max_start + 1).float()).long().clamp_max(max_start)
    if x.size(2) < size:  # whole batch shorter than one window: pad at the end
        x = nn.functional.pad(x, (0, size - x.size(2)))
    return slice_segments(x, starts, size), starts


def generate_path(duration: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Integer durations [B, T_text] → 0/1 alignment [B, T_text, T_frames] (mask [B, T_text, T_frames])."""
    cum = torch.cumsum(duration, -1)  # [B, T_text]
    frames = torch.arange(mask.size(-1), device=duration.device, dtype=cum.dtype)
    end = frames[None, None, :] < cum[:, :, None]
    start = frames[None, None, :] < (cum - duration)[:, :, None]
    return (end & ~start).to(mask.dtype) * mask


def log_likelihood_matrix(z_p: torch.Tensor, m_p: torch.Tensor, logs_p: torch.Tensor) -> torch.Tensor:
    """log N(z_p[:, :, t]; m_p[:, :, i], exp(logs_p[:, :, i])) summed over channels: [B, T_text, T_frames].
    Expanded into four matmuls as in VITS so no [B, C, T_text, T_frames] tensor is formed. fp32."""
    z_p, m_p, logs_p = z_p.float(), m_p.float(), logs_p.float()
    s_p_sq_r = torch.exp(-2 * logs_p)  # [B, C, T_text]
    nc1 = torch.sum(-0.5 * math.log(2 * math.pi) - logs_p, 1).unsqueeze(-1)  # [B, T_text, 1]
    nc2 = (-0.5 * s_p_sq_r).transpose(1, 2) @ z_p.pow(2)  # [B, T_text, T_frames]
    nc3 = (m_p * s_p_sq_r).transpose(1, 2) @ z_p
    nc4 = torch.sum(-0.5 * m_p.pow(2) * s_p_sq_r, 1).unsqueeze(-1)
    return nc1 + nc2 + nc3 + nc4


def beta_binomial_log_prior(x_lengths: torch.Tensor, y_lengths: torch.Tensor, t_text: int, t_frames: int,
                            scale: float = 1.0) -> torch.Tensor:
    """log P(token k | frame t) of the 2-D beta-binomial alignment prior ("One TTS Alignment to Rule
    Them All", Badlani et al. 2021): near the diagonal k/N ≈ t/T, wider in the middle.
    [B, T_text, T_frames], 0 outside each item's rectangle."""
    n = (x_lengths - 1).float()[:, None, None]  # [B, 1, 1]
    m = y_lengths.float()[:, None, None]
    k = torch.arange(t_text, device=x_lengths.device, dtype=torch.float32)[None, :, None]
    j = torch.arange(1, t_frames + 1, device=x_lengths.device, dtype=torch.float32)[None, None, :]
    a, b = scale * j, scale * (m + 1 - j)
    valid = (k <= n) & (j <= m)
    kk, a, b = torch.where(valid, k, 0.0), torch.where(valid, a, 1.0), torch.where(valid, b, 1.0)
    nn_ = torch.where(valid, n.expand_as(valid), 0.0)

    def lbeta(x, y):
        return torch.lgamma(x) + torch.lgamma(y) - torch.lgamma(x + y)

    logp = (torch.lgamma(nn_ + 1) - torch.lgamma(kk + 1) - torch.lgamma(nn_ - kk + 1)
            + lbeta(kk + a, nn_ - kk + b) - lbeta(a, b))
    return torch.where(valid, logp, torch.zeros_like(logp))


class VITS(nn.Module):
    """The generator side of VITS (everything but the discriminator)."""

    def __init__(self, n_vocab: int, spec_channels: int, n_speakers: int, args: VitsArgs, hop_length: int):
        super().__init__()
        if math.prod(args.upsample_rates) != hop_length:
            raise ValueError(f"model_args.upsample_rates {args.upsample_rates} multiply to "
                             f"{math.prod(args.upsample_rates)}, but audio.hop_length is {hop_length}; they must match")
        self.args = args
        self.n_vocab = n_vocab
        self.n_speakers = n_speakers
        self.hop_length = hop_length
        self.segment_frames = args.segment_frames
        gin = args.gin_channels if n_speakers > 1 else 0
        self.gin_channels = gin
        self.enc_p = TextEncoder(n_vocab, args.inter_channels, args.hidden_channels, args.filter_channels,
                                 args.n_heads, args.n_layers, args.kernel_size, args.p_dropout, args.window_size)
        self.dec = Generator(args.inter_channels, args.resblock, args.resblock_kernel_sizes,
                             args.resblock_dilation_sizes, args.upsample_rates, args.upsample_initial_channel,
                             args.upsample_kernel_sizes, gin_channels=gin)
        self.enc_q = PosteriorEncoder(spec_channels, args.inter_channels, args.hidden_channels,
                                      args.posterior_kernel_size, 1, args.n_layers_q, gin_channels=gin)
        self.flow = ResidualCouplingBlock(args.inter_channels, args.hidden_channels, args.flow_kernel_size, 1,
                                          args.flow_n_layers, args.n_flows, gin_channels=gin)
        if args.use_sdp:
            self.dp = StochasticDurationPredictor(args.hidden_channels, 192, 3, 0.5, 4, gin_channels=gin)
        else:
            self.dp = DurationPredictor(args.hidden_channels, args.dp_filter_channels, 3, 0.5, gin_channels=gin)
        if n_speakers > 1:
            self.emb_g = nn.Embedding(n_speakers, gin)

    def speaker_cond(self, sid: torch.Tensor | None) -> torch.Tensor | None:
        if self.n_speakers <= 1:
            return None
        if sid is None:
            sid = torch.zeros(1, dtype=torch.long, device=self.emb_g.weight.device)
        return self.emb_g(sid).unsqueeze(-1)  # [B, gin, 1]

    def forward(self, x: torch.Tensor, x_lengths: torch.Tensor, spec: torch.Tensor, spec_lengths: torch.Tensor,
                sid: torch.Tensor | None = None, mas_prior_weight: float = 0.0) -> dict[str, torch.Tensor]:
        """Training pass. Returns the waveform for a random latent window and what the losses need.

        ``mas_prior_weight`` > 0 adds that much of the beta-binomial diagonal log-prior to the
        log-likelihoods MAS sees (not to any loss): early in training, when the prior and
        posterior are still random, it steers MAS to near-diagonal paths instead of degenerate
        ones, which makes alignments form in far fewer steps. The trainer decays it to 0."""
        h, m_p, logs_p, x_mask = self.enc_p(x, x_lengths)
        g = self.speaker_cond(sid)
        z, m_q, logs_q, y_mask = self.enc_q(spec, spec_lengths, g=g)
        z_p = self.flow(z, y_mask, g=g)

        with torch.no_grad():
            neg_cent = log_likelihood_matrix(z_p, m_p, logs_p)
            attn_mask = x_mask.transpose(1, 2) * y_mask  # [B, T_text, T_frames]
            guided = neg_cent
            if mas_prior_weight > 0:
                guided = neg_cent + mas_prior_weight * beta_binomial_log_prior(
                    x_lengths, spec_lengths, x.size(1), spec.size(2))
            attn = maximum_path(guided, attn_mask)
        w = attn.sum(2).unsqueeze(1)  # [B, 1, T_text] frames per token
        if self.args.use_sdp:
            l_length = self.dp(h, x_mask, w, g=g) / torch.sum(x_mask)
        else:
            logw_ = torch.log(w + 1e-6) * x_mask
            logw = self.dp(h, x_mask, g=g).float()
            l_length = torch.sum((logw - logw_) ** 2, [1, 2]) / torch.sum(x_mask)
        # expand the prior to frames along the alignment
        m_p = (m_p.float() @ attn)  # [B, C, T_text] @ [B, T_text, T_frames]
        logs_p = (logs_p.float() @ attn)
        z_slice, starts = rand_slice_segments(z, spec_lengths, self.segment_frames)
        o = self.dec(z_slice, g=g)
        return {"wav": o, "l_length": l_length, "attn": attn, "starts": starts, "x_mask": x_mask,
                "y_mask": y_mask, "z_p": z_p, "m_p": m_p, "logs_p": logs_p, "m_q": m_q, "logs_q": logs_q,
                "neg_cent": neg_cent}

    @torch.no_grad()
    def align(self, x, x_lengths, spec, spec_lengths, sid=None):
        """Teacher-forced alignment of recordings (evaluation): (log-likelihood matrix, MAS path,
        text mask, frame mask); the posterior mean is used instead of a sample (deterministic)."""
        _, m_p, logs_p, x_mask = self.enc_p(x, x_lengths)
        g = self.speaker_cond(sid)
        _, m_q, _, y_mask = self.enc_q(spec, spec_lengths, g=g)
        z_p = self.flow(m_q * y_mask, y_mask, g=g)
        neg_cent = log_likelihood_matrix(z_p, m_p, logs_p)
        mask = x_mask.transpose(1, 2) * y_mask
        return neg_cent, maximum_path(neg_cent, mask), x_mask, y_mask

    def predict_durations(self, h, x_mask, g, noise_scale_w: float = 0.8, length_scale: float = 1.0):
        if self.args.use_sdp:
            logw = self.dp(h, x_mask, g=g, reverse=True, noise_scale=noise_scale_w)
        else:
            logw = self.dp(h, x_mask, g=g)
        w = torch.exp(logw.float()) * x_mask * length_scale
        return torch.ceil(w)  # [B, 1, T_text]

    @torch.no_grad()
    def infer(self, x: torch.Tensor, x_lengths: torch.Tensor, sid: torch.Tensor | None = None,
              noise_scale: float | torch.Tensor = 0.667, length_scale: float | torch.Tensor = 1.0,
              noise_scale_w: float | torch.Tensor = 0.8, max_frames: int | torch.Tensor | None = None,
              noise: torch.Tensor | None = None, mask_decoder: bool = False):
        """Text ids → (waveform [B, 1, T], alignment [B, T_text, T_frames], frame mask).

        For batched evaluation that must equal item-by-item (tts/vits/evaluation.py): ``max_frames`` may
        be per item [B]; ``noise`` [B, C, ≥T_frames] is the standard normal for z_p (each item's own
        draw, so an item's result does not depend on its batch); ``mask_decoder`` zeroes the
        decoder's activations past each item's length (``Generator.forward``)."""
        h, m_p, logs_p, x_mask = self.enc_p(x, x_lengths)
        g = self.speaker_cond(sid)
        w_ceil = self.predict_durations(h, x_mask, g, noise_scale_w, length_scale)
        y_lengths = torch.clamp_min(torch.sum(w_ceil, [1, 2]), 1).long()
        if max_frames is not None:
            y_lengths = y_lengths.clamp_max(max_frames)
        y_mask = sequence_mask(y_lengths).unsqueeze(1).to(x_mask.dtype)
        attn = generate_path(w_ceil[:, 0], x_mask.transpose(1, 2) * y_mask)  # [B, T_text, T_frames]
        m_p = m_p.float() @ attn
        logs_p = logs_p.float() @ attn
        eps = torch.randn_like(m_p) if noise is None else noise[:, :, : m_p.size(2)].to(m_p)
        z_p = m_p + eps * torch.exp(logs_p) * noise_scale
        z = self.flow(z_p, y_mask, g=g, reverse=True)
        o = self.dec((z * y_mask), g=g, mask=y_mask if mask_decoder else None)
        return o, attn, y_mask

    def remove_weight_norm(self) -> int:
        return remove_all_weight_norm(self)

    def inference_parameters(self) -> int:
        """Weights used at inference: everything except the posterior encoder (and, for the SDP,
        its posterior flows and the one flow the reverse pass skips)."""
        skip = set(id(p) for p in self.enc_q.parameters())
        if self.args.use_sdp:
            for mod in (self.dp.post_pre, self.dp.post_proj, self.dp.post_convs, self.dp.post_flows, self.dp.flows[1]):
                skip |= set(id(p) for p in mod.parameters())
        return sum(p.numel() for p in self.parameters() if id(p) not in skip)


def apply_layout_and_compile(gen: VITS, disc: nn.Module, channels_last: bool, compile: bool) -> list[str]:
    """``channels_last`` and ``compile`` for VITS' generator and critic (a MultiPeriodDiscriminator),
    done in place (checkpoint keys unchanged) before DDP wraps them; returns the report lines."""
    lines = []
    if channels_last:
        convs2d = [m for m in disc.modules() if isinstance(m, torch.nn.Conv2d)]
        disc.to(memory_format=torch.channels_last)
        lines.append(f"applied: channels_last on the period critics' {len(convs2d)} Conv2d layers. Not applied to "
                     "the generator and the scale critic: they are 1-D convs, which have no channels_last "
                     "layout (see tts/README.md for the measured effect)")
    if compile:
        # PeriodDiscriminator.forward is one code object for every period: one graph per period × batch
        # (2B in the D step, B in the G step) = 10 for vits_base, over dynamo's default limit of 8,
        # past which it falls back to eager.
        limit = 4 * len(disc.discriminators)
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, limit)
        gen.dec.compile()
        for critic in disc.discriminators:
            critic.compile()
        lines.append("applied: torch.compile on the HiFi-GAN decoder and each critic (fixed-shape crops); the "
                     "text/posterior encoders, flow and MAS stay eager; evaluation runs eager")
    return lines
