"""Voice-cloning inference: text + a reference clip of any voice → wav, through the NSF vocoder.

    python tts/infer_clone.py --checkpoint runs/tts_clone/checkpoints/best.pt --reference voice.wav \
        --text "Salom, dunyo!" --vocoder runs/vocoder_demo/export --output out.wav

    python tts/infer_clone.py --teacher_forced --checkpoint runs/tts_clone/checkpoints/best.pt \
        --data data/tts_prepared/train.jsonl --output data/gta_mels

`--teacher_forced` writes the model's teacher-forced mels of a prepared dataset (one `<wav name>.npy`
per utterance + mel_settings.json) for `vocoder/prepare_data.py --mel_dir` (`tts.clone.teacher_forced`).

The text may be in any script (Cyrillic or Latin, digits, …) and of any length: it is cut into sentences as
VITS cuts it (`tts.text.sentences.plan`), each goes through the same Uzbek normaliser as the training data and is
spoken on its own by `stream` (the server's Speak uses the same function), 0.3 s of silence between them. Prints the real-time factor of the whole path (text processing,
acoustic model, vocoder) = compute seconds / audio seconds.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from common import exit_codes
from common.checkpoint import (
    CheckpointError,
    load_checkpoint,
    refuse_other_kind,
    resolve_checkpoint_arg,
    run_folder_of,
    saved_config,
)
from common.cli import FlagParser
from common.errors import UserError
from common.run_dir import check_apart, check_output_file, refuse_to_replace
from speech.audio import save_wav
from speech.mel_files import settings_mismatch
from tts.clone.config import AudioConfig, CloneConfig, config_from_dict
from tts.clone.data import DataError, Reference, feature_cache_root, load_reference
from tts.clone.model import VoiceCloneTTS
from tts.text import SYMBOLS, normalize, says_something, text_to_ids
from tts.text.sentences import NothingToSay, SpokenSentence, plan, speak_sentences


class VocoderMismatchError(UserError, ValueError):
    """The vocoder was trained on other mel settings than the acoustic model predicts."""


class NothingSpeakable(DataError, NothingToSay):
    """A text with nothing to say after normalisation: a DataError (as before) and the shared NothingToSay."""


def load_clone_model(path: str | Path, device: str | torch.device = "cpu",
                     ckpt: dict | None = None) -> tuple[VoiceCloneTTS, CloneConfig]:
    """A training checkpoint of tts/train_main.py → (model in eval mode, its config); ``ckpt``: the file
    already loaded (a caller that first read which trainer wrote it loads it once)."""
    ckpt = load_checkpoint(path, map_location="cpu") if ckpt is None else ckpt
    refuse_other_kind(path, ckpt, "clone")
    if "models" not in ckpt or "model" not in ckpt["models"] or not ckpt.get("config"):
        raise CheckpointError(f"{path}: not a voice-cloning checkpoint of tts/train_main.py "
                              "(expected its 'models'/'config' entries)")
    cfg = saved_config(path, ckpt, config_from_dict)
    model = VoiceCloneTTS(cfg.model, len(SYMBOLS), cfg.audio.n_mels)
    model.load_state_dict(ckpt["models"]["model"])
    return model.to(device).eval(), cfg


def check_vocoder_settings(vocoder, audio: AudioConfig, where: str = "") -> None:
    """Raise VocoderMismatchError naming every mel setting that differs between model and vocoder."""
    diff = settings_mismatch(dict(vocoder.mel_kwargs), audio, ("vocoder", "model"))
    if diff:
        raise VocoderMismatchError(
            f"the vocoder{where} uses other mel settings than this model ({'; '.join(diff)}). "
            "A vocoder only understands the mels it was trained on: set the model's audio: section "
            "(tts/clone/configs/clone_*.yaml) to the vocoder's config.json values and retrain, or use a "
            "vocoder trained with the model's settings.")


def load_matching_vocoder(path: str | Path, audio: AudioConfig, device: str | torch.device = "cpu"):
    """`vocoder.infer.load_vocoder` + the mel-settings check (the only way mels become audio here)."""
    from vocoder.infer import load_vocoder

    voc = load_vocoder(path, device)
    check_vocoder_settings(voc, audio, f" at {path}")
    return voc


def text_ids(text: str) -> torch.Tensor:
    """Raw text (any script) → [1, T] symbol ids; unknown characters are dropped with a warning."""
    ids = text_to_ids(normalize(text), on_unknown="warn")
    if not says_something(ids):  # empty, or only pauses and punctuation (emoji-only text)
        raise NothingSpeakable(f"nothing speakable in the text {text!r} after normalisation")
    return torch.tensor([ids], dtype=torch.long)


@torch.no_grad()
def synthesize(model: VoiceCloneTTS, text: str, reference: Reference, vocoder=None,
               length_scale: float = 1.0) -> dict:
    """One utterance: returns mel [n_mels, T], f0 [T], wav (None without a vocoder) and timings."""
    device = next(model.parameters()).device
    t0 = time.perf_counter()
    ids = text_ids(text).to(device)
    out = model.infer(ids, torch.ones_like(ids, dtype=torch.bool), reference.mel.to(device),
                      reference.mask.to(device), length_scale=length_scale)
    wav = None
    if vocoder is not None:
        wav = vocoder(out["mel"], out["f0"])[0].float().cpu().numpy()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return {"mel": out["mel"][0], "f0": out["f0"][0], "durations": out["durations"][0], "wav": wav,
            "spk": out["spk"][0], "compute_s": time.perf_counter() - t0}


def stream(model: VoiceCloneTTS, sentences: Sequence[tuple[str, str]], reference: Reference, vocoder,
           length_scale: float = 1.0, sentence_pause: float = 0.3, paragraph_pause: float = 0.3,
           cancelled: Callable[[], bool] | None = None) -> Iterator[SpokenSentence]:
    """Sentences (`tts.text.sentences.plan(text)`) → one audio chunk per spoken sentence, as it is ready, with
    the pause before it (`tts.text.sentences.speak_sentences`: the same loop as VITS's `stream`). A sentence with
    nothing to say (only symbols) is skipped; `cancelled()` is asked between sentences. The script joins the
    chunks into its file, the server into its answer."""
    def speak(sentence: str) -> np.ndarray | None:
        try:
            return synthesize(model, sentence, reference, vocoder, length_scale)["wav"]
        except NothingToSay:  # only symbols
            return None

    return speak_sentences(sentences, speak, vocoder.sample_rate, sentence_pause, paragraph_pause, cancelled)


def main(argv: list[str] | None = None) -> int:
    p = FlagParser(description="Text + reference voice clip → wav (voice-cloning TTS + NSF vocoder).")
    p.add_argument("--checkpoint", "--ckpt", dest="checkpoint", required=True, help="checkpoint of tts/train_main.py, or its run folder (best.pt, else the newest)")
    p.add_argument("--reference", help="a few seconds of the target voice (wav/flac/ogg/mp3)")
    p.add_argument("--text", help="text to speak (Uzbek, Latin or Cyrillic)")
    p.add_argument("--vocoder", default=None, help="exported vocoder folder or checkpoint "
                   "(default: the vocoder.path the model was trained with)")
    p.add_argument("--output", default=None, help="output wav path (default clone.wav); with --teacher_forced "
                   "the folder for the mels")
    p.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    p.add_argument("--teacher_forced", action="store_true", help="write the teacher-forced (GTA) mels of --data "
                   "for vocoder/prepare_data.py --mel_dir instead of speaking --text")
    p.add_argument("--data", default=None, help="with --teacher_forced: a prepared folder (train.jsonl + eval.jsonl) "
                   "or one .jsonl manifest")
    p.add_argument("--length-scale", type=float, default=1.0, help=">1 speaks slower, <1 faster")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    args.checkpoint = str(resolve_checkpoint_arg(args.checkpoint))  # a run folder: its best.pt, else the newest
    # each mode's flags only: one the mode never reads would be accepted and change nothing
    other = ([f for f, v in (("--reference", args.reference), ("--text", args.text), ("--vocoder", args.vocoder),
                             ("--length-scale", args.length_scale != 1.0)) if v]
             if args.teacher_forced else (["--data"] if args.data else []))
    if other:
        p.error(f"{', '.join(other)} {'do' if len(other) > 1 else 'does'} nothing "
                f"{'with' if args.teacher_forced else 'without'} --teacher_forced")
    if args.teacher_forced:
        return main_teacher_forced(p, args)
    if args.reference is None or args.text is None:  # an empty --text is refused below, with its reason
        p.error("--reference and --text are required (or --teacher_forced with --data and --output)")
    args.output = args.output or "clone.wav"

    def body() -> int:
        check_apart(args.output, "--output", {"--checkpoint": args.checkpoint, "--reference": args.reference,
                                              "--vocoder": args.vocoder}, "_clone")
        check_output_file(args.output, "--output")
        refuse_to_replace(args.output, args.overwrite, "--output")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the unknown characters are reported again when it is spoken
            text_ids(args.text)  # nothing speakable: refused before any model is loaded
        model, cfg = load_clone_model(args.checkpoint, args.device)
        voc_path = args.vocoder or cfg.vocoder.path
        if not voc_path:
            raise DataError("no vocoder: pass --vocoder (an exported NSF-HiFiGAN folder, e.g. runs/vocoder_demo/export)")
        vocoder = load_matching_vocoder(voc_path, cfg.audio, args.device)
        reference = load_reference(args.reference, cfg.audio, cfg.data)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            chunks = list(stream(model, plan(args.text), reference, vocoder, args.length_scale))
        for w in caught:
            print(f"warning: {w.message}", file=sys.stderr)
        wav = np.concatenate([c.audio for c in chunks])
        compute_s = sum(c.compute_s for c in chunks)
        save_wav(args.output, wav, vocoder.sample_rate)
        seconds = len(wav) / vocoder.sample_rate
        rtf = compute_s / seconds if seconds else float("nan")
        print(f"wrote {args.output}: {len(chunks)} sentence(s), {seconds:.2f} s of audio in {compute_s:.3f} s on "
              f"{args.device} (RTF {rtf:.3f}, {1 / rtf:.1f}x real time; text processing + model + vocoder; "
              f"reference {reference.seconds:.1f} s)")
        return 0

    return exit_codes.run_main(body)


def main_teacher_forced(p: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """`--teacher_forced`: the model's GTA mels of `--data` into the folder `--output`."""
    from common.run_dir import check_output_dir
    from tts.clone.teacher_forced import write_teacher_forced_mels

    if not args.data or not args.output:
        p.error("--teacher_forced needs --data (a prepared folder or .jsonl) and --output (a folder for the mels)")

    def body() -> int:
        check_apart(args.output, "--output", {"--checkpoint": args.checkpoint, "--data": args.data}, "_gta_mels")
        model, cfg = load_clone_model(args.checkpoint, args.device)
        check_output_dir(args.output, "--output")
        write_teacher_forced_mels(model, cfg, args.data, args.output,
                                  feature_cache_root(cfg, run_folder_of(Path(args.checkpoint))), args.overwrite)
        return 0

    return exit_codes.run_main(body)


if __name__ == "__main__":
    sys.exit(main())
