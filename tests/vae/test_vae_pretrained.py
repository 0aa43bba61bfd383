"""--init_from a diffusers AutoencoderKL folder (our exporter's, diffusers' own save_pretrained when
installed), read safely (safetensors through the `safetensors` package, .bin weights-only), layout checks that name
the keys, and the latent factors kept from the folder."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import TINY_CONFIG, tiny_cfg

import vae.train_vae as tv
from common.checkpoint import CheckpointError, load_checkpoint
from common.safetensors_io import SafetensorsError, load_safetensors, save_safetensors
from vae.diffusers_io import diffusers_config, load_diffusers, save_diffusers, to_diffusers
from vae.model import build_vae
from vae.pretrained import init_from_diffusers

TINY_ARCH = {"channels": [16, 32], "z_channels": 4, "layers_per_block": 1, "norm_num_groups": 8}


def model(seed: int = 3, **arch):
    torch.manual_seed(seed)
    return build_vae({**TINY_ARCH, **arch}).eval()


def old_style_folder(m, folder, **factors):
    """A folder as older diffusers / hub SD VAEs ship it: .safetensors with the pre-0.15 attention names."""
    folder.mkdir()
    sd = to_diffusers(m.state_dict(), len(m.channels))
    renames = {"to_q": "query", "to_k": "key", "to_v": "value", "to_out.0": "proj_attn"}
    old = {}
    for k, v in sd.items():
        for new, name in renames.items():
            k = k.replace(f"attentions.0.{new}.", f"attentions.0.{name}.")
        old[k] = v
    save_safetensors(old, folder / "diffusion_pytorch_model.safetensors")
    (folder / "config.json").write_text(json.dumps(diffusers_config(m, 32, **factors)))
    return folder


def test_safetensors_reader_round_trip_and_refuses_a_truncated_file(tmp_path):
    tensors = {"a": torch.randn(3, 4), "b": torch.arange(5, dtype=torch.int64), "c": torch.randn(2).half(),
               "d": torch.randn(2, 2).bfloat16(), "e": torch.zeros(0)}
    path = save_safetensors(tensors, tmp_path / "x.safetensors")
    back = load_safetensors(path)
    assert back.keys() == tensors.keys() and all(torch.equal(back[k], tensors[k]) for k in tensors)
    try:
        from safetensors.torch import load_file
    except ImportError:
        pass
    else:  # the package (when installed) reads our files and we read its
        assert all(torch.equal(load_file(str(path))[k], tensors[k]) for k in tensors)
    (tmp_path / "cut.safetensors").write_bytes(path.read_bytes()[:-10])
    with pytest.raises(SafetensorsError, match="do not match"):
        load_safetensors(tmp_path / "cut.safetensors")


def test_old_style_safetensors_folder_loads_exactly(tmp_path):
    m = model()
    loaded, cfg = load_diffusers(old_style_folder(m, tmp_path / "sd", scaling_factor=0.18215))
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), loaded.state_dict().values()))
    assert cfg["scaling_factor"] == 0.18215


def test_init_from_our_exported_folder_fine_tunes_from_it(image_dir, tmp_path, capsys):
    m = model()
    folder = save_diffusers(m, tmp_path / "pretrained", sample_size=32, scaling_factor=0.5)
    out = tmp_path / "run"
    assert tv.main(["--config", str(TINY_CONFIG), "--data_path", str(image_dir), "--output_dir", str(out),
                    "--init_from", str(folder), "--max_steps", "1", "--learning_rate", "0"]) == 0
    printed = capsys.readouterr().out
    assert f"init_from {folder}: all {len(m.state_dict())} tensors of a diffusers AutoencoderKL" in printed
    ckpt = load_checkpoint(out / "checkpoint_last.pt")
    for k, v in m.state_dict().items():  # learning rate 0: the run's weights ARE the folder's
        assert torch.equal(ckpt["models"]["vae"][k], v), k
        assert torch.equal(ckpt["ema"]["vae"]["shadow"][k], v.float()), k  # EMA restarted from them
    measured = json.loads((out / "latent_stats.json").read_text())["scaling_factor"]
    exported = json.loads((out / "diffusers" / "config.json").read_text())
    assert exported["scaling_factor"] == 0.5 and abs(measured - 0.5) > 0.025  # the folder's factor is kept
    assert "latent factors differ from the init folder's: scaling_factor measured" in printed
    assert "--set export_factors=measured" in printed


def test_layout_mismatch_names_the_keys_and_the_flags(tmp_path):
    sd_layout = save_diffusers(model(), tmp_path / "sd")  # f4c4 with quant convs
    t = tv.VAEStep(tiny_cfg(z_channels=8, channels=[16, 32, 32]), torch.device("cpu"))
    with pytest.raises(CheckpointError) as err:
        init_from_diffusers(t.vae, t.cfg, sd_layout, tmp_path / "out")
    msg = str(err.value)
    assert "block_out_channels 16 32 (this run's channels: 16 32 32)" in msg
    assert "latent_channels 4 (this run's z_channels: 8)" in msg and "add: --channels 16 32 --z_channels 4" in msg
    flux_layout = save_diffusers(model(z_channels=16, use_quant_conv=False), tmp_path / "flux", shift_factor=0.1)
    t = tv.VAEStep(tiny_cfg(z_channels=16), torch.device("cpu"))
    with pytest.raises(CheckpointError, match=r"use_quant_conv false \(this run's use_quant_conv: true\).*"
                                              r"--set use_quant_conv=false"):
        init_from_diffusers(t.vae, t.cfg, flux_layout, tmp_path / "out")
    cfg = json.loads((tmp_path / "flux" / "config.json").read_text())
    (tmp_path / "flux" / "config.json").write_text(json.dumps({**cfg, "up_block_types": ["UpDecoderBlock2D",
                                                                                          "AttnUpDecoderBlock2D"]}))
    with pytest.raises(CheckpointError, match="up_block_types.*AttnUpDecoderBlock2D"):
        init_from_diffusers(t.vae, t.cfg, tmp_path / "flux", tmp_path / "out")


def test_unsafe_bin_is_refused(tmp_path):
    folder = save_diffusers(model(), tmp_path / "vae")
    weights = next(folder.glob("diffusion_pytorch_model.*"))
    weights.unlink()
    torch.save({"x": torch.zeros(1), "code": print}, folder / "diffusion_pytorch_model.bin")
    t = tv.VAEStep(tiny_cfg(), torch.device("cpu"))
    with pytest.raises(CheckpointError, match="refused to load"):
        init_from_diffusers(t.vae, t.cfg, folder, tmp_path / "out")


@pytest.mark.parametrize("layout", ["sd_f4c4", "flux_f4c16_bin"])
def test_init_from_a_folder_written_by_diffusers_save_pretrained(tmp_path, layout):
    diffusers = pytest.importorskip("diffusers", reason="diffusers is an optional test dependency "
                                                        "(not in requirements.txt); install it to run this test")
    z, quant = (4, True) if layout == "sd_f4c4" else (16, False)
    torch.manual_seed(0)
    theirs = diffusers.AutoencoderKL(block_out_channels=(16, 32), latent_channels=z, layers_per_block=1,
                                     norm_num_groups=8, down_block_types=("DownEncoderBlock2D",) * 2,
                                     up_block_types=("UpDecoderBlock2D",) * 2, use_quant_conv=quant,
                                     use_post_quant_conv=quant, scaling_factor=0.3,
                                     shift_factor=None if quant else 0.1).eval()
    theirs.save_pretrained(tmp_path / "vae", safe_serialization=quant)  # FLUX-like one as .bin
    t = tv.VAEStep(tiny_cfg(z_channels=z, use_quant_conv=quant), torch.device("cpu"))
    lines = init_from_diffusers(t.vae, t.cfg, tmp_path / "vae", tmp_path / "out")
    assert "scaling_factor 0.3" in lines[0]
    x = torch.rand(1, 3, 32, 32) * 2 - 1
    ours = t.vae.eval()
    with torch.no_grad():
        torch.testing.assert_close(ours.encode(x).mode(), theirs.encode(x).latent_dist.mode(), atol=1e-5, rtol=1e-4)
        zz = torch.randn(1, z, 16, 16)
        torch.testing.assert_close(ours.decode(zz), theirs.decode(zz).sample, atol=1e-5, rtol=1e-4)


def test_malformed_files_given_to_init_from_are_one_line_naming_the_file(tmp_path):
    """Well-formed containers with malformed content (round 3, item 10) raised KeyError, TypeError,
    RecursionError or RuntimeError through `--init_from`: now one CheckpointError naming the file."""
    from vae.pretrained import init_weights

    t = tv.VAEStep(tiny_cfg(**TINY_ARCH), torch.device("cpu"))
    models = {"vae": t.vae}
    cases = {}
    folder = save_diffusers(model(), tmp_path / "wrong_types")  # a diffusers folder whose config lies
    cfg = json.loads((folder / "config.json").read_text())
    cfg["block_out_channels"] = "sixteen"
    (folder / "config.json").write_text(json.dumps(cfg))
    cases["a config.json with a string for a list"] = folder
    deep = save_diffusers(model(), tmp_path / "deep")
    (deep / "config.json").write_text('{"_class_name": "AutoencoderKL", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    cases["a config.json nested past the recursion limit"] = deep
    odd = tmp_path / "odd.safetensors"  # a single file whose VAE tensors have the wrong rank
    sd = {f"first_stage_model.{k}": v.flatten() for k, v in to_diffusers(model().state_dict(), 2).items()}
    save_safetensors(sd, odd)
    cases["a single file whose tensors have the wrong shapes"] = odd
    for what, path in cases.items():
        with pytest.raises(CheckpointError) as caught:
            init_weights(models, t.cfg, path, tmp_path / "out")
        said = str(caught.value)
        assert str(path) in said and "\n" not in said.strip() and "Traceback" not in said, (what, said)
    # the project's own one-line errors pass through as they are: a full disk is not the file's fault
    from unittest import mock

    from common.atomic_write import DiskFullError
    from vae import pretrained

    good = save_diffusers(model(), tmp_path / "good")
    full = DiskFullError("disk full while writing out/init_from.json: 0 MiB free")
    with mock.patch.object(pretrained, "record_factors", side_effect=full), pytest.raises(DiskFullError):
        init_weights(models, t.cfg, good, tmp_path / "out")
