"""Each f0 extractor on this CPU: its speed in seconds per hour of audio (one thread) and how often it leaves the
CONSENSUS of the other extractors, on the vocoder demo's human readers (data/demo/vocoder_readers: people reading
Tux Paint's stamp descriptions, `speech.demo_recordings`) and its espeak-ng voices (data/demo/vocoder_wavs,
`speech.demo_speech`), male and female apart; `make vocoder-demo` or its data step makes both.

    python -m bench.f0_extractors [--demo_dir data/demo] [--per_voice 3] [--rmvpe rmvpe.onnx]

Why a consensus and not one tracker as the reference: these recordings have no ground-truth pitch, and a
reference tracker's own octave jumps are counted as every other tracker's errors (Praat at 65-1100 Hz puts
8-27 % of a low male reader's voiced frames above 450 Hz). Per frame, the reference for extractor X is the
median of the OTHER extractors' voiced values, where most of them (a majority, at least two) lie within 50
cents of that median; frames without such a majority are left out (nobody knows the pitch there). On those
frames, among the ones X calls voiced: `gross` = the share more than 50 cents off (a quarter tone: misses and
jumps, not jitter), `octave` = the share more than 600 cents off (half an octave: octave jumps and worse);
`missed` = the share of consensus frames X calls unvoiced; `spurious` = the share of X's voiced frames that most
others call unvoiced; `> octave off own median` = the share of X's voiced frames more than an octave from X's
median on that file (needs no reference: wild values on breath and creak, which a consensus cannot judge because
the others call those frames unvoiced, show here). Every extractor runs in the same range (`--f0_min`,
`--f0_max`: the speech range by default); `--also` adds rows of an extractor in another range (e.g. Praat in
the singing range, 65-1100 Hz), judged against the same consensus but not part of it. Speed: wall time of
`extract_f0` over the files after one untimed call (model loading, numba compiling), torch / onnxruntime on one
thread. A benchmark measures and prints; it judges nothing.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from speech.audio import load_audio
from speech.demo_recordings import MALE_READERS
from speech.f0 import F0_METHODS, SPEECH_F0_MAX, SPEECH_F0_MIN, check_f0_extractor, extract_f0

REPO = Path(__file__).resolve().parents[1]
HOP = 256
AGREE_CENTS = 50.0  # the consensus' tolerance, and the gross-error threshold
OCTAVE_CENTS = 600.0  # half an octave: nearer the octave than the unison


@dataclass
class Clip:
    """One file of the benchmark and the group it is counted in (e.g. "human male")."""

    path: Path
    voice: str
    group: str


def pick_clips(demo_dir: Path, per_voice: int) -> list[Clip]:
    """The first `per_voice` files of each human reader (corpus.json's order) and of each espeak-ng voice folder
    (uz_m_* male, uz_f_* female)."""
    clips: list[Clip] = []
    readers = demo_dir / "vocoder_readers"
    if (readers / "corpus.json").is_file():
        by_reader: dict[str, list[str]] = {}
        for f in json.loads((readers / "corpus.json").read_text())["files"]:
            by_reader.setdefault(f.split("/")[0], []).append(f)
        for reader, files in by_reader.items():
            sex = "male" if reader in MALE_READERS else "female"
            clips += [Clip(readers / f, reader, f"human {sex}") for f in files[:per_voice]]
    voices = demo_dir / "vocoder_wavs"
    for folder in sorted(voices.glob("uz_*")) if voices.is_dir() else []:
        sex = "male" if folder.name.startswith("uz_m") else "female"
        clips += [Clip(p, folder.name, f"espeak {sex}") for p in sorted(folder.glob("*.wav"))[:per_voice]]
    return clips


def cents(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|1200 log2(a / b)| where both are voiced (> 0), NaN elsewhere."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where((a > 0) & (b > 0), np.abs(1200.0 * np.log2(a / b)), np.nan)


def consensus(others: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(reference f0, unvoiced) per frame. Reference: the median of the tracks' voiced values where a majority of the
    tracks (at least two) lie within `AGREE_CENTS` of it, the median of those; 0 where no such majority exists.
    Unvoiced: a majority of the tracks call the frame unvoiced."""
    stack = np.stack(others)  # [tracks, frames], 0 = unvoiced
    need = max(2, len(others) // 2 + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-unvoiced frames
        med = np.nanmedian(np.where(stack > 0, stack, np.nan), axis=0)
    close = cents(stack, np.nan_to_num(med)[None]) <= AGREE_CENTS
    ref = np.zeros(stack.shape[1])
    for i in np.flatnonzero(close.sum(axis=0) >= need):
        ref[i] = float(np.median(stack[close[:, i], i]))
    return ref, (stack <= 0).sum(axis=0) >= need


def off_own_median(track: np.ndarray) -> np.ndarray:
    """Per voiced frame of one file's track: more than an octave from the track's own median (no reference
    needed: what the prepare report counts, `speech.f0_report`)."""
    v = track[track > 0]
    return cents(v, np.full_like(v, np.median(v))) > 1200.0 if v.size else np.zeros(0, dtype=bool)


def judge(track: np.ndarray, ref: np.ndarray, unvoiced: np.ndarray, wild: np.ndarray) -> dict[str, float]:
    """`gross`, `octave` (shares of the frames voiced in track and consensus that are off by more than 50 / 600
    cents), `missed` (share of the consensus' frames the track calls unvoiced), `spurious` (share of the track's
    voiced frames that most others call unvoiced), `wild` (share of its voiced frames more than an octave off its
    file's median: `wild`, the per-frame flags of `off_own_median`) and `frames` (the consensus' frames)."""
    have = ref > 0
    both = have & (track > 0)
    c = cents(track[both], ref[both])
    n, nv = int(both.sum()), int((track > 0).sum())
    nan = float("nan")
    return {"gross": float(np.mean(c > AGREE_CENTS)) if n else nan,
            "octave": float(np.mean(c > OCTAVE_CENTS)) if n else nan,
            "missed": float(1 - both.sum() / have.sum()) if have.any() else nan,
            "spurious": float(((track > 0) & unvoiced).sum() / nv) if nv else nan,
            "wild": float(wild.mean()) if wild.size else nan, "frames": int(have.sum())}


def run_extractor(method: str, wavs: list[np.ndarray], sr: int, f0_min: float, f0_max: float,
                  weights: str | None) -> tuple[list[np.ndarray], float]:
    """(f0 per file, 0 where unvoiced; seconds for all files after one untimed warm-up call)."""
    extract_f0(wavs[0], sr, HOP, len(wavs[0]) // HOP, f0_min, f0_max, method, weights)
    out, t0 = [], time.perf_counter()
    for w in wavs:
        f0, voiced = extract_f0(w, sr, HOP, len(w) // HOP, f0_min, f0_max, method, weights)
        out.append(np.where(voiced, f0, 0.0).astype(np.float64))
    return out, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--demo_dir", default=str(REPO / "data" / "demo"),
                   help="holds vocoder_readers/ (human) and vocoder_wavs/ (espeak-ng)")
    p.add_argument("--per_voice", type=int, default=3, help="files per reader / voice (8 readers, 6 voices)")
    p.add_argument("--f0_min", type=float, default=SPEECH_F0_MIN)
    p.add_argument("--f0_max", type=float, default=SPEECH_F0_MAX)
    p.add_argument("--also", nargs="*", default=["parselmouth:65:1100"], metavar="METHOD:MIN:MAX",
                   help="extra rows judged against the same consensus (not part of it)")
    p.add_argument("--rmvpe", default=None, help="RVC's rmvpe.onnx: adds rmvpe to the table")
    p.add_argument("--json", default=None, help="also write the figures here")
    args = p.parse_args(argv)
    clips = pick_clips(Path(args.demo_dir), args.per_voice)
    if not clips:
        print(f"no demo recordings under {args.demo_dir}: make them first (make vocoder-demo)")
        return 2
    torch.set_num_threads(1)
    wavs, sr = [], None
    for c in clips:
        w, rate = load_audio(c.path)
        if sr not in (None, rate):
            raise SystemExit(f"{c.path}: {rate} Hz, the other files {sr} Hz")
        wavs.append(w)
        sr = rate
    seconds_audio = sum(len(w) for w in wavs) / sr
    runs: list[tuple[str, str, float, float]] = [(m, m, args.f0_min, args.f0_max) for m in F0_METHODS
                                                 if m != "rmvpe" or args.rmvpe]
    for spec in args.also:
        m, lo, hi = spec.split(":")
        runs.append((f"{m} {float(lo):g}-{float(hi):g} Hz", m, float(lo), float(hi)))
    tracks: dict[str, list[np.ndarray]] = {}
    speed: dict[str, float] = {}
    for label, m, lo, hi in runs:
        try:
            check_f0_extractor(m, args.rmvpe)
        except (ImportError, ValueError) as e:
            print(f"{label}: skipped ({e})")
            continue
        tracks[label], secs = run_extractor(m, wavs, sr, lo, hi, args.rmvpe)
        speed[label] = secs / seconds_audio * 3600
        print(f"{label}: {secs:.1f} s for {seconds_audio:.0f} s of audio", flush=True)
    members = [label for label, m, lo, hi in runs if label == m and label in tracks]  # the consensus' voters
    groups = sorted({c.group for c in clips})
    rows = []
    for label, m, _, _ in runs:
        if label not in tracks:
            continue
        voters = [v for v in members if v != m]
        per_group = {}
        for g in [*groups, "all"]:
            idx = [i for i, c in enumerate(clips) if g in ("all", c.group)]
            refs = [consensus([tracks[v][i] for v in voters]) for i in idx]
            per_group[g] = judge(np.concatenate([tracks[label][i] for i in idx]),
                                 np.concatenate([r for r, _ in refs]), np.concatenate([u for _, u in refs]),
                                 np.concatenate([off_own_median(tracks[label][i]) for i in idx]))
        rows.append({"extractor": label, "s_per_audio_hour": speed[label], **per_group})
    print(f"\n{len(clips)} files ({args.per_voice} per voice), {seconds_audio:.0f} s of audio ({args.demo_dir}), "
          f"f0 {args.f0_min:g}-{args.f0_max:g} Hz, {platform.processor() or platform.machine()}, "
          f"torch {torch.__version__}, one thread\n")
    print("gross (> 50 cents) / octave (> 600 cents) share of voiced frames against the consensus of the others\n")
    print("| extractor | s per audio hour | " + " | ".join(groups) + " | all | missed | spurious | > octave off "
          "own median |")
    print("|---|---|" + "---|" * len(groups) + "---|---|---|---|")
    for r in rows:
        cells = " | ".join(f"{100 * r[g]['gross']:.1f}% / {100 * r[g]['octave']:.1f}%" for g in [*groups, "all"])
        print(f"| {r['extractor']} | {r['s_per_audio_hour']:.0f} | {cells} | {100 * r['all']['missed']:.1f}% "
              f"| {100 * r['all']['spurious']:.1f}% | {100 * r['all']['wild']:.1f}% |")
    if args.json:
        Path(args.json).write_text(json.dumps({"files": len(clips), "audio_seconds": seconds_audio, "rows": rows},
                                              indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
