"""The vocoder demo (``make vocoder-demo``): real human speech, a few CPU minutes of training,
copy-synthesis of held-out readers it never heard, and an exported generator.

1. ``apt-get download tuxpaint-stamps-default`` (Debian's package of Tux Paint's read-aloud stamp
   descriptions, GPL-2): 30 clips from each of six readers to train on, 3 from each of two other
   readers to hold out -> ``data/demo/vocoder_readers`` (22.05 kHz; ``speech.demo_recordings``).
   When the package cannot be fetched, espeak-ng reads Uzbek sentences in six voices instead
   (``data/demo/vocoder_wavs``, 6 random files held out), and one line says so;
2. ``prepare_data`` binarizes them (the held-out readers via ``test_prefixes``);
3. ``demo.yaml`` trains ~5 CPU minutes (2000 generator-only steps, then 250 with the critic) -> ``runs/vocoder_demo`` (TensorBoard in logs/);
4. the held-out files are copy-synthesised -> ``runs/vocoder_demo/copysyn/`` (``*_gt.wav`` beside), with best.pt
   when it is from the critic phase (ranked from one step after ``discriminator_train_start_steps``,
   ``common.checkpoint.ranking_start``), else the checkpoint the run finished with; every picture names the step
   read from the checkpoint loaded;
5. that generator is exported -> ``runs/vocoder_demo/export/`` (the TTS voice-cloning demo uses it).

It prints the held-out multi-resolution STFT distance at step 0 and at the end (it must fall
clearly), writes ``copysyn/<file>.png`` (ground-truth and generated mel side by side) for every
held-out file, and judges the copy-synthesis with ``speech.mcd``: each file's level within
6 dB of its ground truth and the mean MCD-DTW below ``MAX_MCD``, the mean hop comb (a buzz at the frame rate,
``speech.buzz``) below ``BUZZ_DB``, and the steps trained against the plan (a run cut short by ``max_minutes`` fails:
its thresholds were measured at the planned steps). Exit status 1 when any fails. Every
stage is resumable: a second run reuses the corpus and the dataset and continues (or skips) training.
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
from common.checkpoint import load_checkpoint, read_best_record
from common.cli import FlagParser
from common.config import load_config
from common.demo import (
    add_demo_overrides,
    demo_overrides,
    demo_threads,
    record_demo_settings,
    report,
    steps_figure,
    trained_with_other_settings,
)
from common.log import save_figure
from speech.audio import MelSpectrogram, load_audio, save_wav
from speech.buzz import hop_comb_db, hop_comb_figure
from speech.demo_recordings import HELD_OUT_READERS, LICENCE, RecordingsUnavailable, make_recordings_corpus
from speech.demo_speech import DEMO_SPEAKERS, UZBEK_SENTENCES, make_corpus
from speech.mcd import compare_speech, speech_figures
from speech.plots import plot_spectrograms
from vocoder.config import VocoderConfig
from vocoder.export import export
from vocoder.infer import load_vocoder
from vocoder.prepare_data import prepare
from vocoder.train import VocoderTrainer

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "vocoder" / "configs" / "demo.yaml"
REQUIRED_DROP = 0.8  # the final distance must be below 80 % of the step-0 distance
MAX_MCD = 3.3  # mean copy-synthesis MCD-DTW over the held-out clips, dB: see MEASURED below
# MEASURED (python -m bench.demo_references; the demo's 22.05 kHz 80-bin mel) on the 6 held-out clips
# of readers ro and da: what clearly wrong output scores, mean over the clips (min-max of the pairs):
# the same reader saying other words 3.50 (3.31-3.75), another reader 5.30 (3.83-8.70), white noise at
# the clip's level 6.53, a flat 30-harmonic stack on the clip's own f0 7.20. The demo itself, six
# fresh-clone make demo runs over three seeds and 1 / 2 threads (docs/DEMO.md): 2.75-3.02 dB. A
# copy-synthesis re-uses the clip's own mel and f0, so a plausible one must be closer to it than the same
# reader saying other words: <= 3.3 dB, 0.28 dB (9 %) beyond the worst run and 0.2 dB below that.


# what the export's card says of the espeak-ng part of the demo data (no recording of anyone)
ESPEAK_DATA = "synthetic speech espeak-ng made from this repository's Uzbek sentences"


def make_dataset(cfg: VocoderConfig, sentences: int = 24, wavs: str | Path = REPO / "data" / "demo" / "vocoder_wavs",
                 data: str | Path = REPO / "data" / "demo" / "vocoder_bin", overwrite: bool = False) -> dict:
    """Steps 1-2 with espeak-ng speech: the corpus and its binarized dataset (both reused when
    already made); returns the manifest. bench/learning.py trains on the same data. `overwrite`: a folder
    prepared with other settings (an older demo's) is prepared again, its files moved aside."""
    print(f"[1/5] speech corpus: {sentences} Uzbek sentences x {len(DEMO_SPEAKERS)} espeak-ng voices")
    make_corpus(UZBEK_SENTENCES[:sentences], wavs, DEMO_SPEAKERS, cfg.audio.sample_rate, num_workers=2)
    print("[2/5] binarize (mel + f0)")
    return prepare(cfg, [wavs], data, log=lambda m: print("   ", m), overwrite=overwrite, data_licence=ESPEAK_DATA)


def make_recordings_dataset(cfg: VocoderConfig, recordings: str | Path, data: str | Path,
                            wavs: str | Path, sentences: int, overwrite: bool = False) -> dict:
    """Steps 1-2 with real readers, plus `sentences` espeak-ng sentences per voice in training (the
    cloning demo vocodes espeak-ng voices through this vocoder); raises RecordingsUnavailable when
    the package cannot be had."""
    print("[1/5] speech corpus: real readers from Debian's tuxpaint-stamps-default (apt-get download)")
    corpus = make_recordings_corpus(recordings, cfg.audio.sample_rate)
    print(f"    {len(corpus['files'])} clips, training readers {', '.join(corpus['train_readers'])}, held-out "
          f"readers {', '.join(corpus['held_out_readers'])}; licence {LICENCE}")
    roots = [recordings]
    if sentences > 0:
        print(f"    + {sentences} Uzbek sentences x {len(DEMO_SPEAKERS)} espeak-ng voices in training")
        make_corpus(UZBEK_SENTENCES[:sentences], wavs, DEMO_SPEAKERS, cfg.audio.sample_rate, num_workers=2)
        roots.append(wavs)
    print("[2/5] binarize (mel + f0)")
    licence = LICENCE + (f"; plus {ESPEAK_DATA}" if sentences > 0 else "")  # into the checkpoints and the export's card
    return prepare(cfg, roots, data, log=lambda m: print("   ", m), overwrite=overwrite, data_licence=licence)


def demo_dataset(cfg: VocoderConfig, espeak: bool, recordings: str | Path, wavs: str | Path,
                 data: str | Path | None, sentences: int = 24) -> tuple[dict, Path]:
    """(manifest, prepared folder): the real readers (held out by reader through cfg.test_prefixes),
    or espeak-ng speech when asked or when the package cannot be fetched (one line says why). The demo's own
    folders (no `data` given) are prepared again when an older demo made them with other settings (the speech f0
    extractor changed); a folder the user names never is."""
    own = data is None
    if not espeak:
        cfg.test_prefixes = [f"{reader}/" for reader in HELD_OUT_READERS]
        prepared = Path(data or REPO / "data" / "demo" / "vocoder_readers_bin")
        try:
            return make_recordings_dataset(cfg, recordings, prepared, wavs, sentences, overwrite=own), prepared
        except RecordingsUnavailable as e:
            print(f"note: no real recordings ({e}); training on espeak-ng speech instead")
            cfg.test_prefixes = []
    prepared = Path(data or REPO / "data" / "demo" / "vocoder_bin")
    return make_dataset(cfg, sentences, wavs, prepared, overwrite=own), prepared


def demo_checkpoint(ckpt_dir: Path, ranked_from: int, final: Path) -> Path:
    """What the demo copy-synthesises, pictures and exports: best.pt when it was ranked within the phase the run
    ends in (its best.json step at or after `ranked_from`, `common.checkpoint.ranking_start`), else the checkpoint
    the run finished with. A best.pt from before the critics (an older run's, or one ranked across the switch) is
    a generator that never trained with them."""
    best = ckpt_dir / "best.pt"
    step = read_best_record(ckpt_dir / "best.json", print).get("step", -1)
    return best if best.is_file() and step >= ranked_from else final


def main(argv: list[str] | None = None) -> int:
    return exit_codes.run_main(lambda: demo(argv))


def demo(argv: list[str] | None) -> int:
    """The demo's steps; `main` runs them through `common.exit_codes.run_main` (what the user can fix: one line, 2)."""
    p = FlagParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--espeak", action="store_true", help="train on espeak-ng speech, not the real readers")
    p.add_argument("--sentences", type=int, default=24, help="espeak-ng sentences per voice (6 voices), beside the "
                   "real readers in training (all the speech with --espeak or without the package)")
    p.add_argument("--wavs", default=str(REPO / "data" / "demo" / "vocoder_wavs"), help="espeak-ng corpus")
    p.add_argument("--recordings", default=str(REPO / "data" / "demo" / "vocoder_readers"), help="real readers")
    p.add_argument("--data", default=None, help="the prepared dataset (default: data/demo/vocoder_readers_bin, "
                   "or data/demo/vocoder_bin for espeak-ng)")
    p.add_argument("--run", default=str(REPO / "runs" / "vocoder_demo"))
    add_demo_overrides(p, "demo.yaml", "seed")
    args = p.parse_args(argv)
    cfg = load_config(CONFIG, VocoderConfig, demo_overrides(args))
    run = Path(args.run)
    t_start = time.time()
    torch.set_num_threads(demo_threads())
    print(f"training with {torch.get_num_threads()} thread(s), seed {cfg.seed}")

    manifest, data = demo_dataset(cfg, args.espeak, args.recordings, args.wavs, args.data, args.sentences)

    print(f"[3/5] train demo.yaml for {cfg.max_updates} steps on the CPU -> {run}")
    if trained_with_other_settings(run, demo_overrides(args)):
        shutil.rmtree(run)
    record_demo_settings(run, demo_overrides(args))
    resume = "auto" if (run / "checkpoints").is_dir() else None
    trainer = VocoderTrainer(cfg, data, run, resume=resume, device="cpu")
    t0 = time.time()
    result = trainer.fit()
    train_s = time.time() - t0
    if result.stopped == "signal":
        print("stopped by a signal; run the demo again to continue where it stopped")
        return 130
    valid = trainer.history.get("valid", [])  # the sanity validation at step 0 first
    if not valid:
        print("error: no validation results were recorded", file=sys.stderr)
        return 1
    start, end = valid[0], valid[-1]

    print("[4/5] copy-synthesis of the held-out files")
    ckpt = demo_checkpoint(run / "checkpoints", trainer.checkpoints.store.save_best_after, Path(result.last_good))
    state = load_checkpoint(ckpt)
    step = int(state["counters"]["step"])  # the step of the weights loaded, for every title and the summary
    print(f"    {ckpt.name}: step {step}")
    voc = load_vocoder(ckpt, ckpt=state)
    out_dir = run / "copysyn"
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    audio_s = compute_s = 0.0
    mel = MelSpectrogram(**voc.mel_kwargs)
    pairs, pictures, combs = [], [], []
    for name in manifest["valid"]:
        src = Path(manifest["items"][name]["source"])
        wav, _ = load_audio(src, sr=voc.sample_rate)
        t = time.perf_counter()
        out = voc.copy_synthesize(wav)
        compute_s += time.perf_counter() - t
        audio_s += len(out) / voc.sample_rate
        stem = f"{src.parent.name}_{src.stem}"
        save_wav(out_dir / f"{stem}.wav", out, voc.sample_rate)
        save_wav(out_dir / f"{stem}_gt.wav", wav[: len(out)], voc.sample_rate)
        pair = compare_speech(stem, out, wav[: len(out)], mel)
        pairs.append(pair)
        combs.append(hop_comb_db(out, voc.sample_rate, voc.hop_length))
        pictures.append(save_figure(plot_spectrograms(
            [("ground truth", pair.ref_mel), (f"generated ({pair.level_db:+.1f} dB, MCD {pair.mcd:.2f} dB, "
                                              f"hop comb {combs[-1]:.1f} dB)", pair.gen_mel)],
            title=f"vocoder copy-synthesis, held-out {stem} (step {step})",
            hop_seconds=voc.hop_length / voc.sample_rate), out_dir / f"{stem}.png"))
    rtf = compute_s / max(audio_s, 1e-9)

    print("[5/5] export the generator (DiffSinger/OpenUtau layout)")
    export(ckpt, run / "export")

    drop = end["mrstft"] / start["mrstft"]
    figures = [*speech_figures(pairs, MAX_MCD), hop_comb_figure(combs), steps_figure(result.step, result.planned,
                                                                                      result.stopped)]
    summary = {"mrstft_step0": start["mrstft"], "mrstft_final": end["mrstft"], "final_step": end["step"],
               "checkpoint_step": step, "steps_trained": result.step, "steps_planned": result.planned,
               "stopped": result.stopped,
               "ratio": drop, "train_seconds_this_run": round(train_s, 1), "copysyn_rtf": rtf,
               "plausibility": {f.name: {"value": f.value, "limit": f.limit, "ok": f.ok} for f in figures},
               "pictures": [str(p) for p in pictures],
               "checkpoint": str(ckpt), "export": str(run / "export"), "total_seconds": round(time.time() - t_start, 1)}
    write_text(run / "demo_summary.json", json.dumps(summary, indent=1))
    print()
    print(f"held-out MR-STFT distance: step 0 = {start['mrstft']:.3f}, step {end['step']} = {end['mrstft']:.3f} "
          f"({100 * (1 - drop):.0f} % lower)")
    print(f"held-out mel L1:           step 0 = {start['mel_l1']:.3f}, step {end['step']} = {end['mel_l1']:.3f}")
    print(f"copy-synthesis: {len(manifest['valid'])} files -> {out_dir} (RTF {rtf:.3f} on this CPU)")
    print(f"exported generator -> {run / 'export'}; TensorBoard: tensorboard --logdir {run / 'logs'}")
    plausible = report(figures, "copy-synthesis of the held-out files vs their ground truth")
    print("pictures (ground truth | generated):")
    for path in pictures:
        print(f"  {path}")
    ok = True
    if not np.isfinite(end["mrstft"]) or drop > REQUIRED_DROP:
        print(f"error: the held-out distance did not fall clearly (ratio {drop:.2f} > {REQUIRED_DROP})", file=sys.stderr)
        ok = False
    if not plausible:
        print("error: the copy-synthesis is not plausible speech (figures above)", file=sys.stderr)
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
