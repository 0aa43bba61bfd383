"""VITS model parts: presets' sizes, forward/backward, flows' invertibility, weight-norm removal."""

from __future__ import annotations

import pytest
import torch

from tts.text import SYMBOLS
from tts.vits.attentions import MultiHeadAttention
from tts.vits.config import model_args
from tts.vits.discriminator import MultiPeriodDiscriminator
from tts.vits.flows import (
    ResidualCouplingBlock,
    StochasticDurationPredictor,
    rational_quadratic_spline,
)
from tts.vits.losses import discriminator_loss, feature_loss, generator_loss, kl_loss
from tts.vits.model import VITS, generate_path, log_likelihood_matrix
from tts.vits.modules import sequence_mask


def _count(m: torch.nn.Module) -> float:
    return sum(p.numel() for p in m.parameters()) / 1e6


@pytest.mark.parametrize("preset, gen_m, disc_m", [
    ("vits_base", 36.3, 46.7),  # jaywalnut310's 83 M configuration
    ("high", 36.3, 46.7),
    ("medium", 23.6, 46.7),
    ("x_low", 7.05, 46.7),
    ("tiny", 0.252, 0.519),
])
def test_preset_parameter_counts(preset, gen_m, disc_m):
    """Built on the meta device (no memory, no forward): single-speaker generator and the
    discriminator, in millions."""
    args = model_args(preset)
    with torch.device("meta"):
        gen = VITS(len(SYMBOLS), 513, 1, args, 256)
        disc = MultiPeriodDiscriminator(args.mpd_periods, args.disc_channel_scale)
    assert _count(gen) == pytest.approx(gen_m, rel=0.01)
    assert _count(disc) == pytest.approx(disc_m, rel=0.01)
    if preset == "vits_base":
        assert _count(gen) + _count(disc) == pytest.approx(83.0, abs=0.3)
        assert gen.inference_parameters() / 1e6 == pytest.approx(28.3, rel=0.01)


def test_relative_attention_matches_explicit_formula():
    torch.manual_seed(0)
    attn = MultiHeadAttention(8, 2, window_size=2).eval()
    x = torch.randn(1, 8, 6)
    mask = torch.ones(1, 1, 6, 6)
    out = attn(x, mask)
    # explicit O(T^2) reference of relative-position attention (Shaw et al.) with a window
    q = attn.conv_q(x).view(1, 2, 4, 6).transpose(2, 3) / 2.0
    k = attn.conv_k(x).view(1, 2, 4, 6).transpose(2, 3)
    v = attn.conv_v(x).view(1, 2, 4, 6).transpose(2, 3)
    scores = torch.zeros(1, 2, 6, 6)
    for i in range(6):
        for j in range(6):
            rel = attn.emb_rel_k[j - i + 2] if abs(j - i) <= 2 else torch.zeros(4)
            scores[:, :, i, j] = (q[:, :, i] * (k[:, :, j] + rel)).sum(-1)
    p = scores.softmax(-1)
    ref = torch.zeros(1, 2, 6, 4)
    for i in range(6):
        for j in range(6):
            rel = attn.emb_rel_v[j - i + 2] if abs(j - i) <= 2 else torch.zeros(4)
            ref[:, :, i] += p[:, :, i, j, None] * (v[:, :, j] + rel)
    ref = attn.conv_o(ref.transpose(2, 3).reshape(1, 8, 6))
    assert torch.allclose(out, ref, atol=1e-5)


def _batch(n_speakers: int = 1):
    torch.manual_seed(0)
    x_len = torch.tensor([9, 6])
    x = torch.randint(1, len(SYMBOLS), (2, 9)) * sequence_mask(x_len)
    y_len = torch.tensor([40, 30])
    spec = torch.rand(2, 513, 40) * sequence_mask(y_len).unsqueeze(1)
    return x, x_len, spec, y_len, torch.tensor([0, n_speakers - 1])


@pytest.mark.parametrize("use_sdp, n_speakers", [(False, 1), (True, 3)])
def test_tiny_forward_backward(use_sdp, n_speakers):
    args = model_args("tiny", {"use_sdp": use_sdp})
    gen = VITS(len(SYMBOLS), 513, n_speakers, args, 256)
    disc = MultiPeriodDiscriminator(args.mpd_periods, args.disc_channel_scale)
    x, x_len, spec, y_len, sid = _batch(n_speakers)
    out = gen(x, x_len, spec, y_len, sid)
    assert out["wav"].shape == (2, 1, args.segment_frames * 256)
    attn = out["attn"]
    assert attn.shape == (2, 9, 40)
    assert torch.equal(attn.sum(1)[0], torch.ones(40)) and attn[1, 6:].sum() == 0 and attn[1].sum() == 30
    assert (attn[0].sum(-1) >= 1).all()  # every token gets a frame
    y = torch.randn_like(out["wav"])
    d_r, d_g, f_r, f_g = disc(y, out["wav"])
    loss = (generator_loss(d_g) + feature_loss(f_r, f_g) + out["l_length"].sum()
            + kl_loss(out["z_p"], out["logs_q"], out["m_p"], out["logs_p"], out["y_mask"]))
    assert torch.isfinite(loss) and torch.isfinite(discriminator_loss(d_r, d_g))
    loss.backward()
    dp_layer = "dp.flows.1.proj.weight" if use_sdp else "dp.proj.weight"  # (the SDP's last layers start at 0)
    for name in ("enc_p.emb.weight", "enc_q.pre.weight", "dec.conv_pre.weight", dp_layer):
        grad = dict(gen.named_parameters())[name].grad
        assert grad is not None and grad.abs().sum() > 0, name
    wav, path, y_mask = gen.eval().infer(x, x_len, sid, max_frames=40)
    assert wav.shape[-1] == y_mask.shape[-1] * 256 and path.shape[1] == 9


def test_flows_invert():
    torch.manual_seed(0)
    flow = ResidualCouplingBlock(8, 16, 5, 1, 2, n_flows=3)
    for layer in flow.flows:  # zero-initialised post layers would make this trivially true
        torch.nn.init.normal_(layer.post.weight, std=0.1)
    z = torch.randn(2, 8, 20)
    mask = sequence_mask(torch.tensor([20, 14])).unsqueeze(1).float()
    z = z * mask
    z_p = flow(z, mask)
    assert not torch.allclose(z_p, z)
    assert torch.allclose(flow(z_p, mask, reverse=True), z, atol=1e-5)


def test_spline_inverse_and_log_det():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 11, generator=g, dtype=torch.float64) * 3  # some outside the ±5 tails
    w, h = torch.randn(3, 11, 10, generator=g, dtype=torch.float64), torch.randn(3, 11, 10, generator=g, dtype=torch.float64)
    d = torch.randn(3, 11, 9, generator=g, dtype=torch.float64)
    y, logdet = rational_quadratic_spline(x, w, h, d, inverse=False, tail_bound=5.0)
    x_back, logdet_inv = rational_quadratic_spline(y, w, h, d, inverse=True, tail_bound=5.0)
    assert torch.allclose(x_back, x, atol=1e-10) and torch.allclose(logdet, -logdet_inv, atol=1e-10)
    eps = 1e-6
    y2, _ = rational_quadratic_spline(x + eps, w, h, d, inverse=False, tail_bound=5.0)
    assert torch.allclose(((y2 - y) / eps).log(), logdet, atol=1e-4)


def test_stochastic_duration_predictor_is_fp32_under_autocast():
    torch.manual_seed(0)
    sdp = StochasticDurationPredictor(16, 16, 3, 0.0)
    x = torch.randn(2, 16, 7)
    mask = torch.ones(2, 1, 7)
    w = torch.randint(1, 5, (2, 1, 7)).float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        nll = sdp(x, mask, w)
        logw = sdp(x, mask, reverse=True, noise_scale=0.0)
    assert nll.dtype == torch.float32 and logw.dtype == torch.float32 and torch.isfinite(nll).all()


def test_weight_norm_removal_keeps_output():
    gen = VITS(len(SYMBOLS), 513, 2, model_args("tiny"), 256).eval()
    x, x_len, _, _, sid = _batch(2)
    torch.manual_seed(1)
    before, _, _ = gen.infer(x, x_len, sid, noise_scale=0.0, noise_scale_w=0.0)
    n = gen.remove_weight_norm()
    assert n > 10 and not any("parametrizations" in k for k in gen.state_dict())
    after, _, _ = gen.infer(x, x_len, sid, noise_scale=0.0, noise_scale_w=0.0)
    assert torch.allclose(before, after, atol=1e-5)


def test_generate_path_and_likelihood_matrix():
    dur = torch.tensor([[2.0, 1.0, 3.0]])
    path = generate_path(dur, torch.ones(1, 3, 6))
    assert path[0].tolist() == [[1, 1, 0, 0, 0, 0], [0, 0, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1]]
    torch.manual_seed(0)
    z, m, logs = torch.randn(1, 4, 5), torch.randn(1, 4, 3), torch.randn(1, 4, 3) * 0.3
    ll = log_likelihood_matrix(z, m, logs)
    ref = torch.distributions.Normal(m[0].T[:, :, None], logs.exp()[0].T[:, :, None]).log_prob(z[0][None]).sum(1)
    assert torch.allclose(ll[0], ref, atol=1e-5)
