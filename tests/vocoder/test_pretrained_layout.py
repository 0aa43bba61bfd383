"""Fine-tuning from an openvpi/SingingVocoders (DiffSinger NSF-HiFiGAN) checkpoint: a Lightning
``state_dict`` with ``generator.`` / ``discriminator.`` prefixes, weight norm under the old hook names
``weight_g`` / ``weight_v`` and the first MSD sub-critic's spectral norm under ``weight_orig`` /
``weight_u`` / ``weight_v``. Built here from our own modules with the deprecated hook APIs (the layout
those modules save), then loaded: nothing may be re-initialised or left unused, and every critic and the
generator must compute what the source computed."""

import warnings

import torch
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import _SpectralNorm

from vocoder.pretrained import load_pretrained
from vocoder.train import build_discriminator, build_generator

from .conftest import tiny_config


def _to_hook_api(module: torch.nn.Module) -> torch.nn.Module:
    """Our parametrized layers rebuilt with torch.nn.utils.weight_norm / spectral_norm (old hooks)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the hook APIs are deprecated
        for m in list(module.modules()):
            if parametrize.is_parametrized(m, "weight"):
                spectral = isinstance(m.parametrizations.weight[0], _SpectralNorm)
                parametrize.remove_parametrizations(m, "weight", leave_parametrized=True)
                (torch.nn.utils.spectral_norm if spectral else torch.nn.utils.weight_norm)(m)
    return module


def test_singingvocoders_lightning_checkpoint_loads_completely(tmp_path):
    cfg = tiny_config("model_args.discriminators=[msd,mpd]")  # SingingVocoders' nsf_HiFigan_task critics
    torch.manual_seed(1)
    src_g, src_d = _to_hook_api(build_generator(cfg)), _to_hook_api(build_discriminator(cfg))
    sd = {f"generator.{k}": v for k, v in src_g.state_dict().items()}
    sd |= {f"discriminator.{k}": v for k, v in src_d.state_dict().items()}
    assert "discriminator.msd.discriminators.0.convs.0.weight_orig" in sd  # really the old layout
    assert "discriminator.msd.discriminators.0.convs.0.weight_v" in sd
    assert "discriminator.msd.discriminators.1.convs.0.weight_g" in sd
    torch.save({"state_dict": sd, "global_step": 1000, "epoch": 3}, tmp_path / "model_ckpt_steps_1000.ckpt")

    torch.manual_seed(2)
    g, d = build_generator(cfg), build_discriminator(cfg)
    report = load_pretrained(tmp_path / "model_ckpt_steps_1000.ckpt", g, d)
    assert "re-initialised" not in report and "unused" not in report, report

    for m in (src_g, src_d, g, d):
        m.eval()
    x = torch.randn(2, 1, 4096) * 0.3
    with torch.no_grad():
        for name in ("msd", "mpd"):
            (logits_a, _), (logits_b, _) = src_d[name](x), d[name](x)
            for a, b in zip(logits_a, logits_b):
                torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
        mel, f0 = torch.randn(1, cfg.audio.n_mels, 8), torch.full((1, 8), 150.0)
        torch.manual_seed(3)
        wav_a = src_g(mel, f0)
        torch.manual_seed(3)
        torch.testing.assert_close(g(mel, f0), wav_a, rtol=1e-5, atol=1e-6)
