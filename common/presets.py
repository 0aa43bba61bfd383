"""`--preset {rtx4090,rtx5090,auto,cpu}`: one flag, the same meaning in every trainer.

A preset fills in the settings that depend on the card — batch size, DataLoader workers, precision
and the training crop — so a user with a 4090 or 5090 need not tune them by hand. The values per
card live in `common.hardware.PRESETS` (with the reasons); this module maps them onto each
trainer's own config keys (data, below) and applies them.

Precedence, lowest first: schema defaults < the YAML config < the preset < what the user typed
(the trainer's flags and `--set`). The preset sits above the YAML on purpose: every shipped recipe
sets these keys, so a preset below the YAML would change nothing. A setting the user typed is kept
whole: with `--precision` or `--mixed_precision` on the command line, the preset touches no
precision key. One line says what the preset set (and what it replaced) and what it left alone.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from common.config import explicit_keys
from common.hardware import PRESETS, preset_name

PRESET_CHOICES = ("rtx4090", "rtx5090", "auto", "cpu")

# The trainers that take `--preset` (`make check` lists them; a test runs each with it).
TRAINER_SCRIPTS = {"vocoder": "vocoder/train.py", "tts": "tts/train.py", "tts_clone": "tts/train_main.py",
                   "vae": "vae/train_vae.py"}
# Each trainer's config key for the preset's batch_size / num_workers / crop.
TRAINER_KEYS: dict[str, dict[str, str]] = {
    "vocoder": {"batch_size": "batch_size", "num_workers": "ds_workers", "crop": "crop_mel_frames"},
    "tts": {"batch_size": "batch_size", "num_workers": "num_loader_workers", "crop": "model_args.segment_frames"},
    "tts_clone": {"batch_size": "train.batch_size", "num_workers": "train.num_workers", "crop": "data.ref_seconds"},
    # The VAE guide fixes batch and crop per resolution profile (24/16/8/4 at 768/1024/1536/2048) and
    # `fit_batch_size` lowers the batch at start when memory says so; a card preset must not undo that.
    "vae": {"num_workers": "num_workers"},
}
# Each trainer's spelling of a precision (`32-true | 16-mixed | bf16-mixed`): the keys it sets.
PRECISION_KEYS: dict[str, dict[str, dict[str, Any]]] = {
    "vocoder": {p: {"pl_trainer_precision": p} for p in ("32-true", "16-mixed", "bf16-mixed")},
    "tts_clone": {p: {"train.precision": p} for p in ("32-true", "16-mixed", "bf16-mixed")},
    "tts": {"32-true": {"mixed_precision": False},
            "16-mixed": {"mixed_precision": True, "amp_dtype": "fp16"},
            "bf16-mixed": {"mixed_precision": True, "amp_dtype": "bf16"}},
    "vae": {"32-true": {"mixed_precision": False},
            "16-mixed": {"mixed_precision": True, "use_bf16": False},
            "bf16-mixed": {"mixed_precision": True, "use_bf16": True}},
}


def add_preset_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--preset", choices=PRESET_CHOICES, type=str.lower, default=None,
        help="card preset: batch size, workers, precision and training crop for an RTX 4090 / 5090, "
             "the CPU, or auto (by the detected GPU); your flags and --set win over it")


def preset_settings(name: str, trainer: str) -> dict[str, dict[str, Any]]:
    """{setting: {config key: value}} of preset `name` (not `auto`) in `trainer`'s own keys."""
    values = PRESETS[name][trainer]
    out = {setting: {key: values[setting]} for setting, key in TRAINER_KEYS[trainer].items()}
    out["precision"] = dict(PRECISION_KEYS[trainer][values["precision"]])
    return out


def preset_summary(name: str) -> list[str]:
    """One line per trainer: the script and the config values preset `name` (not `auto`) sets."""
    lines = []
    for trainer, script in TRAINER_SCRIPTS.items():
        values = [f"{k}={v}" for keys in preset_settings(name, trainer).values() for k, v in keys.items()]
        lines.append(f"{script} --preset {name}: {', '.join(values)}")
    return lines


def _node(cfg: Any, dotted: str) -> tuple[Any, str]:
    *parents, last = dotted.split(".")
    node = cfg
    for part in parents:
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    return node, last


def get_key(cfg: Any, dotted: str) -> Any:
    node, last = _node(cfg, dotted)
    return node.get(last) if isinstance(node, dict) else getattr(node, last)


def _set_key(cfg: Any, dotted: str, value: Any) -> None:
    node, last = _node(cfg, dotted)
    if isinstance(node, dict):
        node[last] = value
    else:
        setattr(node, last, value)


def _typed_source(key: str, explicit: dict[str, str]) -> str | None:
    """Where the user typed `key` (or a mapping holding it, e.g. `--set model_args={...}`), or None."""
    return explicit.get(key) or next((src for e, src in explicit.items() if key.startswith(f"{e}.")), None)


def apply_preset(cfg: Any, name: str | None, trainer: str, log: Callable[[str], None] | None = None,
                 vram_gb: float | None = None) -> dict[str, Any]:
    """Applies preset `name` (None: nothing) to a loaded config in place; returns {key: value} it set.

    A setting any of whose keys the user typed (`common.config.explicit_keys`) is left whole.
    Prints one line (rank 0 only under torchrun)."""
    if name is None:
        return {}
    if log is None:
        log = print if os.environ.get("RANK", "0") == "0" else (lambda _line: None)
    name = preset_name(name, vram_gb, say=log)
    explicit = explicit_keys(cfg)
    applied: dict[str, Any] = {}
    set_words: list[str] = []
    kept_words: list[str] = []
    precision_keys = {k for keys in PRECISION_KEYS[trainer].values() for k in keys}
    for setting, keys in preset_settings(name, trainer).items():
        owned = precision_keys if setting == "precision" else set(keys)  # every key that spells it
        typed = {k: src for k in sorted(owned) if (src := _typed_source(k, explicit))}
        if typed:
            kept_words += [f"{k}={get_key(cfg, k)} ({src}; preset: {keys.get(k, '-')})" for k, src in typed.items()]
            continue
        for key, value in keys.items():
            old = get_key(cfg, key)
            _set_key(cfg, key, value)
            applied[key] = value
            set_words.append(f"{key}={value}" + (f" (config had {old})" if old is not None and old != value else ""))
    line = f"[preset] {name} for {trainer}: set {', '.join(set_words) or 'nothing'}"
    log(line + (f"; kept what you typed: {', '.join(kept_words)}" if kept_words else ""))
    return applied
