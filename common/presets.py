"""Presets: named sets of config values, one rule for all of them.

`--preset {rtx4090,rtx5090,auto,cpu}` is one flag with the same meaning in every trainer. It fills
in the settings that depend on the card — batch size, DataLoader workers, precision and the
training crop — so a user with a 4090 or 5090 need not tune them by hand. Each trainer keeps its
values per card (with the reasons) in its own `CardPresets` table, and its schema maps them onto its
own config keys (`PRESET_KEYS`); this module applies a table it is given and knows no trainer. A
trainer's own recipe flag (data in that trainer's package) goes through the same `apply_settings`.

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
from common.hardware import CARDS, preset_name

PRESET_CHOICES = ("rtx4090", "rtx5090", "auto", "cpu")
# The settings a card preset may give (a trainer's schema maps those it takes in `PRESET_KEYS`):
#   batch_size  - per-GPU batch (DDP multiplies it by the number of GPUs)
#   num_workers - DataLoader worker processes per GPU
#   precision   - `32-true | 16-mixed | bf16-mixed` (see common.precision)
#   crop        - the training crop, in the trainer's own unit (frames, seconds, pixels)
SETTINGS = ("batch_size", "num_workers", "precision", "crop")


@dataclass(frozen=True)
class CardPresets:
    """One trainer's settings per card preset. `trainer`: how the preset line names it ("[preset] rtx5090
    for <trainer>: ..."); `script`: the script that takes `--preset` (`make check` lists it); `schema`: its
    config schema, whose `PRESET_KEYS` maps each setting onto its own key; `values`: card (every name of
    `common.hardware.CARDS`) -> {setting: value}."""

    trainer: str
    script: str
    schema: type
    values: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if set(self.values) != set(CARDS):
            raise ValueError(f"{self.trainer} presets: values for {sorted(self.values)}, need exactly {list(CARDS)}")
        for card, settings in self.values.items():
            unknown = set(settings) - set(SETTINGS)
            if unknown:
                raise ValueError(f"{self.trainer} preset {card}: unknown settings {sorted(unknown)} "
                                 f"(valid: {', '.join(SETTINGS)})")

    def resolve(self, name: str, vram_gb: float | None = None, say: Callable[[str], None] = print) -> dict[str, Any]:
        """The settings of preset `name` (a copy); `auto` as in `common.hardware.preset_name`."""
        return dict(self.values[preset_name(name, vram_gb, say=say)])


def add_preset_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--preset", choices=PRESET_CHOICES, type=str.lower, default=None,
        help="card preset for an RTX 4090 / 5090, the CPU, or auto (by the detected GPU): workers and precision, "
             "and batch size and training crop where this trainer takes them from the card; "
             "your flags and --set win over it")


def preset_settings(name: str, presets: CardPresets) -> dict[str, dict[str, Any]]:
    """{setting: {config key: value}} of preset `name` (not `auto`) in `presets`, in the keys its schema's
    `PRESET_KEYS` ({setting: config key}) names."""
    values = presets.values[name]
    return {setting: {key: values[setting]} for setting, key in presets.schema.PRESET_KEYS.items()}


def registered_presets() -> list[CardPresets]:
    """The `CardPresets` of every trainer that has them (`common.trainers`, in pyproject.toml's order)."""
    from common.trainers import trainers

    return [import_from_string(info.presets) for info in trainers() if info.presets]


def preset_summary(name: str) -> list[str]:
    """One line per trainer: the script and the config values preset `name` (not `auto`) sets."""
    lines = []
    for presets in registered_presets():
        values = [f"{k}={v}" for keys in preset_settings(name, presets).values() for k, v in keys.items()]
        lines.append(f"{presets.script} --preset {name}: {', '.join(values)}")
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


def apply_preset(cfg: Any, name: str | None, presets: CardPresets, log: Callable[[str], None] | None = None,
                 vram_gb: float | None = None) -> dict[str, Any]:
    """Applies card preset `name` (None: nothing) of a trainer's `presets` to its loaded config in place, in
    the keys its schema's `PRESET_KEYS` names; returns {key: value} it set.

    A setting the user typed (`common.config.explicit_keys`, any spelling of it: aliases resolve at
    load) is left alone. Prints one line (rank 0 only under torchrun)."""
    if name is None:
        return {}
    if not isinstance(cfg, presets.schema):
        raise TypeError(f"the {presets.trainer} presets set keys of {presets.schema.__name__}, not of {type(cfg).__name__}")
    if log is None:
        log = print if launched_as_rank0() else (lambda _line: None)
    name = preset_name(name, vram_gb, say=log)
    done = apply_settings(cfg, preset_settings(name, presets), f"--preset {name}")
    set_words = [f"{k}={new}" + (f" (config had {old})" if old is not None and old != new else "")
                 for k, (old, new) in done.written.items()]
    kept_words = [f"{k}={now} ({src}; preset: {preset})" for k, (now, preset, src) in done.kept.items()]
    line = f"[preset] {name} for {presets.trainer}: set {', '.join(set_words) or 'nothing'}"
    log(line + (f"; kept what you typed: {', '.join(kept_words)}" if kept_words else ""))
    return {k: new for k, (_, new) in done.written.items()}
