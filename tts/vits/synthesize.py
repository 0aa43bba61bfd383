"""Text (Latin or Cyrillic Uzbek, digits and all, any length) → wav with a trained VITS checkpoint.

    python tts/synthesize.py --checkpoint runs/uzbek_vits/checkpoints/best.pt \
        --text "Salom, dunyo! Bugun 2024-yil 5-sentabr." --out salom.wav \
        [--speaker NAME|ID] [--noise_scale N] [--length_scale L] [--noise_scale_w W]  (default: the config's)
    python tts/synthesize.py --checkpoint ... --text_file book.txt --out book.wav   (paragraphs: blank lines)
    python tts/synthesize.py --checkpoint ... --text_file book.txt --out_dir out/   (one wav per paragraph)

Long text is split into paragraphs (blank lines) and sentences (tts/text/sentences.py: Uzbek
punctuation, abbreviations, quotes, Latin or Cyrillic), each normalised and synthesised on its own,
and written to the output file as soon as it is ready (``--sentence_pause`` between sentences,
``--paragraph_pause`` between paragraphs), so a book never sits in memory and the start of the
file is playable while the rest is synthesised. The model's own front-end (graphemes or espeak-ng
phonemes, saved in the checkpoint) reads the text. Prints the real-time factor (synthesis seconds /
audio seconds), text processing included. Unknown characters are dropped with a warning that names them.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from common import exit_codes
from common.atomic_write import atomic_output
from common.checkpoint import (
    CheckpointError,
    load_checkpoint,
    refuse_other_kind,
    resolve_checkpoint_arg,
    saved_config,
)
from common.cli import FlagParser
from common.config import ConfigError, load_config
from common.run_dir import check_apart, check_output_dir, check_output_file, refuse_to_replace
from speech.audio import to_int16
from tts.text import intersperse, normalize, says_something
from tts.text.phonemes import Frontend
from tts.text.sentences import NothingToSay, SpokenSentence, paragraphs, plan, speak_sentences
from tts.vits.config import TrainConfig
from tts.vits.model import VITS


def load_generator(path: str | Path, device: str | torch.device = "cpu", remove_wn: bool = True,
                   ckpt: dict | None = None) -> tuple[VITS, TrainConfig, dict[str, int]]:
    """Checkpoint → (generator in eval mode, its training config, speakers name → id); ``ckpt``: the file
    already loaded (a caller that reads more of it loads it once)."""
    ckpt = load_checkpoint(path) if ckpt is None else ckpt
    refuse_other_kind(path, ckpt, "vits")  # a vocoder's file: say so, not "unknown config key 'task_cls'"
    if "models" not in ckpt or "generator" not in ckpt["models"]:
        raise CheckpointError(f"{path}: not a VITS checkpoint from tts/train.py (no generator weights)")
    cfg = saved_config(path, ckpt, lambda saved: load_config(None, TrainConfig, extra=saved,
                                                             extra_sources=dict.fromkeys(saved, "saved config")))
    extra = ckpt.get("extra", {})
    speakers = dict(extra.get("speakers", {"speaker": 0}))
    symbols = Frontend.of(cfg).symbols
    if extra.get("symbols") and list(extra["symbols"]) != list(symbols):
        raise CheckpointError(f"{path} was trained with a different symbol set ({len(extra['symbols'])} symbols, "
                              f"this code has {len(symbols)} for phoneme_type {cfg.phoneme_type}); "
                              "fine-tune it with --init_from first")
    n_vocab = ckpt["models"]["generator"]["enc_p.emb.weight"].shape[0]
    model = VITS(n_vocab, cfg.audio.n_fft // 2 + 1, len(speakers), cfg.args(), cfg.audio.hop_length)
    model.load_state_dict(ckpt["models"]["generator"])
    model.eval()
    if remove_wn:
        model.remove_weight_norm()
    return model.to(device), cfg, speakers


def resolve_speaker(speaker: str | None, speakers: dict[str, int], flag: str = "--speaker") -> int:
    """A speaker name or id → its id (the first speaker when none is given); `flag`: what the message calls the
    choice (the script's --speaker, the server's form field speaker)."""
    if speaker is None:
        return 0
    if speaker in speakers:
        return speakers[speaker]
    if speaker.isdigit() and int(speaker) < max(1, len(speakers)):
        return int(speaker)
    raise ConfigError(f"{flag} {speaker!r} is not in this model's speakers: {', '.join(speakers) or '(one)'}")


def text_to_input(text: str, add_blank: bool, frontend: Frontend | None = None) -> torch.Tensor:
    """Raw text → [1, T] ids as the model reads them (normalised, graphemes or phonemes, blanks)."""
    frontend = frontend or Frontend()
    ids = frontend.ids(normalize(text), on_unknown="warn")
    if not says_something(ids, frontend.symbols):  # empty, or only pauses and punctuation (emoji-only text)
        raise NothingToSay(f"nothing to say in {text!r} after normalisation")
    return torch.tensor([intersperse(ids) if add_blank else ids], dtype=torch.long)


@torch.no_grad()
def synthesize(model: VITS, cfg: TrainConfig, text: str, sid: int = 0, noise_scale: float = 0.667,
               length_scale: float = 1.0, noise_scale_w: float = 0.8, device: str | torch.device = "cpu"
               ) -> torch.Tensor:
    """One sentence → waveform [T] (float, −1..1)."""
    x = text_to_input(text, cfg.data.add_blank, Frontend.of(cfg)).to(device)
    wav, _, _ = model.infer(x, torch.tensor([x.size(1)], device=device), torch.tensor([sid], device=device),
                            noise_scale, length_scale, noise_scale_w)
    return wav[0, 0].float().cpu()


def stream(model: VITS, cfg: TrainConfig, sentences: Sequence[tuple[str, str]], sid: int = 0,
           noise_scale: float = 0.667, length_scale: float = 1.0, noise_scale_w: float = 0.8,
           sentence_pause: float = 0.3, paragraph_pause: float = 0.8, device: str | torch.device = "cpu",
           cancelled: Callable[[], bool] | None = None) -> Iterator[SpokenSentence]:
    """Sentences (`tts.text.sentences.plan(text)`) → one audio chunk per spoken sentence, as it is ready, with
    the pause before it (`tts.text.sentences.speak_sentences`: the same loop as the cloning model's `stream`).
    A sentence with nothing to say (only symbols) is skipped; `cancelled()` is asked between sentences. The
    script writes the chunks to a file as they come (`write_stream`), the server joins them."""
    def speak(sentence: str) -> np.ndarray | None:
        try:
            return synthesize(model, cfg, sentence, sid, noise_scale, length_scale, noise_scale_w, device).numpy()
        except NothingToSay:  # nothing speakable after normalisation ("***", a lone quote)
            return None

    return speak_sentences(sentences, speak, cfg.audio.sample_rate, sentence_pause, paragraph_pause, cancelled)


def write_stream(chunks: Iterable[SpokenSentence], out: str | Path, sample_rate: int,
                 on_sentence: Callable[[int, SpokenSentence], None] | None = None) -> dict:
    """A stream's chunks → one 16-bit wav, each appended (and flushed) as soon as it comes, into a temp file
    beside `out` that becomes `out` when the stream ends (`common.atomic_write`: a stop or a full disk never
    leaves a truncated wav, and a stream that raises leaves no file). ``on_sentence(i, chunk)`` is called after
    each write (`i` counts the chunks from 0). Returns {"seconds", "sentences", "indices", "elapsed"} (`indices`: the plan places spoken)."""
    samples, indices, t0 = 0, [], time.perf_counter()
    with atomic_output(out) as tmp, sf.SoundFile(str(tmp), "w", samplerate=sample_rate, channels=1,
                                                 subtype="PCM_16", format="WAV") as f:
        for chunk in chunks:
            f.write(to_int16(chunk.audio))
            f.flush()
            samples += len(chunk.audio)
            indices.append(chunk.index)
            if on_sentence is not None:
                on_sentence(len(indices) - 1, chunk)
    return {"seconds": samples / sample_rate, "sentences": len(indices), "indices": indices,
            "elapsed": time.perf_counter() - t0}


def read_text_file(path: str | Path) -> str:
    """--text_file's content; a missing or unreadable file is the user's to fix (one line, exit 2)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"--text_file {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise ConfigError(f"--text_file {path}: {e.strerror or e}") from None


def main(argv: list[str] | None = None) -> int:
    p = FlagParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", "--ckpt", dest="checkpoint", required=True)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="text to speak (any length: split into sentences)")
    src.add_argument("--text_file", help="UTF-8 text file; paragraphs are separated by blank lines")
    p.add_argument("--out", default="out.wav", help="output wav (everything, streamed sentence by sentence)")
    p.add_argument("--out_dir", default=None, help="with --text_file: one wav per paragraph in this folder instead")
    p.add_argument("--overwrite", action="store_true", help="replace the output wav(s) if it exists")
    p.add_argument("--speaker", default=None, help="speaker name or id (see --list_speakers)")
    p.add_argument("--list_speakers", action="store_true")
    p.add_argument("--noise_scale", type=float, default=None, help="default: the checkpoint config's (0.667 unless set)")
    p.add_argument("--length_scale", type=float, default=None,
                   help="> 1 speaks slower (default: the checkpoint config's, 1.0 unless set)")
    p.add_argument("--noise_scale_w", type=float, default=None,
                   help="the stochastic duration predictor's noise (default: the checkpoint config's, 0.8 unless set)")
    p.add_argument("--sentence_pause", type=float, default=0.3, help="seconds of silence between sentences")
    p.add_argument("--paragraph_pause", type=float, default=0.8, help="seconds of silence between paragraphs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (torch.set_num_threads)")
    args = p.parse_args(argv)
    args.checkpoint = str(resolve_checkpoint_arg(args.checkpoint))  # a run folder: its best.pt, else the newest
    if args.threads:
        torch.set_num_threads(args.threads)
    def body() -> int:
        for flag in ("sentence_pause", "paragraph_pause"):
            if getattr(args, flag) < 0:
                raise ConfigError(f"--{flag} must be >= 0 seconds, not {getattr(args, flag)}")
        if args.out_dir is not None and args.text_file is None:
            raise ConfigError("--out_dir goes with --text_file (one wav per paragraph); with --text use --out")
        if not args.list_speakers:
            check_apart(args.out_dir or args.out, "--out_dir" if args.out_dir else "--out",
                        {"--checkpoint": args.checkpoint, "--text_file": args.text_file}, "_speech")
            if args.out_dir is None:
                check_output_file(args.out, "--out")
            else:
                check_output_dir(args.out_dir, "--out_dir")
        model, cfg, speakers = load_generator(args.checkpoint, args.device)
        if args.list_speakers:
            print("\n".join(f"{i}\t{name}" for name, i in speakers.items()))
            return 0
        sid = resolve_speaker(args.speaker, speakers)
        scales = {k: getattr(cfg, k) if getattr(args, k) is None else getattr(args, k)  # as the export and the samples
                  for k in ("noise_scale", "length_scale", "noise_scale_w")}
        if scales["noise_scale"] < 0 or scales["noise_scale_w"] < 0 or scales["length_scale"] <= 0:
            raise ConfigError(f"--noise_scale and --noise_scale_w must be >= 0 and --length_scale > 0, got {scales}")
        if args.text is not None:
            jobs = [(args.text, Path(args.out))]
        else:
            text = read_text_file(args.text_file)
            if args.out_dir is None:
                jobs = [(text, Path(args.out))]
            else:
                jobs = [(para, Path(args.out_dir) / f"{i:04d}.wav") for i, para in enumerate(paragraphs(text))]
        for _, out in jobs:  # before any synthesis: an earlier result is never replaced silently
            refuse_to_replace(out, args.overwrite, "--out" if args.out_dir is None else "--out_dir: the file")
        synthesize(model, cfg, "salom", sid, device=args.device)  # warm-up (lazy inits), not timed
        torch.manual_seed(args.seed)
        for text, out in jobs:
            sentences = plan(text)
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                chunks = stream(model, cfg, sentences, sid, scales["noise_scale"], scales["length_scale"],
                                scales["noise_scale_w"], args.sentence_pause, args.paragraph_pause, args.device)
                stats = write_stream(chunks, out, cfg.audio.sample_rate, lambda i, c: print(
                    f"  [{i + 1}] {c.seconds:.2f} s | {normalize(c.text)}", flush=True))
            skipped = [s for i, (s, _) in enumerate(sentences) if i not in stats["indices"]]
            if skipped:
                print(f"note: skipped {len(skipped)} sentence(s) with nothing to say: {skipped[:3]}")
            print(f"{out}: {stats['sentences']} sentence(s), {stats['seconds']:.2f} s of audio in {stats['elapsed']:.3f} s, "
                  f"RTF {stats['elapsed'] / max(stats['seconds'], 1e-9):.3f} (text processing included)")
        return 0

    return exit_codes.run_main(body)


if __name__ == "__main__":
    sys.exit(main())
