"""`make gta-demo`: fine-tune the demo vocoder on the cloning model's teacher-forced (GTA) mels, the
hifi-gan / BigVGAN `--fine_tuning` workflow, and measure what it changes on the cloning demo's
held-out sentences.

1. the two demos' outputs (`runs/vocoder_demo`, `runs/tts_clone_demo`), made by their own demos when missing;
2. `tts/infer_clone.py --teacher_forced`: the cloning model's mels of its TRAINING utterances (the
   held-out ones stay unheard) -> runs/gta_demo/gta_mels;
3. `vocoder/prepare_data.py --mel_dir` over those utterances' audio -> runs/gta_demo/vocoder_bin;
4. `vocoder/train.py --init_from` the vocoder demo's checkpoint: STEPS CPU steps at LR, with its critic
   -> runs/gta_demo/vocoder;
5. each held-out sentence spoken by the cloning model (predicted durations, as a user gets it) through the
   original and the fine-tuned vocoder, against its recording (`tts.clone.demo.held_out_check`: level
   and MCD-DTW, `speech.mcd`) -> runs/gta_demo/{before,after}/ and summary.json.

Every stage is reused when its output exists (`--again` redoes 2-5). `--control` runs the same chain
with mels computed from the same audio (-> runs/gta_demo_control): what the extra in-domain steps give
without GTA mels.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

from common import exit_codes
from common.atomic_write import write_text
from common.checkpoint import RUN_BEST, best_in_run
from common.cli import FlagParser
from common.config import load_config
from common.demo import demo_threads
from speech.mel_files import MEL_SETTINGS_FILE
from tts.clone.data import read_manifest
from tts.clone.demo import PREPARED_DIR, held_out_check
from tts.clone.demo import RUN_DIR as CLONE_RUN
from tts.clone.infer import load_clone_model, load_matching_vocoder
from tts.clone.teacher_forced import write_teacher_forced_mels
from vocoder.config import VocoderConfig
from vocoder.prepare_data import prepare
from vocoder.train import VocoderTrainer

VOCODER_RUN = Path("runs/vocoder_demo")
OUT = Path("runs/gta_demo")
STEPS = 300  # a few CPU minutes; hifi-gan fine-tunes for 100k+ GPU steps
LR = 2e-4  # hifi-gan's learning rate, fine-tuning included (the demo trains from scratch at 1e-3)
FINE_TUNE = [f"max_updates={STEPS}", f"generator_optimizer_args.lr={LR}", f"discriminator_optimizer_args.lr={LR}",
             "discriminator_train_start_steps=0",  # the demo's critic is trained: use it from the first step
             "test_prefixes=[]", "val_num=6", f"validate_every={STEPS}", "num_sanity_val_steps=6",
             "key_aug=false"]


def ensure_demos() -> Path:
    """The vocoder demo's checkpoint and the cloning demo's model, each made by its demo when missing."""
    vocoder_ckpt = VOCODER_RUN / RUN_BEST
    if not vocoder_ckpt.is_file():
        from vocoder import demo as vocoder_demo
        vocoder_demo.main([])
    if best_in_run(CLONE_RUN) is None:
        from tts.clone import demo as clone_demo
        clone_demo.main([])
    for need in (vocoder_ckpt, best_in_run(CLONE_RUN) or CLONE_RUN / RUN_BEST):
        if not need.is_file():
            raise SystemExit(f"error: {need} is missing after its demo ran; see the demo's output above")
    return vocoder_ckpt


def fine_tune(model, cfg, vocoder_ckpt: Path, out: Path, again: bool, gta: bool = True, seed: int | None = None) -> Path:
    """Stages 2-4 into `out` with the cloning demo's `model` and `cfg` (`gta` False: computed mels, the
    control; `seed`: the vocoder run's, default the demo's); returns the fine-tuned checkpoint."""
    mels, data, run = out / "gta_mels", out / "vocoder_bin", out / "vocoder"
    if again:
        shutil.rmtree(out, ignore_errors=True)
    print("[2/5] teacher-forced mels of the cloning model's training utterances" + ("" if gta else ": no, the control"))
    if gta and not (mels / MEL_SETTINGS_FILE).is_file():
        write_teacher_forced_mels(model, cfg, PREPARED_DIR / "train.jsonl", mels, CLONE_RUN / "features")
    print(f"[3/5] prepare the vocoder data {'with --mel_dir' if gta else 'with computed mels'}")
    vcfg = load_config(VOCODER_RUN / "config.yaml", VocoderConfig, FINE_TUNE + ([f"seed={seed}"] if seed is not None else []))
    rows, _ = read_manifest(PREPARED_DIR / "train.jsonl")
    prepare(vcfg, [Path(r["wav"]) for r in rows], data, mel_dir=mels if gta else None, log=lambda m: print("   ", m))
    print(f"[4/5] fine-tune from {vocoder_ckpt}: {STEPS} steps at lr {LR} on the CPU -> {run}")
    resume = "auto" if (run / "checkpoints").is_dir() else None
    trainer = VocoderTrainer(vcfg, data, run, resume=resume, init_from=str(vocoder_ckpt), device="cpu")
    result = trainer.fit()
    if result.stopped == "signal":
        raise SystemExit(130)
    return Path(result.last_good)


def main(argv: list[str] | None = None) -> int:
    return exit_codes.run_main(lambda: demo(argv))


def demo(argv: list[str] | None) -> int:
    """The demo's steps; `main` runs them through `common.exit_codes.run_main` (what the user can fix: one line, 2)."""
    p = FlagParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--again", action="store_true", help=f"delete {OUT} and fine-tune again")
    p.add_argument("--control", action="store_true", help=f"computed mels instead of GTA ones, into {OUT}_control")
    p.add_argument("--seed", type=int, default=None, help=f"the fine-tune's seed (its crops), into {OUT}_seed<N>")
    args = p.parse_args(argv)
    out = OUT.with_name(OUT.name + ("_control" if args.control else "") + (f"_seed{args.seed}" if args.seed is not None else ""))
    torch.set_num_threads(demo_threads())
    t0 = time.time()
    print("[1/5] the vocoder and cloning demos' outputs")
    vocoder_ckpt = ensure_demos()
    model, cfg = load_clone_model(best_in_run(CLONE_RUN), "cpu")
    tuned_ckpt = fine_tune(model, cfg, vocoder_ckpt, out, args.again, not args.control, args.seed)
    print("[5/5] held-out sentences through the original and the fine-tuned vocoder")
    results = {}
    for label, ckpt in (("before", vocoder_ckpt), ("after", tuned_ckpt)):
        torch.manual_seed(0)  # the NSF source's noise: the same draw for both vocoders
        figures, _, _ = held_out_check(model, cfg, PREPARED_DIR, load_matching_vocoder(ckpt, cfg.audio), out / label)
        levels = [f.value for f in figures[:-1]]
        results[label] = {"vocoder": str(ckpt), "mean_mcd_dtw_db": figures[-1].value,
                          "mean_level_db": float(np.mean(levels)), "mean_abs_level_db": float(np.mean(np.abs(levels))),
                          "files": {f.name: f.value for f in figures[:-1]}}
    summary = {"mels": "computed" if args.control else "gta", "steps": STEPS, "lr": LR, "held_out": len(read_manifest(PREPARED_DIR / "eval.jsonl")[0]),
               **results, "seconds": round(time.time() - t0, 1)}
    write_text(out / "summary.json", json.dumps(summary, indent=1))
    print(f"\nheld-out sentences ({summary['held_out']}), the cloning model's output vs the recordings:")
    print(f"{'':<7} {'MCD-DTW dB':>10} {'level dB':>9} {'|level| dB':>10}  vocoder")
    for label in ("before", "after"):
        r = results[label]
        print(f"{label:<7} {r['mean_mcd_dtw_db']:10.2f} {r['mean_level_db']:+9.2f} {r['mean_abs_level_db']:10.2f}  "
              f"{r['vocoder']}")
    print(f"samples: {out}/before, {out}/after; summary: {out / 'summary.json'} ({summary['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
