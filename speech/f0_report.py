"""What a preparation's f0 extractor found: the voiced fraction, the range of voiced f0 (1st / 50th / 99th
percentile), a histogram picture, and a warning with suggested values when `f0_min` / `f0_max` cut a
speaker off (many voiced frames at a bound, or the 1st / 99th percentile near one: an extractor never
reports f0 outside its bounds, so a voice beyond them piles up at the bound or goes unvoiced).

It also counts the voiced frames more than an octave off their file's median f0, and warns per file (naming
the file and its speaker) where they are many. Why: nobody speaks an octave above their own median for long,
so such frames are the extractor's octave jumps (Praat's autocorrelation in the singing range, 65-1100 Hz,
tracked 8-27 % of a low male reader's voiced frames above 450 Hz), and the vocoder would learn them as pitch.
A percentile over the whole corpus hides them: it mixes every speaker's register."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np

NEAR = 1.05  # within 5% of a bound counts as "at" it
AT_BOUND_FRACTION = 0.02  # this share of voiced frames at a bound is a cut
OCTAVE_OFF_WARN = 0.05  # a file with this share of its voiced frames an octave off its median is warned about
MAX_FILE_WARNINGS = 20  # the report names at most this many files (report.json lists them all)
F0_PNG = "f0_histogram.png"


NAMED_FILES = 3  # a cut bound's warning names the files with the most frames at it, this many


def octave_off_share(f0: np.ndarray, voiced: np.ndarray) -> float:
    """The share of one file's voiced frames more than an octave (1200 cents) from the file's median voiced f0;
    0 when nothing is voiced."""
    v = np.asarray(f0, dtype=np.float64)[np.asarray(voiced, dtype=bool)]
    v = v[v > 0]
    if not v.size:
        return 0.0
    return float(np.mean(np.abs(np.log2(v / np.median(v))) > 1.0))


def f0_summary(tracks: Iterable[tuple], f0_min: float, f0_max: float, extractor: str) -> dict:
    """`tracks`: (f0 [frames], voiced [frames]) or (f0, voiced, label) per item; the label names the file and its
    speaker in a warning ("item <i>" without one): a user fixes a speaker, or a file, not a corpus. Returns the
    numbers the report states: `voiced` (all voiced f0 values, for the picture), `voiced_fraction`,
    `p1`/`p50`/`p99` (Hz, None when nothing is voiced), `at_min`/`at_max` (share of voiced frames near each
    bound), `cut` (the bounds that cut a voice off), `suggest` (values for those bounds), `cut_files` ({bound:
    [(label, frames at it)], most first, for labelled tracks}), `octave_off` (share of all voiced frames more than
    an octave off their file's median) and `octave_off_files` ([{"file": label, "share"}] of the files at or
    above `OCTAVE_OFF_WARN`, worst first)."""
    values, frames, off_frames, files, at_bound = [], 0, 0.0, [], []
    for i, track in enumerate(tracks):
        f0, voiced = track[0], np.asarray(track[1], dtype=bool)
        label = str(track[2]) if len(track) > 2 else f"item {i}"
        frames += len(voiced)
        values.append(np.asarray(f0, dtype=np.float64)[voiced])
        share = octave_off_share(f0, voiced)
        off_frames += share * values[-1].size
        if share >= OCTAVE_OFF_WARN:
            files.append({"file": label, "share": share})
        if len(track) > 2:
            at_bound.append((label, int((values[-1] <= f0_min * NEAR).sum()), int((values[-1] >= f0_max / NEAR).sum())))
    v = np.concatenate(values) if values else np.zeros(0)
    s: dict = {"extractor": extractor, "frames": frames, "voiced_frames": int(v.size),
               "voiced_fraction": v.size / frames if frames else 0.0, "f0_min": f0_min, "f0_max": f0_max,
               "p1": None, "p50": None, "p99": None, "at_min": 0.0, "at_max": 0.0, "cut": [], "suggest": {},
               "octave_off": off_frames / v.size if v.size else 0.0,
               "octave_off_files": sorted(files, key=lambda f: -f["share"]), "cut_files": {}, "voiced": v}
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


def f0_report_lines(s: dict, key_prefix: str = "", redo: str = "prepare again", method_key: str = "pe") -> list[str]:
    """The report's lines for `f0_summary`'s result (for report.txt and the log). A cut bound's warning says
    what to run: `redo` with `--set <key_prefix>f0_min=...` (keys inside a config block: its prefix). A file
    with many frames an octave off its median is named, with the extractor's key (`method_key`) to change."""
    head = (f"f0 ({s['extractor']}, f0_min {s['f0_min']:g} Hz, f0_max {s['f0_max']:g} Hz): "
            f"{100 * s['voiced_fraction']:.1f}% of {s['frames']} frames voiced")
    if s["p1"] is None:
        return [head + "; no voiced frame: f0 range unknown"]
    lines = [head + f"; voiced f0 1st/50th/99th percentile {s['p1']:.1f} / {s['p50']:.1f} / {s['p99']:.1f} Hz; "
                    f"{100 * s['octave_off']:.1f}% of voiced frames more than an octave off their file's median"]
    for key, at in (("f0_min", "at_min"), ("f0_max", "at_max")):
        if key in s["cut"]:
            files = s.get("cut_files", {}).get(key)
            where = ("; most in " + ", ".join(f"{name} ({n} frames)" for name, n in files)) if files else ""
            lines.append(f"WARNING: {key}={s[key]:g} Hz cuts a voice off ({100 * s[at]:.1f}% of voiced frames "
                         f"within 5% of it{where}): {redo} with --set {key_prefix}{key}={s['suggest'][key]}")
    off = s["octave_off_files"]
    for f in off[:MAX_FILE_WARNINGS]:
        lines.append(f"WARNING: {f['file']}: {100 * f['share']:.1f}% of its voiced frames are more than an octave "
                     f"off its median f0 (octave jumps of {s['extractor']}, or a voice that leaves its register)")
    if off:
        more = f" ({len(off) - MAX_FILE_WARNINGS} more not shown; the .json lists them all)" if len(
            off) > MAX_FILE_WARNINGS else ""
        lines.append(f"{len(off)} file(s) with >= {100 * OCTAVE_OFF_WARN:g}% of voiced frames an octave off{more}: "
                     f"listen to them; for speech, an extractor that does not jump octaves ({method_key}) in the "
                     f"speech range ({key_prefix}f0_min / {key_prefix}f0_max) avoids most (bench/README.md, "
                     f"\"f0 extractors\")")
    return lines


def summary_json(s: dict) -> dict:
    """`f0_summary`'s numbers without the values (for a report.json)."""
    return {k: v for k, v in s.items() if k != "voiced"}


def save_f0_report(s: dict, folder: str | Path, name: str, key_prefix: str = "", redo: str = "prepare again",
                   extra: dict | None = None, method_key: str = "pe") -> list[str]:
    """A report of its own in `folder`: <name>.txt (the lines), <name>.json (the numbers and `extra`, e.g. what
    identifies the extractor) and <name>.png (the histogram, when a frame is voiced). Returns the lines. A
    report whose three files already say the same is left as it is: each start of a run on a feature cache
    reports the same f0, and drawing the histogram again took half a second."""
    from common.atomic_write import write_text

    folder = Path(folder)
    lines = f0_report_lines(s, key_prefix, redo, method_key)
    text, numbers = "\n".join(lines) + "\n", json.dumps({**(extra or {}), **summary_json(s)}, indent=1)
    files = {folder / f"{name}.txt": text, folder / f"{name}.json": numbers}
    png = folder / f"{name}.png" if s["voiced_frames"] else None
    if all(_holds(p, t) for p, t in files.items()) and (png is None or png.is_file()):
        return lines
    for path, content in files.items():
        write_text(path, content)
    if png is not None:
        save_f0_histogram(s, png)
    return lines


def _holds(path: Path, text: str) -> bool:
    try:
        return path.read_text(encoding="utf-8") == text
    except (OSError, UnicodeDecodeError):
        return False


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
