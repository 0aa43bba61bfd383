"""Piper training checkpoints as `--init_from` sources.

Piper (`piper-tts`'s `python -m piper.train`, and the older `piper_train`) trains VITS in PyTorch
Lightning and saves a `.ckpt`: `state_dict` holds the generator (`model_g.*`, jaywalnut310's
`SynthesizerTrn`) and the critics (`model_d.*`, the same MultiPeriodDiscriminator as ours), and
`hyper_parameters` the sizes the Lightning module was built with. The voice's symbols, audio settings
and speakers live in the voice config the training wrote (`config.json`; the exported voice's
`.onnx.json` has the same keys). The file is read weights-only: tensors and plain data, plus the
`pathlib` paths older `piper_train` checkpoints keep in their hyper-parameters; anything else is
refused (`common.checkpoint.load_checkpoint`).

What differs from our names, and only that, is converted here: Lightning's prefixes, the old
weight-norm names (`weight_g`/`weight_v`), the coupling flow's list (Piper interleaves a `Flip`
module at every odd index; ours flips inside the block) and the attention's relative embeddings
(Piper stores them with a leading head axis of 1). Sizes Piper's `SynthesizerTrn` fixes in code
(posterior encoder, flow, duration predictor widths, critic periods) are `PIPER_FIXED`.
"""

from __future__ import annotations

import ast
import json
import pathlib
import re
from pathlib import Path
from typing import Any

import torch

from common.checkpoint import load_checkpoint, refuse_other_kind
from tts.vits.published.source import SourceError, SourceVoice
from vocoder.layouts import from_legacy_names

# Sizes that piper's SynthesizerTrn / attentions.Encoder fix in code (not hyper-parameters): posterior
# encoder WN(kernel 5, 16 layers), flow 4 × WN(kernel 5, 4 layers), deterministic duration predictor
# 256 filters, relative-attention window 4.
PIPER_FIXED: dict[str, Any] = {
    "window_size": 4, "posterior_kernel_size": 5, "n_layers_q": 16, "n_flows": 4, "flow_n_layers": 4,
    "flow_kernel_size": 5, "dp_filter_channels": 256,
}
# piper's MultiPeriodDiscriminator: periods 2..11 at full width (fixed in code); a checkpoint without
# critics leaves their shape to the recipe
PIPER_CRITICS: dict[str, Any] = {"mpd_periods": [2, 3, 5, 7, 11], "disc_channel_scale": 1.0}
# Piper's hyper-parameters that are `VitsArgs` keys of the same name, with piper's defaults (its
# VitsModel signature: the "medium" quality) for a checkpoint that does not store one.
PIPER_HPARAMS: dict[str, Any] = {
    "hidden_channels": 192, "inter_channels": 192, "filter_channels": 768, "n_heads": 2, "n_layers": 6,
    "kernel_size": 3, "resblock": "2", "resblock_kernel_sizes": [3, 5, 7],
    "resblock_dilation_sizes": [[1, 2], [2, 6], [3, 12]], "upsample_rates": [8, 8, 4],
    "upsample_initial_channel": 256, "upsample_kernel_sizes": [16, 16, 8], "use_sdp": True,
}
# our `AudioConfig` key -> (piper's hyper-parameter, its default)
PIPER_AUDIO: dict[str, tuple[str, Any]] = {
    "sample_rate": ("sample_rate", 22050), "n_fft": ("filter_length", 1024), "win_length": ("win_length", 1024),
    "hop_length": ("hop_length", 256), "n_mels": ("mel_channels", 80), "fmin": ("mel_fmin", 0.0),
    "fmax": ("mel_fmax", None),
}
PIPER_GIN_DEFAULT = 512  # piper's speaker-embedding width when a multi-speaker voice sets none (gin_channels 0)
# data-only classes older piper_train checkpoints hold in `hyper_parameters` (the dataset paths)
PLAIN_DATA = (pathlib.PosixPath, pathlib.WindowsPath, pathlib.PurePosixPath, pathlib.PureWindowsPath)
_FLOW = re.compile(r"^flow\.flows\.(\d+)\.")


def voice_config_path(ckpt_path: Path, given: str | Path | None) -> Path:
    """`--init_config`, else `config.json` beside the checkpoint, else the one `*.onnx.json` there."""
    if given is not None:
        path = Path(given)
        if not path.is_file():
            raise SourceError(f"--init_config {path}: no such file; give the voice's config.json (or its .onnx.json)")
        return path
    beside = ckpt_path.parent / "config.json"
    if beside.is_file():
        return beside
    onnx_json = sorted(ckpt_path.parent.glob("*.onnx.json"))
    if len(onnx_json) == 1:
        return onnx_json[0]
    raise SourceError(f"{ckpt_path}: no voice config beside it (config.json or one *.onnx.json): pass "
                      "--init_config PATH, the config.json the Piper voice was trained with or its .onnx.json "
                      "(it holds the phoneme_id_map that says which symbol each embedding row is)")


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SourceError(f"{path}: not a readable voice config ({type(e).__name__}: {str(e)[:120]}); give the "
                          "voice's config.json with --init_config") from None
    if not isinstance(data, dict):
        raise SourceError(f"{path}: a voice config is a JSON object, this is a {type(data).__name__}")
    return data


def _plain(value: Any) -> Any:
    """A hyper-parameter as plain lists (LightningCLI may keep `(8, 8, 4)` as a string, Lightning as tuples)."""
    if isinstance(value, str) and value[:1] in "([":
        value = ast.literal_eval(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def symbols_by_row(id_map: Any, rows: int, config: Path) -> tuple[list[str | None], list[str]]:
    """phoneme_id_map {symbol: [id]} -> the symbol of each embedding row (None: no symbol), and notes.
    A symbol written as several ids has no row of its own (a note says so)."""
    inconsistent = f"{config}: inconsistent phoneme_id_map"
    if not isinstance(id_map, dict) or not id_map:
        raise SourceError(f"{config}: no phoneme_id_map (the symbol of each embedding row); give the voice's own "
                          "config.json or .onnx.json with --init_config")
    symbols: list[str | None] = [None] * rows
    sequences, notes = [], []
    for symbol, ids in id_map.items():
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            raise SourceError(f"{inconsistent}: '{symbol}' maps to {ids!r}, not a list of ids")
        bad = [i for i in ids if not 0 <= i < rows]
        if bad:
            raise SourceError(f"{inconsistent}: '{symbol}' maps to id {bad[0]}, but the checkpoint's text embedding "
                              f"has {rows} rows: the config belongs to another voice; give the one trained with "
                              "this checkpoint with --init_config")
        if len(ids) != 1:
            sequences.append(symbol)
            continue
        if symbols[ids[0]] is not None:
            raise SourceError(f"{inconsistent}: '{symbols[ids[0]]}' and '{symbol}' both map to id {ids[0]}; give "
                              "the voice's own config with --init_config")
        symbols[ids[0]] = symbol
    if sequences:
        notes.append(f"{len(sequences)} Piper symbol(s) written as several ids have no row of their own: "
                     + " ".join(repr(s) for s in sequences))
    return symbols, notes


def _weights(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """`model_g.*` / `model_d.*` of a Lightning state_dict under our names (see the module docstring)."""
    out = {}
    for name, tensor in from_legacy_names({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}).items():
        flow = _FLOW.match(name)
        if flow:  # piper: flows.0 coupling, flows.1 Flip, flows.2 coupling... ; ours: couplings only
            name = f"flow.flows.{int(flow.group(1)) // 2}." + name[flow.end():]
        if name.endswith((".emb_rel_k", ".emb_rel_v")) and tensor.dim() == 3 and tensor.size(0) == 1:
            tensor = tensor[0]  # piper keeps the shared-heads axis [1, 2w+1, d]; ours is [2w+1, d]
        out[name] = tensor
    return out


def read(path: str | Path, config_path: str | Path | None = None) -> SourceVoice:
    """A Piper `.ckpt` (and its voice config) as a `SourceVoice`; SourceError for anything unusable."""
    path = Path(path)
    ckpt = load_checkpoint(path, plain_data=PLAIN_DATA)
    refuse_other_kind(path, ckpt, "vits")  # another trainer's file of this repo: say which and where it goes
    state = ckpt.get("state_dict")
    if not isinstance(state, dict) or "model_g.enc_p.emb.weight" not in state:
        raise SourceError(f"{path}: not a Piper voice checkpoint (no model_g.* generator in a Lightning state_dict); "
                          "--init_from reads this trainer's checkpoints, Piper training .ckpt files (with their "
                          "config.json) and transformers VitsModel folders")
    config = voice_config_path(path, config_path)
    voice = _read_json(config)
    hp = ckpt.get("hyper_parameters") if isinstance(ckpt.get("hyper_parameters"), dict) else {}
    rows = state["model_g.enc_p.emb.weight"].size(0)
    for where, n in (("hyper_parameters num_symbols", hp.get("num_symbols")), (f"{config} num_symbols",
                                                                               voice.get("num_symbols"))):
        if n is not None and n != rows:
            raise SourceError(f"{path}: its text embedding has {rows} rows but {where} is {n}: the checkpoint and "
                              "the config are of different voices; give the right config with --init_config")
    symbols, notes = symbols_by_row(voice.get("phoneme_id_map"), rows, config)

    audio = {ours: _plain(hp.get(theirs, default)) for ours, (theirs, default) in PIPER_AUDIO.items()}
    config_rate = (voice.get("audio") or {}).get("sample_rate")
    if config_rate is not None and "sample_rate" in hp and config_rate != audio["sample_rate"]:
        raise SourceError(f"{path}: trained at {audio['sample_rate']} Hz but {config} says {config_rate} Hz: the "
                          "checkpoint and the config are of different voices; give the right config with --init_config")
    audio["sample_rate"] = audio["sample_rate"] if "sample_rate" in hp else (config_rate or audio["sample_rate"])
    model_args = {**{k: _plain(hp.get(k, v)) for k, v in PIPER_HPARAMS.items()}, **PIPER_FIXED}
    model_args["resblock"] = str(model_args["resblock"])
    if model_args["use_sdp"]:
        del model_args["dp_filter_channels"]  # the stochastic predictor's width is the encoder's

    speakers: dict[str, int] = {}
    if "model_g.emb_g.weight" in state:
        n_speakers, width = state["model_g.emb_g.weight"].shape
        model_args["gin_channels"] = width
        id_map = voice.get("speaker_id_map") or {}
        if sorted(id_map.values()) != list(range(n_speakers)):
            if id_map:
                notes.append(f"{config}: speaker_id_map does not number the {n_speakers} speakers 0..{n_speakers - 1}; "
                             "the speakers are named by their ids")
            id_map = {str(i): i for i in range(n_speakers)}
        speakers = dict(sorted(id_map.items(), key=lambda kv: kv[1]))

    generator, discriminator = _weights(state, "model_g."), _weights(state, "model_d.")
    if discriminator:
        model_args.update(PIPER_CRITICS, use_spectral_norm=bool(hp.get("use_spectral_norm", False)))
    other = sorted({k.split(".")[0] for k in state if not k.startswith(("model_g.", "model_d."))})
    if other:
        notes.append(f"not used: {', '.join(other)} ({sum(k.split('.')[0] in other for k in state)} tensors; "
                     "model_mrd is piper's optional multi-resolution critic, which this trainer does not have)")
    phoneme_type = voice.get("phoneme_type", "espeak")
    espeak_voice = (voice.get("espeak") or {}).get("voice")
    if espeak_voice:
        notes.append(f"the Piper voice read espeak-ng voice '{espeak_voice}' phonemes (this run: espeak_voice of "
                     "the config)")
    if ckpt.get("optimizer_states"):
        notes.append("Piper's optimizer states are not carried over: the run starts new optimizers")
    licence = voice.get("licence") or voice.get("license")
    return SourceVoice(path=path, kind="piper", model_args=model_args, audio=audio, symbols=symbols,
                       generator=generator, discriminator=discriminator or None, speakers=speakers,
                       licence=str(licence) if licence else None,
                       phoneme_type=phoneme_type if phoneme_type in ("espeak", "text") else None, notes=notes)
