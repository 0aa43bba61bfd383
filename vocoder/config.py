"""The vocoder's config schema: every key a YAML may contain, with the SingingVocoders /
DiffSinger name and meaning, and the code that reads it.

Loaded by ``common.config.load_config(path, VocoderConfig, overrides)``; an unknown key is an
error naming the closest valid key, so a typo never silently does nothing. The seed configs'
misspelt optimizer keys (``generater_optimizer_args``, ``discriminate_optimizer_args``),
``ds_workers``, ``num_ckpt_keep`` and ``pl_trainer_precision`` (the fields ``num_workers``,
``save_n_checkpoints`` and ``precision``: "One name per concept" in docs/conventions.md) and
Muon_AdamW's ``muon_args.weight_decay`` / ``adamw_args.{weight_decay,eps}`` are accepted as
aliases, in any layer (the later layer wins whichever spelling it uses), and translated to the field
names at load. The mel settings are the shared ``audio:`` block (``speech.audio.AudioSettings``); the
seed's flat keys (``audio_sample_rate``, ``hop_size``, ``fft_size``, ``win_size``,
``audio_num_mel_bins``, ``fmin``, ``fmax``) are aliases of its fields.

Step semantics: one "step" (``max_updates``, ``val_check_interval``, ``log_interval``,
``warmup_steps``, ``save_best_after``) is one training iteration = one discriminator update
followed by one generator update.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, field
from typing import ClassVar

from common.best_by import check_best_by
from common.config import ConfigError, load_config  # noqa: F401 (re-exported for callers)
from common.log import tracker_names
from common.loop import CadenceKeys
from common.precision import precision_name
from common.ranges import (
    AnyFloat,
    AnyInt,
    Decay,
    Fraction,
    LoudnessTarget,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Probability,
)
from speech.audio import AudioSettings
from speech.pitch_metrics import PITCH_METRICS

TASKS = {
    "nsf_HiFigan_task.nsf_HiFigan": "standard",
    "nsf_HiFigan_fast_task.nsf_HiFigan": "fast",
}
DEFAULT_DISCRIMINATORS = {"standard": ["mpd", "msd"], "fast": ["fast_mpd", "mrd"]}
SCHEDULER_NAMES = {
    # seed spelling -> common.schedulers name
    "lr_scheduler.scheduler.WarmupLR": "warmup",
    "WarmupLR": "warmup",
    "torch.optim.lr_scheduler.ExponentialLR": "exponential",
    "ExponentialLR": "exponential",
    "warmup": "warmup",
    "constant": "constant",
    "exponential": "exponential",
    "cosine_with_warmup": "cosine_with_warmup",
}


def task_kind(task_cls: str) -> str:
    """'standard' (MPD+MSD) or 'fast' (fast MPD + MRD) for a seed task name, with or without the
    seeds' ``training.`` prefix."""
    name = task_cls.removeprefix("training.")
    if name not in TASKS:
        raise ConfigError(
            f"task_cls '{task_cls}' is not a vocoder task; use one of {sorted(TASKS)} "
            "(a 'training.' prefix is accepted)"
        )
    return TASKS[name]


@dataclass
class ModelArgs:
    mini_nsf: bool = False  # one sine injected once after the 2nd upsampling layer (needed by pc_aug)
    noise_sigma: NonNegativeFloat = 0.0  # std of Gaussian noise added to the mel embedding while training
    upsample_rates: list[PositiveInt] = field(default_factory=lambda: [8, 8, 2, 2, 2])  # product == hop_size
    upsample_kernel_sizes: list[PositiveInt] = field(default_factory=lambda: [16, 16, 4, 4, 4])
    upsample_initial_channel: PositiveInt = 512
    resblock: str = "1"  # "1" = HiFi-GAN V1 block, "2" = the lighter V3 block
    resblock_kernel_sizes: list[PositiveInt] = field(default_factory=lambda: [3, 7, 11])
    resblock_dilation_sizes: list[list[PositiveInt]] = field(default_factory=lambda: [[1, 3, 5], [1, 3, 5], [1, 3, 5]])
    harmonic_num: NonNegativeInt = 8  # overtones of the full NSF source (ignored with mini_nsf)
    # Critics. None -> the task's default (standard: [mpd, msd]; fast: [fast_mpd, mrd]).
    discriminators: list[str] | None = None
    discriminator_periods: list[PositiveInt] = field(default_factory=lambda: [3, 5, 7, 11, 17, 23, 37])
    fast_mpd_strides: list[PositiveInt] = field(default_factory=lambda: [4, 4, 4])
    fast_mpd_kernel_size: PositiveInt = 11
    fast_mpd_init_channel: PositiveInt = 8
    mrd_fft_sizes: list[PositiveInt] = field(default_factory=lambda: [512, 1024, 2048])
    mrd_hop_sizes: list[PositiveInt] = field(default_factory=lambda: [64, 128, 256])
    mrd_win_lengths: list[PositiveInt] = field(default_factory=lambda: [512, 1024, 2048])
    mrd_channels: PositiveInt = 32  # width of each resolution critic's 2-D convs


@dataclass
class OptimizerArgs:
    # SingingVocoders' Muon_AdamW takes per-half arguments (nsf_hifigan_fast.yaml: `muon_args:
    # {weight_decay: 0.03}`, `adamw_args: {weight_decay: 0.0}`); these are the ones with a key here.
    # weight_decay is the AdamW half's, and the Muon half's too unless muon_weight_decay is given.
    ALIASES: ClassVar[dict[str, str]] = {
        "muon_args.weight_decay": "muon_weight_decay", "adamw_args.weight_decay": "weight_decay",
        "adamw_args.eps": "eps",
    }
    # torch.optim.AdamW / AdamW, or common.muon.MuonAdamW / Muon_AdamW (Muon on hidden weights,
    # AdamW - with beta1/beta2 below - on the rest).
    optimizer_cls: str = "torch.optim.AdamW"
    lr: PositiveFloat = 1e-4
    beta1: Fraction = 0.8  # HiFi-GAN's betas; also the AdamW half of Muon_AdamW
    beta2: Fraction = 0.99
    eps: PositiveFloat = 1e-8
    weight_decay: NonNegativeFloat = 0.0
    muon_weight_decay: NonNegativeFloat | None = None  # Muon_AdamW only; None = weight_decay
    fused: bool | None = None  # torch's fused AdamW: null = CUDA only; true/false = any device / never (common.muon)
    batched_ns: bool | None = None  # MuonAdamW's Newton-Schulz batched by weight shape; null/false = off (common.muon)

    def __post_init__(self) -> None:
        # The seeds name their own copy of the optimizer; ours lives in common.muon.
        if self.optimizer_cls.endswith("Muon_AdamW") or self.optimizer_cls.endswith("MuonAdamW"):
            self.optimizer_cls = "common.muon.MuonAdamW"

    @property
    def is_muon(self) -> bool:
        return self.optimizer_cls == "common.muon.MuonAdamW"


@dataclass
class LRSchedulerArgs:
    # warmup (linear warmup, then constant; the seeds' lr_scheduler.scheduler.WarmupLR),
    # exponential (warmup, then gamma**step), cosine_with_warmup (to min_lr at max_updates), constant.
    scheduler_cls: str = "warmup"
    warmup_steps: NonNegativeInt = 5000
    min_lr: Probability = 1e-5  # floor of cosine_with_warmup (as a fraction of each optimizer's lr)
    gamma: Decay = 0.999996  # per-step decay of "exponential"

    def __post_init__(self) -> None:
        if self.scheduler_cls not in SCHEDULER_NAMES:
            raise ValueError(f"lr_scheduler_args.scheduler_cls '{self.scheduler_cls}' unknown; use one of "
                             f"{sorted(SCHEDULER_NAMES)}")

    @property
    def name(self) -> str:
        return SCHEDULER_NAMES[self.scheduler_cls]


@dataclass
class BinarizationArgs:
    num_workers: NonNegativeInt = 8  # processes for prepare_data.py (its --num_workers overrides)
    shuffle: bool = True  # shuffle files (seeded) before taking the val_num validation files
    min_seconds: NonNegativeFloat = 0.5  # shorter files are skipped (reported)
    # longer files are skipped from their header, before decoding (None = no limit): 10 min holds a whole song
    # and bounds a prepare worker to about 1.5 GB (README, "Data preparation")
    max_seconds: PositiveFloat | None = 600.0
    silence_db: AnyFloat = -60.0  # peak below this -> skipped as silent
    max_clip_fraction: Probability = 0.01  # more samples than this at full scale -> skipped as clipped
    # Silero VAD trims leading/trailing silence before mel and f0, keeping trim_margin s each side (speech/trim.py)
    trim_silence: bool = False
    trim_margin: NonNegativeFloat = 0.25
    loudness_lufs: LoudnessTarget | None = None  # a level (e.g. -23): every file scaled to it (ITU-R BS.1770); None = off


# SingingVocoders keys with no equivalent here, each with what does the job instead (a config
# written for SingingVocoders fails on them with that line, not with a guess at a similar name).
_LIGHTNING = ("a PyTorch Lightning launch setting; here a plain run uses one device (cuda when available, "
              "--device cpu forces the CPU) and several GPUs/nodes run through torchrun "
              "(torchrun --nproc_per_node N vocoder/train.py ..., nccl on GPU)")
_LAYOUT = ("SingingVocoders' binarizer layout; here prepare_data.py writes one folder (--output, key "
           "binary_data_dir) holding the train/valid split (val_num) in its manifest.json")


_SEED_AUDIO_KEYS = ("audio_sample_rate", "hop_size", "fft_size", "win_size", "audio_num_mel_bins")


# What validation measures (vocoder/validation.py), the names --best_by takes; "pesq" too with valid_pesq.
VALIDATES = ("mrstft", "mel_l1", *PITCH_METRICS)


@dataclass
class VocoderConfig(CadenceKeys):
    NOT_READ_HERE: ClassVar[dict[str, str]] = {  # common.config names the replacement instead of guessing
        **dict.fromkeys(("pl_trainer_accelerator", "pl_trainer_devices", "pl_trainer_num_nodes",
                         "pl_trainer_strategy", "ddp_backend", "nccl_p2p"), _LIGHTNING),
        **dict.fromkeys(("data_out_path", "DataIndexPath", "valid_set_name", "train_set_name", "raw_data_dir"),
                        _LAYOUT),
        "aug_num": ("SingingVocoders' count of offline augmented copies; here key_aug augments each crop on the "
                    "fly (key_aug, key_aug_prob, aug_min, aug_max)"),
        "shuff_val": ("SingingVocoders' validation-pick shuffle; here binarization_args.shuffle (a seeded "
                      "shuffle before the val_num files are held out)"),
        **dict.fromkeys(("permanent_ckpt_start", "permanent_ckpt_interval"),
                        "not implemented here: the newest save_n_checkpoints (num_ckpt_keep) checkpoints and best.pt "
                        "are kept"),
        "accumulate_grad_batches": ("not implemented for this GAN loop (one critic and one generator update per "
                                    "batch); raise batch_size, or lower crop_mel_frames to fit it"),
        "sampler_frame_count_grid": ("SingingVocoders' length-grid sampler setting; training crops here have one "
                                     "fixed length (crop_mel_frames)"),
    }
    # `--preset` (common.presets): each card setting of vocoder/presets.py -> the key it sets here
    # read by vocoder/prepare_data.py alone: training reads the manifest and the stored mels / f0
    PREPARE_ONLY: ClassVar[tuple[str, ...]] = ("binarization_args", "data_input_path", "val_num", "test_prefixes",
                                               "pe", "pe_ckpt", "f0_min", "f0_max")
    PRESET_KEYS: ClassVar[dict[str, str]] = {"batch_size": "batch_size", "num_workers": "num_workers",
                                             "crop": "crop_mel_frames", "precision": "precision"}
    ALIASES: ClassVar[dict[str, str]] = {
        "generater_optimizer_args": "generator_optimizer_args",
        "discriminate_optimizer_args": "discriminator_optimizer_args",
        # the seed's spellings of the names every trainer reads (docs/conventions.md, "One name per concept")
        "ds_workers": "num_workers", "num_ckpt_keep": "save_n_checkpoints", "pl_trainer_precision": "precision",
        "grad_clip": "clip_grad_norm", "gradient_clip_val": "clip_grad_norm",
        # the seed's flat mel keys -> the audio: block
        **{k: f"audio.{v}" for k, v in AudioSettings.ALIASES.items() if k in _SEED_AUDIO_KEYS},
        "fmin": "audio.fmin", "fmax": "audio.fmax",
        "f0_extractor": "pe",  # the (and the tts guide's) name for DiffSinger's `pe`
        "f0_extractor_weights": "pe_ckpt",
        # the seed's cadence keys -> the five every trainer takes (common.loop.CadenceKeys)
        "log_interval": "log_every", "val_check_interval": "validate_every",
    }

    # ---- task
    task_cls: str = "nsf_HiFigan_task.nsf_HiFigan"  # or nsf_HiFigan_fast_task.nsf_HiFigan (fast MPD + MRD)
    seed: AnyInt = 114514

    # ---- preprocessing (prepare_data.py)
    data_input_path: list[str] = field(default_factory=list)  # folders of raw audio
    binary_data_dir: str | None = None  # the prepared dataset (train.py --data_dir overrides)
    val_num: PositiveInt = 1  # files held out for validation (a seeded random pick; see test_prefixes)
    # DiffSinger's key: files whose path below the input folder starts with one of these are the
    # validation set instead of a random val_num pick (hold out whole speakers: [spk_a/, spk_b/])
    test_prefixes: list[str] = field(default_factory=list)
    # f0 extractor (alias f0_extractor): parselmouth (fast, default), pyin, harvest (pyworld), crepe (torchcrepe),
    # fcpe (torchfcpe), rmvpe (RVC's rmvpe.onnx given as pe_ckpt); harvest/crepe/fcpe are optional packages
    pe: str = "parselmouth"
    pe_ckpt: str = ""  # DiffSinger's key (alias f0_extractor_weights): the weights file pe=rmvpe runs
    f0_min: PositiveFloat = 65.0
    f0_max: PositiveFloat = 1100.0
    binarization_args: BinarizationArgs = field(default_factory=BinarizationArgs)

    # ---- audio / mel (the generator's input contract; exported with the model): sample_rate, n_fft,
    # win_length, hop_length, n_mels, fmin, fmax (44.1 kHz, 2048/2048/512, 128 mels, 40-16000 Hz)
    audio: AudioSettings = field(default_factory=AudioSettings)
    fmax_for_loss: PositiveFloat | None = None  # mel loss upper frequency (None = Nyquist)
    mel_vmin: AnyFloat = -6.0  # colour range of logged mel plots
    mel_vmax: AnyFloat = 1.5

    # ---- data loading and augmentation
    crop_mel_frames: PositiveInt = 48  # random training crop, in mel frames (x hop_size samples)
    batch_size: PositiveInt = 16
    num_workers: NonNegativeInt = 4  # DataLoader worker processes (the seed's ds_workers)
    dataloader_prefetch_factor: PositiveInt = 2  # batches each worker keeps ready
    volume_aug: bool = True  # random gain (and the matching log-mel shift)
    volume_aug_prob: Probability = 0.5
    key_aug: bool = False  # speed/key augmentation: resample the crop by aug_min..aug_max
    key_aug_prob: Probability = 0.5
    aug_min: PositiveFloat = 0.9
    aug_max: PositiveFloat = 1.4
    pc_aug: bool = False  # pitch-controllable NSF training (needs mini_nsf)
    pc_aug_rate: Probability = 0.5  # fraction of each batch used for the pitch-shift cycle losses
    pc_aug_key: NonNegativeFloat = 5.0  # max shift, semitones

    # ---- losses
    use_stftloss: bool = False
    loss_fft_sizes: list[PositiveInt] = field(default_factory=lambda: [2048, 2048, 4096, 1024, 512, 256, 128, 1024])
    loss_hop_sizes: list[PositiveInt] = field(default_factory=lambda: [512, 240, 480, 100, 50, 25, 12, 120])
    loss_win_lengths: list[PositiveInt] = field(default_factory=lambda: [2048, 1200, 2400, 480, 240, 120, 60, 600])
    lab_aux_melloss: NonNegativeFloat = 45.0
    lab_aux_stftloss: NonNegativeFloat = 2.5
    # weight of the L1 of each frame's log power (vocoder/losses.frame_energy_loss) on the loss mel;
    # 0 = off (the references). Reconstruction losses leave a young generator too quiet; this asks
    # for the level alone
    lab_aux_energyloss: NonNegativeFloat = 0.0
    # Steps before the critics switch on: until then no D update and no adversarial / feature-matching
    # term, the generator learns from the mel (+ MR-STFT) reconstruction loss alone (ParallelWaveGAN's
    # discriminator_train_start_steps). Such a step costs the generator's fwd+bwd only.
    discriminator_train_start_steps: NonNegativeInt = 0

    # ---- model
    model_args: ModelArgs = field(default_factory=ModelArgs)

    # ---- optimisation
    generator_optimizer_args: OptimizerArgs = field(default_factory=OptimizerArgs)
    discriminator_optimizer_args: OptimizerArgs = field(default_factory=OptimizerArgs)
    lr_scheduler_args: LRSchedulerArgs = field(default_factory=LRSchedulerArgs)
    clip_grad_norm: PositiveFloat | None = None  # max grad norm per network (None = measure only)
    max_nonfinite_steps: PositiveInt = 20  # consecutive non-finite steps before the run stops
    precision: str = "32-true"  # 32-true | 16-mixed | bf16-mixed | auto (the seed's pl_trainer_precision)
    # CUDA only. On: TF32 convs and matmuls, PyTorch's own default for convs and what SingingVocoders trains
    # with; off: IEEE fp32 convs, 2.55x slower for base_hifi_gpu.yaml on an H200 (bench/README.md)
    tf32: bool = True
    cudnn_benchmark: bool = True  # CUDA only; crops have a fixed shape
    # torch.compile the generator and the critics (fixed-shape crops; Precision.prepare_model). Off: 1.04x on the
    # CPU in bf16 after ~400 s of compiling, 1.01x in fp32 on an H200 after 123 s (bench/README.md, "Fast-path keys")
    compile: bool = False
    # CUDA only, with compile: torch.compile's reduce-overhead mode, which replays the generator's and critics'
    # compiled forward and backward as CUDA graphs (one launch, not one per kernel; the step is sync-free and its
    # crops fixed, what graphs need). Off: not yet measured on a card (bench/README.md, "Fast-path keys")
    cuda_graphs: bool = False
    # The MPD's 2-D convs (the only 4-D ones besides the MRD's) on channels_last (NHWC) activations
    # (vocoder/discriminators.py). Same numbers in fp32 (tests/vocoder/test_fast_path.py). Off: slower on the CPU
    # (0.85x fp32, 0.93x bf16), and a CPU figure cannot decide a GPU default; gpu-check's vocoder "plain +
    # channels_last" row measures it on a card (bench/README.md, "Fast-path keys of the vocoder").
    mpd_channels_last: bool = False

    # ---- loop, logging, checkpoints (all in steps = one D + one G update)
    max_updates: PositiveInt = 150000
    log_every: PositiveInt = 100  # alias log_interval
    logger: str = "tensorboard"  # experiment trackers: tensorboard, wandb, mlflow, comma-separated (--logger)
    validate_every: NonNegativeInt = 2000  # validate + checkpoint every this many steps (alias val_check_interval)
    num_sanity_val_steps: NonNegativeInt = 1  # >0: validate that many files before the first step
    num_valid_plots: NonNegativeInt = 10  # validation files logged as audio + mel plots
    valid_max_seconds: PositiveFloat = 20.0  # validation files are cut to this length
    save_n_checkpoints: PositiveInt = 5  # the newest N step checkpoints kept (the seed's num_ckpt_keep)
    save_best_after: NonNegativeInt = 0  # best.pt (by best_by) only from this step on
    best_by: str = "mrstft"  # the held-out metric best.pt is chosen by (--best_by; VALIDATES, common/best_by.py)
    valid_pesq: bool = False  # also wide-band PESQ at validation (slow on a CPU: ~0.3 s per second of audio)

    # ---- fine-tuning and freezing
    finetune_enabled: bool = False
    finetune_ckpt_path: str | None = None
    finetune_ignored_params: list[str] = field(default_factory=list)  # name substrings not loaded
    finetune_strict_shapes: bool = True
    freezing_enabled: bool = False
    frozen_params: list[str] = field(default_factory=list)  # name prefixes, e.g. discriminator.mpd

    def __post_init__(self) -> None:
        task_kind(self.task_cls)
        self.precision = precision_name(self.precision)
        self.logger = tracker_names(self.logger)
        self.best_by = check_best_by(self.best_by, VALIDATES + ("pesq",) * self.valid_pesq,
                                     {"pesq": "set valid_pesq: true"})
        if self.valid_pesq and importlib.util.find_spec("pesq") is None:  # at start, not at the first validation
            raise ValueError("valid_pesq: the pesq package is not installed: pip install pesq (requirements.txt), "
                             "or set valid_pesq: false")
        a = self.audio
        if math.prod(self.model_args.upsample_rates) != a.hop_length:
            raise ValueError(
                f"model_args.upsample_rates {self.model_args.upsample_rates} multiply to "
                f"{math.prod(self.model_args.upsample_rates)} but audio.hop_length (hop_size) is {a.hop_length}; "
                "make them equal"
            )
        if a.win_length > a.n_fft:
            raise ValueError(f"audio.win_length (win_size, {a.win_length}) must be <= audio.n_fft (fft_size, {a.n_fft})")
        if self.pc_aug and not self.model_args.mini_nsf:
            raise ValueError("pc_aug needs model_args.mini_nsf: true (the pitch-shift cycle uses the mini-NSF source)")
        if self.mpd_channels_last and "mpd" not in self.discriminator_names:  # it would change nothing
            raise ValueError(f"mpd_channels_last: the critics are {self.discriminator_names}, with no mpd; drop the "
                             "key, or add mpd to model_args.discriminators")
        if self.cuda_graphs and self.pc_aug:  # a graph's outputs are its replay's: the second call would overwrite them
            raise ValueError("cuda_graphs with pc_aug: pc_aug runs the generator several times a step, and a CUDA "
                             "graph's outputs are overwritten by its next replay; drop one of the two")
        if self.aug_min > self.aug_max:
            raise ValueError(f"aug_min ({self.aug_min}) must be <= aug_max ({self.aug_max})")
        for name in ("generator_optimizer_args", "discriminator_optimizer_args"):
            opt = getattr(self, name)
            if opt.muon_weight_decay is not None and not opt.is_muon:  # it would change nothing
                raise ValueError(f"{name}.muon_weight_decay (muon_args.weight_decay) is Muon_AdamW's, and this "
                                 f"optimizer is {opt.optimizer_cls}: drop it, or set its optimizer_cls: Muon_AdamW")

    @property
    def task(self) -> str:
        return task_kind(self.task_cls)

    @property
    def discriminator_names(self) -> list[str]:
        return list(self.model_args.discriminators or DEFAULT_DISCRIMINATORS[self.task])

    def optimizer_spec(self) -> dict:
        """Each optimizer's hyper-parameters and the config keys that set them (a resume that gives
        one explicitly replaces the checkpoint's value: `common.training.optimizer_overrides`)."""
        spec = {}
        for name, key in (("generator", "generator_optimizer_args"), ("discriminator", "discriminator_optimizer_args")):
            a = getattr(self, key)
            spec[name] = {"lr": ((f"{key}.lr",), a.lr), "betas": ((f"{key}.beta1", f"{key}.beta2"), (a.beta1, a.beta2)),
                          "eps": ((f"{key}.eps",), a.eps), "weight_decay": ((f"{key}.weight_decay",), a.weight_decay)}
            if a.muon_weight_decay is not None:  # the Muon half's, re-applied after a weight_decay (which sets both)
                spec[name]["muon_weight_decay"] = ((f"{key}.muon_weight_decay", f"{key}.weight_decay"),
                                                   a.muon_weight_decay)
        return spec
