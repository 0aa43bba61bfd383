"""--init_from single files as users download them (a Stable Diffusion checkpoint with its VAE under
`first_stage_model.`, a standalone LDM-layout VAE, FLUX's ae.safetensors), checked against diffusers' own
single-file conversion (`AutoencoderKL.from_single_file` with a local config, offline) on random weights:
the same encoder mean and reconstruction within 1e-5. Files of the wrong model, truncated or unsafe
files: one line naming the file and what to give instead, exit 2, nothing written to the run folder."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import types

import numpy as np
import pytest
import torch
from helpers import TINY_CONFIG, tiny_cfg

import vae.train_vae as tv
from common.checkpoint import CheckpointError
from common.safetensors_io import save_safetensors
from vae.pretrained import init_weights
from vae.single_file import ldm_to_ours_key

# diffusers is found at collection and imported by the tests that compare with it: importing it costs every test
# worker ~1 s whether or not it runs them
pytestmark = pytest.mark.skipif(importlib.util.find_spec("diffusers") is None,
                                reason="diffusers is a test dependency (requirements-test.txt)")

CH, CH_MULT, BLOCKS = 32, (1, 2, 2, 2), 1  # four levels (f8) like SD/FLUX, narrow and one block per level
CHANNELS = [CH * m for m in CH_MULT]


def ldm_vae(z: int, quant: bool, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights under latent-diffusion's key names and shapes (its Encoder/Decoder, as FLUX's
    autoencoder.py keeps them): written from that layout, not from our mapping, so that a wrong rename
    shows. Middle attention q/k/v/proj_out are 1x1 convs, as in those files."""
    g = torch.Generator().manual_seed(seed)
    sd: dict[str, torch.Tensor] = {}

    def conv(name, cout, cin, k):
        sd[f"{name}.weight"] = torch.randn(cout, cin, k, k, generator=g) / math.sqrt(cin * k * k)
        sd[f"{name}.bias"] = 0.1 * torch.randn(cout, generator=g)

    def norm(name, c):
        sd[f"{name}.weight"] = 1 + 0.1 * torch.randn(c, generator=g)
        sd[f"{name}.bias"] = 0.1 * torch.randn(c, generator=g)

    def resnet(name, cin, cout):
        norm(f"{name}.norm1", cin)
        conv(f"{name}.conv1", cout, cin, 3)
        norm(f"{name}.norm2", cout)
        conv(f"{name}.conv2", cout, cout, 3)
        if cin != cout:
            conv(f"{name}.nin_shortcut", cout, cin, 1)

    def mid(side, c):
        resnet(f"{side}.mid.block_1", c, c)
        norm(f"{side}.mid.attn_1.norm", c)
        for part in ("q", "k", "v", "proj_out"):
            conv(f"{side}.mid.attn_1.{part}", c, c, 1)
        resnet(f"{side}.mid.block_2", c, c)

    conv("encoder.conv_in", CH, 3, 3)
    block_in = CH
    for i, m in enumerate(CH_MULT):
        for j in range(BLOCKS):
            resnet(f"encoder.down.{i}.block.{j}", block_in, CH * m)
            block_in = CH * m
        if i != len(CH_MULT) - 1:
            conv(f"encoder.down.{i}.downsample.conv", block_in, block_in, 3)
    mid("encoder", block_in)
    norm("encoder.norm_out", block_in)
    conv("encoder.conv_out", 2 * z, block_in, 3)
    if quant:
        conv("quant_conv", 2 * z, 2 * z, 1)
        conv("post_quant_conv", z, z, 1)
    conv("decoder.conv_in", block_in, z, 3)
    mid("decoder", block_in)
    for i in reversed(range(len(CH_MULT))):
        for j in range(BLOCKS + 1):
            resnet(f"decoder.up.{i}.block.{j}", block_in, CH * CH_MULT[i])
            block_in = CH * CH_MULT[i]
        if i != 0:
            conv(f"decoder.up.{i}.upsample.conv", block_in, block_in, 3)
    norm("decoder.norm_out", block_in)
    conv("decoder.conv_out", 3, block_in, 3)
    return sd


# layout -> (latent channels, quant convs, how the file is written, the factors ours must record)
LAYOUTS = {
    "sd_ckpt": (4, True, "sd.ckpt", (0.18215, None)),
    "sd_safetensors": (4, True, "sd.safetensors", (0.18215, None)),
    "ldm_vae_safetensors": (4, True, "vae-ft-mse-840000-ema-pruned.safetensors", (0.18215, None)),
    "flux_ae_safetensors": (16, False, "ae.safetensors", (0.3611, 0.1159)),
}


def write_file(layout: str, folder) -> tuple:
    """The layout's file in `folder` and diffusers' config for it: (file, config folder, z, quant, factors)."""
    z, quant, name, factors = LAYOUTS[layout]
    vae = ldm_vae(z, quant)
    path = folder / name
    if layout.startswith("sd_"):  # a whole SD checkpoint: the VAE under first_stage_model., plus other parts
        whole = {f"first_stage_model.{k}": v for k, v in vae.items()}
        whole["model.diffusion_model.input_blocks.0.0.weight"] = torch.randn(32, 4, 3, 3)
        whole["cond_stage_model.transformer.text_model.embeddings.position_embedding.weight"] = torch.randn(77, 16)
        if path.suffix == ".ckpt":  # as latent-diffusion saves it (Lightning): state_dict + counters
            torch.save({"state_dict": whole, "global_step": 840000, "epoch": 6}, path)
        else:
            save_safetensors({k: v.half() for k, v in whole.items()}, path)  # SD .safetensors are mostly fp16
    else:
        save_safetensors(vae, path)
    cfg_dir = folder / f"{layout}_config"
    import diffusers

    diffusers.AutoencoderKL(block_out_channels=CHANNELS, latent_channels=z, layers_per_block=BLOCKS,
                            down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                            use_quant_conv=quant, use_post_quant_conv=quant).save_config(cfg_dir)
    return path, cfg_dir, z, quant, factors


def run_cfg(z: int, quant: bool) -> tv.VAEConfig:
    return tiny_cfg(channels=CHANNELS, z_channels=z, layers_per_block=BLOCKS, norm_num_groups=32, use_quant_conv=quant)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_single_file_loads_like_diffusers_from_single_file(tmp_path, layout):
    path, cfg_dir, z, quant, (scale, shift) = write_file(layout, tmp_path)
    import diffusers

    theirs = diffusers.AutoencoderKL.from_single_file(str(path), config=str(cfg_dir), local_files_only=True).eval()
    t = tv.VAEStep(run_cfg(z, quant), torch.device("cpu"))
    lines = init_weights(t.models, t.cfg, path, tmp_path / "run")
    ours = t.vae.eval()
    assert f"scaling_factor {scale}, shift_factor {shift}" in lines[0]
    assert json.loads((tmp_path / "run" / "init_from.json").read_text()) == {
        "init_from": str(path), "scaling_factor": scale, "shift_factor": shift}
    if layout.startswith("sd_"):  # the family is the checkpoint's; a VAE-only file's is assumed from its layout
        assert "under 'first_stage_model.'; 2 other tensors ignored" in lines[0] and "assumed" not in lines[0]
    else:
        assert "assumed from the layout: an S" in lines[0] and "give --init_from its diffusers folder" in lines[0]
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(1)) * 2 - 1
    with torch.no_grad():
        mean = ours.encode(x).mean
        torch.testing.assert_close(mean, theirs.encode(x).latent_dist.mean, atol=1e-5, rtol=0)
        recon, _ = ours(x, sample_posterior=False)
        torch.testing.assert_close(recon, theirs(x, sample_posterior=False).sample, atol=1e-5, rtol=0)
    assert mean.shape == (2, z, 4, 4) and recon.abs().max() > 0.1  # a real signal, not zeros compared


def test_the_ldm_rename_covers_every_part():
    assert ldm_to_ours_key("encoder.down.1.block.0.nin_shortcut.weight") == "encoder.down.1.blocks.0.skip.weight"
    assert ldm_to_ours_key("decoder.up.3.upsample.conv.bias") == "decoder.up.3.upsample.conv.bias"
    assert ldm_to_ours_key("decoder.mid.attn_1.proj_out.weight") == "decoder.mid.attn.proj.weight"
    assert ldm_to_ours_key("encoder.mid.attn_1.q.bias") == "encoder.mid.attn.q.bias"
    assert ldm_to_ours_key("post_quant_conv.weight") == "post_quant_conv.weight"


@pytest.mark.parametrize("decoder_only", [False, True])
def test_a_run_from_flux_ae_exports_flux_factors(image_dir, tmp_path, capsys, decoder_only):
    """Also with --train_decoder_only: a single file's family factors are the init's, which that mode keeps."""
    path, *_ = write_file("flux_ae_safetensors", tmp_path)
    out = tmp_path / "run"
    args = ["--config", str(TINY_CONFIG), "--data_path", str(image_dir), "--output_dir", str(out), "--init_from",
            str(path), "--channels", *map(str, CHANNELS), "--z_channels", "16", "--layers_per_block", "1",
            "--set", "norm_num_groups=32", "--set", "use_quant_conv=false", "--max_steps", "1",
            "--set", "disc_weight=0", "--set", "latent_stats_images=2"] + ["--train_decoder_only"] * decoder_only
    assert tv.main(args) == 0
    printed = capsys.readouterr().out
    assert f"init_from {path}: the FLUX.1 autoencoder (" in printed and "f8c16 (the SD3/FLUX layout)" in printed
    exported = json.loads((out / "diffusers" / "config.json").read_text())
    assert (exported["scaling_factor"], exported["shift_factor"]) == (0.3611, 0.1159)
    assert exported["use_quant_conv"] is False and exported["latent_channels"] == 16


def _bad_files(tmp_path) -> dict:
    """name -> (file, what its one line must say)."""
    sd_file, *_ = write_file("sd_safetensors", tmp_path)
    files = {}
    unet = tmp_path / "unet_only.safetensors"
    save_safetensors({"model.diffusion_model.input_blocks.0.0.weight": torch.zeros(8, 4, 3, 3)}, unet)
    files["unet"] = (unet, "looks like a diffusion model (UNet/transformer) without its VAE")
    text = tmp_path / "clip_l.safetensors"
    save_safetensors({"text_model.embeddings.token_embedding.weight": torch.zeros(10, 4)}, text)
    files["text encoder"] = (text, "looks like a text encoder")
    random_dict = tmp_path / "random.ckpt"
    torch.save({"weights": torch.zeros(3), "step": 5}, random_dict)
    files["random dict"] = (random_dict, "no VAE in this file (1 tensor, none named")
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(sd_file.read_bytes()[: sd_file.stat().st_size // 2])
    files["truncated safetensors"] = (cut, "download it again")
    ckpt, *_ = write_file("sd_ckpt", tmp_path)
    cut_ckpt = tmp_path / "cut.ckpt"
    cut_ckpt.write_bytes(ckpt.read_bytes()[:-1000])
    files["truncated ckpt"] = (cut_ckpt, "give a complete file (download or copy it again)")
    evil = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "hook": print}, evil)
    files["pickled code"] = (evil, "refused to load")
    files["missing"] = (tmp_path / "sd_xl_base_1.0.safetensors", "no such file or folder; give a Stable Diffusion")
    files["other layout"] = (sd_file, "block_out_channels 32 64 64 64 (this run's channels: 16 32)")
    return files


def test_wrong_or_damaged_files_are_one_line_and_exit_2_before_anything_is_written(image_dir, tmp_path, capsys):
    for name, (path, says) in _bad_files(tmp_path).items():
        out = tmp_path / f"run_{name.replace(' ', '_')}"
        rc = tv.main(["--config", str(TINY_CONFIG), "--data_path", str(image_dir), "--output_dir", str(out),
                      "--init_from", str(path), "--max_steps", "1"])
        err = capsys.readouterr().err.strip()
        assert rc == 2, name
        assert len(err.splitlines()) == 1 and err.startswith("error: ") and str(path) in err, (name, err)
        assert says in err, (name, err)
        assert not out.exists() or not any(out.iterdir()), (name, list(out.iterdir()))


def _pickled_class(monkeypatch, qualified: str) -> type:
    """A class that pickles under `qualified` (module.Name) without that package installed."""
    module, name = qualified.rsplit(".", 1)
    parts = module.split(".")
    for i in range(1, len(parts) + 1):
        monkeypatch.setitem(sys.modules, ".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    cls = type(name, (), {"__module__": module})
    setattr(sys.modules[module], name, cls)
    return cls


def test_an_sd_lightning_ckpt_loads_and_other_pickled_objects_stay_refused(tmp_path, monkeypatch):
    """SD 1.x .ckpt files pickle Lightning's ModelCheckpoint class (their callback state's key) and numpy
    scalars: allowed by exactly those names. A pickle with any other object is refused."""
    callback = _pickled_class(monkeypatch, "pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint")
    payload = _pickled_class(monkeypatch, "somewhere.Payload")
    vae = {f"first_stage_model.{k}": v for k, v in ldm_vae(4, True).items()}
    good, bad = tmp_path / "sd-v1-4.ckpt", tmp_path / "bad.ckpt"
    torch.save({"state_dict": vae, "global_step": np.int64(470000),
                "callbacks": {callback: {"best_model_score": np.float64(0.5)}}}, good)
    torch.save({"state_dict": vae, "callbacks": {callback: {}}, "x": payload()}, bad)
    monkeypatch.undo()  # the classes are gone again, as on a machine without Lightning
    t = tv.VAEStep(run_cfg(4, True), torch.device("cpu"))
    line = init_weights(t.models, t.cfg, good, tmp_path / "run")[0]
    assert "the Stable Diffusion 1.x/2.x VAE (180 tensors under 'first_stage_model.')" in line
    assert torch.equal(t.vae.decoder.mid.attn.proj.weight, vae["first_stage_model.decoder.mid.attn_1.proj_out.weight"][:, :, 0, 0])
    with pytest.raises(CheckpointError, match="bad.ckpt: refused to load: the file contains pickled code"):
        init_weights(t.models, t.cfg, bad, tmp_path / "run")



def test_a_rank_above_0_starts_decoder_only_from_a_pickled_ldm_vae(image_dir, tmp_path, monkeypatch):
    """Rank 1 of 2 (simulated: the main rank's share is its init_from.json, written while rank 1 waits at
    the barrier). Rank 1 must read the file as the main rank does, and never as one of our checkpoints:
    the check once looked for the main rank's record instead, so a rank > 0 that got there first re-read
    a `.pt` VAE as ours and stopped alone (exit 2) while the others waited."""
    from common import distributed
    from vae.pretrained import record_factors

    z, quant, _, (scale, shift) = LAYOUTS["ldm_vae_safetensors"]
    path = tmp_path / "community-vae.pt"  # many shared SD VAEs: an ldm state_dict pickled as .pt
    torch.save({"state_dict": ldm_vae(z, quant)}, path)
    out = tmp_path / "run"
    monkeypatch.setattr(distributed, "setup_distributed",
                        lambda *a, **k: distributed.DistInfo(1, 2, 1, torch.device("cpu"), False))
    monkeypatch.setattr(distributed, "barrier", lambda *a, **k: record_factors(
        path, {"scaling_factor": scale, "shift_factor": shift}, out, main=True))
    argv = ["--config", str(TINY_CONFIG), "--data_path", str(image_dir), "--output_dir", str(out),
            "--init_from", str(path), "--train_decoder_only", "--max_steps", "1", "--set", "export_diffusers=false",
            "--set", f"z_channels={z}", "--set", f"use_quant_conv={str(quant).lower()}",
            "--set", f"channels={CHANNELS}".replace(" ", ""), "--set", f"layers_per_block={BLOCKS}",
            "--set", "norm_num_groups=32"]
    assert tv.main(argv) == 0
