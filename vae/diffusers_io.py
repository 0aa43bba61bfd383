"""Save/load our AutoencoderKL in diffusers' `AutoencoderKL` folder layout (config.json + weights).

Why: users train a VAE to put it into a diffusion pipeline (`AutoencoderKL.from_pretrained(folder)`).
The key names below are diffusers' (`encoder.down_blocks.{i}.resnets.{j}.conv_shortcut`,
`decoder.up_blocks.{i}` counted from the LOWEST resolution, `mid_block.attentions.0.to_q`, ...);
ours are CompVis-like (`encoder.down.{i}.blocks.{j}.skip`, `decoder.up.{level}` counted from full
resolution). The mapping is a pure rename: every tensor keeps its shape. diffusers itself is not
needed to write or read the folder.

`export_final` is the end of a training run: the latent statistics (scaling factor), `vae_final.pt`
and this folder, with the latent factors the pipelines need (`export_factors`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from common.atomic_write import write_text
from common.checkpoint import TRAINER_FIELD, CheckpointError, load_checkpoint, save_atomic
from common.config import config_to_dict
from common.errors import InputNotFoundError
from common.log import RunLogger
from common.model_card import write_model_card
from common.precision import Precision
from common.safetensors_io import load_safetensors, save_safetensors
from vae.config import VAEConfig
from vae.data import eval_loader, read_json
from vae.metrics import latent_statistics
from vae.model import AutoencoderKL, build_vae

WEIGHTS_SAFETENSORS = "diffusion_pytorch_model.safetensors"
WEIGHTS_BIN = "diffusion_pytorch_model.bin"
INIT_RECORD = "init_from.json"  # written by `--init_from` a diffusers folder: that folder's latent factors
# diffusers' AutoencoderKL default (SD 1.x/2.x's factor): what diffusers uses for a config.json without
# the key, as folders saved by early diffusers versions are.
DEFAULT_SCALING_FACTOR = 0.18215

_RES = {"skip": "conv_shortcut"}  # ResBlock parts that are renamed; norm1/conv1/norm2/conv2 match
_ATTN = {"norm": "group_norm", "q": "to_q", "k": "to_k", "v": "to_v", "proj": "to_out.0"}
_TOP = {"conv_in": "conv_in", "norm_out": "conv_norm_out", "conv_out": "conv_out"}


def _mid_to_diffusers(rest: str) -> str:
    part, tail = rest.split(".", 1)
    if part == "block_1":
        return f"mid_block.resnets.0.{_res(tail)}"
    if part == "block_2":
        return f"mid_block.resnets.1.{_res(tail)}"
    if part == "attn":
        name, param = tail.rsplit(".", 1)
        return f"mid_block.attentions.0.{_ATTN[name]}.{param}"
    raise KeyError(rest)


def _res(tail: str) -> str:
    name, param = tail.split(".", 1)
    return f"{_RES.get(name, name)}.{param}"


def to_diffusers_key(key: str, num_levels: int) -> str:
    """One of our state-dict keys → the diffusers AutoencoderKL key."""
    if key.startswith(("quant_conv.", "post_quant_conv.")):
        return key
    side, rest = key.split(".", 1)
    head = rest.split(".", 1)[0]
    if head in _TOP:
        return f"{side}.{_TOP[head]}.{rest.split('.', 1)[1]}"
    if head == "mid":
        return f"{side}.{_mid_to_diffusers(rest.split('.', 1)[1])}"
    m = re.fullmatch(r"(down|up)\.(\d+)\.(blocks\.(\d+)|downsample|upsample)\.(.+)", rest)
    if m is None:
        raise KeyError(f"no diffusers name for '{key}'")
    kind, level, block, tail = m.group(1), int(m.group(2)), m.group(4), m.group(5)
    if kind == "down":
        prefix = f"down_blocks.{level}"
    else:  # diffusers runs the decoder's up_blocks from the lowest resolution
        prefix = f"up_blocks.{num_levels - 1 - level}"
    if block is not None:
        return f"{side}.{prefix}.resnets.{block}.{_res(tail)}"
    sampler = "downsamplers" if kind == "down" else "upsamplers"
    return f"{side}.{prefix}.{sampler}.0.{tail}"


def to_diffusers(state_dict: dict[str, torch.Tensor], num_levels: int) -> dict[str, torch.Tensor]:
    return {to_diffusers_key(k, num_levels): v for k, v in state_dict.items()}


def from_diffusers(state_dict: dict[str, torch.Tensor], model: AutoencoderKL) -> dict[str, torch.Tensor]:
    """diffusers keys → ours, checked against `model`: a missing, extra or wrongly shaped tensor is
    an error naming the key (a folder from another architecture must not half-load)."""
    n = len(model.channels)
    own = model.state_dict()
    inverse = {to_diffusers_key(k, n): k for k in own}
    out: dict[str, torch.Tensor] = {}
    unexpected = [k for k in state_dict if k not in inverse]
    missing = [k for k in inverse if k not in state_dict]
    if unexpected or missing:
        raise KeyError(f"diffusers weights do not match this architecture: missing {missing[:5]}, "
                       f"unexpected {unexpected[:5]} ({len(missing)} missing, {len(unexpected)} unexpected)")
    for dkey, ours in inverse.items():
        tensor = state_dict[dkey]
        if tuple(tensor.shape) != tuple(own[ours].shape):
            raise ValueError(f"{dkey}: shape {tuple(tensor.shape)} but the model expects {tuple(own[ours].shape)}")
        out[ours] = tensor
    return out


def diffusers_config(model: AutoencoderKL, sample_size: int = 512, scaling_factor: float = DEFAULT_SCALING_FACTOR,
                     shift_factor: float | None = None) -> dict:
    """The `config.json` diffusers' AutoencoderKL reads (newer keys are ignored by older diffusers)."""
    n = len(model.channels)
    return {
        "_class_name": "AutoencoderKL",
        "_diffusers_version": "0.30.0",
        "act_fn": "silu",
        "block_out_channels": list(model.channels),
        "down_block_types": ["DownEncoderBlock2D"] * n,
        "up_block_types": ["UpDecoderBlock2D"] * n,
        "in_channels": model.in_channels,
        "out_channels": model.out_channels,
        "latent_channels": model.z_channels,
        "layers_per_block": model.layers_per_block,
        "norm_num_groups": model.norm_num_groups,
        "sample_size": int(sample_size),
        "scaling_factor": float(scaling_factor),
        "shift_factor": None if shift_factor is None else float(shift_factor),
        "latents_mean": None,
        "latents_std": None,
        "force_upcast": True,
        "use_quant_conv": model.use_quant_conv,
        "use_post_quant_conv": model.use_quant_conv,
        "mid_block_add_attention": model.mid_attention,
    }


# The latent layout (downsampling factor, channels) whose pipelines shift latents before scaling:
# diffusers' StableDiffusion3Pipeline and FluxPipeline encode (z - shift_factor) * scaling_factor and
# decode z / scaling_factor + shift_factor. SD 1.x/2.x and SDXL (f8c4) read only scaling_factor.
SHIFTED_LAYOUT = (8, 16)


def latent_layout(model: AutoencoderKL) -> tuple[int, int]:
    """(spatial downsampling factor, latent channels): (8, 4) for SD, (8, 16) for SD3/FLUX."""
    return 2 ** (len(model.channels) - 1), model.z_channels


def pipeline_factors(model: AutoencoderKL, stats: dict) -> dict[str, float | None]:
    """`scaling_factor` and `shift_factor` for config.json from `latent_statistics`' output: the shift
    (the latent mean) only for the f8c16 layout, whose pipelines subtract it; None (not applied)
    otherwise, where no diffusers pipeline reads it (it stays in latent_stats.json)."""
    shift = stats["shift_factor"] if latent_layout(model) == SHIFTED_LAYOUT else None
    return {"scaling_factor": float(stats["scaling_factor"]), "shift_factor": shift}


def save_diffusers(model: AutoencoderKL, folder: str | Path, sample_size: int = 512,
                   scaling_factor: float = DEFAULT_SCALING_FACTOR, shift_factor: float | None = None) -> Path:
    """Writes `folder/config.json` and the weights as `diffusion_pytorch_model.safetensors`
    (`common.safetensors_io`), the file diffusers reads first."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().float().cpu().contiguous() for k, v in to_diffusers(model.state_dict(), len(model.channels)).items()}
    save_safetensors(sd, folder / WEIGHTS_SAFETENSORS)
    cfg = diffusers_config(model, sample_size, scaling_factor, shift_factor)
    write_text(folder / "config.json", json.dumps(cfg, indent=2) + "\n")
    return folder


# diffusers before 0.15 named the middle attention's parts `query/key/value/proj_attn` (many hub
# folders, e.g. SD 1.x VAEs, still do); diffusers renames them on load, and so do we.
_DEPRECATED_ATTN = {"query": "to_q", "key": "to_k", "value": "to_v", "proj_attn": "to_out.0"}


def _modern_key(key: str) -> str:
    m = re.fullmatch(r"(.+\.mid_block\.attentions\.0\.)(query|key|value|proj_attn)\.(weight|bias)", key)
    return f"{m.group(1)}{_DEPRECATED_ATTN[m.group(2)]}.{m.group(3)}" if m else key


def weights_file(folder: Path) -> Path:
    """The folder's weights: safetensors first (cannot carry code), then the pickled .bin; the fp16
    variants (`diffusion_pytorch_model.fp16.*`) when the plain files are absent."""
    for name in (WEIGHTS_SAFETENSORS, WEIGHTS_BIN, "diffusion_pytorch_model.fp16.safetensors",
                 "diffusion_pytorch_model.fp16.bin"):
        if (folder / name).is_file():
            return folder / name
    raise InputNotFoundError(f"{folder}: neither {WEIGHTS_SAFETENSORS} nor {WEIGHTS_BIN} found")


def read_diffusers_folder(folder: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    """(weights with today's diffusers key names in fp32, config.json) of an AutoencoderKL folder, read
    safely: safetensors by `common.safetensors_io`, a .bin only by `torch.load(weights_only=True)`."""
    folder = Path(folder)
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise InputNotFoundError(f"{folder}: no config.json; expected a diffusers AutoencoderKL folder")
    again = f"download {folder} again (its config.json and weights), or give another folder"
    cfg = read_json(cfg_path, again, CheckpointError)
    if cfg.get("_class_name", "AutoencoderKL") != "AutoencoderKL":
        raise CheckpointError(f"{cfg_path}: _class_name is {cfg.get('_class_name')!r}, not AutoencoderKL; "
                              "give the folder of a VAE (a pipeline's vae/ subfolder)")
    try:
        arch = arch_from_config(cfg)
        usable = (isinstance(arch["channels"], list) and arch["channels"] and all(
            isinstance(arch[k], int) for k in ("z_channels", "layers_per_block", "in_channels", "out_channels",
                                               "norm_num_groups")) and all(isinstance(c, int) for c in arch["channels"]))
    except (KeyError, TypeError):
        usable = False
    if not usable:
        raise CheckpointError(f"{cfg_path} is damaged (no usable block_out_channels, latent_channels, "
                              f"layers_per_block, ...: the keys of an AutoencoderKL config); {again}")
    path = weights_file(folder)
    raw = load_safetensors(path) if path.suffix == ".safetensors" else load_checkpoint(path)
    sd = {}
    for k, v in raw.items():
        k = _modern_key(k)
        if k.endswith(("to_q.weight", "to_k.weight", "to_v.weight", "to_out.0.weight")) and v.dim() == 4:
            v = v[:, :, 0, 0]  # very old conversions stored the attention projections as 1x1 convs
        sd[k] = v.float() if v.is_floating_point() else v
    return sd, cfg


def arch_from_config(cfg: dict) -> dict:
    """Our `arch()` dict from a diffusers config.json, with diffusers' defaults for absent keys."""
    return {"channels": list(cfg["block_out_channels"]), "z_channels": cfg.get("latent_channels", 4),
            "layers_per_block": cfg.get("layers_per_block", 1), "in_channels": cfg.get("in_channels", 3),
            "out_channels": cfg.get("out_channels", 3), "norm_num_groups": cfg.get("norm_num_groups", 32),
            "mid_attention": cfg.get("mid_block_add_attention", True),
            "use_quant_conv": cfg.get("use_quant_conv", True)}


# No VAE of this layout comes near this (SD's and FLUX's AutoencoderKL: 84M parameters): a file declaring
# more is refused before anything is built, whatever it holds.
MAX_VAE_PARAMS = 2**30


def declared_model(source: str | Path, arch: dict, stored: dict, what: str = "its arch",
                   fix: str = "give the file again") -> AutoencoderKL:
    """The model `arch` (a checkpoint's `arch`, a folder's config.json) declares, built on the meta device
    (shapes, no memory), once its size is known to match the `stored` tensors (the file's weights for it):
    as many values, and at most `MAX_VAE_PARAMS`. Else CheckpointError naming `source` (then `fix`), before
    any memory is allocated for the model: a few bytes of config can declare a 360 GB model."""
    held = sum(t.numel() for t in stored.values() if isinstance(t, torch.Tensor))
    channels, blocks = arch.get("channels", ()), arch.get("layers_per_block", 1)
    # every level holds at least one block of 8 tensors: a layout of more levels x blocks than the file has
    # tensors is refused before even the meta build walks it (channels [32] * 10**6 from a few MB of JSON)
    if isinstance(channels, list | tuple) and isinstance(blocks, int) and len(channels) * blocks > len(stored):
        raise CheckpointError(f"{source}: {what} declares {len(channels)} levels of {blocks} blocks each, but its weights "
                              f"are {len(stored)} tensors (a block alone has 8): not that model's weights; refused "
                              f"before building it; {fix}")
    with torch.device("meta"):
        shell = build_vae(arch)
    declared = sum(p.numel() for p in shell.state_dict().values())
    if declared > MAX_VAE_PARAMS or declared != held:
        beyond = f", beyond the {MAX_VAE_PARAMS:,} of any VAE of this layout" if declared > MAX_VAE_PARAMS else ""
        raise CheckpointError(
            f"{source}: {what} declares a model of {declared:,} parameters ({declared * 4 / 2**30:.3g} GiB as fp32"
            f"{beyond}), but its weights hold {held:,} values: not that model's weights; refused before building "
            f"it; {fix}")
    return shell


def load_diffusers(folder: str | Path, fix: str = "give another folder") -> tuple[AutoencoderKL, dict]:
    """Reads a diffusers AutoencoderKL folder into our model; returns (model, config.json dict). The model
    its config.json declares is built only once the weights are known to be its (`declared_model`)."""
    folder = Path(folder)
    sd, cfg = read_diffusers_folder(folder)
    arch = arch_from_config(cfg)
    state = from_diffusers(sd, declared_model(folder, arch, sd, "its config.json", fix))  # names and shapes
    model = build_vae(arch)
    model.load_state_dict(state)
    return model, cfg


# ----------------------------------------------------------------------------- the end-of-run export


def export_factors(cfg: VAEConfig, out_dir: Path, measured: dict[str, float | None]) -> tuple[dict, list[str]]:
    """The factors to write into the exported config.json and the lines that explain the choice."""
    record = out_dir / INIT_RECORD
    if not record.is_file():
        return measured, []
    init = json.loads(record.read_text(encoding="utf-8"))
    old = {"scaling_factor": init.get("scaling_factor"), "shift_factor": init.get("shift_factor")}
    if old["scaling_factor"] is None:
        return measured, [f"{init['init_from']} had no scaling_factor: exporting the measured factors"]

    def rel(a, b) -> float:
        return abs((a or 0.0) - (b or 0.0)) / max(abs(b or 0.0), 1e-8)

    differ = [k for k in old if (old[k] is None) != (measured[k] is None) or rel(measured[k], old[k]) > 0.05]
    lines = []
    if differ:
        if cfg.train_decoder_only:  # the encoder never changed: only the images measured differ
            choice = "; exporting them (train_decoder_only: the encoder and its latent space are the init's)"
        elif cfg.export_factors == "init":
            choice = "; exporting them (export_factors: init; --set export_factors=measured writes the measured ones)"
        else:
            choice = "; exporting the measured ones as asked (export_factors: measured)"
        lines.append("latent factors differ from the init folder's: " + ", ".join(
            f"{k} measured {measured[k]} vs {init['init_from']} {old[k]}" for k in differ)
            + ". Diffusion models trained on that VAE expect its factors" + choice)
    return (old if cfg.export_factors == "init" else measured), lines


# the config keys the model card lists first
CARD_KEYS = ("image_size", "channels", "z_channels", "layers_per_block", "batch_size", "learning_rate", "kl_weight",
             "perceptual_weight", "precision", "seed")


def export_final(cfg: VAEConfig, model: AutoencoderKL, precision: Precision, train_files: list[Path], out_dir: Path,
                 writer: RunLogger, gstep: int, metrics: dict, eval_batch: int = 4, ema: bool = False,
                 data: dict | None = None, best_psnr: float | None = None) -> None:
    """Latent statistics (scaling factor), `vae_final.pt` and, with `export_diffusers`, the diffusers folder
    of `model` (`ema`: it holds the EMA weights, said in the log line) with its model card README.md
    (`common.model_card`; `data`: the run's `data_source`, `best_psnr` and `metrics` its held-out figures)."""
    device = next(model.parameters()).device
    n = min(cfg.latent_stats_images, len(train_files))
    batches = eval_loader(train_files, cfg.image_size, cfg.max_pixels, cfg.seed, batch_size=eval_batch, limit=n)
    stats = latent_statistics(model, batches, device, precision.autocast, seed=cfg.seed)
    stats["images"] = n
    write_text(out_dir / "latent_stats.json", json.dumps(stats, indent=1) + "\n")
    writer.scalars({"scaling_factor": stats["scaling_factor"], "shift_factor": stats["shift_factor"],
                    "std": stats["std"]}, gstep, "latent")
    for c, (mu, sd) in enumerate(zip(stats["per_channel_mean"], stats["per_channel_std"])):
        writer.scalars({f"mean_{c}": mu, f"std_{c}": sd}, gstep, "latent_channel")
    print(f"latents over {n} images: mean {stats['mean']:.4f}, std {stats['std']:.4f} -> scaling_factor "
          f"{stats['scaling_factor']:.5f} (shift_factor {stats['shift_factor']:.5f} for FLUX-style pipelines)")
    final = {TRAINER_FIELD: "vae", "arch": model.arch(), "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
             "latent_stats": stats, "metrics": metrics, "config": config_to_dict(cfg), "step": gstep}
    save_atomic(final, out_dir / "vae_final.pt")
    print(f"saved {out_dir / 'vae_final.pt'}" + (" (EMA weights)" if ema else ""))
    if cfg.export_diffusers:
        factors, notes = export_factors(cfg, out_dir, pipeline_factors(model, stats))
        for line in notes:
            print(line)
        folder = save_diffusers(model, out_dir / "diffusers", sample_size=cfg.image_size, **factors)
        held_out = [f"final validation (step {gstep}): " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()
                                                                    if isinstance(v, int | float))] if metrics else []
        held_out += [f"best held-out PSNR {best_psnr:.4g} dB"] if best_psnr is not None else []
        write_model_card(folder, trainer="vae", step=gstep, config=config_to_dict(cfg), held_out=held_out, data=data,
                         source=str(out_dir / "vae_final.pt"), export="vae/train_vae.py (the end of the run)",
                         key_config=CARD_KEYS)
        print(f"saved diffusers AutoencoderKL folder {folder} (AutoencoderKL.from_pretrained('{folder}')), "
              + ", ".join(f"{k} {v:.5f}" for k, v in factors.items() if v is not None))
