"""Export a trained generator in the layout DiffSinger and OpenUtau load.

    python vocoder/export.py --ckpt runs/vocoder/checkpoints/best.pt --out exports/my_vocoder [--onnx]

writes ``<out>/model.ckpt`` (``{"generator": state_dict}``, weight-norm tensors under the
classic ``weight_g`` / ``weight_v`` names that DiffSinger's ``NsfHifiGAN`` loads and then
folds) and ``<out>/config.json`` (the model args plus every mel/audio parameter:
``sampling_rate``, ``num_mels``, ``hop_size``, ``n_fft``, ``win_size``, ``fmin``, ``fmax``,
``pc_aug``, ``mini_nsf``, ``noise_sigma``; plus the f0 settings used in preprocessing). Point
DiffSinger's ``vocoder_ckpt`` at ``model.ckpt``. ``--onnx`` also writes ``<out>/model.onnx``
(inputs ``mel`` [1, frames, n_mels] natural-log mel and ``f0`` [1, frames] Hz; output
``waveform`` [1, samples]) and ``vocoder.yaml`` in the layout of an OpenUtau vocoder package.
``--oudep`` (implies ``--onnx``) also writes ``<out>.oudep`` beside the folder: the OpenUtau
dependency package a user drops onto OpenUtau's window to install the vocoder (`write_oudep`).
``<out>/README.md`` is the model card (`common.model_card`): steps, held-out figures, data and licences.

The checkpoint layouts it reads and the names it writes live in ``vocoder/layouts.py``.
"""

from __future__ import annotations

import json
import re
import sys
import warnings
import zipfile
from pathlib import Path

import torch

from common import exit_codes
from common.atomic_write import atomic_output, write_text
from common.checkpoint import (
    CheckpointError,
    load_checkpoint,
    refuse_other_kind,
    resolve_checkpoint_arg,
    save_atomic,
)
from common.cli import FlagParser
from common.model_card import checkpoint_facts, write_model_card
from common.run_dir import check_apart, check_output_dir
from vocoder.layouts import generator_args, split_checkpoint, to_legacy_names
from vocoder.model import Generator, remove_all_weight_norm

# what vocoder.yaml needs (OpenUtau checks each against the acoustic model before it renders)
MEL_KEYS = ("sampling_rate", "num_mels", "hop_size", "n_fft", "win_size", "fmin", "fmax")
# the config keys the model card lists first
CARD_KEYS = ("audio.sample_rate", "audio.hop_length", "audio.n_mels", "pe", "model_args.upsample_initial_channel",
             "model_args.mini_nsf", "batch_size", "crop_mel_frames", "generator_optimizer_args.lr", "precision")


def export(ckpt_path: str | Path, out_dir: str | Path, onnx: bool = False, oudep: bool = False) -> Path:
    """Write model.ckpt + config.json (and optionally model.onnx + vocoder.yaml, and with `oudep` the
    OpenUtau package ``<out_dir>.oudep`` beside the folder) into out_dir. A checkpoint that cannot give
    every file asked for is refused before anything is written."""
    obj = load_checkpoint(ckpt_path)
    refuse_other_kind(ckpt_path, obj, "vocoder")
    gen_state, _, info = split_checkpoint(obj)
    if info is None:
        raise CheckpointError(f"{ckpt_path}: not a training checkpoint of this repo (no model/mel settings in it)")
    missing = [k for k in MEL_KEYS if k not in info]
    if (onnx or oudep) and missing:
        raise CheckpointError(
            f"{ckpt_path}: its export settings lack the mel settings {', '.join(missing)} that OpenUtau's "
            "vocoder.yaml needs; export a checkpoint that vocoder/train.py of this repo wrote (it records them), "
            "or leave out --onnx/--oudep")
    generator = Generator(generator_args(info))
    generator.load_state_dict(gen_state)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_atomic({"generator": to_legacy_names(generator.state_dict())}, out / "model.ckpt", note="")
    write_text(out / "config.json", json.dumps(info, indent=1))
    if onnx or oudep:
        export_onnx(generator, info, out)
    if oudep:
        write_oudep(out, info)
    write_model_card(out, **checkpoint_facts(obj, ckpt_path), export="vocoder/export.py", key_config=CARD_KEYS)
    return out


class _OnnxWrapper(torch.nn.Module):
    """mel [1, frames, n_mels] + f0 [1, frames] -> waveform [1, samples] (DiffSinger's ONNX I/O)."""

    def __init__(self, generator: Generator):
        super().__init__()
        self.generator = generator

    def forward(self, mel: torch.Tensor, f0: torch.Tensor) -> torch.Tensor:
        return self.generator(mel.transpose(1, 2), f0).squeeze(1)


def export_onnx(generator: Generator, info: dict, out: Path) -> Path:
    generator = generator.eval()
    remove_all_weight_norm(generator)
    frames = 20
    mel = torch.randn(1, frames, info["num_mels"])
    f0 = torch.full((1, frames), 220.0)
    path = out / "model.onnx"
    # The TorchScript exporter (dynamo=False) handles the data-dependent source cleanly; its
    # deprecation and constant-folding notices are noise for this graph.
    with warnings.catch_warnings(), atomic_output(path) as tmp:
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _OnnxWrapper(generator), (mel, f0), str(tmp), input_names=["mel", "f0"], output_names=["waveform"],
            dynamic_axes={"mel": {1: "n_frames"}, "f0": {1: "n_frames"}, "waveform": {1: "n_samples"}},
            opset_version=17, dynamo=False,
        )
    write_text(out / "vocoder.yaml", vocoder_yaml(info, out.name, path.name))
    return path


def vocoder_yaml(info: dict, name: str, model: str) -> str:
    """OpenUtau's vocoder.yaml: the keys of ``DsVocoderConfig`` (OpenUtau.Core/DiffSinger/DiffSingerVocoder.cs;
    OpenUtau ignores keys it does not know). `model` is the ONNX file's name beside it."""
    import yaml

    fmax = info["fmax"] if info["fmax"] is not None else info["sampling_rate"] / 2
    return yaml.safe_dump({
        "name": name, "model": model, "sample_rate": info["sampling_rate"], "hop_size": info["hop_size"],
        "win_size": info["win_size"], "fft_size": info["n_fft"], "num_mel_bins": info["num_mels"],
        "mel_fmin": info["fmin"], "mel_fmax": fmax, "mel_base": "e", "mel_scale": "slaney",
        "pitch_controllable": bool(info.get("pc_aug", False)), "force_on_cpu": False,
    }, sort_keys=False)


def package_id(name: str) -> str:
    """An OpenUtau package id from a folder name: lowercase letters, digits, '-' and '.' only (the rule
    of OpenUtau's package index); it names the folder the package unpacks into, which a voicebank's
    dsconfig.yaml names as its ``vocoder``."""
    return re.sub(r"[^a-z0-9.-]+", "-", name.lower()).strip("-.") or "vocoder"


def oudep_path(out: str | Path) -> Path:
    """Where `write_oudep` puts the package of the export folder `out`: beside it, named after it."""
    folder = Path(out).resolve()  # "." or "exports/v/" still name the folder
    return folder.parent / f"{folder.name}.oudep"


def write_oudep(out: Path, info: dict, version: str = "1.0") -> Path:
    """``<out>.oudep`` beside the export folder: OpenUtau's dependency package, a zip of ``oudep.yaml``,
    the ONNX vocoder and ``vocoder.yaml``.

    The format is stakira/OpenUtau's ``OpenUtau.Core/PackageManager.cs`` (``OudepMetadata``,
    ``InstallFromStreamAsync``): the zip must hold ``oudep.yaml`` at its root; its ``id`` (older OpenUtau,
    ``OpenUtau.Core/DependencyInstaller.cs``: ``name``; both are written) names the folder
    ``Dependencies/<id>`` every entry unpacks into; ``version`` and ``description`` are shown by its package
    manager. ``OpenUtau.Core/DiffSinger/DiffSingerVocoder.cs`` then loads ``Dependencies/<id>/vocoder.yaml``
    and the ONNX file its ``model`` names. Written whole or not at all (`atomic_output`)."""
    import yaml

    path = oudep_path(out)
    pid = package_id(path.stem)
    metadata = {
        "id": pid, "name": pid, "version": version,
        "description": (f"NSF-HiFiGAN vocoder, {info['sampling_rate']} Hz, hop {info['hop_size']}, "
                        f"{info['num_mels']} mel bins (vocoder/export.py)"),
    }
    with atomic_output(path) as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("oudep.yaml", yaml.safe_dump(metadata, sort_keys=False))
        z.write(out / "model.onnx", "model.onnx")
        z.writestr("vocoder.yaml", vocoder_yaml(info, pid, "model.onnx"))
    return path


def main(argv: list[str] | None = None) -> int:
    p = FlagParser(description="Export a vocoder generator for DiffSinger / OpenUtau.")
    p.add_argument("--ckpt", "--checkpoint", dest="ckpt", required=True, help="training checkpoint (.pt) of vocoder/train.py, or its run folder (best.pt, else the newest)")
    p.add_argument("--out", required=True, help="output folder (model.ckpt + config.json)")
    p.add_argument("--onnx", action="store_true", help="also write model.onnx + vocoder.yaml (OpenUtau)")
    p.add_argument("--oudep", action="store_true",
                   help="also write <out>.oudep beside the folder: the OpenUtau dependency package (implies --onnx)")
    args = p.parse_args(argv)
    args.ckpt = str(resolve_checkpoint_arg(args.ckpt, "--ckpt"))  # a run folder: its best.pt, else the newest
    made = not Path(args.out).exists()

    def body() -> int:
        check_apart(args.out, "--out", {"--ckpt": args.ckpt}, "_export")  # beside the checkpoint's folder: fine
        check_output_dir(args.out, "--out")  # first: a bad --out is told before the checkpoint is read
        out = export(args.ckpt, args.out, args.onnx, args.oudep)
        print(f"exported generator -> {out / 'model.ckpt'} + {out / 'config.json'} + {out / 'README.md'}"
              + (f" + {out / 'model.onnx'}" if args.onnx or args.oudep else "")
              + (f"; OpenUtau package {oudep_path(out)}" if args.oudep else ""))
        return 0

    def remove_probe() -> None:
        """The folder the output check made, still empty: a refused export leaves nothing behind."""
        if made and Path(args.out).is_dir() and not any(Path(args.out).iterdir()):
            Path(args.out).rmdir()

    return exit_codes.run_main(body, cleanup=remove_probe)

if __name__ == "__main__":
    sys.exit(main())
