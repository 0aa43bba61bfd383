"""--train_decoder_only (sd-vae-ft-mse's decoder fine-tune): the encoder side never changes (weights,
eval mode, encode() bitwise), only the decoder side is optimised and averaged, the export keeps the
init's latent factors, a run without an init stops before touching its folder, resume stays exact,
and vae/configs/finetune_sd_decoder.yaml loads with the recipe's values."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import REPO, TINY_CONFIG, tiny_cfg

import vae.train_vae as tv
from common.checkpoint import load_checkpoint
from common.config import load_config
from common.training import EMA
from vae import decoder_only
from vae.config import VAEConfig
from vae.diffusers_io import INIT_RECORD, load_diffusers, save_diffusers
from vae.model import AutoencoderKL, build_vae
from vae.pretrained import init_from_diffusers

TINY_ARCH = {"channels": [16, 32], "z_channels": 4, "layers_per_block": 1, "norm_num_groups": 8}
FLAG = "--train_decoder_only"


def source_vae(seed: int = 3) -> AutoencoderKL:
    torch.manual_seed(seed)
    return build_vae(TINY_ARCH).eval()


def run(data, out, *args) -> int:
    return tv.main(["--config", str(TINY_CONFIG), "--data_path", str(data), "--output_dir", str(out), *args])


def names(module, params) -> set[str]:
    ids = {id(p) for p in params}
    return {n for n, p in module.named_parameters() if id(p) in ids}


def side(state_keys) -> set[str]:
    return {k.split(".")[0] for k in state_keys}


@pytest.mark.parametrize("optimizer", ["AdamW", "common.muon.MuonAdamW"])
def test_encoder_is_frozen_bitwise_and_only_the_decoder_side_trains(optimizer):
    cfg = tiny_cfg(train_decoder_only=True, optimizer_cls=optimizer, ema_decay=0.5, disc_start=0)
    t = tv.VAEStep(cfg, torch.device("cpu"))
    vae = t.vae
    opt_params = [p for g in t.g_opt.param_groups for p in g["params"]]
    trained = names(vae, opt_params)
    assert trained and side(trained) == {"decoder", "post_quant_conv"}  # no encoder or quant_conv parameter
    assert not any(p.requires_grad for p in [*vae.encoder.parameters(), *vae.quant_conv.parameters()])
    assert set(t.ema.shadow) == {k for k in vae.state_dict() if k.startswith(("decoder.", "post_quant_conv."))}

    torch.manual_seed(0)
    x = torch.rand(2, 3, 32, 32) * 2 - 1
    with torch.no_grad():
        before = vae.encode(x)
    encoder_before = {k: v.clone() for k, v in vae.state_dict().items() if not k.startswith(AutoencoderKL.DECODER_SIDE)}
    decoder_before = {k: v.clone() for k, v in vae.state_dict().items() if k.startswith(AutoencoderKL.DECODER_SIDE)}
    for step in range(3):
        assert t.train_step([x], step)["stepped"]  # train_step returns its logs (common.loop)
        vae.train()  # what validation does around its evaluation: the encoder stays in eval mode
        assert vae.training and not vae.encoder.training and not vae.quant_conv.training
        assert vae.decoder.training
    with torch.no_grad():
        after = vae.encode(x)
    assert torch.equal(before.mean, after.mean) and torch.equal(before.logvar, after.logvar)
    now = vae.state_dict()
    assert all(torch.equal(now[k], v) for k, v in encoder_before.items())
    assert any(not torch.equal(now[k], v) for k, v in decoder_before.items())
    assert t.eval_model.encoder_frozen and not t.eval_model.encoder.training  # the EMA copy: same encoder
    assert all(torch.equal(t.eval_model.state_dict()[k], v) for k, v in encoder_before.items())


def test_plain_run_still_trains_everything():
    t = tv.VAEStep(tiny_cfg(), torch.device("cpu"))
    opt_params = [p for g in t.g_opt.param_groups for p in g["params"]]
    assert side(names(t.vae, opt_params)) == {"encoder", "decoder", "quant_conv", "post_quant_conv"}
    assert set(t.ema.shadow) == set(t.vae.state_dict())


def test_ema_refuses_a_saved_state_of_other_entries():
    vae = source_vae()
    full, decoder = EMA(vae, 0.9), EMA(vae, 0.9, only=AutoencoderKL.DECODER_SIDE)
    with pytest.raises(ValueError, match="other entries"):
        full.load_state_dict(decoder.state_dict())
    with pytest.raises(ValueError, match="other entries"):
        decoder.load_state_dict(full.state_dict())


def test_decoder_only_run_keeps_the_latent_space_and_the_init_factors(image_dir, tmp_path, capsys):
    src = source_vae()
    folder = save_diffusers(src, tmp_path / "sd_vae", sample_size=32, scaling_factor=0.5)
    out = tmp_path / "run"
    assert run(image_dir, out, "--init_from", str(folder), FLAG, "--max_steps", "3") == 0
    printed = capsys.readouterr().out
    assert f"{FLAG}: the export keeps {folder}'s scaling_factor 0.5, shift_factor None (not re-estimated" in printed
    assert f"{FLAG}: encoder and quant_conv frozen" in printed

    exported = json.loads((out / "diffusers" / "config.json").read_text())
    measured = json.loads((out / "latent_stats.json").read_text())["scaling_factor"]
    assert exported["scaling_factor"] == 0.5 and exported["shift_factor"] is None
    assert abs(measured - 0.5) > 0.025  # a re-estimate would have given another value

    new, _ = load_diffusers(out / "diffusers")
    ckpt = load_checkpoint(out / "checkpoint_last.pt")
    assert side(ckpt["ema"]["vae"]["shadow"]) == {"decoder", "post_quant_conv"}
    src_sd, new_sd, live = src.state_dict(), new.state_dict(), ckpt["models"]["vae"]
    for k, v in src_sd.items():
        if not k.startswith(AutoencoderKL.DECODER_SIDE):  # the exported and the trained encoder: the source's
            assert torch.equal(new_sd[k], v) and torch.equal(live[k], v), k
    assert any(not torch.equal(new_sd[k], v) for k, v in src_sd.items() if k.startswith(AutoencoderKL.DECODER_SIDE))

    torch.manual_seed(1)
    x = torch.rand(2, 3, 32, 32) * 2 - 1
    with torch.no_grad():
        z = src.encode(x).mode()  # latents of the source VAE, as a diffusion model trained on it would make
        assert torch.equal(new.eval().encode(x).mode(), z)
        rec = new.decode(z)
    assert rec.shape == x.shape and torch.isfinite(rec).all()


def test_without_init_from_it_stops_before_the_run_folder_exists(image_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert run(image_dir, out, FLAG, "--max_steps", "1") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and FLAG in err[0] and "--init_from" in err[0]
    assert not out.exists()
    assert run(image_dir, out, FLAG, "--resume_from", "auto") == 2  # nothing to resume either
    assert not out.exists()


def test_resume_is_exact_and_keeps_the_mode(image_dir, tmp_path, capsys):
    folder = save_diffusers(source_vae(), tmp_path / "sd_vae", sample_size=32, scaling_factor=0.5)
    straight, split = tmp_path / "straight", tmp_path / "split"
    common = ("--init_from", str(folder), FLAG, "--max_steps", "4")
    assert run(image_dir, straight, *common) == 0
    assert run(image_dir, split, *common, "--stop_at_step", "2") == 0  # mid-epoch (4 steps per epoch)
    assert run(image_dir, split, FLAG, "--max_steps", "4", "--resume_from", "auto") == 0  # no --init_from needed
    a, b = load_checkpoint(straight / "checkpoint_last.pt"), load_checkpoint(split / "checkpoint_last.pt")
    assert a["counters"]["step"] == b["counters"]["step"] == 4
    for key in ("models", "optimizers", "schedulers", "ema"):
        assert repr(a[key].keys()) == repr(b[key].keys())
        for name in a[key]:
            sa, sb = a[key][name], b[key][name]
            flat_a, flat_b = list(_tensors(sa)), list(_tensors(sb))
            assert len(flat_a) == len(flat_b) and all(torch.equal(u, v) for u, v in zip(flat_a, flat_b)), (key, name)
    assert json.loads((split / "diffusers" / "config.json").read_text())["scaling_factor"] == 0.5
    capsys.readouterr()
    assert run(image_dir, split, "--max_steps", "6", "--resume_from", "auto") == 2  # the flag left out
    assert f"trained with {FLAG}; add {FLAG}" in capsys.readouterr().err


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for k in sorted(obj, key=str):
            yield from _tensors(obj[k])
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def test_factors_come_from_vae_final_and_a_checkpoint_without_them_is_refused(image_dir, tmp_path, capsys):
    first = tmp_path / "first"
    assert run(image_dir, first, "--max_steps", "1", "--set", "export_diffusers=false") == 0
    stats = load_checkpoint(first / "vae_final.pt")["latent_stats"]
    out = tmp_path / "from_final"
    assert run(image_dir, out, "--init_from", str(first / "vae_final.pt"), FLAG, "--max_steps", "1",
               "--learning_rate", "0") == 0
    record = json.loads((out / INIT_RECORD).read_text())
    assert record["scaling_factor"] == stats["scaling_factor"] and record["shift_factor"] is None  # f4c4: no shift
    assert json.loads((out / "diffusers" / "config.json").read_text())["scaling_factor"] == stats["scaling_factor"]
    capsys.readouterr()
    assert run(image_dir, tmp_path / "from_last", "--init_from", str(first / "checkpoint_last.pt"), FLAG,
               "--max_steps", "1") == 2
    err = capsys.readouterr().err
    assert "records none" in err and "vae_final.pt" in err


def test_a_folder_without_factors_in_config_json_has_diffusers_default(tmp_path):
    folder = save_diffusers(source_vae(), tmp_path / "old_hub_folder", sample_size=32)
    folder_cfg = json.loads((folder / "config.json").read_text())
    del folder_cfg["scaling_factor"], folder_cfg["shift_factor"]  # as early diffusers versions saved it
    (folder / "config.json").write_text(json.dumps(folder_cfg))
    t = tv.VAEStep(tiny_cfg(train_decoder_only=True), torch.device("cpu"))
    init_from_diffusers(t.vae, t.cfg, folder, tmp_path / "run")
    init = decoder_only.init_factors(tmp_path / "run")
    assert (init["scaling_factor"], init["shift_factor"]) == (0.18215, None)
    diffusers = pytest.importorskip("diffusers", reason="diffusers is a test dependency (requirements-test.txt)")
    theirs = diffusers.AutoencoderKL.from_pretrained(folder).config
    assert (theirs.scaling_factor, theirs.shift_factor) == (0.18215, None)  # what diffusers reads there


def test_export_factors_measured_contradicts_decoder_only(image_dir, tmp_path, capsys):
    assert run(image_dir, tmp_path / "run", FLAG, "--init_from", str(tmp_path), "--set",
               "export_factors=measured") == 2
    assert "export_factors: measured contradicts" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_finetune_sd_decoder_config_loads_with_the_recipe():
    cfg = load_config(REPO / "vae" / "configs" / "finetune_sd_decoder.yaml", VAEConfig)
    assert cfg.train_decoder_only is True
    assert (cfg.channels, cfg.z_channels, cfg.layers_per_block, cfg.use_quant_conv) == ([128, 256, 512, 512], 4, 2, True)
    assert (cfg.rec_loss, cfg.perceptual_weight, cfg.perceptual_net) == ("l2", 0.1, "vgg")  # MSE + 0.1 * LPIPS
    assert cfg.disc_weight == 0.0 and cfg.ema_decay == 0.9999 and cfg.export_factors == "init"
    assert cfg.learning_rate == 4.5e-6 and (cfg.adam_beta1, cfg.adam_beta2, cfg.weight_decay) == (0.9, 0.999, 0.01)
    assert cfg.batch_size * cfg.accumulation_steps == 192 and cfg.max_steps == 280_000


def test_num_epochs_under_the_recipes_max_steps_is_refused_not_ignored(tmp_path, capsys):
    """The recipe fixes the length with max_steps: a --num_epochs given on top changed nothing, silently."""
    recipe = str(REPO / "vae" / "configs" / "finetune_sd_decoder.yaml")
    assert tv.main(["--config", recipe, "--data_path", str(tmp_path), "--output_dir", str(tmp_path / "r"),
                    "--num_epochs", "2"]) == 2
    err = capsys.readouterr().err
    assert "num_epochs (given on the command line) has no effect while max_steps is 280000" in err
    assert "finetune_sd_decoder.yaml" in err and not (tmp_path / "r").exists()


def test_a_new_run_forgets_the_factors_an_earlier_attempt_left(image_dir, tmp_path):
    """An attempt that wrote `init_from.json` (an init from a diffusers folder) and then died before its
    first checkpoint must not hand that folder's factors to the next, different run in the same folder."""
    out = tmp_path / "run"
    out.mkdir()
    (out / INIT_RECORD).write_text(json.dumps({"init_from": "/gone/sd-vae", "scaling_factor": 0.5,
                                               "shift_factor": None}))
    assert run(image_dir, out, "--max_steps", "1") == 0  # from scratch: its factors are measured
    assert not (out / INIT_RECORD).exists()
    assert json.loads((out / "diffusers" / "config.json").read_text())["scaling_factor"] != 0.5
