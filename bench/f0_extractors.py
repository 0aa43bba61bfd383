"""Each f0 extractor on this CPU: its speed in seconds per hour of audio (one thread) and how far it agrees with
Praat (parselmouth, the default) on the vocoder demo's human recordings (data/demo/vocoder_readers: people
reading Tux Paint's stamp descriptions, `speech.demo_recordings`; `make vocoder-demo` or its data step makes it).

    python -m bench.f0_extractors [--recordings data/demo/vocoder_readers] [--per_reader 10] [--rmvpe rmvpe.onnx]

Agreement, on `speech.f0.extract_f0`'s mel grid (hop 256 at 22.05 kHz), against parselmouth's track of the
same file: `gross` = the share of the frames both call voiced that lie more than 50 cents apart (octave jumps and
misses, not jitter), `median` = the median |difference| in cents there, `voicing` = the share of all frames
whose voiced / unvoiced call is the same (`speech.pitch_metrics`). Speed: wall time of `extract_f0` over the
files after one untimed call (model loading, numba compiling), torch / onnxruntime on one thread. A benchmark
measures and prints; it judges nothing.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

from speech.audio import load_audio
from speech.f0 import F0_METHODS, check_f0_extractor, extract_f0
from speech.pitch_metrics import f0_agreement, vuv_error

REPO = Path(__file__).resolve().parents[1]
HOP = 256


def pick_files(root: Path, per_reader: int) -> list[Path]:
    """The first `per_reader` files of each reader in corpus.json (train and held-out readers alike)."""
    corpus = json.loads((root / "corpus.json").read_text())
    by_reader: dict[str, list[str]] = {}
    for f in corpus["files"]:
        by_reader.setdefault(f.split("/")[0], []).append(f)
    return [root / f for files in by_reader.values() for f in files[:per_reader]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recordings", default=str(REPO / "data" / "demo" / "vocoder_readers"))
    p.add_argument("--per_reader", type=int, default=10, help="files per reader (8 readers, ~1.6 s each)")
    p.add_argument("--f0_min", type=float, default=65.0)
    p.add_argument("--f0_max", type=float, default=800.0)
    p.add_argument("--rmvpe", default=None, help="RVC's rmvpe.onnx: adds rmvpe to the table")
    p.add_argument("--json", default=None, help="also write the figures here")
    args = p.parse_args(argv)
    root = Path(args.recordings)
    if not (root / "corpus.json").is_file():
        print(f"{root}/corpus.json not found: make the demo's recordings first (make vocoder-demo, or "
              "speech.demo_recordings.make_recordings_corpus)")
        return 2
    torch.set_num_threads(1)
    files = pick_files(root, args.per_reader)
    wavs = [load_audio(f)[0] for f in files]
    sr = load_audio(files[0])[1]
    hours = sum(len(w) for w in wavs) / sr / 3600
    methods = [m for m in F0_METHODS if m != "rmvpe" or args.rmvpe]
    rows, tracks = [], {}
    for m in methods:
        try:
            check_f0_extractor(m, args.rmvpe)
        except (ImportError, ValueError) as e:
            print(f"{m}: skipped ({e})")
            continue
        extract_f0(wavs[0], sr, HOP, len(wavs[0]) // HOP, args.f0_min, args.f0_max, m, args.rmvpe)  # warm-up
        out, t0 = [], time.perf_counter()
        for w in wavs:
            f0, voiced = extract_f0(w, sr, HOP, len(w) // HOP, args.f0_min, args.f0_max, m, args.rmvpe)
            out.append(np.where(voiced, f0, 0.0))
        seconds = time.perf_counter() - t0
        tracks[m] = out
        rows.append({"extractor": m, "s_per_audio_hour": seconds / hours, "x_real_time": hours * 3600 / seconds})
        print(f"{m}: {seconds:.1f} s for {hours * 3600:.0f} s of audio", flush=True)
    ref = tracks["parselmouth"]
    for row in rows:
        f0 = np.concatenate(tracks[row["extractor"]])
        r = np.concatenate(ref)
        agree = f0_agreement(f0, r)
        row.update(voiced=float((f0 > 0).mean()), gross=agree["gross"], median_cents=agree["median_cents"],
                   voicing=1.0 - vuv_error(f0, r))
    print(f"\n{len(files)} files, {hours * 3600:.0f} s of audio ({root}), f0 {args.f0_min:g}-{args.f0_max:g} Hz, "
          f"{platform.processor() or platform.machine()}, torch {torch.__version__}, one thread\n")
    print("| extractor | s per audio hour | × real time | voiced | gross error vs parselmouth (> 50 cents) "
          "| median cents | voicing agreement |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['extractor']} | {r['s_per_audio_hour']:.0f} | {r['x_real_time']:.0f} | {100 * r['voiced']:.0f}% "
              f"| {100 * r['gross']:.1f}% | {r['median_cents']:.1f} | {100 * r['voicing']:.1f}% |")
    if args.json:
        Path(args.json).write_text(json.dumps({"files": len(files), "audio_seconds": hours * 3600, "rows": rows},
                                              indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
