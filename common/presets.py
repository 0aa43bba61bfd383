"""Presets: named sets of config values, one rule for all of them.

`--preset {rtx4090,rtx5090,auto,cpu}` is one flag with the same meaning in every trainer. It fills
in the settings that depend on the card — batch size, DataLoader workers, precision and the
training crop — so a user with a 4090 or 5090 need not tune them by hand. The values per card live
in `common.hardware.PRESETS` (with the reasons); each trainer's schema maps them onto its own config
keys (`PRESET_KEYS`), and this module applies them. A trainer's own recipe flag (the cloning
trainer's `--fast-convergence`, whose values are data in `tts/clone/presets.py`) goes through the
same `apply_settings`.

Precedence, lowest first: schema defaults < the YAML config < a preset < what the user typed
(the trainer's flags and `--set`). A preset sits above the YAML on purpose: every shipped recipe
sets these keys, so a preset below the YAML would change nothing. A setting the user typed is kept
whole: with a precision on the command line (`--precision`, `--mixed_precision`, `--set precision=…`:
every spelling is the one `precision` key once the config is loaded), the preset leaves it alone.
What a preset writes is recorded as asked for (`common.config.mark_explicit`), so a later preset
leaves it alone and a resume applies it like a typed value. One line says what the
preset set (and what it replaced) and what it left alone.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from common.config import explicit_keys, import_from_string, mark_explicit
from common.distributed import launched_as_rank0
from common.hardware import PRESETS, preset_name

PRESET_CHOICES = ("rtx4090", "rtx5090", "auto", "cpu")

# The trainers that take `--preset` (`make check` lists them; a test runs each with it), and the
# schema whose `PRESET_KEYS` maps each card setting onto that trainer's own config key.
TRAINER_SCRIPTS = {"vocoder": "vocoder/train.py", "tts": "tts/train.py", "tts_clone": "tts/train_main.py",
                   "vae": "vae/train_vae.py"}
TRAINER_SCHEMAS = {"vocoder": "vocoder.config.VocoderConfig", "tts": "tts.vits.config.TrainConfig",
                   "tts_clone": "tts.clone.config.CloneConfig", "vae": "vae.config.VAEConfig"}


def add_preset_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--preset", choices=PRESET_CHOICES, type=str.lower, default=None,
        help="card preset for an RTX 4090 / 5090, the CPU, or auto (by the detected GPU): workers and precision, "
             "and for the speech trainers batch size and training crop (the VAE keeps its resolution profile's); "
             "your flags and --set win over it")


def preset_settings(name: str, trainer: str, preset_keys: dict[str, str]) -> dict[str, dict[str, Any]]:
    """{setting: {config key: value}} of preset `name` (not `auto`) for `trainer`, in the keys its
    schema's `PRESET_KEYS` ({setting: config key}) names."""
    values = PRESETS[name][trainer]
    return {setting: {key: values[setting]} for setting, key in preset_keys.items()}


def preset_summary(name: str) -> list[str]:
    """One line per trainer: the script and the config values preset `name` (not `auto`) sets."""
    lines = []
    for trainer, script in TRAINER_SCRIPTS.items():
        keys = import_from_string(TRAINER_SCHEMAS[trainer]).PRESET_KEYS
        values = [f"{k}={v}" for keys in preset_settings(name, trainer, keys).values() for k, v in keys.items()]
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


@dataclass
class PresetOutcome:
    """What `apply_settings` did: keys written (old, new value) and keys left as the user typed them
    (value now, the preset's value, where the user typed it)."""

    written: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    kept: dict[str, tuple[Any, Any, str]] = field(default_factory=dict)


def apply_settings(cfg: Any, settings: dict[str, dict[str, Any]], source: str) -> PresetOutcome:
    """The one preset rule (module docstring), on a loaded config in place. `settings`: setting →
    {config key: value}; a setting any of whose keys the user typed (`explicit_keys`, or a mapping
    above it) is left whole. Written keys are marked explicit with `source`."""
    explicit = explicit_keys(cfg)
    out = PresetOutcome()
    for keys in settings.values():
        typed = {k: src for k in sorted(keys) if (src := _typed_source(k, explicit))}
        if typed:
            out.kept.update({k: (get_key(cfg, k), keys.get(k, "-"), src) for k, src in typed.items()})
            continue
        for key, value in keys.items():
            out.written[key] = (get_key(cfg, key), value)
            _set_key(cfg, key, value)
            mark_explicit(cfg, key, source)
    return out


def apply_preset(cfg: Any, name: str | None, trainer: str, log: Callable[[str], None] | None = None,
                 vram_gb: float | None = None) -> dict[str, Any]:
    """Applies card preset `name` (None: nothing) to a loaded config in place, in the keys its schema's
    `PRESET_KEYS` names; returns {key: value} it set.

    A setting the user typed (`common.config.explicit_keys`, any spelling of it: aliases resolve at
    load) is left alone. Prints one line (rank 0 only under torchrun)."""
    if name is None:
        return {}
    if log is None:
        log = print if launched_as_rank0() else (lambda _line: None)
    name = preset_name(name, vram_gb, say=log)
    done = apply_settings(cfg, preset_settings(name, trainer, type(cfg).PRESET_KEYS), f"--preset {name}")
    set_words = [f"{k}={new}" + (f" (config had {old})" if old is not None and old != new else "")
                 for k, (old, new) in done.written.items()]
    kept_words = [f"{k}={now} ({src}; preset: {preset})" for k, (now, preset, src) in done.kept.items()]
    line = f"[preset] {name} for {trainer}: set {', '.join(set_words) or 'nothing'}"
    log(line + (f"; kept what you typed: {', '.join(kept_words)}" if kept_words else ""))
    return {k: new for k, (_, new) in done.written.items()}
