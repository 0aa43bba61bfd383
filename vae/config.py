"""The VAE trainer's configuration: one flat dataclass.

Flat on purpose: the RTX 5090 guide's JSON (`{"channels": [...], "z_channels": 16, "image_size":
1024, "batch_size": 4}`) and its command-line flags (`--kl_weight 1e-6`) use these exact names, so a
guide JSON, a YAML profile, `--set key=value` and the flags all feed the same keys through one
validation path (`common.config.load_config`): an unknown key fails with the closest valid one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from common.precision import MixedPrecisionSwitch, precision_name


@dataclass
class VAEConfig:
    ALIASES: ClassVar[dict[str, str]] = {"lr": "learning_rate", "epochs": "num_epochs",
                                         "gradient_accumulation_steps": "accumulation_steps",
                                         "block_out_channels": "channels", "latent_channels": "z_channels",
                                         # the names every trainer reads (README, "One name per concept")
                                         "save_n_checkpoints": "keep_checkpoints",
                                         "val_check_interval": "val_freq", "clip_grad_norm": "gradient_clip"}
    # `--preset` (common.presets): each card setting of common.hardware.PRESETS -> the key it sets here.
    # Workers and precision only: the guide fixes batch and crop per resolution profile (24/16/8/4 at
    # 768/1024/1536/2048) and `fit_batch_size` lowers the batch at start when memory says so.
    PRESET_KEYS: ClassVar[dict[str, str]] = {"num_workers": "num_workers", "precision": "precision"}
    # The guide's switches, as its flags read: --mixed_precision alone = fp16 autocast + GradScaler,
    # --mixed_precision --use_bf16 = bf16 autocast, neither = fp32; read as `precision` at load.
    MULTI_KEY_ALIASES: ClassVar[tuple[MixedPrecisionSwitch, ...]] = (MixedPrecisionSwitch(
        "mixed_precision", "use_bf16", ((True, "bf16-mixed"), (False, "16-mixed")), default_mixed="16-mixed"),)

    # ---- data
    data_path: str = "data/vae"               # prepared folder (manifest.json) or any folder of images
    val_data_path: str = ""                   # optional separate validation folder; else held out of data_path
    output_dir: str = "runs/vae"
    image_size: int = 256                     # square random crop; multiple of 8
    batch_size: int | Literal["auto"] = 4     # per GPU; "auto" measures the largest that fits (CUDA)
    fit_batch_size: bool = True               # CUDA: lower batch_size at start when it does not fit (accumulation raised)
    num_workers: int = 4
    persistent_workers: bool = True
    prefetch_factor: int = 2
    pin_memory: bool = True
    random_flip: bool = True
    num_val_images: int = 16                  # fixed held-out set (capped at 20 % of the images)
    max_pixels: int = 2**28                   # decompression-bomb limit for training images

    # ---- model (SD/FLUX-style AutoencoderKL)
    channels: list[int] = field(default_factory=lambda: [128, 256, 512, 512])
    z_channels: int = 16
    layers_per_block: int = 2
    norm_num_groups: int = 32
    mid_attention: bool = True
    use_quant_conv: bool = True
    dropout: float = 0.0
    gradient_checkpointing: bool = False

    # ---- loss (latent-diffusion LPIPSWithDiscriminator semantics; see vae/losses.py)
    rec_loss: Literal["l1", "l2"] = "l1"
    kl_weight: float = 1e-6
    perceptual_weight: float = 1.0
    perceptual_net: Literal["vgg", "alex"] = "vgg"
    perceptual_weights: str = ""              # path to vgg16-397923af.pth; default: torchvision cache
    learn_logvar: bool = False
    logvar_init: float = 0.0
    disc_start: int = 50001                   # global step at which the PatchGAN joins
    disc_weight: float = 0.5                  # 0 disables the discriminator entirely
    disc_factor: float = 1.0
    disc_channels: int = 64
    disc_layers: int = 3

    # ---- optimisation
    optimizer_cls: str = "AdamW"              # or torch.optim.Adam, common.muon.MuonAdamW, ...
    learning_rate: float = 1e-4
    disc_learning_rate: float = 0.0           # 0: same as learning_rate
    adam_beta1: float = 0.5                   # latent-diffusion's GAN-friendly betas
    adam_beta2: float = 0.9
    weight_decay: float = 0.0
    lr_scheduler: Literal["cosine_with_warmup", "constant", "warmup"] = "cosine_with_warmup"
    warmup_steps: int = 500
    min_lr_ratio: float = 0.1
    num_epochs: int = 100
    max_steps: int = 0                        # >0: the run (and its LR plan) ends at this optimizer step
    stop_at_step: int = 0                     # >0: save and stop at this step WITHOUT changing the LR plan
    time_limit_minutes: float = 0.0           # >0: save and stop after this long (plan unchanged)
    accumulation_steps: int = 1
    gradient_clip: float = 1.0                # max grad norm; 0 disables clipping (the norm is still logged)
    ema_decay: float = 0.999                  # 0 disables the EMA copy
    max_nonfinite: int = 20                   # consecutive non-finite steps before the run stops
    seed: int = 42

    # ---- speed / precision
    precision: str = "32-true"                # 32-true | 16-mixed | bf16-mixed | auto (the profiles: bf16)
    enable_tf32: bool = True
    channels_last: bool = True
    use_torch_compile: bool = False
    cudnn_benchmark: bool = True
    device: str = ""                          # "" = cuda if available, else cpu

    # ---- checkpoints, logging, validation
    checkpoint_freq: int = 1                  # epochs between checkpoint_epoch_{N}.pt
    keep_checkpoints: int = 3                 # rotation: newest N epoch checkpoints are kept
    save_every_steps: int = 0                 # >0: also refresh checkpoint_last.pt every N steps
    save_samples_freq: int = 500              # steps between reconstruction grids
    val_freq: int = 1000                      # steps between validation (PSNR/SSIM/LPIPS)
    log_freq: int = 20                        # steps between TensorBoard scalars
    num_sample_images: int = 4
    latent_stats_images: int = 64             # images encoded at the end for the scaling factor
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
        if self.image_size < 8 or self.image_size % 8:
            problems.append(f"image_size must be a positive multiple of 8, got {self.image_size}")
        if self.batch_size != "auto" and int(self.batch_size) < 1:
            problems.append(f"batch_size must be >= 1 or 'auto', got {self.batch_size}")
        if self.accumulation_steps < 1:
            problems.append(f"accumulation_steps must be >= 1, got {self.accumulation_steps}")
        if not self.channels:
            problems.append("channels must list at least one width")
        if self.z_channels < 1 or self.layers_per_block < 1:
            problems.append(f"z_channels and layers_per_block must be >= 1, got {self.z_channels}, "
                            f"{self.layers_per_block}")
        bad = [c for c in self.channels if self.norm_num_groups < 1 or c % self.norm_num_groups]
        if bad:
            problems.append(f"channels {bad} are not divisible by norm_num_groups {self.norm_num_groups}")
        if self.num_epochs < 1 and self.max_steps < 1:
            problems.append("set num_epochs >= 1 or max_steps >= 1")
        for name in ("kl_weight", "perceptual_weight", "disc_weight", "gradient_clip", "learning_rate"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.ema_decay < 1.0:
            problems.append(f"ema_decay must be in [0, 1), got {self.ema_decay}")
        if self.checkpoint_freq < 1 or self.keep_checkpoints < 1:
            problems.append("checkpoint_freq and keep_checkpoints must be >= 1")
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
