"""Fine-tuning from openvpi/SingingVocoders (DiffSinger NSF-HiFiGAN) weights.

A Lightning checkpoint: a ``state_dict`` with ``generator.`` / ``discriminator.`` prefixes, weight norm
under the old hook names ``weight_g`` / ``weight_v`` and the first MSD sub-critic's spectral norm under
``weight_orig`` / ``weight_u`` / ``weight_v``. The openvpi release (``nsf_hifigan_44.1k_hop512_128bin_2024.02``):
``{"generator": state_dict}`` with the old names + ``config.json``. Both are built here from our own modules
with the deprecated hook APIs (the layout those modules save), then loaded: every tensor loads, nothing is
re-initialised or left unused, and the networks compute what the source computed. The fine-tuning recipe
``vocoder/configs/finetune_openvpi.yaml`` keeps the release's contract and trains from such a release."""

import json
import warnings
from pathlib import Path

import torch
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import _SpectralNorm

from common.checkpoint import load_checkpoint
from common.config import file_overrides, load_config
from vocoder.config import VocoderConfig
from vocoder.infer import load_vocoder
from vocoder.layouts import export_info, from_legacy_names
from vocoder.prepare_data import prepare
from vocoder.pretrained import load_pretrained
from vocoder.train import build_discriminator, build_generator, build_lr_scheduler
from vocoder.train import main as train_main

from .conftest import REPO, TINY_YAML, tiny_config, write_tones


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


# ---- the openvpi release layout: {"generator": state_dict} (old weight-norm names) + config.json
RECIPE = REPO / "vocoder" / "configs" / "finetune_openvpi.yaml"


def _write_release(folder: Path, cfg, seed: int) -> torch.nn.Module:
    """A release folder like nsf_hifigan_44.1k_hop512_128bin_2024.02 (random weights): model.ckpt =
    {"generator": state_dict} with weight_g / weight_v names, config.json = the model and mel settings."""
    torch.manual_seed(seed)
    src = _to_hook_api(build_generator(cfg))
    folder.mkdir(parents=True)
    torch.save({"generator": src.state_dict()}, folder / "model.ckpt")
    (folder / "config.json").write_text(json.dumps(export_info(cfg)))
    return src


def test_openvpi_release_layout_loads_every_tensor(tmp_path):
    cfg = tiny_config("model_args.mini_nsf=true")  # the release's source: mini-NSF (source_conv)
    src = _write_release(tmp_path / "release", cfg, seed=1)
    released = torch.load(tmp_path / "release" / "model.ckpt", weights_only=True)["generator"]
    assert "conv_pre.weight_g" in released and "source_conv.weight" in released  # really the release layout

    torch.manual_seed(2)
    g, d = build_generator(cfg), build_discriminator(cfg)
    report = load_pretrained(tmp_path / "release" / "model.ckpt", g, d)
    own = g.state_dict()
    assert f"loaded {len(own)} tensors" in report, report
    assert "re-initialised" not in report and "unused" not in report, report
    converted = from_legacy_names(released)
    assert set(converted) == set(own)
    for name, tensor in own.items():
        assert torch.equal(tensor, converted[name]), name

    mel, f0 = torch.randn(1, cfg.audio.n_mels, 8) - 5, torch.full((1, 8), 150.0)
    with torch.no_grad():
        reference = src.eval()(mel, f0)
        torch.testing.assert_close(g.eval()(mel, f0), reference, rtol=1e-5, atol=1e-6)
        # the folder itself (config.json beside model.ckpt) loads for inference too
        torch.testing.assert_close(load_vocoder(tmp_path / "release")(mel, f0), reference.squeeze(1),
                                   rtol=1e-4, atol=1e-5)


def test_finetune_openvpi_recipe_keeps_the_release_contract():
    cfg = load_config(RECIPE, VocoderConfig)
    a = cfg.audio
    assert (a.sample_rate, a.n_mels, a.hop_length, a.n_fft, a.win_length) == (44100, 128, 512, 2048, 2048)
    assert (a.fmin, a.fmax) == (40, 16000)
    assert cfg.model_args.mini_nsf and cfg.pc_aug
    m = cfg.model_args
    assert (m.upsample_rates, m.upsample_kernel_sizes, m.upsample_initial_channel, m.resblock) == (
        [8, 8, 2, 2, 2], [16, 16, 4, 4, 4], 512, "1")
    # SingingVocoders' ft_hifigan.yaml: 1e-5 for both networks, clipping at 1, fp32; its README: ~2000 steps
    assert cfg.generator_optimizer_args.lr == cfg.discriminator_optimizer_args.lr == 1e-5
    assert (cfg.clip_grad_norm, cfg.precision, cfg.max_updates) == (1.0, "32-true", 2000)
    assert cfg.lr_scheduler_args.name == "constant" and cfg.save_best_after < cfg.max_updates
    # constant from the first step: base_hifi_gpu.yaml's 5000-step warmup is not inherited
    opt = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters(), lr=1e-5)
    sched = build_lr_scheduler(opt, cfg, 1e-5)
    assert [sched.lr_lambdas[0](s) for s in (0, 1000, cfg.max_updates - 1)] == [1.0, 1.0, 1.0]


def test_finetune_openvpi_recipe_trains_from_a_release(tmp_path, capsys):
    """train.py --config finetune_openvpi.yaml --init_from <release>/model.ckpt: the whole generator
    loads and a step runs (the model shrunk with tiny.yaml's keys as --set overrides, the release built to fit)."""
    overrides = [*file_overrides(TINY_YAML), "max_updates=1"]
    cfg = load_config(RECIPE, VocoderConfig, overrides)
    src = _write_release(tmp_path / "release", cfg, seed=1)
    write_tones(tmp_path / "wavs", 3, 44100)
    prepare(cfg, [tmp_path / "wavs"], tmp_path / "bin", num_workers=0, log=lambda *a: None)
    argv = ["--config", str(RECIPE), "--data_dir", str(tmp_path / "bin"), "--run_dir", str(tmp_path / "run"),
            "--init_from", str(tmp_path / "release" / "model.ckpt"), "--device", "cpu"]
    assert train_main(argv + [a for o in overrides for a in ("--set", o)]) == 0
    out = capsys.readouterr().out
    assert f"loaded {len(src.state_dict())} tensors" in out and "re-initialised" not in out, out
    tuned = load_checkpoint(tmp_path / "run" / "checkpoints" / "model_00000001.pt")["models"]["generator"]
    start = from_legacy_names(src.state_dict())
    assert set(tuned) == set(start)
    # one AdamW step at lr 1e-5 moves each weight by about 1e-5: the start was the release, and it trained
    steps = [(tuned[k] - start[k]).abs().max().item() for k in tuned]
    assert max(steps) < 5e-5 and max(steps) > 0
