"""A folder of precomputed mels (one `<name>.npy` per audio file, float `[n_mels, frames]`) and the
settings file beside them, so a writer (an acoustic model's teacher-forced mels) and a reader (the
data preparation of a model trained on them) agree on one format.

The settings file records the mel contract (`speech.audio.AudioSettings`, the seven `mel_kwargs`
fields) the mels were made with: a model must only be trained on mels of its own settings, and a
mel's frame grid (hop) cannot be checked from the array alone.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from common.atomic_write import write_text
from speech.audio import AudioSettings

MEL_SETTINGS_FILE = "mel_settings.json"
FRAME_TOLERANCE = 1  # a mel may have this many frames more or fewer than the audio (trimmed to the shorter)


def write_mel_settings(folder: str | Path, audio: AudioSettings) -> Path:
    """Write `<folder>/mel_settings.json` with the mel settings the folder's mels were made with."""
    return write_text(Path(folder) / MEL_SETTINGS_FILE, json.dumps(audio.mel_kwargs, indent=1) + "\n")


def read_mel_settings(folder: str | Path) -> dict | None:
    """The recorded settings, or None when the file is missing or unreadable."""
    try:
        settings = json.loads((Path(folder) / MEL_SETTINGS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return settings if isinstance(settings, dict) else None


def settings_mismatch(recorded: dict, expected: AudioSettings, sides: tuple[str, str] = ("mels", "config")
                      ) -> list[str]:
    """'key: mels X vs config Y' (`sides` names the two) for every mel setting that differs or that
    `recorded` lacks (fmax None = sample_rate / 2)."""
    want = expected.mel_kwargs

    def value(settings: dict, key: str) -> float | None:
        v = settings.get(key)
        if key == "fmax" and v is None and settings.get("sample_rate"):
            v = settings["sample_rate"] / 2
        return None if v is None else float(v)

    wrong = []
    for key in want:
        got, exp = value(recorded, key), value(want, key)
        if got is None or exp is None or not math.isclose(got, exp, rel_tol=1e-6):
            wrong.append(f"{key}: {sides[0]} {recorded.get(key)} vs {sides[1]} {want[key]}")
    return wrong
