"""Checkpoints written before the one layout keep resuming: each file in tests/data/checkpoints_5caa793/ is a
step-3 checkpoint of a 6-step run written by that commit's own training command (tiny models, the critics
training), with its guards where that trainer kept them then (the vocoder's `counters.g_guard/d_guard`, VITS's
one `counters.guard`, the cloning model's `extra.guard` and its schedule as "scheduler", the VAE's
`extra.guard/d_guard` and `micro_in_epoch`). Each resumes through today's command line, with everything restored
as the file holds it, and trains on to step 6."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch

from common import loop
from common.checkpoint import load_checkpoint, read_guards, upgrade_layout

FIXTURES = Path(__file__).resolve().parent / "data" / "checkpoints_5caa793"
S = lambda sets: sum((["--set", s] for s in sets), [])  # noqa: E731


def resume_vocoder(tmp: Path, fixture: Path) -> int:
    from tests.vocoder.conftest import TINY_YAML, tiny_config, write_tones
    from vocoder.prepare_data import prepare
    from vocoder.train import main

    write_tones(tmp / "wavs", 5, 22050)
    prepare(tiny_config(), [tmp / "wavs"], tmp / "bin", num_workers=0, log=lambda *a: None)
    small = ["model_args.upsample_initial_channel=16", "model_args.discriminator_periods=[2,3]",
             "model_args.fast_mpd_init_channel=1", "model_args.fast_mpd_strides=[2,2]", "model_args.fast_mpd_kernel_size=3"]
    return main(["--config", str(TINY_YAML), "--data_dir", str(tmp / "bin"), "--run_dir", str(tmp / "run"),
                 "--device", "cpu", *S([*small, "max_updates=6", "val_check_interval=3", "num_ckpt_keep=2"]),
                 "--resume", str(fixture)])


def resume_vits(tmp: Path, fixture: Path) -> int:
    from tests.tts.test_vits_train import _args, _corpus
    from tts.vits.train import main

    data = _corpus(tmp / "corpus", ["anna"])
    small = [f"model_args.{k}" for k in ("hidden_channels=8", "inter_channels=8", "filter_channels=16", "n_layers=1",
                                         "n_layers_q=1", "n_flows=1", "flow_n_layers=1", "dp_filter_channels=8",
                                         "upsample_initial_channel=8", "resblock_kernel_sizes=[3]",
                                         "resblock_dilation_sizes=[[1,2]]", "mpd_periods=[2]", "disc_channel_scale=0.01")]
    return main(_args(data, tmp / "run", "save_step=3", *small, steps=6) + ["--resume", str(fixture)])


def resume_clone(tmp: Path, fixture: Path, monkeypatch) -> int:
    import tts.clone.config as clone_config
    from tests.tts.test_clone_train import clone_argv
    from tests.tts.test_vits_train import _corpus
    from tts.clone.train import main

    # the fixture's widths: smaller than the "tiny" model size (no config key goes below it)
    monkeypatch.setitem(clone_config.SIZES, "tiny", {"text": (8, 1, 2), "audio": (8, 1, 2), "decoder": (8, 1, 2)})
    monkeypatch.setitem(clone_config.POSTNET, "tiny", (8, 2))
    monkeypatch.setitem(clone_config.DURATION_HIDDEN, "tiny", 8)
    data = _corpus(tmp / "corpus", ["anna", "bobur"])
    return main(clone_argv(data, tmp / "run", "--set", "train.max_updates=6", "--set", "train.val_check_interval=100",
                           "--set", "train.save_interval=3", "--set", "val.at_start=false", "--resume", str(fixture)))


def resume_vae(tmp: Path, fixture: Path) -> int:
    from tests.vae.helpers import TINY_CONFIG, write_images
    from vae.train_vae import main

    write_images(tmp / "images", 10, size=48)
    small = ["channels=[8,8]", "norm_num_groups=4", "z_channels=2", "disc_channels=2", "disc_layers=2"]
    return main(["--config", str(TINY_CONFIG), "--data_path", str(tmp / "images"), "--output_dir", str(tmp / "run"),
                 "--num_epochs", "2", "--stop_at_step", "6", *S(small), "--resume_from", str(fixture)])


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.mark.parametrize("trainer", ["vocoder", "vits", "clone", "vae"])
def test_a_checkpoint_of_before_the_one_layout_resumes_whole(trainer, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fixture = tmp_path / "fixture.pt"
    shutil.copy(FIXTURES / f"{trainer}.pt", fixture)
    old = load_checkpoint(fixture)
    assert "guards" not in old  # written before the one layout
    seen = {}
    real_fit = loop.fit

    def at_start(t, *args, **kwargs):  # the trainer as resumed, before its first step
        seen["step"] = t.step
        seen["weights"] = all(torch.equal(v.cpu(), old["models"][name][k]) for name, m in t.models.items()
                              for k, v in m.state_dict().items())
        seen["optimizers"] = {name: o.state_dict()["state"][0]["step"].item() for name, o in t.optimizers.items()}
        seen["guards"] = {name: g.state_dict() for name, g in t.guards.items()}
        seen["divergence"] = t.divergence.state_dict()
        return real_fit(t, *args, **kwargs)

    monkeypatch.setattr(loop, "fit", at_start)
    run = {"vocoder": resume_vocoder, "vits": resume_vits, "vae": resume_vae}.get(trainer)
    rc = run(tmp_path, fixture) if run else resume_clone(tmp_path, fixture, monkeypatch)
    assert rc == 0
    assert seen["step"] == 3 and seen["weights"]
    want = {name: o["state"][0]["step"].item() for name, o in old["optimizers"].items()}
    assert seen["optimizers"] == want
    guards = read_guards(old, list(old["optimizers"]))
    assert seen["guards"] == {name: guards[name] for name in seen["guards"]}
    assert seen["divergence"]["recent"] == guards["divergence"]["recent"] and guards["divergence"]["recent"]["loss"]
    assert upgrade_layout(old, list(old["optimizers"]))["counters"]["batch_in_epoch"] >= 0


@pytest.mark.parametrize("kind", ["vits", "clone"])
@pytest.mark.parametrize("damage", ["not a mapping", "a section as a list"])
def test_a_damaged_saved_config_is_one_line_naming_the_file(kind, damage):
    """A checkpoint whose saved config is not a mapping, or holds a list where a section goes (a hand-edited
    file), is one CheckpointError naming the file, never an AttributeError or a blamed `--set` flag."""
    from common.checkpoint import CheckpointError
    from tts.clone.infer import load_clone_model
    from tts.vits.synthesize import load_generator

    path = FIXTURES / f"{kind}.pt"
    ckpt = load_checkpoint(path)
    section = "model_args" if kind == "vits" else "model"
    ckpt["config"] = [1, 2] if damage == "not a mapping" else {**ckpt["config"], section: [ckpt["config"][section]]}
    load = load_generator if kind == "vits" else load_clone_model
    with pytest.raises(CheckpointError, match=re.escape(str(path)) + ": its saved config ") as e:
        load(path, "cpu", ckpt=ckpt)
    assert "\n" not in str(e.value) and ("saved config does not load" in str(e.value)) == (damage != "not a mapping")
