"""Normalising flows of VITS: the residual-coupling flow between posterior and prior, and the
stochastic duration predictor (a flow over log-durations with rational-quadratic splines,
trained by variational dequantisation), plus the deterministic duration predictor.

Precision: the coupling flow is mean-only (volume preserving, log-determinant 0) and keeps its
residual path in fp32; the stochastic duration predictor runs entirely in fp32 (autocast off)
because its log-determinants and spline solves lose too much in half precision.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from tts.vits.attentions import LayerNorm
from tts.vits.modules import WN, DDSConv

LOG_2PI = math.log(2 * math.pi)


# ------------------------------------------------------------------------------- coupling flow
class ResidualCouplingLayer(nn.Module):
    """Affine coupling: the second half of the channels is shifted by a WaveNet of the first."""

    def __init__(self, channels: int, hidden_channels: int, kernel_size: int, dilation_rate: int, n_layers: int,
                 gin_channels: int = 0, mean_only: bool = True):
        super().__init__()
        self.half = channels // 2
        self.mean_only = mean_only
        self.pre = nn.Conv1d(self.half, hidden_channels, 1)
        self.enc = WN(hidden_channels, kernel_size, dilation_rate, n_layers, gin_channels=gin_channels)
        self.post = nn.Conv1d(hidden_channels, self.half * (2 - mean_only), 1)
        nn.init.zeros_(self.post.weight)  # start as the identity
        nn.init.zeros_(self.post.bias)

    def forward(self, x: torch.Tensor, x_mask: torch.Tensor, g: torch.Tensor | None = None,
                reverse: bool = False) -> torch.Tensor:
        x0, x1 = x[:, : self.half], x[:, self.half :]
        h = self.pre(x0) * x_mask
        h = self.enc(h, x_mask, g=g)
        stats = self.post(h).float() * x_mask  # the residual path stays fp32 under autocast
        if self.mean_only:
            m, logs = stats, torch.zeros_like(stats)
        else:
            m, logs = stats[:, : self.half], stats[:, self.half :]
        x1 = x1.float()
        if not reverse:
            x1 = (m + x1 * torch.exp(logs)) * x_mask
        else:
            x1 = (x1 - m) * torch.exp(-logs) * x_mask
        return torch.cat([x0.float(), x1], 1)


class ResidualCouplingBlock(nn.Module):
    """n_flows × (coupling, channel flip): f(z) = z_p in training, its inverse at inference."""

    def __init__(self, channels: int, hidden_channels: int, kernel_size: int, dilation_rate: int, n_layers: int,
                 n_flows: int = 4, gin_channels: int = 0):
        super().__init__()
        self.flows = nn.ModuleList(
            ResidualCouplingLayer(channels, hidden_channels, kernel_size, dilation_rate, n_layers, gin_channels)
            for _ in range(n_flows))

    def forward(self, x: torch.Tensor, x_mask: torch.Tensor, g: torch.Tensor | None = None,
                reverse: bool = False) -> torch.Tensor:
        if not reverse:
            for flow in self.flows:
                x = torch.flip(flow(x, x_mask, g=g), [1])
        else:
            for flow in reversed(self.flows):
                x = flow(torch.flip(x, [1]), x_mask, g=g, reverse=True)
        return x


# ------------------------------------------------------------------------------- splines
def rational_quadratic_spline(x: torch.Tensor, widths: torch.Tensor, heights: torch.Tensor,
                              derivatives: torch.Tensor, inverse: bool, tail_bound: float,
                              min_bin_width: float = 1e-3, min_bin_height: float = 1e-3,
                              min_derivative: float = 1e-3) -> tuple[torch.Tensor, torch.Tensor]:
    """Monotonic rational-quadratic spline on [-B, B], identity outside (Durkan et al. 2019).

    widths/heights: unnormalised [..., K]; derivatives: unnormalised [..., K-1] at the inner
    knots (the outer ones are 1 so the tails join linearly). Returns (y, log|dy/dx|) of the
    forward map, or of the inverse map when ``inverse``. Computed on clamped inputs and then
    selected with ``where`` (no boolean indexing: shapes stay static, ONNX exports it).
    """
    num_bins = widths.shape[-1]
    inside = (x >= -tail_bound) & (x <= tail_bound)
    xc = x.clamp(-tail_bound, tail_bound)
    edge = math.log(math.exp(1 - min_derivative) - 1)  # softplus(edge) + min_derivative = 1
    derivatives = F.pad(derivatives, (1, 1), value=edge)
    derivatives = min_derivative + F.softplus(derivatives)

    def knots(unnorm: torch.Tensor, min_size: float) -> tuple[torch.Tensor, torch.Tensor]:
        size = min_size + (1 - min_size * num_bins) * F.softmax(unnorm, dim=-1)
        cum = F.pad(torch.cumsum(size, dim=-1), (1, 0), value=0.0)
        cum = 2 * tail_bound * cum - tail_bound
        cum = torch.cat([torch.full_like(cum[..., :1], -tail_bound), cum[..., 1:-1],
                         torch.full_like(cum[..., :1], tail_bound)], -1)
        return cum, cum[..., 1:] - cum[..., :-1]

    cumwidths, widths = knots(widths, min_bin_width)
    cumheights, heights = knots(heights, min_bin_height)
    locations = cumheights if inverse else cumwidths
    # bin index: number of inner knots at or below the input
    upper = torch.cat([locations[..., :-1], locations[..., -1:] + 1e-6], -1)
    idx = (xc[..., None] >= upper).sum(-1, keepdim=True) - 1
    idx = idx.clamp(0, num_bins - 1)

    def pick(t: torch.Tensor) -> torch.Tensor:
        return t.gather(-1, idx)[..., 0]

    in_cumw, in_w = pick(cumwidths), pick(widths)
    in_cumh, in_h = pick(cumheights), pick(heights)
    in_delta = pick(heights / widths)
    d0, d1 = pick(derivatives), pick(derivatives[..., 1:])
    if inverse:
        y_rel = xc - in_cumh
        a = y_rel * (d0 + d1 - 2 * in_delta) + in_h * (in_delta - d0)
        b = in_h * d0 - y_rel * (d0 + d1 - 2 * in_delta)
        c = -in_delta * y_rel
        disc = (b.pow(2) - 4 * a * c).clamp_min(0.0)
        theta = (2 * c) / (-b - torch.sqrt(disc))
        out = theta * in_w + in_cumw
    else:
        theta = (xc - in_cumw) / in_w
        t1 = theta * (1 - theta)
        out = in_cumh + in_h * (in_delta * theta.pow(2) + d0 * t1) / (in_delta + (d0 + d1 - 2 * in_delta) * t1)
    t1 = theta * (1 - theta)
    denom = in_delta + (d0 + d1 - 2 * in_delta) * t1
    deriv_num = in_delta.pow(2) * (d1 * theta.pow(2) + 2 * in_delta * t1 + d0 * (1 - theta).pow(2))
    logabsdet = torch.log(deriv_num) - 2 * torch.log(denom)
    if inverse:
        logabsdet = -logabsdet
    return torch.where(inside, out, x), torch.where(inside, logabsdet, torch.zeros_like(logabsdet))


# ------------------------------------------------------------------------------- SDP flows
class Log(nn.Module):
    def forward(self, x, x_mask, g=None, reverse=False):
        if not reverse:
            y = torch.log(torch.clamp_min(x, 1e-5)) * x_mask
            return y, torch.sum(-y, [1, 2])
        return torch.exp(x) * x_mask


class Flip(nn.Module):
    def forward(self, x, x_mask, g=None, reverse=False):
        x = torch.flip(x, [1])
        if not reverse:
            return x, torch.zeros(x.size(0), dtype=x.dtype, device=x.device)
        return x


class ElementwiseAffine(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.m = nn.Parameter(torch.zeros(channels, 1))
        self.logs = nn.Parameter(torch.zeros(channels, 1))

    def forward(self, x, x_mask, g=None, reverse=False):
        if not reverse:
            y = (self.m + torch.exp(self.logs) * x) * x_mask
            return y, torch.sum(self.logs * x_mask, [1, 2])
        return (x - self.m) * torch.exp(-self.logs) * x_mask


class ConvFlow(nn.Module):
    """Spline coupling: half the channels are transformed by a spline whose knots a DDSConv of
    the other half (and the conditioning) predicts."""

    def __init__(self, in_channels: int, filter_channels: int, kernel_size: int, n_layers: int,
                 num_bins: int = 10, tail_bound: float = 5.0):
        super().__init__()
        self.half = in_channels // 2
        self.filter_channels = filter_channels
        self.num_bins = num_bins
        self.tail_bound = tail_bound
        self.pre = nn.Conv1d(self.half, filter_channels, 1)
        self.convs = DDSConv(filter_channels, kernel_size, n_layers, p_dropout=0.0)
        self.proj = nn.Conv1d(filter_channels, self.half * (num_bins * 3 - 1), 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, x, x_mask, g=None, reverse=False):
        x0, x1 = x[:, : self.half], x[:, self.half :]
        h = self.convs(self.pre(x0), x_mask, g=g)
        h = self.proj(h) * x_mask
        b, c, t = x0.shape
        h = h.reshape(b, c, -1, t).permute(0, 1, 3, 2)  # [B, c, T, 3K-1]
        k, scale = self.num_bins, math.sqrt(self.filter_channels)
        x1, logabsdet = rational_quadratic_spline(x1, h[..., :k] / scale, h[..., k : 2 * k] / scale,
                                                  h[..., 2 * k :], inverse=reverse, tail_bound=self.tail_bound)
        x = torch.cat([x0, x1], 1) * x_mask
        if not reverse:
            return x, torch.sum(logabsdet * x_mask, [1, 2])
        return x


class StochasticDurationPredictor(nn.Module):
    """Flow-based duration model: trained on the negative ELBO of MAS durations (variational
    dequantisation + augmentation), sampled at inference (noise_scale_w controls variety)."""

    def __init__(self, in_channels: int, filter_channels: int, kernel_size: int, p_dropout: float,
                 n_flows: int = 4, gin_channels: int = 0):
        super().__init__()
        filter_channels = in_channels  # as in VITS: the predictor works at the encoder's width
        self.log_flow = Log()
        self.flows = nn.ModuleList([ElementwiseAffine(2)])
        for _ in range(n_flows):
            self.flows.append(ConvFlow(2, filter_channels, kernel_size, n_layers=3))
            self.flows.append(Flip())
        self.post_pre = nn.Conv1d(1, filter_channels, 1)
        self.post_proj = nn.Conv1d(filter_channels, filter_channels, 1)
        self.post_convs = DDSConv(filter_channels, kernel_size, n_layers=3, p_dropout=p_dropout)
        self.post_flows = nn.ModuleList([ElementwiseAffine(2)])
        for _ in range(4):
            self.post_flows.append(ConvFlow(2, filter_channels, kernel_size, n_layers=3))
            self.post_flows.append(Flip())
        self.pre = nn.Conv1d(in_channels, filter_channels, 1)
        self.proj = nn.Conv1d(filter_channels, filter_channels, 1)
        self.convs = DDSConv(filter_channels, kernel_size, n_layers=3, p_dropout=p_dropout)
        if gin_channels:
            self.cond = nn.Conv1d(gin_channels, filter_channels, 1)

    def _condition(self, x, x_mask, g):
        x = self.pre(x.detach())  # durations must not push the text encoder around
        if g is not None and hasattr(self, "cond"):
            x = x + self.cond(g.detach())
        return self.proj(self.convs(x, x_mask)) * x_mask

    def forward(self, x: torch.Tensor, x_mask: torch.Tensor, w: torch.Tensor | None = None,
                g: torch.Tensor | None = None, reverse: bool = False, noise_scale: float = 1.0) -> torch.Tensor:
        """Training (``w`` = MAS durations [B, 1, T]): NLL per item [B]. Inference: log-durations."""
        with torch.autocast(x.device.type, enabled=False):
            x, x_mask = x.float(), x_mask.float()
            g = g.float() if g is not None else None
            x = self._condition(x, x_mask, g)
            if not reverse:
                return self._nll(x, x_mask, w.float())
            flows = list(reversed(self.flows))
            flows = flows[:-2] + [flows[-1]]  # the first ConvFlow only acts on the discarded z1
            z = torch.randn_like(x[:, :2]) * noise_scale  # randn_like: exports as RandomNormalLike
            for flow in flows:
                z = flow(z, x_mask, g=x, reverse=True)
            return z[:, :1]

    def _nll(self, x, x_mask, w):
        h_w = self.post_proj(self.post_convs(self.post_pre(w), x_mask)) * x_mask
        e_q = torch.randn(w.size(0), 2, w.size(2), device=w.device, dtype=w.dtype) * x_mask
        z_q, logdet_q = e_q, torch.zeros(w.size(0), device=w.device)
        for flow in self.post_flows:
            z_q, ld = flow(z_q, x_mask, g=x + h_w)
            logdet_q = logdet_q + ld
        z_u, z1 = z_q[:, :1], z_q[:, 1:]
        u = torch.sigmoid(z_u) * x_mask
        z0 = (w - u) * x_mask
        logdet_q = logdet_q + torch.sum((F.logsigmoid(z_u) + F.logsigmoid(-z_u)) * x_mask, [1, 2])
        logq = torch.sum(-0.5 * (LOG_2PI + e_q.pow(2)) * x_mask, [1, 2]) - logdet_q
        z0, logdet = self.log_flow(z0, x_mask)
        z = torch.cat([z0, z1], 1)
        for flow in self.flows:
            z, ld = flow(z, x_mask, g=x)
            logdet = logdet + ld
        nll = torch.sum(0.5 * (LOG_2PI + z.pow(2)) * x_mask, [1, 2]) - logdet
        return nll + logq


class DurationPredictor(nn.Module):
    """Deterministic log-duration regressor (VITS' alternative to the SDP; Piper's tiny choice)."""

    def __init__(self, in_channels: int, filter_channels: int, kernel_size: int, p_dropout: float,
                 gin_channels: int = 0):
        super().__init__()
        self.drop = nn.Dropout(p_dropout)
        self.conv_1 = nn.Conv1d(in_channels, filter_channels, kernel_size, padding=kernel_size // 2)
        self.norm_1 = LayerNorm(filter_channels)
        self.conv_2 = nn.Conv1d(filter_channels, filter_channels, kernel_size, padding=kernel_size // 2)
        self.norm_2 = LayerNorm(filter_channels)
        self.proj = nn.Conv1d(filter_channels, 1, 1)
        if gin_channels:
            self.cond = nn.Conv1d(gin_channels, in_channels, 1)

    def forward(self, x, x_mask, g=None):
        x = x.detach()
        if g is not None and hasattr(self, "cond"):
            x = x + self.cond(g.detach())
        x = self.drop(self.norm_1(torch.relu(self.conv_1(x * x_mask))))
        x = self.drop(self.norm_2(torch.relu(self.conv_2(x * x_mask))))
        return self.proj(x * x_mask) * x_mask
