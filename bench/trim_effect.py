"""What silence trimming does to VITS (issue 40, "Measure"): the demo corpus prepared with trimming on (the
default, Silero VAD, 0.25 s margins) and off (``--no_trim``), the demo recipe trained on each for the same
steps from the same seed, then for each model:

- held-out MCD-DTW (tts/vits/evaluation.py's ``evaluate``, what training logs) against its own prepared
  held-out recordings and against the trimmed ones (the same references for both models);
- the leading and trailing silence of its held-out syntheses (the 6 eval sentences in their speakers' voices,
  the demo's ``held_out_check`` way): frames 40 dB under the loudest one (``librosa.effects.trim``), and
  before / after the speech Silero VAD finds (``speech.trim.speech_span`` with no margin), beside the same
  figures of the recordings.

    python -m bench.trim_effect [--steps 1700] [--seed 1234] [--threads 1] [--retrain] [--pad 1.0]

``--pad S``: every recording of the corpus first gets 0.2..S s of a -60 dBFS noise floor before and after its
speech (seeded per file), as a room recording has; espeak-ng's own files have almost none to trim.

The corpus is the demo's (data/demo/tts_raw, made when missing); the prepared folders go under
data/bench/trim_effect/, the runs under runs/bench/trim_effect/<on|off>_s<seed>/ (a finished one with the same
steps is reused). The table is printed and written to runs/bench/trim_effect/results_s<seed>.json. A
benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from bench.learning_base import DATA, REPO

OUT_DATA = REPO / "data" / "bench" / "trim_effect"
OUT_RUNS = REPO / "runs" / "bench" / "trim_effect"
SETTINGS = {"on": [], "off": ["--no_trim"]}
TOP_DB = 40.0  # a frame this far under the loudest one is silence (librosa.effects.trim)
FLOOR_DB = -60.0  # --pad's noise floor, dBFS (RMS)


def padded_corpus(raw: Path, pad: float) -> Path:
    """A copy of the demo corpus whose every wav has 0.2..`pad` s of a FLOOR_DB noise floor before and after it
    (lengths and noise seeded by the file's index), with the same metadata.csv. Made once."""
    import soundfile as sf

    out = OUT_DATA / f"raw_pad{pad:g}"
    meta = raw / "metadata.csv"
    if (out / "metadata.csv").is_file():
        return out / "metadata.csv"
    wavs = sorted((raw / "wavs").rglob("*.wav"))
    for i, src in enumerate(wavs):
        wav, sr = sf.read(src, dtype="float32")
        rng = np.random.default_rng(i)
        lead, trail = (int(rng.uniform(0.2, pad) * sr) for _ in range(2))
        floor = 10 ** (FLOOR_DB / 20) * rng.standard_normal(lead + len(wav) + trail).astype(np.float32)
        floor[lead:lead + len(wav)] += wav
        dst = out / "wavs" / src.relative_to(raw / "wavs")
        dst.parent.mkdir(parents=True, exist_ok=True)
        sf.write(dst, floor, sr, subtype="PCM_16")
    (out / "metadata.csv").write_text(meta.read_text(encoding="utf-8"), encoding="utf-8")  # last: marks it done
    return out / "metadata.csv"


def edge_silence(wav: np.ndarray, sr: int) -> dict:
    """Seconds of leading / trailing silence: by level (librosa.effects.trim, 1024/256 frames, TOP_DB) and by
    Silero VAD (no margin; None where it finds no speech)."""
    import librosa

    from speech.trim import speech_span

    _, (start, end) = librosa.effects.trim(wav, top_db=TOP_DB, frame_length=1024, hop_length=256)
    vad_start, vad_end = speech_span(wav, sr, margin=0.0)
    found = vad_end > vad_start
    return {"lead": start / sr, "trail": (len(wav) - end) / sr,
            "vad_lead": vad_start / sr if found else None, "vad_trail": (len(wav) - vad_end) / sr if found else None}


def mean(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if r[key] is not None]
    return statistics.fmean(vals) if vals else None


def prepare(name: str, pad: float) -> Path:
    from tts.vits import demo

    meta = demo.build_corpus(DATA / "tts_raw")
    folder = OUT_DATA / (f"{name}_pad{pad:g}" if pad else name)
    if pad:
        meta = padded_corpus(meta.parent, pad)
    if demo.prepare(meta, folder, *SETTINGS[name]) != 0:
        raise SystemExit(f"error: preparing the demo corpus with trimming {name} failed (see above)")
    return folder


def train(name: str, data: Path, steps: int, seed: int, retrain: bool, pad: float = 0.0) -> Path:
    """The demo recipe on `data` for `steps` steps from `seed` (no step-0 evaluation); its best.pt (the
    only evaluation is the last step's, so it is the final model)."""
    import shutil

    from tts.vits import demo
    from tts.vits import train as train_mod

    run = OUT_RUNS / (f"{name}_pad{pad:g}_s{seed}" if pad else f"{name}_s{seed}")
    stamp = {"steps": steps, "seed": seed}
    done = run / "bench_settings.json"
    if not retrain and (run / "checkpoints" / "best.pt").is_file() and done.is_file() \
            and json.loads(done.read_text()) == stamp:
        print(f"{run}: already trained ({stamp}), reused")
        return run / "checkpoints" / "best.pt"
    if run.exists():
        shutil.rmtree(run)
    sets = [f"max_steps={steps}", f"seed={seed}", "eval_at_start=false", "max_minutes=null", "test_sentences=[]"]
    t0 = time.time()
    rc = train_mod.main(["--config", str(demo.CONFIG), "--data_dir", str(data), "--run_dir", str(run), "--device",
                         "cpu", *sum((["--set", s] for s in sets), [])])
    if rc != 0:
        raise SystemExit(f"error: training with trimming {name} failed (exit {rc})")
    print(f"trimming {name}: {steps} steps in {time.time() - t0:.0f} s")
    done.write_text(json.dumps(stamp))
    return run / "checkpoints" / "best.pt"


@torch.no_grad()
def measure(ckpt: Path, folders: dict[str, Path]) -> dict:
    from speech.audio import load_audio
    from tts.text.phonemes import Frontend
    from tts.vits import synthesize
    from tts.vits.data import VitsDataset, read_manifest
    from tts.vits.evaluation import evaluate
    from tts.vits.train import build_mel

    model, cfg, _ = synthesize.load_generator(ckpt, "cpu")
    mel = build_mel(cfg)
    out = {}
    for refs, folder in folders.items():  # held-out MCD-DTW against each kind of recording
        ds = VitsDataset(folder, "eval", cfg.audio, cfg.data.add_blank, Frontend.of(cfg))
        out[f"mcd_vs_{refs}"] = evaluate(model, ds, mel, torch.device("cpu"), cfg.eval_max_items,
                                         noise_scale=cfg.noise_scale, seed=cfg.seed)["mcd"]
    syn, rec = [], {name: [] for name in folders}
    for row in read_manifest(folders["on"], "eval"):
        torch.manual_seed(cfg.seed)  # the demo's held-out synthesis (tts/vits/demo.py, held_out_check)
        wav = synthesize.synthesize(model, cfg, row["raw_text"], int(row["speaker_id"]), cfg.noise_scale,
                                    noise_scale_w=0.0).numpy()
        syn.append(edge_silence(wav, cfg.audio.sample_rate))
        for name, folder in folders.items():
            ref, sr = load_audio(folder / row["wav"])
            rec[name].append(edge_silence(ref, sr))
    for key in ("lead", "trail", "vad_lead", "vad_trail"):
        out[f"syn_{key}"] = mean(syn, key)
        for name in folders:
            out[f"rec_{name}_{key}"] = mean(rec[name], key)
    out["vad_found"] = sum(r["vad_lead"] is not None for r in syn)
    out["items"] = len(syn)
    return out


def fmt(v) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=1700, help="training steps of each run (the demo's 1700)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--retrain", action="store_true", help="train again even when a finished run is there")
    p.add_argument("--pad", type=float, default=0.0, help="add 0.2..PAD s of a -60 dBFS floor around every recording")
    p.add_argument("--only", choices=list(SETTINGS), default=None, help="train one setting (two processes, two cores)")
    args = p.parse_args(argv)
    if args.pad and args.pad <= 0.2:
        p.error("--pad must be more than 0.2 s (the shortest pad)")
    torch.set_num_threads(args.threads)
    folders = {name: prepare(name, args.pad) for name in SETTINGS}
    if args.only:  # train one; a later call without --only reuses both runs and measures
        train(args.only, folders[args.only], args.steps, args.seed, args.retrain, args.pad)
        return 0
    results = {name: measure(train(name, folders[name], args.steps, args.seed, args.retrain, args.pad), folders)
               for name in SETTINGS}
    OUT_RUNS.mkdir(parents=True, exist_ok=True)
    tag = f"_pad{args.pad:g}" if args.pad else ""
    (OUT_RUNS / f"results{tag}_s{args.seed}.json").write_text(json.dumps(
        {"steps": args.steps, "seed": args.seed, "pad": args.pad, **results}, indent=1))
    print(f"\nVITS demo recipe, {args.steps} steps, seed {args.seed}, held-out sentences "
          f"({results['on']['items']}){f', corpus padded with 0.2-{args.pad:g} s of a {FLOOR_DB:g} dBFS floor' if args.pad else ''}; "
          "silence in seconds (mean)")
    print("| trimming | MCD-DTW vs own recordings | MCD-DTW vs trimmed recordings | lead (-40 dB) | trail (-40 dB) "
          "| lead (Silero) | trail (Silero) |")
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} (synthesis) | {r[f'mcd_vs_{name}']:.3f} | {r['mcd_vs_on']:.3f} | {fmt(r['syn_lead'])} "
              f"| {fmt(r['syn_trail'])} | {fmt(r['syn_vad_lead'])} | {fmt(r['syn_vad_trail'])} |")
    for name in SETTINGS:
        r = results["on"]
        print(f"| {name} (recordings) | | | {fmt(r[f'rec_{name}_lead'])} | {fmt(r[f'rec_{name}_trail'])} "
              f"| {fmt(r[f'rec_{name}_vad_lead'])} | {fmt(r[f'rec_{name}_vad_trail'])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
