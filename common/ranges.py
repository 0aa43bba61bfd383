"""The allowed values of a config field, declared once in its schema's type annotation.

A schema writes `save_step: PositiveInt = 500` or `betas: Annotated[list[float], Length(2)]`;
`common.config` checks the value when it loads the config, so a bad `--set` ends the run with one
line naming the key and its range before any work (exit 2), never mid-run with a ZeroDivisionError.
Why not pydantic: the schemas are plain dataclasses read by `common.config`, which already owns the
type conversion and the error messages; a range is one more check there.

Every int or float field of a trainer schema carries a Range (tests/common/test_config_ranges.py
sweeps them): `AnyInt` / `AnyFloat` say on purpose that every value means something (a seed, a dB
level), so an unchecked field is a decision, not an oversight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

from common.errors import ConfigError


class RangeError(ConfigError):
    """A value of the right type outside its field's declared range."""


@dataclass(frozen=True)
class Range:
    """min <= value <= max (`min_open` / `max_open`: strictly). None = no bound on that side."""

    min: float | None = None
    max: float | None = None
    min_open: bool = False
    max_open: bool = False

    def admits(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if self.min is not None and (value <= self.min if self.min_open else value < self.min):
            return False
        return not (self.max is not None and (value >= self.max if self.max_open else value > self.max))

    def words(self) -> str:
        low = None if self.min is None else f"{'>' if self.min_open else '>='} {self.min:g}"
        high = None if self.max is None else f"{'<' if self.max_open else '<='} {self.max:g}"
        if low and high:
            return f"{low} and {high}"
        return low or high or "any finite number"

    def check(self, value: Any, key: str, source: str) -> None:
        if not self.admits(value):
            raise RangeError(f"{key} ({source}): {value!r} is out of range; it must be {self.words()}")


@dataclass(frozen=True)
class Length:
    """A list of exactly `n` items (Adam's two betas)."""

    n: int

    def words(self) -> str:
        return f"a list of {self.n}"

    def check(self, value: Any, key: str, source: str) -> None:
        if len(value) != self.n:
            raise RangeError(f"{key} ({source}): expected {self.n} values, got {len(value)} ({value!r})")


def check_annotations(value: Any, metadata: tuple, key: str, source: str) -> None:
    """Runs every Range / Length of an `Annotated[...]` type on its converted value (None skips)."""
    if value is None:
        return
    for rule in metadata:
        if isinstance(rule, (Range, Length)):
            rule.check(value, key, source)


PositiveInt = Annotated[int, Range(min=1)]  # counts of things and intervals in steps
NonNegativeInt = Annotated[int, Range(min=0)]  # 0 = off / none
PositiveFloat = Annotated[float, Range(min=0, min_open=True)]  # learning rates, seconds, Hz
NonNegativeFloat = Annotated[float, Range(min=0)]  # loss weights, weight decay (0 = off)
Probability = Annotated[float, Range(0, 1)]
Fraction = Annotated[float, Range(0, 1, max_open=True)]  # Adam betas, decay rates: 1 would freeze
Decay = Annotated[float, Range(0, 1, min_open=True)]  # a per-step multiplier of the LR: 1 = constant
AnyInt = Annotated[int, Range()]  # every value means something (a seed)
AnyFloat = Annotated[float, Range()]  # every finite value means something (a dB level, a log-mel bound)
LoudnessTarget = Annotated[float, Range(-70, 0)]  # LUFS: BS.1770's absolute gate (-70) up to full scale (a sign slip, 23, is refused)
