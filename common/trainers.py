"""The trainers of this repository as common/ meets them: through what each one declares, never by name.

common/ is model-agnostic: it names no trainer. Two repo-wide jobs still concern every trainer: `make check`
lists what `--preset` sets in each one, and a checkpoint given to the wrong script is refused naming the
trainer that wrote it and the scripts that take it. For those, each trainer package declares itself in its
`__init__.py` as `TRAINER = TrainerInfo(...)`, and pyproject.toml lists those packages
(`[tool.trainers] packages`, in the order `make check` prints them; an installed copy, which has no
pyproject.toml, reads the same list from its entry points, group `trainers.packages`). They are read on those paths alone
(the hardware report, a refusal message), once per process, never in a training step.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = REPO / "pyproject.toml"
ENTRY_POINT_GROUP = "trainers.packages"


@dataclass(frozen=True)
class TrainerInfo:
    """What the rest of the repository needs to know about one trainer.

    name: what every checkpoint it writes records (`common.checkpoint.make_state(trainer=name)`) and what
        its readers accept (`refuse_other_kind(path, ckpt, name)`).
    files: kind -> (what such a file is, the scripts that take it), for messages; `name` is its training
        checkpoint, further kinds are the other layouts it writes or reads (an export, a release).
    recognise: the kind of a file that records no trainer (written before checkpoints recorded one, or in
        another layout), from its keys; None when the file is none of this trainer's.
    presets: dotted path of its `common.presets.CardPresets` (what `--preset` sets), or None.
    """

    name: str
    files: dict[str, tuple[str, str]]
    recognise: Callable[[dict], str | None] | None = None
    presets: str | None = None

    def __post_init__(self) -> None:
        if self.name not in self.files:
            raise ValueError(f"TrainerInfo {self.name!r}: `files` must describe its own checkpoint (kind {self.name!r})")


def trainer_packages(pyproject: Path = PYPROJECT) -> list[str]:
    """The trainer packages pyproject.toml lists (`[tool.trainers] packages`); without the file (`pip install .`
    copies only the packages) those the installed distribution declares as entry points of the group
    `trainers.packages`, in the order of their names; [] when neither is there."""
    if not pyproject.is_file():
        found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        return [ep.value for ep in sorted(found, key=lambda ep: ep.name)]
    with open(pyproject, "rb") as f:
        return list(tomllib.load(f).get("tool", {}).get("trainers", {}).get("packages", []))


@functools.cache
def trainers() -> tuple[TrainerInfo, ...]:
    """Every trainer's `TRAINER`, in the order pyproject.toml lists their packages."""
    found = []
    for package in trainer_packages():
        info = getattr(importlib.import_module(package), "TRAINER", None)
        if not isinstance(info, TrainerInfo):
            raise TypeError(f"pyproject.toml [tool.trainers] lists {package!r}, whose __init__.py declares no "
                            "`TRAINER = common.trainers.TrainerInfo(...)`")
        found.append(info)
    return tuple(found)


def file_kinds() -> dict[str, tuple[str, str]]:
    """kind -> (what the file is, the scripts that take it), over every trainer's `files`."""
    return {kind: about for info in trainers() for kind, about in info.files.items()}


def recognise(ckpt: dict) -> str | None:
    """The kind the first trainer that recognises `ckpt` (a file recording no trainer) names, or None."""
    for info in trainers():
        kind = info.recognise(ckpt) if info.recognise is not None else None
        if kind is not None:
            return kind
    return None
