"""The vocoder's checkpoint layouts and weight-norm names, in one place that the trainer, the loaders and the
export command all read.

Why a module of its own: the training model is built from ``export_info(cfg)`` (the config.json a checkpoint
records) through ``generator_args``, and starting from a checkpoint (``--init_from``, ``vocoder/infer.py``,
serve, the TTS decoders) reads any layout through ``split_checkpoint``. None of that is exporting; when it
lived in ``vocoder/export.py`` the trainer was built through the export command's module.

The layouts: our training checkpoints (``models`` / ``extra.export``), exported ``{"generator": ...}``
files (DiffSinger / OpenUtau, weight norm under the classic ``weight_g`` / ``weight_v`` names) and
Lightning checkpoints of openvpi/SingingVocoders (``state_dict`` with ``generator.`` / ``discriminator.``
prefixes), with either weight-norm naming.
"""

from __future__ import annotations

import torch

from common.checkpoint import CheckpointError
from vocoder.model import GeneratorArgs

_NEW = ("parametrizations.weight.original0", "parametrizations.weight.original1")
_OLD = ("weight_g", "weight_v")


def to_legacy_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """parametrizations.weight.original0/1 -> weight_g/weight_v (torch.nn.utils.weight_norm names)."""
    out = {}
    for k, v in state.items():
        for new, old in zip(_NEW, _OLD):
            if k.endswith(new):
                k = k[: -len(new)] + old
        out[k] = v
    return out


# spectral norm (torch.nn.utils.spectral_norm hook API) -> parametrizations.spectral_norm names
_SPECTRAL = {"weight_orig": "parametrizations.weight.original", "weight_u": "parametrizations.weight.0._u",
             "weight_v": "parametrizations.weight.0._v"}


def from_legacy_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Old hook-API names -> our parametrization names: weight norm's weight_g/weight_v ->
    original0/1, spectral norm's weight_orig/weight_u/weight_v -> original, 0._u, 0._v. A layer
    with a ``weight_orig`` is spectral-normed: its ``weight_v`` is the power-iteration vector."""
    spectral = {k[: -len("weight_orig")] for k in state if k == "weight_orig" or k.endswith(".weight_orig")}
    out = {}
    for k, v in state.items():
        prefix, leaf = k[: len(k) - len(k.rpartition(".")[2])], k.rpartition(".")[2]
        if prefix in spectral and leaf in _SPECTRAL:
            k = prefix + _SPECTRAL[leaf]
        elif leaf in _OLD:
            k = prefix + _NEW[_OLD.index(leaf)]
        out[k] = v
    return out


def export_info(cfg) -> dict:
    """config.json content for a VocoderConfig: generator args + every mel/audio parameter."""
    m = cfg.model_args
    return {
        "sampling_rate": cfg.audio.sample_rate,
        "num_mels": cfg.audio.n_mels,
        "hop_size": cfg.audio.hop_length,
        "n_fft": cfg.audio.n_fft,
        "win_size": cfg.audio.win_length,
        "fmin": cfg.audio.fmin,
        "fmax": cfg.audio.fmax,
        "mel_base": "e",
        "upsample_rates": list(m.upsample_rates),
        "upsample_kernel_sizes": list(m.upsample_kernel_sizes),
        "upsample_initial_channel": m.upsample_initial_channel,
        "resblock": str(m.resblock),
        "resblock_kernel_sizes": list(m.resblock_kernel_sizes),
        "resblock_dilation_sizes": [list(d) for d in m.resblock_dilation_sizes],
        "discriminator_periods": list(m.discriminator_periods),
        "mini_nsf": m.mini_nsf,
        "noise_sigma": m.noise_sigma,
        "harmonic_num": m.harmonic_num,
        "pc_aug": cfg.pc_aug,
        "pe": cfg.pe,
        "pe_ckpt": cfg.pe_ckpt or None,  # pe=rmvpe: the weights file inference extracts f0 with
        "f0_min": cfg.f0_min,
        "f0_max": cfg.f0_max,
    }


def generator_args(info: dict) -> GeneratorArgs:
    """GeneratorArgs from an export_info dict (or a DiffSinger config.json)."""
    try:
        return GeneratorArgs(
            sampling_rate=int(info["sampling_rate"]), num_mels=int(info["num_mels"]), hop_size=int(info["hop_size"]),
            upsample_rates=list(info["upsample_rates"]), upsample_kernel_sizes=list(info["upsample_kernel_sizes"]),
            upsample_initial_channel=int(info["upsample_initial_channel"]), resblock=str(info["resblock"]),
            resblock_kernel_sizes=list(info["resblock_kernel_sizes"]),
            resblock_dilation_sizes=[list(d) for d in info["resblock_dilation_sizes"]],
            mini_nsf=bool(info.get("mini_nsf", False)), noise_sigma=float(info.get("noise_sigma") or 0.0),
            harmonic_num=int(info.get("harmonic_num", 8)),
        )
    except KeyError as e:
        raise CheckpointError(f"vocoder config lacks the key {e}; it needs the NSF-HiFiGAN model args and mel settings") from None


def split_checkpoint(obj: dict) -> tuple[dict, dict | None, dict | None]:
    """(generator state, discriminator state or None, export info or None) from any supported
    layout, with our parameter names."""
    if "models" in obj and "generator" in obj["models"]:  # our training checkpoint
        info = (obj.get("extra") or {}).get("export")
        return obj["models"]["generator"], obj["models"].get("discriminator"), info
    if "generator" in obj and isinstance(obj["generator"], dict):  # exported / DiffSinger
        return from_legacy_names(obj["generator"]), None, None
    if "state_dict" in obj:  # Lightning (SingingVocoders)
        sd = obj["state_dict"]
        gen = {k[len("generator."):]: v for k, v in sd.items() if k.startswith("generator.")}
        disc = {k[len("discriminator."):]: v for k, v in sd.items() if k.startswith("discriminator.")}
        if not gen:
            raise CheckpointError("the checkpoint's state_dict has no 'generator.*' weights")
        return from_legacy_names(gen), (from_legacy_names(disc) or None), None
    raise CheckpointError(
        "unrecognised checkpoint layout: expected a training checkpoint of this repo ('models'), an exported "
        "vocoder ({'generator': ...}) or a Lightning checkpoint with a 'state_dict'"
    )
