"""Model shapes, the Gaussian posterior, gradient checkpointing and the diffusers layout."""

from __future__ import annotations

import math

import pytest
import torch

from vae.diffusers_io import from_diffusers, load_diffusers, save_diffusers, to_diffusers
from vae.model import AutoencoderKL, DiagonalGaussian


def tiny(levels: int = 4, **kw) -> AutoencoderKL:
    torch.manual_seed(0)
    return AutoencoderKL([8, 16, 16, 16][:levels], z_channels=kw.pop("z", 4), layers_per_block=1, norm_num_groups=4, **kw)


def test_four_levels_downsample_by_8_and_round_trip_shapes():
    m = tiny(4)
    x = torch.randn(2, 3, 64, 48)
    rec, post = m(x)
    assert m.downsample_factor == 8
    assert post.mean.shape == (2, 4, 8, 6)
    assert rec.shape == x.shape
    with pytest.raises(ValueError, match="multiple of 8"):
        m.encode(torch.randn(1, 3, 60, 64))


@pytest.mark.parametrize("z", [4, 16, 32])
def test_z_channels(z):
    m = tiny(3, z=z)
    assert m.encode(torch.randn(1, 3, 16, 16)).sample().shape == (1, z, 4, 4)


def test_sd_vae_parameter_count():
    # The SD VAE ([128,256,512,512], 2 layers, z4) has 83.65 M parameters in diffusers.
    m = AutoencoderKL([128, 256, 512, 512], z_channels=4)
    assert sum(p.numel() for p in m.parameters()) == 83_653_863


def test_attention_only_in_the_middle_block():
    from vae.model import Attention
    m = tiny(4)
    names = [n for n, mod in m.named_modules() if isinstance(mod, Attention)]
    assert names == ["encoder.mid.attn", "decoder.mid.attn"]


def test_posterior_mode_sample_and_kl_value():
    mean = torch.tensor([0.5, -1.0]).view(1, 2, 1, 1).expand(3, 2, 2, 2).contiguous()
    logvar = torch.tensor([0.0, math.log(4.0)]).view(1, 2, 1, 1).expand(3, 2, 2, 2).contiguous()
    post = DiagonalGaussian(torch.cat([mean, logvar], 1))
    assert torch.equal(post.mode(), mean)
    # KL(N(m, s²) || N(0,1)) = 0.5 (m² + s² - 1 - log s²) per element, summed over C·H·W = 2·2·2.
    per_elem = [0.5 * (0.25 + 1 - 1 - 0), 0.5 * (1 + 4 - 1 - math.log(4))]
    expected = 4 * sum(per_elem)
    assert torch.allclose(post.kl(), torch.full((3,), expected), atol=1e-5)
    g = torch.Generator().manual_seed(0)
    s = torch.stack([post.sample(g) for _ in range(400)])
    assert abs(s[:, :, 1].std().item() - 2.0) < 0.1 and abs(s[:, :, 0].mean().item() - 0.5) < 0.05


def test_logvar_is_clamped():
    post = DiagonalGaussian(torch.cat([torch.zeros(1, 1, 1, 1), torch.full((1, 1, 1, 1), 1e4)], 1))
    assert torch.isfinite(post.kl()).all() and post.logvar.item() == 20.0


def test_gradient_checkpointing_same_gradients():
    m = tiny(3)
    x = torch.randn(2, 3, 16, 16)
    grads = []
    for ckpt in (False, True):
        m.zero_grad()
        m.set_gradient_checkpointing(ckpt)
        rec = m.decode(m.encode(x).mode())
        rec.square().mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters()]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


# Written from diffusers' AutoencoderKL (src/diffusers/models/autoencoders/vae.py, unet_2d_blocks.py):
# encoder.down_blocks.{i}.resnets.{j}, .downsamplers.0.conv, mid_block.resnets.{0,1},
# mid_block.attentions.0.{group_norm,to_q,to_k,to_v,to_out.0}, conv_norm_out, conv_shortcut,
# decoder.up_blocks counted from the lowest resolution with layers_per_block + 1 resnets.
EXPECTED_DIFFUSERS_KEYS_2_LEVELS = """
encoder.conv_in decoder.conv_in quant_conv post_quant_conv
encoder.down_blocks.0.resnets.0.norm1 encoder.down_blocks.0.resnets.0.conv1
encoder.down_blocks.0.resnets.0.norm2 encoder.down_blocks.0.resnets.0.conv2
encoder.down_blocks.0.downsamplers.0.conv
encoder.down_blocks.1.resnets.0.norm1 encoder.down_blocks.1.resnets.0.conv1
encoder.down_blocks.1.resnets.0.norm2 encoder.down_blocks.1.resnets.0.conv2
encoder.down_blocks.1.resnets.0.conv_shortcut
encoder.mid_block.resnets.0.norm1 encoder.mid_block.resnets.0.conv1 encoder.mid_block.resnets.0.norm2
encoder.mid_block.resnets.0.conv2 encoder.mid_block.resnets.1.norm1 encoder.mid_block.resnets.1.conv1
encoder.mid_block.resnets.1.norm2 encoder.mid_block.resnets.1.conv2
encoder.mid_block.attentions.0.group_norm encoder.mid_block.attentions.0.to_q
encoder.mid_block.attentions.0.to_k encoder.mid_block.attentions.0.to_v encoder.mid_block.attentions.0.to_out.0
encoder.conv_norm_out encoder.conv_out
decoder.mid_block.resnets.0.norm1 decoder.mid_block.resnets.0.conv1 decoder.mid_block.resnets.0.norm2
decoder.mid_block.resnets.0.conv2 decoder.mid_block.resnets.1.norm1 decoder.mid_block.resnets.1.conv1
decoder.mid_block.resnets.1.norm2 decoder.mid_block.resnets.1.conv2
decoder.mid_block.attentions.0.group_norm decoder.mid_block.attentions.0.to_q
decoder.mid_block.attentions.0.to_k decoder.mid_block.attentions.0.to_v decoder.mid_block.attentions.0.to_out.0
decoder.up_blocks.0.resnets.0.norm1 decoder.up_blocks.0.resnets.0.conv1 decoder.up_blocks.0.resnets.0.norm2
decoder.up_blocks.0.resnets.0.conv2 decoder.up_blocks.0.resnets.1.norm1 decoder.up_blocks.0.resnets.1.conv1
decoder.up_blocks.0.resnets.1.norm2 decoder.up_blocks.0.resnets.1.conv2
decoder.up_blocks.0.upsamplers.0.conv
decoder.up_blocks.1.resnets.0.norm1 decoder.up_blocks.1.resnets.0.conv1 decoder.up_blocks.1.resnets.0.norm2
decoder.up_blocks.1.resnets.0.conv2 decoder.up_blocks.1.resnets.0.conv_shortcut
decoder.up_blocks.1.resnets.1.norm1 decoder.up_blocks.1.resnets.1.conv1
decoder.up_blocks.1.resnets.1.norm2 decoder.up_blocks.1.resnets.1.conv2
decoder.conv_norm_out decoder.conv_out
"""


def test_diffusers_key_names_and_shapes():
    m = AutoencoderKL([8, 16], z_channels=4, layers_per_block=1, norm_num_groups=4)
    d = to_diffusers(m.state_dict(), 2)
    modules = {k.rsplit(".", 1)[0] for k in d}
    assert modules == set(EXPECTED_DIFFUSERS_KEYS_2_LEVELS.split())
    assert d["decoder.up_blocks.0.resnets.0.conv1.weight"].shape == (16, 16, 3, 3)   # lowest resolution first
    assert d["decoder.up_blocks.1.resnets.0.conv_shortcut.weight"].shape == (8, 16, 1, 1)
    assert d["encoder.mid_block.attentions.0.to_q.weight"].shape == (16, 16)        # Linear, as diffusers
    assert d["encoder.conv_out.weight"].shape == (8, 16, 3, 3)                      # 2 x latent channels


@pytest.mark.parametrize("quant", [True, False])
def test_diffusers_round_trip_identical(tmp_path, quant):
    m = tiny(4, use_quant_conv=quant)
    sd = m.state_dict()
    back = from_diffusers(to_diffusers(sd, 4), m)
    assert back.keys() == sd.keys() and all(torch.equal(back[k], sd[k]) for k in sd)
    save_diffusers(m, tmp_path / "vae", sample_size=64, scaling_factor=0.5)
    loaded, cfg = load_diffusers(tmp_path / "vae")
    assert cfg["latent_channels"] == 4 and cfg["block_out_channels"] == [8, 16, 16, 16]
    assert cfg["scaling_factor"] == 0.5 and cfg["use_quant_conv"] is quant
    x = torch.randn(1, 3, 32, 32)
    assert torch.equal(loaded.decode(loaded.encode(x).mode()), m.decode(m.encode(x).mode()))


def test_diffusers_mismatch_is_named():
    m = tiny(4)
    d = to_diffusers(m.state_dict(), 4)
    d.pop("decoder.conv_out.bias")
    with pytest.raises(KeyError, match="decoder.conv_out.bias"):
        from_diffusers(d, m)


def test_against_real_diffusers_if_installed(tmp_path):
    diffusers = pytest.importorskip("diffusers")
    m = tiny(4)
    save_diffusers(m, tmp_path / "vae")
    theirs = diffusers.AutoencoderKL.from_pretrained(tmp_path / "vae").eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        ours = m.decode(m.encode(x).mode())
        ref = theirs.decode(theirs.encode(x).latent_dist.mode()).sample
    assert torch.allclose(ours, ref, atol=1e-4)
