"""The VAE trainer's configuration: one flat dataclass.

Flat on purpose: the RTX 5090 guide's JSON (`{"channels": [...], "z_channels": 16, "image_size":
1024, "batch_size": 4}`) and its command-line flags (`--kl_weight 1e-6`) use these exact names, so a
guide JSON, a YAML profile, `--set key=value` and the flags all feed the same keys through one
validation path (`common.config.load_config`): an unknown key fails with the closest valid one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from common.best_by import check_best_by
from common.log import tracker_names
from common.loop import CadenceKeys
from common.precision import MixedPrecisionSwitch, precision_name
from common.ranges import (
    AnyFloat,
    AnyInt,
    Fraction,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
    Probability,
)
from vae.rfid import WEIGHTS_NAME, hub_weights

DECODER_ONLY_FLAG = "--train_decoder_only"  # named in the messages of vae/decoder_only.py and vae/pretrained.py
VALIDATES = ("psnr", "ssim", "l1", "lpips", "rfid")  # what vae/metrics.py measures (lpips, rfid: with their settings)


@dataclass
class VAEConfig(CadenceKeys):
    ALIASES: ClassVar[dict[str, str]] = {"lr": "learning_rate", "epochs": "num_epochs",
                                         "gradient_accumulation_steps": "accumulation_steps",
                                         "block_out_channels": "channels", "latent_channels": "z_channels",
                                         # the guide's spellings of the names every trainer reads
                                         # (docs/conventions.md, "One name per concept"); its flags too
                                         "keep_checkpoints": "save_n_checkpoints",
                                         "val_freq": "validate_every", "gradient_clip": "clip_grad_norm",
                                         # the cadence keys' spellings before they were one set (CadenceKeys)
                                         "val_check_interval": "validate_every", "log_freq": "log_every",
                                         "save_every_steps": "save_every", "time_limit_minutes": "max_minutes"}
    # `--preset` (common.presets): each card setting of vae/presets.py -> the key it sets here.
    # Workers and precision only: the guide fixes batch and crop per resolution profile (24/16/8/4 at
    # 768/1024/1536/2048) and `fit_batch_size` lowers the batch at start when memory says so.
    PRESET_KEYS: ClassVar[dict[str, str]] = {"num_workers": "num_workers", "precision": "precision"}
    # what else an out-of-memory stop suggests (common.stopping.oom_hints)
    OOM_KEYS: ClassVar[dict[str, str]] = {"batch_size": "batch_size", "crop": "image_size",
                                          "accumulation": "accumulation_steps", "checkpointing": "gradient_checkpointing"}
    # The guide's switches, as its flags read: --mixed_precision alone = fp16 autocast + GradScaler,
    # --mixed_precision --use_bf16 = bf16 autocast, neither = fp32; read as `precision` at load.
    MULTI_KEY_ALIASES: ClassVar[tuple[MixedPrecisionSwitch, ...]] = (MixedPrecisionSwitch(
        "mixed_precision", "use_bf16", ((True, "bf16-mixed"), (False, "16-mixed")), default_mixed="16-mixed"),)

    # ---- data
    data_path: str = "data/vae"               # prepared folder (manifest.json) or any folder of images
    val_data_path: str = ""                   # optional separate validation folder; else held out of data_path
    output_dir: str = "runs/vae"
    image_size: PositiveInt = 256             # square random crop; multiple of 8
    batch_size: PositiveInt | Literal["auto"] = 4  # per GPU; "auto" measures the largest that fits (CUDA)
    fit_batch_size: bool = True               # CUDA: lower batch_size at start when it does not fit (accumulation raised)
    num_workers: NonNegativeInt = 4
    persistent_workers: bool = True
    prefetch_factor: PositiveInt = 2
    pin_memory: bool = True
    random_flip: bool = True
    num_val_images: PositiveInt = 16          # fixed held-out set (capped at 20 % of the images)
    max_pixels: PositiveInt = 2**28           # decompression-bomb limit for training images

    # ---- model (SD/FLUX-style AutoencoderKL)
    channels: list[PositiveInt] = field(default_factory=lambda: [128, 256, 512, 512])
    z_channels: PositiveInt = 16
    layers_per_block: PositiveInt = 2
    norm_num_groups: PositiveInt = 32
    mid_attention: bool = True
    use_quant_conv: bool = True
    dropout: Fraction = 0.0
    gradient_checkpointing: bool = False
    # Fine-tune only the decoder side (post_quant_conv + decoder) of the --init_from VAE: the encoder and
    # quant_conv stay frozen, so the latent space (and the exported factors) stay the init's (sd-vae-ft-mse).
    train_decoder_only: bool = False

    # ---- loss (latent-diffusion LPIPSWithDiscriminator semantics; see vae/losses.py)
    rec_loss: Literal["l1", "l2"] = "l1"
    kl_weight: NonNegativeFloat = 1e-6
    perceptual_weight: NonNegativeFloat = 1.0
    perceptual_net: Literal["vgg", "alex"] = "vgg"
    perceptual_weights: str = ""              # path to vgg16-397923af.pth; default: torchvision cache
    learn_logvar: bool = False
    logvar_init: AnyFloat = 0.0
    disc_start: NonNegativeInt = 50001        # global step at which the PatchGAN joins
    disc_weight: NonNegativeFloat = 0.5       # 0 disables the discriminator entirely
    disc_factor: NonNegativeFloat = 1.0
    disc_channels: PositiveInt = 64
    disc_layers: PositiveInt = 3

    # ---- optimisation
    optimizer_cls: str = "AdamW"              # or torch.optim.Adam, common.muon.MuonAdamW, ...
    learning_rate: NonNegativeFloat = 1e-4     # 0 freezes the weights (how the tests prove a carry-over)
    disc_learning_rate: NonNegativeFloat = 0.0  # 0: same as learning_rate
    adam_beta1: Fraction = 0.5                # latent-diffusion's GAN-friendly betas
    adam_beta2: Fraction = 0.9
    weight_decay: NonNegativeFloat = 0.0
    optimizer_fused: bool | None = None       # torch's fused AdamW: null = CUDA only; true/false = any device / never (common.muon)
    optimizer_batched_ns: bool | None = None  # MuonAdamW's Newton-Schulz batched by weight shape; null/false = off (common.muon)
    lr_scheduler: Literal["cosine_with_warmup", "constant", "warmup"] = "cosine_with_warmup"
    warmup_steps: NonNegativeInt = 500
    min_lr_ratio: Probability = 0.1
    num_epochs: NonNegativeInt = 100
    max_steps: NonNegativeInt = 0             # >0: the run (and its LR plan) ends at this optimizer step
    accumulation_steps: PositiveInt = 1
    clip_grad_norm: NonNegativeFloat = 1.0    # max grad norm (gradient_clip); 0 = no clipping (the norm is still logged)
    ema_decay: Fraction = 0.999               # 0 disables the EMA copy
    max_nonfinite: PositiveInt = 20           # consecutive non-finite steps before the run stops
    seed: AnyInt = 42

    # ---- speed / precision
    precision: str = "32-true"                # 32-true | 16-mixed | bf16-mixed | auto (the profiles: bf16)
    enable_tf32: bool = True
    channels_last: bool = True
    use_torch_compile: bool = False
    cudnn_benchmark: bool = True
    device: str = ""                          # "" = cuda if available, else cpu

    # ---- checkpoints, logging, validation
    checkpoint_freq: PositiveInt = 1          # epochs between checkpoint_epoch_{N}.pt
    save_n_checkpoints: PositiveInt = 3       # rotation: newest N epoch checkpoints are kept (keep_checkpoints)
    save_every: NonNegativeInt = 0            # >0: also refresh checkpoint_last.pt every N steps (save_every_steps)
    save_samples_freq: NonNegativeInt = 500   # steps between reconstruction grids
    validate_every: NonNegativeInt = 1000     # steps between validation (PSNR/SSIM/LPIPS); the guide's val_freq
    # rFID of the held-out set (vae/rfid.py): pytorch-fid's pt_inception-2015-12-05-6726825d.pth; "" = from the
    # torch hub cache when there, "off" = no rFID; never downloaded (no file: one line, rFID off)
    rfid_weights: str = ""
    log_every: PositiveInt = 20               # steps between TensorBoard scalars (log_freq)
    logger: str = "tensorboard"               # experiment trackers: tensorboard, wandb, mlflow, comma-separated
    best_by: str = "psnr"                     # the held-out metric best.pt is chosen by (--best_by; common/best_by.py)
    num_sample_images: PositiveInt = 4
    latent_stats_images: PositiveInt = 64     # images encoded at the end for the scaling factor
    export_diffusers: bool = True             # write output_dir/diffusers/ at the end
    # After --init_from a diffusers folder: "init" writes that folder's scaling/shift factors into the
    # export (the latent space its diffusion models were trained on), "measured" the new run's.
    export_factors: Literal["init", "measured"] = "init"
    resume_from: str = ""                     # checkpoint path or "auto"

    def __post_init__(self) -> None:
        problems = []
        try:
            self.precision = precision_name(self.precision)
        except ValueError as exc:
            problems.append(str(exc))
        try:
            self.logger = tracker_names(self.logger)
        except ValueError as exc:
            problems.append(str(exc))
        try:  # what vae/metrics.py's evaluate measures; LPIPS only with the perceptual loss's network, rFID with weights
            rfid = self.rfid_weights != "off" and (Path(self.rfid_weights).expanduser().is_file() if self.rfid_weights
                                                   else hub_weights() is not None)
            self.best_by = check_best_by(
                self.best_by, VALIDATES[:3] + ("lpips",) * (self.perceptual_weight > 0) + ("rfid",) * rfid,
                {"lpips": "it needs perceptual_weight > 0",
                 "rfid": f"it needs Inception weights: rfid_weights naming pytorch-fid's {WEIGHTS_NAME}, none found"})
        except ValueError as exc:
            problems.append(str(exc))
        if self.image_size % 8:
            problems.append(f"image_size must be a multiple of 8, got {self.image_size}")
        if not self.channels:
            problems.append("channels must list at least one width")
        bad = [c for c in self.channels if c % self.norm_num_groups]
        if bad:
            problems.append(f"channels {bad} are not divisible by norm_num_groups {self.norm_num_groups}")
        if self.num_epochs < 1 and self.max_steps < 1:
            problems.append("set num_epochs >= 1 or max_steps >= 1")
        if self.train_decoder_only and self.export_factors == "measured":
            problems.append("train_decoder_only keeps the init's encoder, so the export keeps its scaling/shift "
                            "factors; export_factors: measured contradicts that (drop one of the two)")
        if problems:
            raise ValueError("; ".join(problems))

    def optimizer_spec(self, with_disc: bool) -> dict:
        """Each optimizer's hyper-parameters and the config keys that set them (for a resume that
        changes them: `common.training.optimizer_overrides`)."""
        shared = {"betas": (("adam_beta1", "adam_beta2"), (self.adam_beta1, self.adam_beta2)),
                  "weight_decay": (("weight_decay",), self.weight_decay)}
        spec = {"vae": {"lr": (("learning_rate",), self.learning_rate), **shared}}
        if with_disc:
            keys = ("disc_learning_rate",) if self.disc_learning_rate else ("disc_learning_rate", "learning_rate")
            spec["disc"] = {"lr": (keys, self.disc_learning_rate or self.learning_rate), **shared}
        return spec
