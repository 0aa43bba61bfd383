"""Typed configuration of the Uzbek VITS trainer, and the model presets.

One schema serves prepare_data.py, train.py, synthesize.py and export_onnx.py, so the YAML a
user trains with is also the one that prepared the data (same sample rate, hop, filters).
Key names follow Coqui TTS / jaywalnut310 VITS where those exist (``batch_size``,
``eval_batch_size``, ``print_step``, ``save_step``, ``save_n_checkpoints``, ``save_best_after``,
``test_delay_epochs``, ``test_sentences``), except the keys every trainer shares ("One name per
concept" in docs/conventions.md: ``num_workers``, ``val_check_interval``, ``clip_grad_norm``,
``precision``), whose Coqui / guide spellings (``num_loader_workers``, ``eval_interval``,
``grad_clip``, ``gradient_clip_val``, ``mixed_precision`` + ``amp_dtype``, and ``filter_length`` /
``sampling_rate`` in ``audio``) are aliases translated at load, so their configs read naturally here.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal

from common.best_by import check_best_by
from common.config import ConfigError, build_dataclass
from common.log import tracker_names
from common.loop import CadenceKeys
from common.precision import MixedPrecisionSwitch, precision_name
from common.ranges import (
    AnyFloat,
    AnyInt,
    Decay,
    Fraction,
    Length,
    LoudnessTarget,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Probability,
)
from speech.audio import AudioSettings
from speech.pitch_metrics import PITCH_METRICS


@dataclass
class VitsArgs:
    """Architecture hyper-parameters (the paper's / jaywalnut310's names)."""

    hidden_channels: PositiveInt = 192
    inter_channels: PositiveInt = 192
    filter_channels: PositiveInt = 768
    n_heads: PositiveInt = 2
    n_layers: PositiveInt = 6
    kernel_size: PositiveInt = 3
    p_dropout: Fraction = 0.1
    window_size: PositiveInt = 4  # relative-position window of the text encoder's attention
    # HiFi-GAN generator ("decoder")
    resblock: Literal["1", "2"] = "1"
    resblock_kernel_sizes: list[PositiveInt] = field(default_factory=lambda: [3, 7, 11])
    resblock_dilation_sizes: list[list[PositiveInt]] = field(default_factory=lambda: [[1, 3, 5]] * 3)
    upsample_rates: list[PositiveInt] = field(default_factory=lambda: [8, 8, 2, 2])
    upsample_initial_channel: PositiveInt = 512
    upsample_kernel_sizes: list[PositiveInt] = field(default_factory=lambda: [16, 16, 4, 4])
    # posterior encoder (WaveNet) and flow
    posterior_kernel_size: PositiveInt = 5
    n_layers_q: PositiveInt = 16
    n_flows: PositiveInt = 4
    flow_n_layers: PositiveInt = 4
    flow_kernel_size: PositiveInt = 5
    # durations
    use_sdp: bool = True  # stochastic duration predictor (else the deterministic one)
    dp_filter_channels: PositiveInt = 256
    # speakers
    gin_channels: PositiveInt = 256  # speaker embedding size (used when the data has > 1 speaker)
    # training crop of the latent, in spectrogram frames (segment_size / hop in jaywalnut310)
    segment_frames: PositiveInt = 32
    # discriminator: periods of the MPD plus one scale discriminator (as VITS)
    mpd_periods: list[PositiveInt] = field(default_factory=lambda: [2, 3, 5, 7, 11])
    disc_channel_scale: PositiveFloat = 1.0  # width multiplier of every discriminator layer
    use_spectral_norm: bool = False


# Presets. vits_base is jaywalnut310's ljs_base/vctk_base; x_low/medium/high follow Piper's
# quality levels (piper_train --quality); tiny is for CPU tests and the demo.
PRESETS: dict[str, dict[str, Any]] = {
    "vits_base": {},
    "x_low": {
        "hidden_channels": 96, "inter_channels": 96, "filter_channels": 384,
        "resblock": "2", "resblock_kernel_sizes": [3, 5, 7],
        "resblock_dilation_sizes": [[1, 2], [2, 6], [3, 12]], "upsample_rates": [8, 8, 4],
        "upsample_initial_channel": 256, "upsample_kernel_sizes": [16, 16, 8],
    },
    "medium": {
        "resblock": "2", "resblock_kernel_sizes": [3, 5, 7],
        "resblock_dilation_sizes": [[1, 2], [2, 6], [3, 12]], "upsample_rates": [8, 8, 4],
        "upsample_initial_channel": 256, "upsample_kernel_sizes": [16, 16, 8],
    },
    "high": {},  # Piper "high" is the full VITS decoder (resblock 1, 512 channels)
    "tiny": {
        "hidden_channels": 32, "inter_channels": 32, "filter_channels": 96, "n_heads": 2,
        "n_layers": 2, "p_dropout": 0.0, "resblock": "2", "resblock_kernel_sizes": [3, 5],
        "resblock_dilation_sizes": [[1, 2], [2, 6]], "upsample_rates": [8, 8, 4],
        "upsample_initial_channel": 64, "upsample_kernel_sizes": [16, 16, 8],
        "n_layers_q": 3, "n_flows": 2, "flow_n_layers": 2, "use_sdp": False,
        "dp_filter_channels": 64, "gin_channels": 32, "segment_frames": 16,
        "mpd_periods": [2, 3, 5], "disc_channel_scale": 0.125,
    },
}


def model_args(preset: str, overrides: dict[str, Any] | None = None) -> VitsArgs:
    """Preset + ``model_args`` overrides → VitsArgs; unknown names fail with a suggestion."""
    if preset not in PRESETS:
        close = difflib.get_close_matches(preset, list(PRESETS), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"unknown model preset '{preset}' (config key 'model'); valid: "
                          f"{', '.join(PRESETS)}{hint}")
    args = {**PRESETS[preset], **(overrides or {})}
    return build_dataclass(VitsArgs, args, "model_args.", f"model_args over preset '{preset}'")


@dataclass
class AudioConfig(AudioSettings):
    """The shared mel block (`speech.audio.AudioSettings`, its aliases included) with jaywalnut310's
    22.05 kHz ljs_base values as defaults."""

    sample_rate: PositiveInt = 22050
    n_fft: PositiveInt = 1024
    win_length: PositiveInt = 1024
    hop_length: PositiveInt = 256
    n_mels: PositiveInt = 80
    fmin: NonNegativeFloat = 0.0
    fmax: PositiveFloat | None = None


@dataclass
class DataConfig:
    """What prepare_data.py keeps (filters) and how it splits; read again by the data loader."""

    # read by tts/prepare_data.py alone (training reads the lists it wrote); add_blank, num_buckets: training's
    PREPARE_ONLY: ClassVar[tuple[str, ...]] = (
        "data.min_audio_len", "data.max_audio_len", "data.min_text_len", "data.max_text_len",
        "data.min_chars_per_second", "data.max_chars_per_second", "data.silence_db", "data.max_clip_fraction",
        "data.eval_split_size", "data.eval_split_max_size", "data.split_seed", "data.trim_silence",
        "data.trim_margin", "data.loudness_lufs")

    min_audio_len: NonNegativeFloat = 0.5  # seconds
    max_audio_len: PositiveFloat = 15.0
    min_text_len: NonNegativeInt = 2  # tokens of the normalised text
    max_text_len: PositiveInt = 400
    min_chars_per_second: NonNegativeFloat = 4.0  # normalised letters per second: catches wrong transcripts
    max_chars_per_second: PositiveFloat = 30.0
    silence_db: AnyFloat = -50.0
    max_clip_fraction: Probability = 0.01
    eval_split_size: PositiveFloat = 0.02  # a fraction (< 1) or a count (>= 1) of utterances
    eval_split_max_size: PositiveInt = 64
    split_seed: AnyInt = 1234
    # Silero VAD trims leading/trailing silence before the spec is made, keeping trim_margin s each side
    # (Piper's 0.25 s; speech/trim.py); prepare_data.py --no_trim turns it off
    trim_silence: bool = True
    trim_margin: NonNegativeFloat = 0.25
    loudness_lufs: LoudnessTarget | None = None  # a level (e.g. -23): every file scaled to it (ITU-R BS.1770); None = off
    add_blank: bool = True  # intersperse a blank token between symbols (VITS)
    num_buckets: PositiveInt = 8  # length buckets of the training batches


# What evaluation measures (tts/vits/evaluation.py), the names --best_by takes.
VALIDATES = ("score", "mcd", "align_sharpness", "dur_mae", "dur_err", *PITCH_METRICS)


@dataclass
class TrainConfig(CadenceKeys):
    """Everything train.py reads. Defaults are the RTX 4090 recipe's (tts/vits/configs/uzbek_vits.yaml)."""

    run_name: str = "uzbek_vits_rtx4090"
    seed: AnyInt = 1234
    model: str = "vits_base"  # preset name, see PRESETS
    model_args: dict[str, Any] = field(default_factory=dict)
    audio: AudioConfig = field(default_factory=AudioConfig)
    data: DataConfig = field(default_factory=DataConfig)
    # front-end: "text" = normalised Latin letters; "espeak" = espeak-ng IPA of espeak_voice (Piper's
    # phoneme_type; needs espeak-ng; prepare_data.py caches the phonemes), see tts/text/phonemes.py
    phoneme_type: Literal["text", "espeak"] = "text"
    espeak_voice: str = "uz"
    # batches and loading
    batch_size: PositiveInt = 64
    # > 0: a batch holds at most this many padded spectrogram frames (items x their bucket's length), so a
    # bucket of long utterances makes smaller batches; batch_size stays the upper bound. 0 = off
    max_frames_per_batch: NonNegativeInt = 0
    eval_batch_size: PositiveInt = 16
    num_workers: NonNegativeInt = 6  # DataLoader workers (Coqui's num_loader_workers)
    num_eval_loader_workers: NonNegativeInt = 2
    pin_memory: bool = True
    prefetch_factor: PositiveInt = 2
    persistent_workers: bool = True
    # optimisation (separate G and D optimizers and schedulers)
    optimizer_cls: str = "AdamW"
    lr: PositiveFloat = 2e-4  # both networks unless lr_gen / lr_disc are set
    lr_gen: PositiveFloat | None = None
    lr_disc: PositiveFloat | None = None
    betas: Annotated[list[Fraction], Length(2)] = field(default_factory=lambda: [0.8, 0.99])
    eps: PositiveFloat = 1e-9
    weight_decay: NonNegativeFloat = 0.01  # AdamW's; jaywalnut310 (torch's default) and Coqui both use 0.01
    optimizer_fused: bool | None = None  # torch's fused AdamW: null = CUDA only; true/false = any device / never (common.muon)
    optimizer_batched_ns: bool | None = None  # MuonAdamW's Newton-Schulz batched by weight shape; null/false = off (common.muon)
    lr_gamma: Decay = 0.999875  # exponential decay factor ...
    # ... applied once per EPOCH as jaywalnut310 (scheduler.step() after each epoch) and Coqui
    # (scheduler_after_epoch) do; "step" applies it after every optimizer step (far faster decay)
    lr_scheduler_per: Literal["step", "epoch"] = "epoch"
    clip_grad_norm: PositiveFloat | None = 1.0  # max total gradient norm per network (None: measure only)
    # 32-true | 16-mixed | bf16-mixed | auto; Coqui's `mixed_precision: true|false` + `amp_dtype: fp16|bf16`
    # are read as this key when the config loads (MULTI_KEY_ALIASES)
    precision: str = "bf16-mixed"
    tf32: bool = True
    # cudnn.benchmark autotunes each new input shape once. With it (on CUDA) or compile, each batch is
    # padded to its length bucket's fixed (text, frames) size (data.num_buckets shapes per run, not one
    # per batch): see common.data.BucketShapes and bench/bench_vits_rtx.py for the counts.
    cudnn_benchmark: bool = False
    compile: bool = False  # torch.compile (in place) the HiFi-GAN decoder and every critic: fixed-shape crops
    channels_last: bool = False  # channels_last layout for the period critics' Conv2d (the only 4-D convs)
    deterministic: bool = False  # deterministic kernels + cudnn flags (common.precision.Precision)
    max_nonfinite_steps: PositiveInt = 20  # consecutive skipped steps before the run stops
    # alignment: the beta-binomial diagonal prior added to what MAS sees (not to the loss), with
    # weight mas_prior_weight at step 0 falling linearly to 0 at mas_prior_steps (0 = off, as the paper)
    mas_prior_steps: NonNegativeInt = 0
    mas_prior_weight: NonNegativeFloat = 1.0
    # losses
    c_mel: NonNegativeFloat = 45.0
    c_kl: NonNegativeFloat = 1.0
    # multi-resolution STFT loss on the decoded segment (Parallel WaveGAN's, from vocoder/losses.py);
    # 0 = the paper's objective. Its spectral-convergence term is linear in magnitude, so it weighs
    # the harmonic peaks that carry the power, which the log-mel L1 leaves too quiet early on
    c_stft: NonNegativeFloat = 0.0
    # L1 of each frame's log power on the decoded segment (vocoder/losses.frame_energy_loss); 0 = the
    # paper. Reconstruction losses leave a young decoder too quiet; this one asks for the level only
    c_energy: NonNegativeFloat = 0.0
    # Steps before the critics join (as the vocoder's key of the same name): until then no D update and
    # no adversarial / feature-matching term, the decoder learns from mel (+ MR-STFT) reconstruction and
    # the prior from the KL alone, at the cost of the generator's fwd+bwd only. 0 = the paper (from step 0)
    discriminator_train_start_steps: NonNegativeInt = 0
    # schedule
    epochs: PositiveInt = 200
    max_steps: PositiveInt | None = None  # stop after this many steps (None: run the epochs)
    log_every: PositiveInt = 50  # alias print_step, log_interval
    logger: str = "tensorboard"  # experiment trackers: tensorboard, wandb, mlflow, comma-separated (--logger)
    save_every: NonNegativeInt = 500  # alias save_step, checkpoint_interval
    save_n_checkpoints: PositiveInt = 8
    save_best_after: NonNegativeInt = 5000
    best_by: str = "score"  # the held-out metric best.pt is chosen by (--best_by; VALIDATES, common/best_by.py)
    validate_every: NonNegativeInt = 500  # steps between evaluations; 0 = at the end only (alias val_check_interval)
    test_delay_epochs: NonNegativeInt = 3
    run_eval: bool = True
    eval_at_start: bool = False  # evaluate the untrained model too (the demo's "step 0" figures)
    progress_bar: bool = True
    eval_max_items: PositiveInt = 32  # eval utterances used for MCD/alignment metrics
    # the speaker encoder of evaluation's speaker_sim (speech/speaker_similarity.py): "resemblyzer" = the weights
    # in that package (pip install --no-deps resemblyzer==0.1.4), a path = your state-dict file (a TorchScript /
    # .pt2 file only with TRUST_CODE_FILES=1: it runs code), "" = off; a missing one is one line and the metric is off
    speaker_encoder: str = "resemblyzer"
    test_sentences: list[str] = field(default_factory=list)
    test_speaker: str | None = None  # speaker name for test sentences (default: the first)
    noise_scale: NonNegativeFloat = 0.667
    noise_scale_w: NonNegativeFloat = 0.8
    length_scale: PositiveFloat = 1.0
    # data location (usually from the command line)
    data_dir: str | None = None
    run_dir: str | None = None
    # `--preset` (common.presets): each card setting of tts/vits/presets.py -> the key it sets here
    PRESET_KEYS: ClassVar[dict[str, str]] = {"batch_size": "batch_size", "num_workers": "num_workers",
                                             "crop": "model_args.segment_frames", "precision": "precision"}
    ALIASES: ClassVar[dict[str, str]] = {
        # Coqui's / the guides' spellings of the names every trainer reads (docs/conventions.md, "One name
        # per concept"); gradient_clip_val is Lightning's name, as the 4090 guide writes it
        "num_loader_workers": "num_workers", "ds_workers": "num_workers",
        "eval_interval": "validate_every", "val_check_interval": "validate_every",
        "grad_clip": "clip_grad_norm", "grad_clip_norm": "clip_grad_norm", "gradient_clip_val": "clip_grad_norm",
        "max_updates": "max_steps", "checkpoint_interval": "save_every", "save_step": "save_every",
        "log_interval": "log_every", "print_step": "log_every",
        "learning_rate": "lr", "lr_decay": "lr_gamma",
    }
    MULTI_KEY_ALIASES: ClassVar[tuple[MixedPrecisionSwitch, ...]] = (MixedPrecisionSwitch(
        "mixed_precision", "amp_dtype", (("fp16", "16-mixed"), ("bf16", "bf16-mixed")), default_mixed="bf16-mixed"),)

    def __post_init__(self) -> None:
        self.precision = precision_name(self.precision)
        self.logger = tracker_names(self.logger)
        self.best_by = check_best_by(self.best_by, VALIDATES + ("speaker_sim",) * bool(self.speaker_encoder),
                                     {"speaker_sim": "it needs a speaker_encoder"})
        self.args()  # model_args is a free mapping: its keys, types and ranges are checked at load too

    def args(self) -> VitsArgs:
        return model_args(self.model, self.model_args)
