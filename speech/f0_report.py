"""What a preparation's f0 extractor found: the voiced fraction, the range of voiced f0 (1st / 50th / 99th
percentile), a histogram picture, and a warning with suggested values when `f0_min` / `f0_max` cut a
speaker off (many voiced frames at a bound, or the 1st / 99th percentile near one: an extractor never
reports f0 outside its bounds, so a voice beyond them piles up at the bound or goes unvoiced)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np

NEAR = 1.05  # within 5% of a bound counts as "at" it
AT_BOUND_FRACTION = 0.02  # this share of voiced frames at a bound is a cut
F0_PNG = "f0_histogram.png"


NAMED_FILES = 3  # a cut bound's warning names the files with the most frames at it, this many


def f0_summary(tracks: Iterable[tuple], f0_min: float, f0_max: float, extractor: str) -> dict:
    """`tracks`: (f0 [frames], voiced [frames]) per item, or (f0, voiced, name) where `name` says which speaker
    and file it is (then a cut bound's warning names the files with the most frames at it: a user fixes a
    speaker, or a file, not a corpus). Returns the numbers the report states: `voiced`
    (all voiced f0 values, for the picture), `voiced_fraction`, `p1`/`p50`/`p99` (Hz, None when nothing is
    voiced), `at_min`/`at_max` (share of voiced frames near each bound), `cut` (the bounds that cut a voice
    off), `suggest` (values for those bounds) and `cut_files` ({bound: [(name, frames at it)], most first})."""
    values, frames, at_bound = [], 0, []
    for f0, voiced, *name in tracks:
        frames += len(voiced)
        values.append(np.asarray(f0, dtype=np.float64)[np.asarray(voiced, dtype=bool)])
        if name:
            at_bound.append((str(name[0]), int((values[-1] <= f0_min * NEAR).sum()),
                             int((values[-1] >= f0_max / NEAR).sum())))
    v = np.concatenate(values) if values else np.zeros(0)
    s: dict = {"extractor": extractor, "frames": frames, "voiced_frames": int(v.size),
               "voiced_fraction": v.size / frames if frames else 0.0, "f0_min": f0_min, "f0_max": f0_max,
               "p1": None, "p50": None, "p99": None, "at_min": 0.0, "at_max": 0.0, "cut": [], "suggest": {},
               "cut_files": {}, "voiced": v}
    for key, column in (("f0_min", 1), ("f0_max", 2)):
        most = sorted((row for row in at_bound if row[column]), key=lambda row: -row[column])[:NAMED_FILES]
        s["cut_files"][key] = [(row[0], row[column]) for row in most]
    if not v.size:
        return s
    p1, p50, p99 = (float(x) for x in np.percentile(v, [1, 50, 99]))
    s.update(p1=p1, p50=p50, p99=p99, at_min=float((v <= f0_min * NEAR).mean()),
             at_max=float((v >= f0_max / NEAR).mean()))
    if p1 <= f0_min * NEAR or s["at_min"] >= AT_BOUND_FRACTION:
        s["cut"].append("f0_min")
        s["suggest"]["f0_min"] = max(20, 5 * math.floor(min(p1, f0_min) / 1.5 / 5))
    if p99 >= f0_max / NEAR or s["at_max"] >= AT_BOUND_FRACTION:
        s["cut"].append("f0_max")
        s["suggest"]["f0_max"] = 10 * math.ceil(max(p99, f0_max) * 1.5 / 10)
    return s


def f0_report_lines(s: dict, key_prefix: str = "", redo: str = "prepare again") -> list[str]:
    """The report's lines for `f0_summary`'s result (for report.txt and the log). A cut bound's warning says
    what to run: `redo` with `--set <key_prefix>f0_min=...` (keys inside a config block: its prefix)."""
    head = (f"f0 ({s['extractor']}, f0_min {s['f0_min']:g} Hz, f0_max {s['f0_max']:g} Hz): "
            f"{100 * s['voiced_fraction']:.1f}% of {s['frames']} frames voiced")
    if s["p1"] is None:
        return [head + "; no voiced frame: f0 range unknown"]
    lines = [head + f"; voiced f0 1st/50th/99th percentile {s['p1']:.1f} / {s['p50']:.1f} / {s['p99']:.1f} Hz"]
    for key, at in (("f0_min", "at_min"), ("f0_max", "at_max")):
        if key in s["cut"]:
            files = s.get("cut_files", {}).get(key)
            where = ("; most in " + ", ".join(f"{name} ({n} frames)" for name, n in files)) if files else ""
            lines.append(f"WARNING: {key}={s[key]:g} Hz cuts a voice off ({100 * s[at]:.1f}% of voiced frames "
                         f"within 5% of it{where}): {redo} with --set {key_prefix}{key}={s['suggest'][key]}")
    return lines


def summary_json(s: dict) -> dict:
    """`f0_summary`'s numbers without the values (for a report.json)."""
    return {k: v for k, v in s.items() if k != "voiced"}


def save_f0_report(s: dict, folder: str | Path, name: str, key_prefix: str = "", redo: str = "prepare again",
                   extra: dict | None = None) -> list[str]:
    """A report of its own in `folder`: <name>.txt (the lines), <name>.json (the numbers and `extra`, e.g. what
    identifies the extractor) and <name>.png (the histogram, when a frame is voiced). Returns the lines."""
    from common.atomic_write import write_text

    folder = Path(folder)
    lines = f0_report_lines(s, key_prefix, redo)
    write_text(folder / f"{name}.txt", "\n".join(lines) + "\n")
    write_text(folder / f"{name}.json", json.dumps({**(extra or {}), **summary_json(s)}, indent=1))
    if s["voiced_frames"]:
        save_f0_histogram(s, folder / f"{name}.png")
    return lines


def save_f0_histogram(s: dict, path: str | Path) -> Path:
    """The voiced f0 histogram (log-spaced bins) with the bounds and percentiles marked, as a PNG."""
    from common.log import new_figure, save_figure

    fig = new_figure(figsize=(6, 3), dpi=100)
    ax = fig.add_subplot(1, 1, 1)
    v = s["voiced"]
    lo, hi = s["f0_min"] / 1.2, s["f0_max"] * 1.2
    if v.size:
        lo, hi = min(lo, float(v.min())), max(hi, float(v.max()) * 1.01)
        ax.hist(v, bins=np.geomspace(lo, hi, 80), color="tab:blue")
    for x, style, label in ((s["f0_min"], "r-", "f0_min"), (s["f0_max"], "r-", "f0_max"),
                            (s["p1"], "k--", "1st pct"), (s["p99"], "k--", "99th pct")):
        if x is not None:
            ax.axvline(x, color=style[0], linestyle=style[1:], linewidth=1, label=f"{label} {x:.0f}")
    ax.set_xscale("log")
    ax.set_xlabel("f0 (Hz), voiced frames")
    ax.set_ylabel("frames")
    ax.set_title(f"{s['extractor']}: {100 * s['voiced_fraction']:.1f}% voiced", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)
