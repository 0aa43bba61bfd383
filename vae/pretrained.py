"""`--init_from`: start a run from pretrained weights — a diffusers `AutoencoderKL` folder (fine-tuning
SD 1.x/2.x, SDXL, SD3 or FLUX's VAE), a single file as users download it (a Stable Diffusion checkpoint,
a standalone LDM-layout VAE, FLUX's ae.safetensors: `vae/single_file.py`) or one of our checkpoints.

Why a diffusers folder must match the profile exactly (no partial load): a VAE whose latent layout
changed is no longer the VAE its diffusion models were trained on, so a mismatch stops with the
config keys that differ and the flags that make the run match the folder.

Why the folder's latent factors are kept: SD/SDXL/SD3/FLUX denoisers were trained on latents scaled
(and for f8c16 shifted) by the factors in that folder's config.json. A fine-tuned decoder is meant to
drop into those pipelines, so the export keeps the folder's `scaling_factor`/`shift_factor`
(`export_factors: init`) and says how far the measured ones moved; `export_factors: measured` writes
the new statistics instead (a VAE for a new diffusion model). The folder's factors are recorded in
`<output_dir>/init_from.json`, so a resumed run exports them too (`diffusers_io.export_factors`). A single
file carries no factors: its family's published ones are recorded the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

from torch import nn

from common.atomic_write import write_text
from common.checkpoint import (
    CheckpointError,
    compare_state,
    fit_summary,
    load_checkpoint,
    load_matching,
    refuse_other_kind,
)
from vae.config import DECODER_ONLY_FLAG, VAEConfig
from vae.diffusers_io import (
    DEFAULT_SCALING_FACTOR,
    INIT_RECORD,
    arch_from_config,
    from_diffusers,
    pipeline_factors,
    read_diffusers_folder,
)
from vae.model import AutoencoderKL
from vae.single_file import ACCEPTED, is_ours, load_pickled, read_single_file
from vae.weights import malformed_is_one_line

# config.json key -> (our config key, how to set it on the command line)
_LAYOUT_KEYS = {"block_out_channels": ("channels", "--channels {}"), "latent_channels": ("z_channels", "--z_channels {}"),
                "layers_per_block": ("layers_per_block", "--layers_per_block {}"),
                "norm_num_groups": ("norm_num_groups", "--set norm_num_groups={}"),
                "use_quant_conv": ("use_quant_conv", "--set use_quant_conv={}"),
                "mid_block_add_attention": ("mid_attention", "--set mid_attention={}")}


def layout_name(arch: dict) -> str:
    """The family a layout belongs to, for messages: SD 1.x/2.x/SDXL (f8c4) or SD3/FLUX (f8c16)."""
    f, z = 2 ** (len(arch["channels"]) - 1), arch["z_channels"]
    family = {(8, 4): " (the SD 1.x/2.x/SDXL layout)", (8, 16): " (the SD3/FLUX layout)"}.get((f, z), "")
    return f"f{f}c{z}{family}"


def _flag_value(v) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, list):
        return " ".join(str(x) for x in v)
    return str(v)


def layout_mismatch(folder_cfg: dict, cfg: VAEConfig) -> list[tuple[str, object, str, object, str]]:
    """(config.json key, its value, our config key, our value, the flag that matches the folder) for every
    architecture key that differs; empty when the folder fits this run's model."""
    arch = arch_from_config(folder_cfg)
    folder_values = {"block_out_channels": arch["channels"], "latent_channels": arch["z_channels"],
                     "layers_per_block": arch["layers_per_block"], "norm_num_groups": arch["norm_num_groups"],
                     "use_quant_conv": arch["use_quant_conv"], "mid_block_add_attention": arch["mid_attention"]}
    out = []
    for key, value in folder_values.items():
        ours, flag = _LAYOUT_KEYS[key]
        if getattr(cfg, ours) != value:
            out.append((key, value, ours, getattr(cfg, ours), flag.format(_flag_value(value))))
    return out


def check_supported(folder: Path, folder_cfg: dict) -> None:
    """The parts of a diffusers AutoencoderKL our model does not have (block types, activation, a
    quant conv without its post-quant twin): one clear error instead of a wrong model."""
    problems = []
    if folder_cfg.get("act_fn", "silu") != "silu":
        problems.append(f"act_fn {folder_cfg['act_fn']!r} (only 'silu')")
    for key, want in (("down_block_types", "DownEncoderBlock2D"), ("up_block_types", "UpDecoderBlock2D")):
        bad = sorted({t for t in folder_cfg.get(key, [want]) if t != want})
        if bad:
            problems.append(f"{key} {bad} (only {want})")
    if folder_cfg.get("use_post_quant_conv", folder_cfg.get("use_quant_conv", True)) != folder_cfg.get("use_quant_conv", True):
        problems.append("use_quant_conv and use_post_quant_conv differ (this model has both or neither)")
    for key in ("in_channels", "out_channels"):
        if folder_cfg.get(key, 3) != 3:
            problems.append(f"{key} {folder_cfg[key]} (RGB only: 3)")
    if problems:
        raise CheckpointError(f"--init_from {folder}: this AutoencoderKL has parts this trainer's model does not: "
                              + "; ".join(problems))


def check_layout(source: Path, what: str, layout: dict, cfg: VAEConfig) -> None:
    """CheckpointError when `layout` (diffusers config.json keys) is not this run's model: the keys that
    differ and the flags that make the run match (`what`: "the folder's", "the file's")."""
    diff = layout_mismatch(layout, cfg)
    if diff:
        keys = ", ".join(f"{k} {_flag_value(v)} (this run's {ours}: {_flag_value(mine)})" for k, v, ours, mine, _ in diff)
        raise CheckpointError(
            f"--init_from {source}: {what} layout, {layout_name(arch_from_config(layout))}, does not match this run's "
            f"model: {keys}. To fine-tune this VAE, add: {' '.join(flag for *_, flag in diff)}")


def forget_stale_record(out_dir: Path, main: bool) -> None:
    """Every new run's factors come from its own init (or, with none recorded, are measured): an
    `init_from.json` left by an earlier attempt in this folder that never saved a checkpoint would
    otherwise hand that attempt's init factors to the export of a run that never started from it."""
    if main:
        (out_dir / INIT_RECORD).unlink(missing_ok=True)


def record_factors(source: Path, factors: dict, out_dir: Path, main: bool) -> None:
    """The init's latent factors in `<output_dir>/init_from.json`, which the export reads (main rank only)."""
    if main:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_text(out_dir / INIT_RECORD, json.dumps({"init_from": str(source), **factors}, indent=1) + "\n")


def init_from_diffusers(vae: AutoencoderKL, cfg: VAEConfig, folder: str | Path, out_dir: Path,
                        main: bool = True) -> list[str]:
    """Loads a diffusers folder into `vae` (all weights, exactly); returns the lines to print."""
    folder = Path(folder)
    sd, folder_cfg = read_diffusers_folder(folder)
    check_supported(folder, folder_cfg)
    arch = arch_from_config(folder_cfg)
    check_layout(folder, "the folder's", folder_cfg, cfg)
    try:
        vae.load_state_dict(from_diffusers(sd, vae))
    except (KeyError, ValueError) as exc:
        raise CheckpointError(f"--init_from {folder}: {str(exc).strip(chr(34))}") from None
    factors = {"scaling_factor": folder_cfg.get("scaling_factor", DEFAULT_SCALING_FACTOR),
               "shift_factor": folder_cfg.get("shift_factor")}
    record_factors(folder, factors, out_dir, main)
    return [f"init_from {folder}: all {len(sd)} tensors of a diffusers AutoencoderKL, {layout_name(arch)}; "
            f"its scaling_factor {factors['scaling_factor']}, shift_factor {factors['shift_factor']} "
            f"(export_factors: {cfg.export_factors})"]


def init_from_single_file(vae: AutoencoderKL, cfg: VAEConfig, path: str | Path, out_dir: Path, main: bool = True,
                          loaded: dict | None = None) -> list[str]:
    """Loads the VAE of a single-file checkpoint into `vae` (all weights, exactly; `vae/single_file.py`)
    and records its family's latent factors; returns the lines to print."""
    path = Path(path)
    sf = read_single_file(path, loaded)
    check_layout(path, "the file's", sf.config, cfg)
    own = vae.state_dict()
    report = compare_state(own, sf.state_dict)
    if report.mismatched or report.missing or report.unexpected:
        raise CheckpointError(f"--init_from {path}: its VAE does not load into this model "
                              f"({fit_summary(own, sf.state_dict)}); give {ACCEPTED}")
    vae.load_state_dict(sf.state_dict)
    record_factors(path, sf.factors, out_dir, main)
    f = sf.factors
    return [f"init_from {path}: {sf.describe()}, {layout_name(arch_from_config(sf.config))}; latent factors: "
            f"scaling_factor {f['scaling_factor']}, shift_factor {f['shift_factor']} ({sf.factors_source()}; "
            f"export_factors: {cfg.export_factors})"]


def init_from_checkpoint(models: dict[str, nn.Module], path: str | Path, init: dict | None = None) -> list[str]:
    """Weights only from a train_vae.py checkpoint or vae_final.pt (mismatched layers re-initialised and
    listed); `init`: the file's content when the caller already loaded it."""
    init = load_checkpoint(path) if init is None else init
    refuse_other_kind(path, init, "vae")
    weights = init.get("models") or ({"vae": init["state_dict"]} if "state_dict" in init else {})
    if "vae" not in weights:
        raise CheckpointError(f"--init_from {path}: no VAE weights; give {ACCEPTED}")
    lines = []
    for name, module in models.items():  # "vae" first: its share is checked before anything loads
        if name in weights:
            required = {"source": path, "ckpt": init} if name == "vae" else {}  # logvar, critic: only reported
            lines.append(f"init_from {name}: {load_matching(module, weights[name], **required)}")
    return lines


def record_checkpoint_factors(vae: AutoencoderKL, path: Path, init: dict, out_dir: Path, main: bool) -> None:
    """A decoder-only run from one of our checkpoints (`init`: its content): the file must hold the whole
    encoder side this run keeps, and the factors `vae_final.pt` carries (`latent_stats`) are recorded. A
    training checkpoint carries none: the start-up check then says what to use."""
    weights = init.get("models", {}).get("vae") or init.get("state_dict") or {}
    own = vae.state_dict()
    frozen = [k for k in own if not k.startswith(AutoencoderKL.DECODER_SIDE)]
    absent = [k for k in frozen if k not in weights or tuple(weights[k].shape) != tuple(own[k].shape)]
    if absent:
        raise CheckpointError(f"--init_from {path}: {DECODER_ONLY_FLAG} keeps the encoder as loaded, but {len(absent)} "
                              f"of its {len(frozen)} tensors are not in this file with this shape (e.g. {absent[:3]}); "
                              "init from a VAE of this run's layout")
    if init.get("latent_stats"):
        record_factors(path, pipeline_factors(vae, init["latent_stats"]), out_dir, main)


def init_weights(models: dict[str, nn.Module], cfg: VAEConfig, path: str | Path, out_dir: Path,
                 main: bool = True) -> list[str]:
    """`--init_from PATH` into `models` ("vae", and "logvar" / "disc" from a checkpoint): a diffusers
    folder, a single-file VAE / SD / FLUX checkpoint, or one of our checkpoints (told apart by content:
    a `.ckpt`/`.pt` is loaded once, weights only, then read as whichever it is). Returns the lines to
    print; the caller restarts its EMA from the loaded weights."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"--init_from {path}: no such file or folder; give {ACCEPTED}")
    with malformed_is_one_line(f"--init_from {path}", f"give {ACCEPTED}"):  # never a traceback (round 3, item 10)
        return _init_weights(models, cfg, path, out_dir, main)


def _init_weights(models: dict[str, nn.Module], cfg: VAEConfig, path: Path, out_dir: Path, main: bool) -> list[str]:
    if path.is_dir():
        return init_from_diffusers(models["vae"], cfg, path, out_dir, main)
    if path.suffix == ".safetensors":
        return init_from_single_file(models["vae"], cfg, path, out_dir, main)
    try:
        init = load_pickled(path)
    except CheckpointError as exc:  # cut short, damaged, or refused for holding code
        fix = "" if "refused to load" in str(exc) else "; give a complete file (download or copy it again)"
        raise CheckpointError(f"--init_from {exc}{fix}") from None
    if is_ours(init):
        lines = init_from_checkpoint(models, path, init)
        if cfg.train_decoder_only:
            record_checkpoint_factors(models["vae"], path, init, out_dir, main)
        return lines
    return init_from_single_file(models["vae"], cfg, path, out_dir, main, loaded=init)
