"""bench/vits_reference.py (ours against jaywalnut310/vits): what can be checked without their code
(flags, the recipe both codes can express, the MAS fallback in their layout, the stft shim); with a
checkout in $VITS_REFERENCE_DIR, that --same_init really makes their generator and ours the same model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from bench import learning
from bench import vits_reference as vr
from tts.alignment import maximum_path

REPO = Path(__file__).resolve().parents[2]


def recipe_config(extra: list[str] = ()):
    from common.config import load_config
    from tts.vits import demo
    from tts.vits.train import TrainConfig
    return load_config(str(demo.CONFIG), TrainConfig, [*learning.RECIPE["vits"], *vr.REFERENCE_RECIPE, *extra])


def test_reference_dir_that_is_not_a_vits_checkout_is_one_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="not a jaywalnut310/vits checkout"):
        vr.import_reference(tmp_path)


@pytest.mark.parametrize("trainer", ["vits", "all"])
def test_reference_dir_is_checked_before_anything_runs(trainer, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        learning.main(["--trainer", trainer, "--reference_dir", str(tmp_path)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert ("not a jaywalnut310/vits checkout" in err) if trainer == "vits" else ("needs --trainer vocoder" in err)


def test_the_recipe_is_one_both_codes_can_express():
    cfg = recipe_config()
    vr.check_expressible(cfg.args())  # their hard-coded sizes
    assert (cfg.lr, list(cfg.betas), cfg.eps, cfg.weight_decay) == (2e-4, [0.8, 0.99], 1e-9, 0.01)
    assert (cfg.precision, cfg.clip_grad_norm, cfg.lr_gamma, cfg.c_stft, cfg.mas_prior_steps) == ("32-true", None, 1.0, 0.0, 0)
    with pytest.raises(SystemExit, match="n_layers_q=3"):  # the tiny preset's posterior encoder is not theirs
        vr.check_expressible(recipe_config(["model_args.n_layers_q=3"]).args())


def test_mas_fallback_takes_their_layout_and_returns_our_path():
    g = torch.Generator().manual_seed(0)
    neg_cent = torch.randn(2, 7, 30, generator=g)  # ours: [B, T_text, T_frames]
    mask = torch.ones(2, 7, 30)
    mask[1, 5:] = 0
    mask[1, :, 24:] = 0
    theirs = vr.shared_mas(maximum_path).maximum_path(neg_cent.transpose(1, 2), mask.transpose(1, 2))
    assert torch.equal(theirs.transpose(1, 2), maximum_path(neg_cent, mask))


def test_old_stft_shim_returns_what_torch_1_returned():
    x = torch.randn(2, 4096)
    old = vr._TorchWithOldStft().stft(x, 1024, hop_length=256, win_length=1024, window=torch.hann_window(1024),
                                      center=False, normalized=False, onesided=True)
    assert old.shape == (2, 513, 13, 2)
    assert torch.equal(torch.view_as_complex(old), torch.stft(x, 1024, hop_length=256, win_length=1024,
                                                              window=torch.hann_window(1024), center=False,
                                                              return_complex=True))


@pytest.mark.skipif(not os.environ.get("VITS_REFERENCE_DIR"), reason="set VITS_REFERENCE_DIR to a jaywalnut310/vits checkout")
def test_same_init_makes_their_generator_and_ours_one_model():
    from tts.vits.train import build_models
    ref = vr.import_reference(os.environ["VITS_REFERENCE_DIR"])
    cfg = recipe_config()
    torch.manual_seed(0)
    gen, disc = build_models(cfg, 3)
    theirs = vr.ReferenceTrainer(ref, cfg, gen.n_vocab, 3, seed=1)
    assert "603 of 603" in vr.copy_initial_weights(theirs, gen, disc)
    wrapped = vr.TheirsForEval(theirs.net_g, ref.commons, cfg.args().inter_channels, cfg.audio.hop_length).eval()
    gen.eval()
    x, x_len, sid = torch.randint(1, gen.n_vocab, (1, 20)), torch.tensor([20]), torch.tensor([1])
    spec, spec_len = torch.rand(1, 513, 60), torch.tensor([60])
    noise = torch.randn(1, cfg.args().inter_channels, 240)
    ours_out = gen.infer(x, x_len, sid, noise_scale=0.667, noise_scale_w=0.0, max_frames=torch.tensor([240]), noise=noise)
    their_out = wrapped.infer(x, x_len, sid, noise_scale=0.667, noise_scale_w=0.0, max_frames=torch.tensor([240]), noise=noise)
    assert ours_out[0].shape == their_out[0].shape
    torch.testing.assert_close(ours_out[0], their_out[0], atol=1e-4, rtol=1e-4)
    for a, b in zip(gen.align(x, x_len, spec, spec_len, sid)[:2], wrapped.align(x, x_len, spec, spec_len, sid)[:2]):
        torch.testing.assert_close(a, b, atol=1e-3, rtol=1e-4)
