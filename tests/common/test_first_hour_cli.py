"""The first hour of a user from Piper, coqui or SingingVocoders: checkpoints found the way they name them,
help that is true, both flag spellings (common.cli, common.checkpoint.resolve_checkpoint_arg, common.config)."""

from __future__ import annotations

import re

import pytest

from common.best_by import METRICS
from common.checkpoint import CheckpointError, load_checkpoint, resolve_checkpoint_arg
from common.cli import FlagParser
from common.config import describe_config, load_config


def _parsers():
    from tts.clone.config import CloneConfig
    from tts.clone.options import build_parser as clone_parser
    from tts.vits.build import build_parser as vits_parser
    from tts.vits.config import TrainConfig
    from vae.config import VAEConfig
    from vae.flags import build_parser as vae_parser
    from vocoder.build import build_parser as vocoder_parser
    from vocoder.config import VocoderConfig

    return {"vocoder": (vocoder_parser(), VocoderConfig, ("mrstft", "pesq")),
            "vits": (vits_parser(), TrainConfig, ("score", "speaker_sim")),
            "clone": (clone_parser(), CloneConfig, ("mel_l1", "loss")),
            "vae": (vae_parser(), VAEConfig, ("psnr", "rfid"))}


PARSERS = _parsers()


def _help(parser, flag: str) -> str:
    action = next(a for a in parser._actions if flag in a.option_strings)
    return " ".join(action.help.split())


@pytest.mark.parametrize("name", list(PARSERS))
def test_best_by_help_lists_only_the_trainers_own_metrics(name):
    parser, _, own = PARSERS[name]
    text = _help(parser, "--best_by")
    listed = set(re.search(r"one of ([a-z0-9_, ]+)", text).group(1).replace(" ", "").split(","))
    assert set(own) <= listed and listed <= set(METRICS), text
    if name == "vits":
        assert not listed & {"psnr", "mrstft", "pesq"}, text  # VITS refuses these


@pytest.mark.parametrize("name", list(PARSERS))
def test_each_set_example_in_help_loads_on_its_trainer(name):
    parser, schema, _ = PARSERS[name]
    example = re.search(r"--set (\S+)", _help(parser, "--set")).group(1)
    key, value = example.split("=")
    cfg = load_config(None, schema, [example])
    node = cfg
    for part in key.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    assert str(node) == value


@pytest.mark.parametrize("name", list(PARSERS))
def test_print_config_prints_every_key_with_range_and_aliases_and_exits_0(name, capsys):
    import tts.clone.train
    import tts.vits.train
    import vae.train_vae
    import vocoder.train

    main = {"vocoder": vocoder.train.main, "vits": tts.vits.train.main, "clone": tts.clone.train.main,
            "vae": vae.train_vae.main}[name]
    with pytest.raises(SystemExit) as e:
        main(["--print_config"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    parser, schema, _ = PARSERS[name]
    assert out.strip() == describe_config(load_config(parser.get_default("config"), schema)).strip()  # no preset
    lines = out.splitlines()
    assert len(lines) > 40 and all(" = " in line and line.endswith(")") for line in lines)
    if name == "vocoder":
        assert any(line.startswith("num_workers = ") and "ds_workers" in line and ">= 0" in line for line in lines)


def test_both_flag_spellings_and_the_checkpoint_aliases():
    p = FlagParser()
    p.add_argument("--length-scale", type=float)
    p.add_argument("--noise_scale", type=float)
    p.add_argument("--ckpt", "--checkpoint", dest="ckpt")
    args = p.parse_args(["--length_scale", "1.2", "--noise-scale=0.5", "--checkpoint", "x.pt"])
    assert (args.length_scale, args.noise_scale, args.ckpt) == (1.2, 0.5, "x.pt")
    with pytest.raises(SystemExit):
        p.parse_args(["--lengthscale", "1"])


def test_vocoder_export_takes_checkpoint_for_ckpt(tmp_path, capsys):
    from vocoder.export import main

    assert main(["--checkpoint", str(tmp_path / "nothing.pt"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "required" not in err and "checkpoint not found" in err


def _run(tmp_path, layout: str = "new"):
    run = tmp_path / "run"
    ckpts = run / "checkpoints" if layout == "new" else run
    ckpts.mkdir(parents=True)
    (run / "config.yaml").write_text("save_best_after: 5000\n")
    for step in (100, 200):
        (ckpts / f"model_{step:08d}.pt").write_bytes(b"x")
    return run, ckpts


def test_a_run_folder_picks_best_else_the_newest_saying_which(tmp_path):
    run, ckpts = _run(tmp_path)
    said = []
    assert resolve_checkpoint_arg(run, log=said.append) == ckpts / "model_00000200.pt"
    assert "newest" in said[0] and "save_best_after=5000" in said[0] and "step 200" in said[0]
    (ckpts / "best.pt").write_bytes(b"x")
    assert resolve_checkpoint_arg(run, log=said.append) == ckpts / "best.pt" and "best.pt" in said[1]


def test_a_missing_best_pt_names_the_newest_and_why(tmp_path):
    run, ckpts = _run(tmp_path)
    path = resolve_checkpoint_arg(ckpts / "best.pt", log=lambda s: None)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path)
    text = str(e.value)
    assert "model_00000200.pt" in text and "save_best_after=5000" in text and "step 200" in text


def test_an_old_runs_best_pt_beside_its_checkpoints_is_still_found(tmp_path):
    run, ckpts = _run(tmp_path, layout="old")  # a cloning / VAE run from before checkpoints/best.pt
    (run / "best.pt").write_bytes(b"x")
    assert resolve_checkpoint_arg(run / "checkpoints" / "best.pt", log=lambda s: None) == run / "best.pt"
    assert resolve_checkpoint_arg(run, log=lambda s: None) == run / "best.pt"


def test_a_folder_without_checkpoints_is_left_to_its_loader(tmp_path):
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "model.ckpt").write_bytes(b"x")  # an exported vocoder
    assert resolve_checkpoint_arg(tmp_path / "export") == tmp_path / "export"


def test_an_install_hint_names_the_file_that_holds_the_package():
    from common.errors import missing_dependency_message

    def hint(name: str) -> str:
        return missing_dependency_message(ModuleNotFoundError(f"No module named '{name}'", name=name))

    fcpe = hint("torchfcpe")  # fcpe's package is pinned in requirements-test.txt only
    assert "pip install torchfcpe==" in fcpe and "requirements-test.txt" in fcpe
    assert "-r requirements.txt" not in fcpe
    assert "praat-parselmouth==" in hint("parselmouth") and "-r requirements.txt" in hint("parselmouth")


def test_an_old_runs_best_json_beside_its_checkpoints_keeps_its_best_on_resume(tmp_path):
    """A cloning / VAE run from before <run>/checkpoints/best.pt: its best so far still competes."""
    import json

    from common.checkpoint import CheckpointManager

    (tmp_path / "best.json").write_text(json.dumps({"metric": 0.5, "step": 3, "mode": "min"}))
    manager = CheckpointManager(tmp_path, best_dir=tmp_path / "checkpoints")
    assert manager.best_metric == 0.5
    manager.save({"x": 1}, 4, metric=0.7)  # worse: no new best
    assert not (tmp_path / "checkpoints" / "best.pt").exists()
    manager.save({"x": 2}, 5, metric=0.25)
    assert (tmp_path / "checkpoints" / "best.pt").is_file()
    assert json.loads((tmp_path / "checkpoints" / "best.json").read_text())["step"] == 5


def test_infer_clone_takes_the_guides_spellings(tmp_path, capsys):
    from tts.clone.infer import main

    rc = main(["--ckpt", str(tmp_path / "run" / "checkpoints" / "best.pt"), "--reference", str(tmp_path / "v.wav"),
               "--text", "Salom", "--length_scale", "1.1", "--output", str(tmp_path / "out.wav")])
    err = capsys.readouterr().err
    assert rc == 2 and "checkpoint not found" in err and "unrecognized" not in err
