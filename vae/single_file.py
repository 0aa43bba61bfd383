"""`--init_from` a VAE as users download it in one file: a Stable Diffusion checkpoint (`.ckpt` /
`.safetensors`, the VAE under `first_stage_model.`), a standalone VAE in the latent-diffusion (LDM) layout
(`vae-ft-mse-840000-ema-pruned.safetensors`, `*.vae.pt`) or FLUX's `ae.safetensors`.

All three use the key names of latent-diffusion's `Encoder`/`Decoder` (FLUX's autoencoder kept them, only
without `quant_conv`/`post_quant_conv`). Our model is CompVis-like, so the mapping is a rename of a few
parts (`LDM_TO_OURS`) plus the middle attention's 1×1 convs squeezed to the linear layers we use. It is
written here, not borrowed: only diffusers converts these files, and diffusers is a test dependency (the
tests compare this reader with `AutoencoderKL.from_single_file` on random weights).

Why the shape is read from the tensors: a single file has no config. Widths, levels, blocks per level,
latent channels and the quant convs follow from the tensor shapes; GroupNorm's group count does not show
in them, and latent-diffusion and FLUX both fix it at 32.

Why the latent factors come from the family: the diffusion models were trained on latents scaled (and for
FLUX/SD3 shifted) by published constants that the file does not carry. They are recorded like a diffusers
folder's, so the export keeps them (`vae/pretrained.py`).

Files are read as data only: `.safetensors` by `common.safetensors_io` (only the VAE's tensors of a
multi-GB checkpoint), anything else by `load_checkpoint` (`torch.load(weights_only=True)`, which refuses a
pickle that would run code). Stable Diffusion 1.x `.ckpt` files are Lightning checkpoints that also pickle
the ModelCheckpoint callback's class (as a dict key) and numpy scalars; `load_pickled` allows exactly those
names, the class as an empty stand-in, so such a file loads and anything else is still refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy._core.multiarray as np_multiarray
import torch

from common.checkpoint import CheckpointError, checkpoint_kind, load_checkpoint
from common.safetensors_io import SafetensorsError, load_safetensors, safetensors_header

# Where a whole-model checkpoint keeps its VAE: latent-diffusion / SD 1.x-3.x (`first_stage_model.`),
# ComfyUI-style all-in-one FLUX files (`vae.`); diffusers' single-file loader looks for the same two.
VAE_PREFIXES = ("first_stage_model.", "vae.")
# The keys that make a (prefix-stripped) tensor dict an LDM-layout VAE.
LDM_MARKERS = ("encoder.conv_in.weight", "decoder.conv_out.weight")
# Tensors of the VAE's training a downloaded VAE file may still carry (LPIPS + discriminator, the EMA copy
# that "-ema-pruned" files already baked in): not part of the autoencoder, left out and counted.
TRAINING_ONLY = ("loss.", "model_ema.")

# LDM name part -> ours (vae/model.py). Everything else (conv_in, norm1, conv1, norm2, conv2, downsample,
# upsample, block_1/2, norm_out, conv_out, quant_conv, post_quant_conv, q/k/v, norm) is named alike.
LDM_TO_OURS = (
    (r"\.(down|up)\.(\d+)\.block\.", r".\1.\2.blocks."),  # a level's residual blocks
    (r"\.nin_shortcut\.", ".skip."),                        # the 1x1 projection of a block that changes width
    (r"\.mid\.attn_1\.", ".mid.attn."),                     # the middle self-attention...
    (r"\.mid\.attn\.proj_out\.", ".mid.attn.proj."),        # ...and its output projection
)
_ATTN_WEIGHT = re.compile(r".+\.mid\.attn\.(q|k|v|proj)\.weight")

# family -> (what it is, for messages; scaling_factor; shift_factor).
# SD 1.x/2.x: `scale_factor: 0.18215` of latent-diffusion's v1/v2 inference configs (diffusers'
# LDM_VAE_DEFAULT_SCALING_FACTOR). SDXL: 0.13025 (stabilityai/stable-diffusion-xl-base-1.0, vae/config.json).
# SD3: 1.5305 / 0.0609 (stabilityai/stable-diffusion-3-medium-diffusers, vae/config.json). FLUX.1:
# scale_factor 0.3611, shift_factor 0.1159 (black-forest-labs/flux, src/flux/util.py `ae_params`; the same
# in FLUX.1-dev's vae/config.json).
FAMILIES = {
    "sd": ("Stable Diffusion 1.x/2.x VAE", 0.18215, None),
    "sdxl": ("SDXL VAE", 0.13025, None),
    "sd3": ("Stable Diffusion 3 VAE", 1.5305, 0.0609),
    "flux": ("FLUX.1 autoencoder", 0.3611, 0.1159),
}
# The other family a VAE-only file of the same layout may be (its tensors cannot tell), and what to do then.
SAME_LAYOUT = {"sd": "an SDXL VAE file has this layout too and its factor is 0.13025; for it, give --init_from "
                     "its diffusers folder (config.json + weights, e.g. stabilityai/sdxl-vae)",
               "flux": "an SD3 VAE file has this layout too and its factors are 1.5305/0.0609; for it, give "
                       "--init_from its diffusers folder (config.json + weights)"}
# A key of the diffusion model beside the VAE that says which family a whole checkpoint is (the keys
# diffusers' single-file loader checks, `CHECKPOINT_KEY_NAMES`); SD 1.x/2.x is the default.
_FAMILY_KEYS = (("flux", ("double_blocks.0.img_attn.norm.key_norm.scale", "model.diffusion_model.double_blocks.")),
                ("sd3", ("model.diffusion_model.joint_blocks.", "joint_blocks.0.")),
                ("sdxl", ("conditioner.embedders.",)))

# What a file without a VAE holds, by a key prefix: for the message that says why it was refused.
_NOT_A_VAE = (("encoder.down_blocks.", "the weights of a diffusers AutoencoderKL without its config.json: give "
                                       "--init_from the folder that holds both"),
              ("model.diffusion_model.", "a diffusion model (UNet/transformer) without its VAE"),
              ("double_blocks.", "a FLUX transformer without its VAE (the VAE is FLUX's separate ae.safetensors)"),
              ("input_blocks.", "a UNet without its VAE"),
              ("down_blocks.", "a diffusers UNet/transformer"),
              ("cond_stage_model.", "a text encoder"), ("text_model.", "a text encoder"),
              ("conditioner.", "a text encoder"), ("shared.weight", "a T5 text encoder"),
              ("encoder.block.", "a T5 text encoder"), ("lora_", "a LoRA"))
ACCEPTED = ("a Stable Diffusion checkpoint (.ckpt/.safetensors with first_stage_model.*), a standalone VAE file "
            "(e.g. vae-ft-mse-840000-ema-pruned.safetensors), FLUX's ae.safetensors, a diffusers AutoencoderKL "
            "folder or a train_vae.py checkpoint")


class _LightningCallbackClass:
    """Stands in for pytorch_lightning's ModelCheckpoint class, which SD 1.x .ckpt files pickle as the key
    of their callback state: never instantiated or called, it only lets the dict be rebuilt."""


# The globals latent-diffusion's Lightning checkpoints pickle besides tensors (the list safe SD loaders
# allow): the callback class and numpy scalars / dtypes (global_step, best_model_score), which are data.
LDM_PICKLE_GLOBALS = {
    "pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint": _LightningCallbackClass,
    "numpy.core.multiarray.scalar": np_multiarray.scalar,   # the name numpy 1.x wrote
    "numpy._core.multiarray.scalar": np_multiarray.scalar,  # numpy 2.x
    "numpy.dtype": np.dtype,
}
_NUMPY_DTYPE_CLASSES = [type(np.dtype(c)) for c in "?bhilqBHILQefd"]  # what a pickled dtype's state builds


def load_pickled(path: Path) -> dict:
    """A `.ckpt`/`.pt` file by `load_checkpoint` (weights_only). One refused only for the globals of
    `LDM_PICKLE_GLOBALS` (an SD 1.x Lightning checkpoint) is read again, still weights_only, with exactly
    those allowed; any other refusal stands."""
    try:
        return load_checkpoint(path)
    except CheckpointError as exc:
        if "refused to load" not in str(exc):  # damaged or unreadable: load_checkpoint checked the CRCs already
            raise
        try:
            found = set(torch.serialization.get_unsafe_globals_in_checkpoint(path))
        except Exception:  # noqa: BLE001 - not a zip checkpoint: load_checkpoint's message stands
            found = set()
        if not found or not found <= set(LDM_PICKLE_GLOBALS):
            raise
    allowed = [(obj, name) for name, obj in LDM_PICKLE_GLOBALS.items()] + _NUMPY_DTYPE_CLASSES
    with torch.serialization.safe_globals(allowed):
        obj = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: expected a dict checkpoint, got {type(obj).__name__}")
    return obj


@dataclass
class SingleFileVAE:
    """A VAE read from one file, already in our key names."""

    state_dict: dict[str, torch.Tensor]
    config: dict     # the layout in diffusers' config.json keys (what `vae.pretrained` checks a run against)
    family: str      # a key of FAMILIES, or "" when the layout is none of theirs (no known factors)
    prefix: str      # where the VAE was in the file ("" for a VAE-only file)
    ignored: int     # tensors in the file that are not the VAE's
    assumed: bool    # the family follows from the layout alone (a VAE-only file), not from the checkpoint

    @property
    def factors(self) -> dict[str, float | None]:
        _, scale, shift = FAMILIES.get(self.family, ("", None, None))
        return {"scaling_factor": scale, "shift_factor": shift}

    def factors_source(self) -> str:
        """Where the recorded factors come from, for the log line."""
        if not self.family:
            return "none known for this layout, so the measured ones are exported"
        source = f"{FAMILIES[self.family][0]}'s published factors"
        return source + (f", assumed from the layout: {SAME_LAYOUT[self.family]}" if self.assumed else "")

    def describe(self) -> str:
        what = FAMILIES[self.family][0] if self.family else "LDM-layout VAE"
        where = f" under '{self.prefix}'" if self.prefix else ""
        other = f"; {self.ignored} other tensors ignored" if self.ignored else ""
        return f"the {what} ({len(self.state_dict)} tensors{where}{other})"


def ldm_to_ours_key(key: str) -> str:
    """One LDM-layout VAE key (`encoder.down.1.block.0.nin_shortcut.weight`) → ours (`...blocks.0.skip...`)."""
    key = "." + key
    for pattern, repl in LDM_TO_OURS:
        key = re.sub(pattern, repl, key)
    return key[1:]


def ldm_to_ours(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An LDM-layout VAE state dict in our names, fp32; the attention's 1×1 conv weights become linear ones."""
    out = {}
    for key, tensor in state.items():
        ours = ldm_to_ours_key(key)
        if _ATTN_WEIGHT.fullmatch(ours) and tensor.dim() == 4:
            tensor = tensor[:, :, 0, 0]
        out[ours] = tensor.float() if tensor.is_floating_point() else tensor
    return out


def layout_config(state: dict[str, torch.Tensor]) -> dict:
    """The model's shape from an LDM-layout VAE's tensors, as diffusers config.json keys."""
    levels = sorted({int(m.group(1)) for k in state if (m := re.fullmatch(r"encoder\.down\.(\d+)\.block\.0\.conv1\.weight", k))})
    blocks = {int(m.group(1)) for k in state if (m := re.fullmatch(r"encoder\.down\.0\.block\.(\d+)\.conv1\.weight", k))}
    return {"block_out_channels": [int(state[f"encoder.down.{i}.block.0.conv1.weight"].shape[0]) for i in levels],
            "latent_channels": int(state["decoder.conv_in.weight"].shape[1]),
            "layers_per_block": len(blocks),
            "in_channels": int(state["encoder.conv_in.weight"].shape[1]),
            "out_channels": int(state["decoder.conv_out.weight"].shape[0]),
            "norm_num_groups": 32,  # not visible in the tensors; latent-diffusion and FLUX fix it at 32
            "use_quant_conv": "quant_conv.weight" in state,
            "use_post_quant_conv": "post_quant_conv.weight" in state,
            "mid_block_add_attention": "encoder.mid.attn_1.q.weight" in state}


def _family(config: dict, other_keys: list[str]) -> tuple[str, bool]:
    """(which published family the VAE belongs to, whether that is assumed from its layout alone): from
    the diffusion model beside it in a whole checkpoint, else from the latent layout (f8c4 with quant
    convs: SD 1.x/2.x; f8c16 without: FLUX)."""
    for family, markers in _FAMILY_KEYS:
        if any(k.startswith(markers) for k in other_keys):
            return family, False
    f8 = len(config["block_out_channels"]) == 4
    family = ""
    if f8 and config["latent_channels"] == 4 and config["use_quant_conv"]:
        family = "sd"  # a whole checkpoint of this layout without SDXL's text encoders: SD 1.x/2.x
    elif f8 and config["latent_channels"] == 16 and not config["use_quant_conv"]:
        family = "flux"
    return family, bool(family) and not other_keys


def _not_a_vae(path: Path, keys: list[str]) -> CheckpointError:
    guess = next((what for prefix, what in _NOT_A_VAE if any(k.startswith(prefix) for k in keys)), None)
    looks = f": it looks like {guess}" if guess else ""
    return CheckpointError(f"--init_from {path}: no VAE in this file ({len(keys)} tensor{'s' * (len(keys) != 1)}, none named "
                           f"first_stage_model.encoder.*, vae.encoder.* or encoder.conv_in.*){looks}. "
                           f"--init_from takes {ACCEPTED}")


def _find_vae(path: Path, keys: list[str]) -> str:
    """The prefix under which the file keeps an LDM-layout VAE ('' for a VAE-only file)."""
    for prefix in ("", *VAE_PREFIXES):
        if all(prefix + marker in keys for marker in LDM_MARKERS):
            return prefix
    raise _not_a_vae(path, keys)


def _tensors(obj: dict) -> dict[str, torch.Tensor]:
    """The tensors of a loaded `.ckpt`: latent-diffusion saves {"state_dict": {...}, "global_step": ...}."""
    state = obj.get("state_dict") if isinstance(obj.get("state_dict"), dict) else obj
    return {k: v for k, v in state.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}


def is_ours(obj: dict) -> bool:
    """A checkpoint one of this repo's trainers wrote (handled by `vae.pretrained.init_from_checkpoint`): it
    records its trainer, or a trainer recognises its layout, or it has our `models` block."""
    return checkpoint_kind(obj) is not None or "models" in obj


def read_single_file(path: str | Path, loaded: dict | None = None) -> SingleFileVAE:
    """The VAE of a single-file checkpoint in our key names, with its layout and family. `loaded`: the
    file's content when the caller already loaded it (a `.ckpt`/`.pt`). A file that is not an LDM-layout
    VAE or holds one, or a truncated one, is CheckpointError naming the file and what to give instead."""
    path = Path(path)
    if path.suffix == ".safetensors":
        try:
            keys = list(safetensors_header(path))
            prefix = _find_vae(path, keys)
            state = load_safetensors(path, [k for k in keys if k.startswith(prefix)])
        except SafetensorsError as exc:
            raise CheckpointError(f"--init_from {exc}; the file is damaged or incomplete: download it again") from None
    else:
        tensors = _tensors(loaded if loaded is not None else load_pickled(path))
        keys = list(tensors)
        prefix = _find_vae(path, keys)
        state = {k: v for k, v in tensors.items() if k.startswith(prefix)}
    state = {k[len(prefix):]: v for k, v in state.items()}
    vae_part = {k: v for k, v in state.items() if not k.startswith(TRAINING_ONLY)}
    others = [k for k in keys if not k.startswith(prefix)]
    try:
        config = layout_config(vae_part)
    except KeyError as exc:
        raise CheckpointError(f"--init_from {path}: the VAE in this file is incomplete (no tensor "
                              f"{prefix}{exc.args[0]}); download the file again, or give {ACCEPTED}") from None
    family, assumed = _family(config, others)
    return SingleFileVAE(ldm_to_ours(vae_part), config, family, prefix, len(keys) - len(vae_part), assumed)
