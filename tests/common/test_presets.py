"""`--preset` on every trainer: what it sets in each trainer's own keys, that typed values win, the
`auto` fallback, and that each trainer script really accepts and applies it (and `make check` lists it)."""

from pathlib import Path

import pytest
import torch

from common import check
from common.config import load_config
from common.presets import PRESET_CHOICES, apply_preset, get_key, registered_presets
from tts.clone.config import CloneConfig
from tts.clone.presets import CARD_PRESETS as CLONE_PRESETS
from tts.vits.config import TrainConfig
from tts.vits.presets import CARD_PRESETS as VITS_PRESETS
from vae.config import VAEConfig
from vae.presets import CARD_PRESETS as VAE_PRESETS
from vocoder.config import VocoderConfig
from vocoder.presets import CARD_PRESETS as VOCODER_PRESETS

REPO = Path(__file__).resolve().parents[2]
CONFIGS = {  # a shipped recipe per trainer: the preset must change it (it sits above the YAML)
    "vocoder": (VocoderConfig, REPO / "vocoder/configs/base_hifi_gpu.yaml"),
    "tts": (TrainConfig, REPO / "tts/vits/configs/uzbek_vits.yaml"),
    "tts_clone": (CloneConfig, REPO / "tts/clone/configs/clone_base.yaml"),
    "vae": (VAEConfig, REPO / "vae/configs/base.yaml"),
}
# each trainer's own table (common/ holds none): the preset line names the trainer as its table does
PRESETS = {"vocoder": VOCODER_PRESETS, "tts": VITS_PRESETS, "tts_clone": CLONE_PRESETS, "vae": VAE_PRESETS}
EXPECTED_5090 = {
    "vocoder": {"batch_size": 32, "num_workers": 12, "crop_mel_frames": 80, "precision": "bf16-mixed"},
    "tts": {"batch_size": 96, "num_workers": 8, "model_args.segment_frames": 32, "precision": "bf16-mixed"},
    "tts_clone": {"train.batch_size": 48, "train.num_workers": 12, "data.ref_seconds": 3.0,
                  "train.precision": "bf16-mixed"},
    "vae": {"num_workers": 12, "precision": "bf16-mixed"},  # batch and crop: the profile's
}
TYPED = {  # one typed batch size and one typed precision per trainer, in a guide's spelling
    "vocoder": ["batch_size=3", "pl_trainer_precision=bf16-mixed"],
    "tts": ["batch_size=3", "amp_dtype=fp16"],
    "tts_clone": ["train.batch_size=3", "precision=32-true"],
    "vae": ["batch_size=3", "mixed_precision=false"],
}
PRECISION_KEY = {"vocoder": "precision", "tts": "precision", "tts_clone": "train.precision", "vae": "precision"}


@pytest.mark.parametrize("trainer", list(CONFIGS))
def test_preset_sets_the_trainers_own_keys_over_the_yaml(trainer, capsys):
    schema, path = CONFIGS[trainer]
    cfg = load_config(path, schema)
    applied = apply_preset(cfg, "rtx5090", PRESETS[trainer])
    assert applied == EXPECTED_5090[trainer]
    for key, value in EXPECTED_5090[trainer].items():
        assert get_key(cfg, key) == value
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith(f"[preset] rtx5090 for {trainer}: set ")
    assert apply_preset(cfg, None, PRESETS[trainer]) == {}  # no --preset: nothing


@pytest.mark.parametrize("trainer", list(CONFIGS))
def test_what_the_user_typed_wins_and_is_named(trainer, capsys):
    schema, path = CONFIGS[trainer]
    cfg = load_config(path, schema, TYPED[trainer])
    applied = apply_preset(cfg, "rtx4090", PRESETS[trainer])
    batch_key, precision_key = TYPED[trainer][0].split("=")[0], PRECISION_KEY[trainer]
    preset_keys = schema.PRESET_KEYS
    assert get_key(cfg, batch_key) == 3 and batch_key not in applied
    assert precision_key not in applied  # typed in any spelling: the one precision key is the user's
    # workers and crop (where the trainer takes one from the preset) still come from the preset
    assert set(applied) == {key for name, key in preset_keys.items() if name not in ("batch_size", "precision")}
    line = capsys.readouterr().out
    assert f"kept what you typed: {precision_key}=" in line or f"{batch_key}=3 (--set {batch_key}=3" in line
    assert precision_key in line
    if "batch_size" in preset_keys:  # the VAE's batch is its profile's, never the preset's
        assert f"kept what you typed: {batch_key}=3 (--set {batch_key}=3" in line


def test_auto_picks_by_gpu_memory_and_falls_back_to_cpu(capsys):
    cfg = load_config(None, VocoderConfig)
    apply_preset(cfg, "auto", VOCODER_PRESETS, vram_gb=32.0)
    assert cfg.batch_size == VOCODER_PRESETS.values["rtx5090"]["batch_size"]
    assert "auto -> 'rtx5090'" in capsys.readouterr().out
    if not torch.cuda.is_available():
        cfg = load_config(None, VocoderConfig)
        apply_preset(cfg, "auto", VOCODER_PRESETS)
        assert (cfg.batch_size, cfg.precision) == (2, "32-true")
        out = capsys.readouterr().out
        assert "no CUDA GPU found, so the 'cpu' preset" in out and "[preset] cpu for vocoder" in out


def _mains():
    from tts.clone.train import main as clone_main
    from tts.vits.train import main as vits_main
    from vae.train_vae import main as vae_main
    from vocoder.train import main as vocoder_main
    return {"vocoder": vocoder_main, "tts": vits_main, "tts_clone": clone_main, "vae": vae_main}


def test_every_trainer_script_takes_the_preset_and_applies_it(tmp_path, capsys):
    """Each trainer's real CLI: --preset is accepted, applied (its line printed) before the missing
    dataset stops it with exit 2; an unknown preset is refused by argparse."""
    missing = str(tmp_path / "no_data")
    argv = {
        "vocoder": ["--preset", "cpu", "--run_dir", str(tmp_path / "voc")],
        "tts": ["--config", str(REPO / "tts/vits/configs/demo.yaml"), "--preset", "cpu", "--data_dir", missing,
                "--run_dir", str(tmp_path / "vits")],
        "tts_clone": ["--preset", "cpu", "--train-data", missing, "--checkpoint-dir", str(tmp_path / "clone")],
        "vae": ["--config", str(REPO / "vae/configs/tiny.yaml"), "--preset", "cpu", "--data_path", missing,
                "--output_dir", str(tmp_path / "vae")],
    }
    mains = _mains()
    assert set(mains) == set(PRESETS) == {p.trainer for p in registered_presets()}
    assert all(PRESETS[p.trainer] is p for p in registered_presets())  # `make check` lists these tables
    for trainer, main in mains.items():
        assert main(argv[trainer]) == 2, trainer
        first = "batch_size" if "batch_size" in CONFIGS[trainer][0].PRESET_KEYS else "num_workers"
        assert f"[preset] cpu for {trainer}: set {first}" in capsys.readouterr().out.replace("train.batch", "batch")
        with pytest.raises(SystemExit) as e:
            main(["--preset", "a100"])
        assert e.value.code == 2 and "invalid choice: 'a100'" in capsys.readouterr().err


def test_make_check_lists_the_preset_of_every_trainer(capsys):
    assert check.main() == 0
    out = capsys.readouterr().out
    assert f"--preset {{{','.join(PRESET_CHOICES)}}}" in out
    for presets in registered_presets():
        assert f"{presets.script} --preset " in out


def test_a_typed_mapping_keeps_the_preset_off_the_keys_inside_it(capsys):
    cfg = load_config(REPO / "tts/vits/configs/uzbek_vits.yaml", TrainConfig, ["model_args={segment_frames: 24}"])
    applied = apply_preset(cfg, "rtx4090", VITS_PRESETS)
    assert cfg.model_args["segment_frames"] == 24 and "model_args.segment_frames" not in applied
    assert "model_args.segment_frames=24 (--set model_args={segment_frames: 24}" in capsys.readouterr().out


def test_apply_settings_is_the_one_rule_and_records_what_it_wrote():
    from common.config import explicit_keys
    from common.presets import apply_settings

    cfg = load_config(REPO / "tts/clone/configs/clone_base.yaml", CloneConfig, ["train.batch_size=3"])
    done = apply_settings(cfg, {"batch": {"train.batch_size": 48}, "workers": {"train.num_workers": 16}}, "--recipe")
    assert cfg.train.batch_size == 3 and done.kept == {"train.batch_size": (3, 48, "--set train.batch_size=3")}
    assert cfg.train.num_workers == 16 and done.written == {"train.num_workers": (4, 16)}
    assert explicit_keys(cfg)["train.num_workers"] == "--recipe"  # a later preset leaves it alone
    assert "train.num_workers" not in apply_preset(cfg, "rtx5090", CLONE_PRESETS, log=lambda _line: None)

