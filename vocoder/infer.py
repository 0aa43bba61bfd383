"""Vocoder inference: the public API other packages use, and a copy-synthesis CLI.

API (stable; the TTS voice-cloning model calls it)::

    from vocoder.infer import load_vocoder
    voc = load_vocoder("runs/vocoder_demo/export")        # or a training checkpoint .pt
    mel = voc.mel(wav_tensor)                              # [B, T] -> [B, n_mels, frames]
    f0 = voc.f0(wav_numpy)                                 # [T] -> [frames] Hz
    out = voc(mel, torch.from_numpy(f0)[None])             # -> [B, frames * hop]

CLI::

    python vocoder/infer.py --model runs/vocoder/export --input wavs_or_folders_or_npz... --output out_dir

A ``.wav`` (or any audio) input is copy-synthesised (its mel and f0 re-synthesised); an
``.npz`` with ``mel`` ([n_mels, frames] or [frames, n_mels], natural-log mel) and ``f0``
([frames] Hz) is vocoded directly. Prints the real-time factor (compute seconds / audio seconds).
"""

from __future__ import annotations

import json
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import torch

from common import exit_codes
from common.checkpoint import CheckpointError, load_checkpoint, refuse_other_kind, resolve_checkpoint_arg
from common.cli import FlagParser
from common.errors import ConfigError
from common.run_dir import check_apart, check_output_dir, refuse_to_replace
from speech.audio import MelSpectrogram, load_audio, save_wav
from speech.f0 import check_f0_extractor, extract_f0
from speech.rmvpe import F0WeightsError
from vocoder.layouts import generator_args, split_checkpoint
from vocoder.model import Generator, remove_all_weight_norm

AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3", ".aif", ".aiff", ".opus")


class VocoderInference:
    """A loaded generator (eval mode, weight norm folded) plus its mel/f0 front end."""

    def __init__(self, generator: Generator, info: dict, device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        self.info = dict(info)
        self.sample_rate = int(info["sampling_rate"])
        self.hop_length = int(info["hop_size"])
        self.n_fft = int(info["n_fft"])
        self.win_length = int(info["win_size"])
        self.n_mels = int(info["num_mels"])
        self.fmin = float(info["fmin"])
        self.fmax = None if info.get("fmax") is None else float(info["fmax"])
        self.f0_min = float(info.get("f0_min", 65.0))
        self.f0_max = float(info.get("f0_max", 1100.0))
        self.pe = str(info.get("pe", "parselmouth"))
        self.pe_ckpt = info.get("pe_ckpt")  # pe=rmvpe's weights file
        self.mel_kwargs = dict(sample_rate=self.sample_rate, n_fft=self.n_fft, win_length=self.win_length,
                               hop_length=self.hop_length, n_mels=self.n_mels, fmin=self.fmin, fmax=self.fmax)
        self.generator = generator.to(self.device).eval()
        remove_all_weight_norm(self.generator)
        self._mel = MelSpectrogram(**self.mel_kwargs).to(self.device)

    @torch.no_grad()
    def mel(self, wav: torch.Tensor) -> torch.Tensor:
        """wav [B, T] (or [T]) in [-1, 1] at ``sample_rate`` -> log-mel [B, n_mels, T // hop]."""
        wav = torch.as_tensor(wav, dtype=torch.float32)
        if wav.dim() == 1:
            wav = wav[None]
        return self._mel(wav.to(self.device))

    def f0(self, wav: np.ndarray) -> np.ndarray:
        """f0 in Hz [len(wav) // hop] (unvoiced frames interpolated), frame-aligned with ``mel``."""
        wav = np.asarray(wav, dtype=np.float32).reshape(-1)
        f0, _ = extract_f0(wav, self.sample_rate, self.hop_length, len(wav) // self.hop_length,
                           self.f0_min, self.f0_max, self.pe, self.pe_ckpt)
        return f0

    @torch.no_grad()
    def __call__(self, mel: torch.Tensor, f0: torch.Tensor) -> torch.Tensor:
        """mel [B, n_mels, T] + f0 [B, T] (Hz) -> waveform [B, T * hop]."""
        if mel.dim() == 2:
            mel = mel[None]
        if f0.dim() == 1:
            f0 = f0[None]
        if mel.shape[1] != self.n_mels:
            raise ValueError(f"mel has {mel.shape[1]} bins but this vocoder expects {self.n_mels}")
        mel = mel.to(self.device, torch.float32)
        f0 = f0.to(self.device, torch.float32)
        return self.generator(mel, f0).squeeze(1)

    def copy_synthesize(self, wav: np.ndarray) -> np.ndarray:
        """Analyse a waveform (mel + f0) and re-synthesise it."""
        mel = self.mel(torch.from_numpy(np.asarray(wav, dtype=np.float32))[None])
        f0 = torch.from_numpy(self.f0(wav))[None]
        return self(mel, f0)[0].cpu().numpy()


def _read_export_folder(folder: Path) -> tuple[dict, dict]:
    cfg_file = folder / "config.json"
    ckpt_file = folder / "model.ckpt"
    if not cfg_file.is_file() or not ckpt_file.is_file():
        raise CheckpointError(f"{folder}: an exported vocoder folder needs model.ckpt and config.json")
    return load_checkpoint(ckpt_file), json.loads(cfg_file.read_text())


def load_vocoder(path: str | Path, device: str | torch.device = "cpu", ckpt: dict | None = None) -> VocoderInference:
    """Load a training checkpoint (.pt from vocoder/train.py), an exported folder (model.ckpt +
    config.json) or an exported model.ckpt file (config.json beside it). ``ckpt``: the file at `path` already
    loaded (a caller that first read which trainer wrote it loads it once)."""
    path = Path(path)
    if path.is_dir():
        obj, info = _read_export_folder(path)
    elif path.is_file():
        obj = load_checkpoint(path) if ckpt is None else ckpt
        info = None
        if (path.parent / "config.json").is_file() and "models" not in obj:
            info = json.loads((path.parent / "config.json").read_text())
    else:
        raise CheckpointError(f"vocoder not found: {path} (give a checkpoint file or an exported folder)")
    refuse_other_kind(path, obj, "vocoder", "vocoder_export")
    gen_state, _, ckpt_info = split_checkpoint(obj)
    info = info or ckpt_info
    if info is None:
        raise CheckpointError(f"{path}: no vocoder config found (expected config.json beside an exported model.ckpt)")
    generator = Generator(generator_args(info))
    missing, unexpected = generator.load_state_dict(gen_state, strict=False)
    if missing or unexpected:
        raise CheckpointError(f"{path}: weights do not fit the config (missing {missing[:5]}, unexpected {unexpected[:5]})")
    return VocoderInference(generator, info, device)


def _collect_inputs(inputs: list[str]) -> list[Path]:
    files = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            files += sorted(f for f in p.rglob("*") if f.suffix.lower() in (*AUDIO_SUFFIXES, ".npz"))
        elif p.is_file():
            files.append(p)
        else:
            raise ConfigError(f"input not found: {p}")
    return files


def _load_mel_f0(path: Path, n_mels: int) -> tuple[torch.Tensor, torch.Tensor]:
    if not zipfile.is_zipfile(path):  # np.load would call a text file "pickled data"
        raise ValueError(f"{path}: not a mel file (expected an .npz written by numpy.savez with arrays 'mel' and 'f0')")
    with np.load(path, allow_pickle=False) as data:
        if "mel" not in data or "f0" not in data:
            raise ValueError(f"{path}: an .npz input needs arrays 'mel' and 'f0'")
        mel, f0 = np.asarray(data["mel"], np.float32), np.asarray(data["f0"], np.float32).reshape(-1)
    if mel.ndim != 2 or n_mels not in mel.shape:
        raise ValueError(f"{path}: mel must be [n_mels={n_mels}, frames] or [frames, n_mels], got {mel.shape}")
    if mel.shape[0] != n_mels:
        mel = mel.T
    if mel.shape[1] != len(f0):
        raise ValueError(f"{path}: mel has {mel.shape[1]} frames but f0 has {len(f0)}")
    return torch.from_numpy(mel)[None], torch.from_numpy(f0)[None]


def check_vocodable(mel: torch.Tensor, f0: torch.Tensor) -> None:
    """ValueError when a mel (and its f0) cannot become audio: no frames (the convolutions would fail
    for the whole batch) or NaN / infinite values (the wav would be silence or noise, never an error)."""
    if mel.shape[-1] == 0:
        raise ValueError("0 frames: nothing to vocode")
    for name, x in (("mel", mel), ("f0", f0)):
        bad = int((~torch.isfinite(x)).sum())
        if bad:
            raise ValueError(f"{'all' if bad == x.numel() else bad} of its {x.numel()} {name} values are NaN or "
                             "infinite")


def synthesize_files(voc: VocoderInference, files: list[Path], out_dir: Path, log=print) -> dict:
    """Vocode every file into out_dir/<stem>.wav; a file that cannot be read or vocoded is reported
    (`skipped <file>: <reason>`) and the others are still vocoded. Returns {"files", "skipped",
    "audio_s", "compute_s", "rtf"}."""
    out_dir.mkdir(parents=True, exist_ok=True)
    audio_s = compute_s = 0.0
    done = skipped = 0
    for f in files:
        try:
            if f.suffix.lower() == ".npz":
                mel, f0 = _load_mel_f0(f, voc.n_mels)
            else:
                wav, _ = load_audio(f, sr=voc.sample_rate)
                mel = voc.mel(torch.from_numpy(wav)[None])
                f0 = torch.from_numpy(voc.f0(wav))[None]
            check_vocodable(mel, f0)
        except (ValueError, OSError) as e:
            log(f"skipped {f}: {e}")
            skipped += 1
            continue
        t0 = time.perf_counter()
        out = voc(mel, f0)[0].cpu().numpy()
        compute_s += time.perf_counter() - t0
        audio_s += len(out) / voc.sample_rate
        save_wav(out_dir / f"{f.stem}.wav", out, voc.sample_rate)
        done += 1
    rtf = compute_s / audio_s if audio_s else float("nan")
    log(f"vocoded {done} file(s), {audio_s:.1f} s of audio in {compute_s:.2f} s: RTF {rtf:.3f} "
        f"({1 / rtf if rtf == rtf and rtf > 0 else float('nan'):.1f}x real time) -> {out_dir}")
    return {"files": done, "skipped": skipped, "audio_s": audio_s, "compute_s": compute_s, "rtf": rtf}


def main(argv: list[str] | None = None) -> int:
    p = FlagParser(description="Vocode wav (copy-synthesis) or mel+f0 .npz files.")
    p.add_argument("--model", "--checkpoint", "--ckpt", dest="model", required=True, help="training checkpoint .pt or exported vocoder folder")
    p.add_argument("--input", nargs="+", required=True, help="audio files, .npz (mel, f0) files or folders")
    p.add_argument("--output", required=True, help="output folder for the wavs")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--overwrite", action="store_true", help="replace wavs already in --output (else refused)")
    p.add_argument("--pe_ckpt", default=None, help="rmvpe's weights for the f0 of audio inputs, where the model's "
                   "pe is rmvpe (default: the file its export or checkpoint recorded)")
    args = p.parse_args(argv)
    args.model = str(resolve_checkpoint_arg(args.model, "--model"))  # a run folder: its best.pt, else the newest

    def body() -> int:
        check_apart(args.output, "--output", {"--input": args.input, "--model": args.model}, "_vocoded")  # first
        check_output_dir(args.output, "--output")
        files = _collect_inputs(args.input)
        for f in files:  # before the model loads: a second run must not silently replace the first's wavs
            refuse_to_replace(Path(args.output) / f"{f.stem}.wav", args.overwrite, "--output")
        voc = load_vocoder(args.model, args.device)
        voc.pe_ckpt = args.pe_ckpt or voc.pe_ckpt
        if any(f.suffix.lower() != ".npz" for f in files):  # audio needs the model's f0 extractor: once, not per file
            try:
                check_f0_extractor(voc.pe, voc.pe_ckpt)
            except F0WeightsError as e:  # rmvpe's weights recorded elsewhere: say which flag gives them
                raise ConfigError(f"{e}; this model extracts f0 with pe={voc.pe}: give its weights with --pe_ckpt") from None
        if not files:
            raise ConfigError("no audio or .npz files in the given inputs")
        done = synthesize_files(voc, files, Path(args.output))
        if done["files"] == 0:
            print(f"error: none of the {len(files)} input file(s) could be vocoded (reasons above)", file=sys.stderr)
            return exit_codes.BAD_INPUT
        if done["skipped"]:
            print(f"error: {done['skipped']} of {len(files)} input file(s) could not be vocoded (reasons above); "
                  f"the other {done['files']} are in {args.output}", file=sys.stderr)
            return exit_codes.BAD_INPUT
        return exit_codes.OK

    return exit_codes.run_main(body)

if __name__ == "__main__":
    sys.exit(main())
