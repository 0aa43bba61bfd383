"""Configuration of the voice-cloning model and of `tts/train_main.py`, as typed dataclasses.

One schema, loaded by `common.config.load_config` from YAML (`tts/clone/configs/clone_*.yaml`) and then
overridden by the script's flags. The defaults ARE the documented "after" values of tts/CLONE.md
(what we recommend instead of the XTTS-style settings users arrive with); the `fast_convergence`
preset is applied on top by `tts/clone/options.py`, never hidden in here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from common.best_by import check_best_by
from common.log import tracker_names
from common.loop import CadenceKeys
from common.precision import precision_name
from common.ranges import (
    AnyFloat,
    AnyInt,
    Decay,
    Fraction,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Probability,
)
from speech.audio import AudioSettings
from speech.f0 import SPEECH_F0_MAX, SPEECH_F0_METHOD, SPEECH_F0_MIN

# size -> (text dim, layers, heads), (audio/reference dim, layers, heads), (decoder dim, layers, heads)
SIZES: dict[str, dict[str, tuple[int, int, int]]] = {
    "tiny": {"text": (64, 2, 2), "audio": (64, 2, 2), "decoder": (96, 2, 2)},
    "small": {"text": (256, 4, 4), "audio": (256, 4, 4), "decoder": (384, 6, 6)},
    "normal": {"text": (512, 6, 8), "audio": (512, 6, 8), "decoder": (768, 8, 12)},
}
# postnet (channels, layers) and duration-predictor width per size
POSTNET: dict[str, tuple[int, int]] = {"tiny": (64, 3), "small": (256, 5), "normal": (512, 5)}
DURATION_HIDDEN: dict[str, int] = {"tiny": 64, "small": 256, "normal": 256}


@dataclass
class ModelConfig:
    """Architecture. `size` picks the table above; the other fields are shared by all sizes."""

    size: Literal["tiny", "small", "normal"] = "normal"
    ffn_mult: PositiveInt = 2  # feed-forward width = ffn_mult * dim (conv kernel 3, then 1)
    kernel_size: PositiveInt = 3
    dropout: Fraction = 0.1
    max_log_duration: PositiveFloat = 6.0  # clamp of the predicted log-duration at inference (e^6 ≈ 400 frames)


@dataclass
class AudioConfig(AudioSettings):
    """The shared mel block (`speech.audio.AudioSettings`: the vocoder's 44.1 kHz values, which these
    must equal; checked when the vocoder is loaded) plus the f0 the decoder predicts."""

    # speech: the speech range and extractor (speech.f0.SPEECH_F0_*: pyin, which measured no octave jump on any
    # voice of the demo's; Praat's autocorrelation jumps octaves on low male voices, bench/README.md "f0 extractors")
    f0_min: PositiveFloat = SPEECH_F0_MIN
    f0_max: PositiveFloat = SPEECH_F0_MAX
    # f0 extractor: parselmouth | pyin | harvest | crepe | fcpe | rmvpe (speech.f0.extract_f0); rmvpe runs the
    # weights file f0_weights (RVC's rmvpe.onnx). Both are part of the feature cache's identity (data.features_tag)
    f0_method: str = SPEECH_F0_METHOD
    f0_weights: str = ""


@dataclass
class DataConfig:
    train: str = ""            # --train-data: train.jsonl or a prepared folder (then its train.jsonl)
    val: str = ""              # --val-data: eval.jsonl; default: the prepared folder's eval.jsonl
    cache_dir: str = ""        # mel/f0 cache; default <checkpoint_dir>/features (input is never modified)
    # Limits of the one shared data check (tts.prepare_data.check_item, the VITS trainer's);
    # same defaults as the VITS DataConfig.
    min_seconds: NonNegativeFloat = 0.5
    max_seconds: PositiveFloat = 15.0
    min_text_len: NonNegativeInt = 2  # symbols of the normalised text
    max_text_len: PositiveInt = 400
    min_chars_per_second: NonNegativeFloat = 4.0
    max_chars_per_second: PositiveFloat = 30.0
    silence_db: AnyFloat = -50.0
    max_clip_fraction: Probability = 0.01
    ref_seconds: PositiveFloat = 3.0  # reference crop during training (fixed length: a static shape)
    min_ref_seconds: PositiveFloat = 1.0  # a reference clip shorter than this is refused
    num_buckets: PositiveInt = 8  # length buckets: every batch is padded to its bucket's fixed lengths
    frame_multiple: PositiveInt = 16  # bucket frame lengths are rounded up to this
    text_multiple: PositiveInt = 8  # bucket text lengths are rounded up to this
    prefetch_factor: PositiveInt = 4  # only with num_workers > 0
    pin_memory: bool = True    # only on CUDA
    stats_items: PositiveInt = 256  # training items used for the mel mean/std at a fresh start


@dataclass
class OptimConfig:
    optimizer: Literal["adamw", "muon_adamw"] = "adamw"
    lr: PositiveFloat = 2e-4
    beta1: Fraction = 0.9
    beta2: Fraction = 0.98
    eps: PositiveFloat = 1e-9
    weight_decay: NonNegativeFloat = 0.01
    clip_grad_norm: NonNegativeFloat = 1.0  # 0 disables clipping (the norm is still logged)
    fused: bool | None = None  # torch's fused AdamW: null = CUDA only; true/false = any device / never (common.muon)
    batched_ns: bool | None = None  # MuonAdamW's Newton-Schulz batched by weight shape; null/false = off (common.muon)


@dataclass
class SchedulerConfig:
    name: Literal["noam", "cosine_with_warmup", "exponential", "constant"] = "cosine_with_warmup"
    warmup_steps: NonNegativeInt = 1000
    min_ratio: Probability = 0.05  # cosine floor, as a fraction of the peak LR
    gamma: Decay = 0.99995     # exponential decay per optimizer step


@dataclass
class LossConfig:
    mel: NonNegativeFloat = 1.0  # L1 on the decoder mel and on the post-net mel (normalised units)
    duration: NonNegativeFloat = 1.0  # MSE on log-durations from MAS
    prior: NonNegativeFloat = 1.0  # Gaussian prior under the MAS path (what teaches the aligner)
    f0: NonNegativeFloat = 0.5  # L1 on normalised log-f0
    voiced: NonNegativeFloat = 0.1  # BCE on the voiced flag


# What validation measures (tts/clone/evaluation.py: teacher-forced), the names --best_by takes.
VALIDATES = ("mel_l1", "loss")


@dataclass
class TrainConfig(CadenceKeys):
    # the spellings of the cadence keys before they were one set (common.loop.CadenceKeys)
    ALIASES: ClassVar[dict[str, str]] = {"log_interval": "log_every", "val_check_interval": "validate_every",
                                         "save_interval": "save_every"}
    checkpoint_dir: str = "runs/tts_clone"
    epochs: PositiveInt = 1000
    max_updates: NonNegativeInt = 0  # optimizer steps; 0 = run until --epochs
    batch_size: PositiveInt = 32
    # > 0: a micro-batch holds at most this many padded mel frames (items x their bucket's length), so a
    # bucket of long utterances makes smaller batches; batch_size stays the upper bound. 0 = off
    max_frames_per_batch: NonNegativeInt = 0
    grad_accum: PositiveInt = 1
    num_workers: NonNegativeInt = 4
    precision: str = "auto"    # 32-true | 16-mixed | bf16-mixed | auto (bf16-mixed on a bf16 GPU, else 32-true)
    device: str = "auto"
    seed: AnyInt = 1234
    log_every: PositiveInt = 50  # optimizer steps (alias log_interval)
    logger: str = "tensorboard"  # experiment trackers: tensorboard, wandb, mlflow, comma-separated (--logger)
    validate_every: NonNegativeInt = 1000  # alias val_check_interval
    save_every: NonNegativeInt = 1000  # also saved at every validation and at the end (alias save_interval)
    save_n_checkpoints: PositiveInt = 5
    save_best_after: NonNegativeInt = 0
    best_by: str = "mel_l1"  # the held-out metric best.pt is chosen by (--best_by; VALIDATES, common/best_by.py)
    max_gpu_memory: Probability = 0.0  # fraction of the GPU for this process; 0 = no cap
    max_nonfinite: PositiveInt = 20  # this many non-finite steps in a row stop the run
    compile: bool = False      # torch.compile the model (bucketed shapes keep recompiles bounded)
    tf32: bool = True
    cudnn_benchmark: bool = True

    def __post_init__(self) -> None:
        self.precision = precision_name(self.precision)
        self.logger = tracker_names(self.logger)
        self.best_by = check_best_by(self.best_by, VALIDATES)


@dataclass
class ValConfig:
    at_start: bool = True      # validate the untrained model at step 0 (the "before" figure)
    batch_size: PositiveInt = 16
    max_batches: NonNegativeInt = 0  # 0 = the whole eval set
    sentences: list[str] = field(default_factory=lambda: [
        "Salom, bugun havo juda yaxshi.",
        "Men o'zbek tilida gapirishni yaxshi ko'raman.",
    ])
    reference: str = ""        # fixed reference voice (wav); "" = the first eval item's audio
    # eval items spoken free-running and scored against their recordings (MCD, F0 RMSE, V/UV, periodicity,
    # speaker similarity: tts/clone/evaluation.py synthesis_metrics); 0 = off
    synth_items: NonNegativeInt = 8
    # the speaker encoder of speaker_sim (speech/speaker_similarity.py): "resemblyzer" = the weights in that
    # package (pip install --no-deps resemblyzer==0.1.4), a path = your state-dict file (TorchScript / .pt2 only
    # with TRUST_CODE_FILES=1: it runs code), "" = off
    speaker_encoder: str = "resemblyzer"
    plateau_patience: PositiveInt = 5  # validations without improvement before the plateau notice
    plateau_min_delta: NonNegativeFloat = 0.005  # relative improvement that counts


@dataclass
class VocoderConfig:
    path: str = ""             # exported NSF-HiFiGAN (vocoder/export.py) for validation/inference audio


@dataclass
class CloneConfig:
    ALIASES: ClassVar[dict[str, str]] = {"precision": "train.precision", "logger": "train.logger",
                                         "best_by": "train.best_by",  # the keys every trainer reads
                                         **{k: f"train.{k}" for k in ("log_every", "validate_every", "save_every",
                                                                       "max_minutes", "stop_at_step")}}
    # `--preset` (common.presets): each card setting of tts/clone/presets.py -> the key it sets here
    OOM_KEYS: ClassVar[dict[str, str]] = {"accumulation": "train.grad_accum"}  # common.stopping.oom_hints
    PRESET_KEYS: ClassVar[dict[str, str]] = {"batch_size": "train.batch_size", "num_workers": "train.num_workers",
                                             "crop": "data.ref_seconds", "precision": "train.precision"}

    model: ModelConfig = field(default_factory=ModelConfig)
    audio: AudioConfig = field(default_factory=AudioConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    val: ValConfig = field(default_factory=ValConfig)
    vocoder: VocoderConfig = field(default_factory=VocoderConfig)


def config_from_dict(d: dict) -> CloneConfig:
    """Rebuild the typed config saved inside a checkpoint (`config_to_dict` output), strictly:
    an unknown key is an error, as everywhere else. Values go in as JSON `--set` overrides so
    None (e.g. `audio.fmax: null`) survives."""
    import json

    from common.config import load_config

    overrides: list[str] = []

    def walk(prefix: str, node: dict) -> None:
        for k, v in node.items():
            if isinstance(v, dict):
                walk(f"{prefix}{k}.", v)
            else:
                overrides.append(f"{prefix}{k}={json.dumps(v, ensure_ascii=False)}")

    walk("", d)
    return load_config(None, CloneConfig, overrides=overrides)
