"""The README's "One name per concept" table: every trainer reads the canonical key into its own
field, and the names it read before still work."""

from __future__ import annotations

import pytest

from common.config import load_config
from tts.clone.config import CloneConfig
from tts.vits.config import TrainConfig
from vae.config import VAEConfig
from vocoder.config import VocoderConfig

# schema -> (section prefix of the canonical key, {canonical: (field read, [older names])})
TABLE = {
    VocoderConfig: ("", {"num_workers": ("ds_workers", ["ds_workers"]),
                         "save_n_checkpoints": ("num_ckpt_keep", ["num_ckpt_keep"]),
                         "val_check_interval": ("val_check_interval", []),
                         "clip_grad_norm": ("clip_grad_norm", ["grad_clip", "gradient_clip_val"])}),
    TrainConfig: ("", {"num_workers": ("num_loader_workers", ["num_loader_workers", "ds_workers"]),
                       "save_n_checkpoints": ("save_n_checkpoints", []),
                       "val_check_interval": ("eval_interval", ["eval_interval"]),
                       "clip_grad_norm": ("grad_clip", ["grad_clip", "grad_clip_norm", "gradient_clip_val"])}),
    CloneConfig: ("", {"train.num_workers": ("train.num_workers", []),
                       "train.save_n_checkpoints": ("train.save_n_checkpoints", []),
                       "train.val_check_interval": ("train.val_check_interval", []),
                       "optim.clip_grad_norm": ("optim.clip_grad_norm", [])}),
    VAEConfig: ("", {"num_workers": ("num_workers", []),
                     "save_n_checkpoints": ("keep_checkpoints", ["keep_checkpoints"]),
                     "val_check_interval": ("val_freq", ["val_freq"]),
                     "clip_grad_norm": ("gradient_clip", ["gradient_clip"])}),
}


def _get(cfg, dotted: str):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


@pytest.mark.parametrize("schema", list(TABLE), ids=lambda s: s.__module__)
def test_canonical_and_old_names_reach_the_same_field(schema):
    _, keys = TABLE[schema]
    for value, (canonical, (field, older)) in enumerate(keys.items(), start=3):
        assert _get(load_config(None, schema, [f"{canonical}={value}"]), field) == value
        for old in older:
            assert _get(load_config(None, schema, [f"{old}={value}"]), field) == value
