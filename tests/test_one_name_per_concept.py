"""The "One name per concept" table (docs/conventions.md): every trainer's config field is named by the
canonical key, and the names the guides, the seeds and older runs used are aliases, translated once, at
load (YAML, `--set`, a trainer's flags, the config stored in an older checkpoint)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import yaml

from common.config import config_to_dict, load_config, save_config
from tts.clone.config import CloneConfig
from tts.vits.config import TrainConfig
from vae.config import VAEConfig
from vocoder.config import VocoderConfig

# schema -> {canonical key (= the field the code reads): [the other spellings it accepts]}
CADENCE = ("log_every", "validate_every", "save_every", "max_minutes", "stop_at_step")  # common.loop.CadenceKeys
TABLE = {
    VocoderConfig: {"num_workers": ["ds_workers"],
                    "save_n_checkpoints": ["num_ckpt_keep"],
                    "clip_grad_norm": ["grad_clip", "gradient_clip_val"],
                    "log_every": ["log_interval"], "validate_every": ["val_check_interval"],
                    "save_every": [], "max_minutes": [], "stop_at_step": []},
    TrainConfig: {"num_workers": ["num_loader_workers", "ds_workers"],
                  "save_n_checkpoints": [],
                  "clip_grad_norm": ["grad_clip", "grad_clip_norm", "gradient_clip_val"],
                  "log_every": ["print_step", "log_interval"], "validate_every": ["eval_interval", "val_check_interval"],
                  "save_every": ["save_step", "checkpoint_interval"], "max_minutes": [], "stop_at_step": []},
    CloneConfig: {"train.num_workers": [],
                  "train.save_n_checkpoints": [],
                  "optim.clip_grad_norm": [],
                  "train.log_every": ["train.log_interval"], "train.validate_every": ["train.val_check_interval"],
                  "train.save_every": ["train.save_interval"], "train.max_minutes": [], "train.stop_at_step": []},
    VAEConfig: {"num_workers": [],
                "save_n_checkpoints": ["keep_checkpoints"],
                "clip_grad_norm": ["gradient_clip"],
                "log_every": ["log_freq"], "validate_every": ["val_freq", "val_check_interval"],
                "save_every": ["save_every_steps"], "max_minutes": ["time_limit_minutes"], "stop_at_step": []},
}
# schema -> {the field name an older run stored in its checkpoint / config.yaml: today's field}
RENAMED = {
    VocoderConfig: {"ds_workers": "num_workers", "num_ckpt_keep": "save_n_checkpoints",
                    "log_interval": "log_every", "val_check_interval": "validate_every"},
    TrainConfig: {"num_loader_workers": "num_workers", "eval_interval": "validate_every",
                  "grad_clip": "clip_grad_norm", "print_step": "log_every", "save_step": "save_every"},
    VAEConfig: {"keep_checkpoints": "save_n_checkpoints", "val_freq": "validate_every",
                "gradient_clip": "clip_grad_norm", "log_freq": "log_every", "save_every_steps": "save_every",
                "time_limit_minutes": "max_minutes"},
}


@pytest.mark.parametrize("schema", list(TABLE), ids=lambda s: s.__module__)
def test_every_trainer_takes_the_five_cadence_keys(schema):
    prefix = "train." if schema is CloneConfig else ""
    assert {f"{prefix}{k}" for k in CADENCE} <= set(TABLE[schema])


IDS = lambda s: s.__module__  # noqa: E731


def _get(cfg, dotted: str):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


@pytest.mark.parametrize("schema", list(TABLE), ids=IDS)
def test_the_field_is_named_by_the_canonical_key(schema):
    cfg = schema()
    for canonical, older in TABLE[schema].items():
        *parents, leaf = canonical.split(".")
        node = _get(cfg, ".".join(parents)) if parents else cfg
        names = {f.name for f in dataclasses.fields(node)}
        assert leaf in names, f"{schema.__name__}: no field '{canonical}'"
        assert not names & set(older), f"{schema.__name__}: an alias of '{canonical}' is still a field"


@pytest.mark.parametrize("schema", list(TABLE), ids=IDS)
def test_canonical_and_old_names_reach_the_same_field(schema):
    for value, (canonical, older) in enumerate(TABLE[schema].items(), start=3):
        assert _get(load_config(None, schema, [f"{canonical}={value}"]), canonical) == value
        for old in older:
            assert _get(load_config(None, schema, [f"{old}={value}"]), canonical) == value


@pytest.mark.parametrize("schema", list(RENAMED), ids=IDS)
def test_a_yaml_in_the_old_spelling_loads_to_the_same_values(schema, tmp_path):
    """Each renamed key, spelled the old way in a config file, gives what the canonical spelling gives;
    the resolved config written into the run folder names it canonically."""
    for value, (old, canonical) in enumerate(RENAMED[schema].items(), start=2):
        old_file, new_file = tmp_path / f"old_{old}.yaml", tmp_path / f"new_{old}.yaml"
        old_file.write_text(f"{old}: {value}\n")
        new_file.write_text(f"{canonical}: {value}\n")
        via_old, via_new = load_config(old_file, schema), load_config(new_file, schema)
        assert getattr(via_old, canonical) == value
        assert config_to_dict(via_old) == config_to_dict(via_new)
        saved = yaml.safe_load(save_config(via_old, tmp_path / f"run_{old}").read_text())
        assert saved[canonical] == value and old not in saved


def _old_style(schema, values: dict) -> dict:
    """The config dict an older run stored (its checkpoint's "config", its config.yaml): today's
    resolved config with the renamed fields under the names they had then, set to `values`."""
    stored = config_to_dict(load_config(None, schema))
    for old, canonical in RENAMED[schema].items():
        del stored[canonical]
        stored[old] = values[old]
    return stored


OLD_VALUES = {
    VocoderConfig: {"ds_workers": 3, "num_ckpt_keep": 7, "log_interval": 11, "val_check_interval": 300},
    TrainConfig: {"num_loader_workers": 3, "eval_interval": 250, "grad_clip": 0.5, "print_step": 11, "save_step": 300},
    VAEConfig: {"keep_checkpoints": 7, "val_freq": 250, "gradient_clip": 0.5, "log_freq": 11, "save_every_steps": 40,
                "time_limit_minutes": 2.5},
}


@pytest.mark.parametrize("schema", list(RENAMED), ids=IDS)
def test_a_stored_config_of_an_older_run_still_loads(schema, tmp_path):
    """A checkpoint's stored config is read back through `load_config` (e.g. `tts/vits/synthesize.py`,
    `--init_from`), an older run folder's config.yaml as a config file: the aliases translate both."""
    values = OLD_VALUES[schema]
    stored = _old_style(schema, values)
    from_dict = load_config(None, schema, extra=stored)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(stored, sort_keys=False))
    from_file = load_config(tmp_path / "config.yaml", schema)
    for cfg in (from_dict, from_file):
        for old, canonical in RENAMED[schema].items():
            assert getattr(cfg, canonical) == values[old]
    assert config_to_dict(from_dict) == config_to_dict(from_file)
    assert not set(RENAMED[schema]) & set(config_to_dict(from_dict))  # written back canonically


def test_an_older_vits_checkpoint_loads_for_synthesis():
    """tts/vits/synthesize.py's `load_generator` (also the path of `--init_from` our own VITS file) on a
    checkpoint whose stored config uses the field names of before the rename."""
    from tts.text.phonemes import Frontend
    from tts.vits.model import VITS
    from tts.vits.synthesize import load_generator

    tiny = load_config(None, TrainConfig, ["model=tiny"])
    torch.manual_seed(0)
    vits = VITS(len(Frontend.of(tiny).symbols), tiny.audio.n_fft // 2 + 1, 1, tiny.args(), tiny.audio.hop_length)
    stored = {**_old_style(TrainConfig, OLD_VALUES[TrainConfig]), "model": "tiny"}
    ckpt = {"models": {"generator": vits.state_dict()}, "config": stored, "extra": {"speakers": {"anna": 0}}}
    model, cfg, speakers = load_generator("old.pt", ckpt=ckpt, remove_wn=False)
    assert (cfg.num_workers, cfg.validate_every, cfg.clip_grad_norm, cfg.log_every) == (3, 250, 0.5, 11)
    assert speakers == {"anna": 0} and isinstance(model, VITS)
