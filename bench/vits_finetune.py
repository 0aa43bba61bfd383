"""Why users fine-tune: a VITS voice started from another voice's weights against the same voice from scratch.

    python -m bench.vits_finetune [--pretrain_steps 1500] [--steps 600] [--eval_every 150] [--out runs/bench_vits_finetune]

The demo corpus (tts/vits/demo.py: three espeak-ng voices reading Uzbek) is split by voice: the two
male voices pretrain one model; the female voice (`TARGET`) is then trained twice on the same batches
for the same steps with the same recipe (tts/vits/configs/demo.yaml), once from the pretrained
weights (`--init_from`) and once from random weights. The figure is the held-out MCD-DTW of the target
voice (its eval sentences, never trained on) at every evaluation: the trainer's own `mcd`
(tts/vits/evaluation.py). Both target runs are single-speaker, as a user's fine-tune is; the
pretrained speaker-conditioning layers therefore do not carry over (the start-up lists them).
All runs stay below the recipe's discriminator start, so the comparison is of the mel/KL/duration
learning only. Results are in bench/README.md ("VITS: fine-tuning against scratch").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from common.checkpoint import CheckpointManager
from tts.vits import train as train_mod
from tts.vits.data import read_manifest, read_speakers
from tts.vits.demo import CONFIG, PREPARED_DIR, build_corpus, prepare, read_metrics

TARGET = "uz_f_mid"  # the voice fine-tuned; the other two pretrain


def voice_subset(prepared: Path, out: Path, voices: list[str]) -> Path:
    """A prepared folder holding only `voices` (ids renumbered 0..n-1); audio and spectrograms are linked."""
    out.mkdir(parents=True, exist_ok=True)
    ids = {v: i for i, v in enumerate(voices)}
    for split in ("train", "eval"):
        rows = [dict(r, speaker_id=ids[r["speaker"]]) for r in read_manifest(prepared, split) if r["speaker"] in ids]
        (out / f"{split}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                                            encoding="utf-8")
    (out / "speakers.json").write_text(json.dumps(ids, ensure_ascii=False), encoding="utf-8")
    for name in ("wavs", "spec", "prepare_state.json", "report.json"):
        link = out / name
        if not link.exists():
            os.symlink((prepared / name).resolve(), link)
    return out


def train(data: Path, run: Path, steps: int, eval_every: int, init_from: Path | None = None) -> list[dict]:
    """One run of the demo recipe; its evaluations (metrics.jsonl). A finished run is reused."""
    metrics = read_metrics(run)
    if metrics and metrics[-1]["step"] >= steps:
        return metrics
    sets = {"max_steps": steps, "val_check_interval": eval_every, "save_step": eval_every, "eval_at_start": True,
            "max_minutes": 600, "epochs": 100000}
    argv = ["--config", str(CONFIG), "--data_dir", str(data), "--run_dir", str(run), "--device", "cpu", "--overwrite",
            *sum((["--set", f"{k}={v}"] for k, v in sets.items()), [])]
    if init_from is not None:
        argv += ["--init_from", str(init_from)]
    if train_mod.main(argv) != 0:
        raise SystemExit(f"training {run} failed (see above)")
    return read_metrics(run)


def table(finetuned: list[dict], scratch: list[dict]) -> list[str]:
    """Markdown rows: held-out MCD-DTW of the target voice at each evaluated step, both runs."""
    by_step = {m["step"]: m["mcd"] for m in scratch}
    steps = [m["step"] for m in finetuned if m["step"] in by_step]
    lines = ["| held-out MCD-DTW, dB (" + TARGET + ") | " + " | ".join(f"step {s}" for s in steps) + " |",
             "|---|" + "---|" * len(steps)]
    lines.append("| fine-tuned from the two other voices | "
                 + " | ".join(f"{m['mcd']:.2f}" for m in finetuned if m["step"] in by_step) + " |")
    lines.append("| from scratch | " + " | ".join(f"{by_step[s]:.2f}" for s in steps) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pretrain_steps", type=int, default=1500)
    p.add_argument("--steps", type=int, default=600, help="steps of each target-voice run (fine-tune, scratch)")
    p.add_argument("--eval_every", type=int, default=150)
    p.add_argument("--out", type=Path, default=Path("runs/bench_vits_finetune"))
    args = p.parse_args(argv)
    t0 = time.time()
    if prepare(build_corpus()) != 0:
        return 2
    voices = list(read_speakers(PREPARED_DIR))
    if TARGET not in voices:
        raise SystemExit(f"{PREPARED_DIR}/speakers.json has no {TARGET}: re-make the demo corpus")
    others = [v for v in voices if v != TARGET]
    pre_data = voice_subset(PREPARED_DIR, args.out / "data_pretrain", others)
    target_data = voice_subset(PREPARED_DIR, args.out / "data_target", [TARGET])

    print(f"== pretrain on {', '.join(others)} ({args.pretrain_steps} steps) ==", flush=True)
    train(pre_data, args.out / "pretrain", args.pretrain_steps, args.eval_every)
    init = CheckpointManager(args.out / "pretrain" / "checkpoints", prefix="vits").latest()
    print(f"== {TARGET}: fine-tune from {init} ({args.steps} steps) ==", flush=True)
    finetuned = train(target_data, args.out / "finetune", args.steps, args.eval_every, init)
    print(f"== {TARGET}: from scratch ({args.steps} steps) ==", flush=True)
    scratch = train(target_data, args.out / "scratch", args.steps, args.eval_every)

    print(f"\nVITS tiny (demo recipe), CPU, {time.time() - t0:.0f} s; pretrain {args.pretrain_steps} steps on "
          f"{', '.join(others)}; target {TARGET}: {len(read_manifest(target_data, 'train'))} training / "
          f"{len(read_manifest(target_data, 'eval'))} held-out utterances")
    print("\n".join(table(finetuned, scratch)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
