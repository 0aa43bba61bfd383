"""Damage a prepared file the ways the reliability probes did (round 3, item 9): cut it short, replace it
with random bytes, delete it, or write a NaN into a saved array. Shared by the damaged-data tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def damage(path: Path, how: str) -> None:
    if how == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif how == "garbage":
        path.write_bytes(np.random.default_rng(0).bytes(300))
    elif how == "delete":
        path.unlink()
    elif how == "nan":
        array = np.load(path)
        array.flat[array.size // 2] = np.nan
        np.save(path, array)
    else:
        raise ValueError(f"unknown damage {how!r}")
