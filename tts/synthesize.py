"""Text (Latin or Cyrillic Uzbek, digits and all) → wav with a trained VITS checkpoint.

    python tts/synthesize.py --checkpoint runs/uzbek_vits/checkpoints/best.pt \
        --text "Salom, dunyo! Bugun 2024-yil 5-sentabr." --out salom.wav \
        [--speaker NAME|ID] [--noise_scale 0.667] [--length_scale 1.0] [--noise_scale_w 0.8]
    python tts/synthesize.py --checkpoint ... --text_file sentences.txt --out_dir out/   (one wav per line)

Prints the real-time factor (synthesis seconds / audio seconds), text processing included.
Unknown characters are dropped with a warning that names them.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch

from common.audio import save_wav
from common.checkpoint import CheckpointError, load_checkpoint
from common.config import ConfigError, load_config
from common.run_dir import check_output_dir, check_output_file
from tts.models.vits import VITS
from tts.models.vits_config import TrainConfig
from tts.text import SYMBOLS, intersperse, normalize, text_to_ids


def load_generator(path: str | Path, device: str | torch.device = "cpu", remove_wn: bool = True
                   ) -> tuple[VITS, TrainConfig, dict[str, int]]:
    """Checkpoint → (generator in eval mode, its training config, speakers name → id)."""
    ckpt = load_checkpoint(path)
    if "models" not in ckpt or "generator" not in ckpt["models"]:
        raise CheckpointError(f"{path}: not a VITS checkpoint from tts/train.py (no generator weights)")
    cfg = load_config(None, TrainConfig, extra=ckpt.get("config", {}))
    extra = ckpt.get("extra", {})
    speakers = dict(extra.get("speakers", {"speaker": 0}))
    if extra.get("symbols") and list(extra["symbols"]) != list(SYMBOLS):
        raise CheckpointError(f"{path} was trained with a different symbol set ({len(extra['symbols'])} symbols, "
                              f"this code has {len(SYMBOLS)}); fine-tune it with --init_from first")
    n_vocab = ckpt["models"]["generator"]["enc_p.emb.weight"].shape[0]
    model = VITS(n_vocab, cfg.audio.n_fft // 2 + 1, len(speakers), cfg.args(), cfg.audio.hop_length)
    model.load_state_dict(ckpt["models"]["generator"])
    model.eval()
    if remove_wn:
        model.remove_weight_norm()
    return model.to(device), cfg, speakers


def resolve_speaker(speaker: str | None, speakers: dict[str, int]) -> int:
    if speaker is None:
        return 0
    if speaker in speakers:
        return speakers[speaker]
    if speaker.isdigit() and int(speaker) < max(1, len(speakers)):
        return int(speaker)
    raise ConfigError(f"--speaker {speaker!r} is not in this model's speakers: {', '.join(speakers) or '(one)'}")


def text_to_input(text: str, add_blank: bool) -> torch.Tensor:
    ids = text_to_ids(normalize(text), on_unknown="warn")
    if not ids:
        raise ValueError(f"nothing to say in {text!r} after normalisation")
    return torch.tensor([intersperse(ids) if add_blank else ids], dtype=torch.long)


@torch.no_grad()
def synthesize(model: VITS, cfg: TrainConfig, text: str, sid: int = 0, noise_scale: float = 0.667,
               length_scale: float = 1.0, noise_scale_w: float = 0.8, device: str | torch.device = "cpu"
               ) -> torch.Tensor:
    """One sentence → waveform [T] (float, −1..1)."""
    x = text_to_input(text, cfg.data.add_blank).to(device)
    wav, _, _ = model.infer(x, torch.tensor([x.size(1)], device=device), torch.tensor([sid], device=device),
                            noise_scale, length_scale, noise_scale_w)
    return wav[0, 0].float().cpu()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text")
    src.add_argument("--text_file", help="UTF-8 file, one sentence per line")
    p.add_argument("--out", default="out.wav", help="output wav (with --text)")
    p.add_argument("--out_dir", default="synth_out", help="output folder (with --text_file)")
    p.add_argument("--speaker", default=None, help="speaker name or id (see --list_speakers)")
    p.add_argument("--list_speakers", action="store_true")
    p.add_argument("--noise_scale", type=float, default=0.667)
    p.add_argument("--length_scale", type=float, default=1.0, help="> 1 speaks slower")
    p.add_argument("--noise_scale_w", type=float, default=0.8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (torch.set_num_threads)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        if not args.list_speakers:
            if args.text is not None:
                check_output_file(args.out, "--out")
            else:
                check_output_dir(args.out_dir, "--out_dir")
        model, cfg, speakers = load_generator(args.checkpoint, args.device)
        if args.list_speakers:
            print("\n".join(f"{i}\t{name}" for name, i in speakers.items()))
            return 0
        sid = resolve_speaker(args.speaker, speakers)
        if args.text is not None:
            jobs = [(args.text, Path(args.out))]
        else:
            lines = [ln.strip() for ln in Path(args.text_file).read_text(encoding="utf-8").splitlines()]
            jobs = [(ln, Path(args.out_dir) / f"{i:04d}.wav") for i, ln in enumerate(lines) if ln]
        synthesize(model, cfg, "salom", sid, device=args.device)  # warm-up (lazy inits), not timed
        torch.manual_seed(args.seed)
        sr = cfg.audio.sample_rate
        for text, out in jobs:
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                wav = synthesize(model, cfg, text, sid, args.noise_scale, args.length_scale, args.noise_scale_w,
                                 args.device)
            elapsed = time.perf_counter() - t0
            save_wav(out, wav, sr)
            seconds = wav.numel() / sr
            print(f"{out}: {seconds:.2f} s of audio in {elapsed:.3f} s, RTF {elapsed / max(seconds, 1e-9):.3f} "
                  f"(text processing included) | {normalize(text)}")
    except (CheckpointError, ConfigError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
