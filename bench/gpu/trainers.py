"""The four trainers as `make gpu-check` drives them: each one's base and RTX 5090 configs, its tiny
test-size overrides (the dry run), synthetic data made on the fly, its speed keys, and one call that
builds the real trainer and hands back its real training step and its real data loader.

Nothing here trains differently from the trainers: a `Stepper` is the trainer's own object, its
`step` is the trainer's `train_step`, its `batches` the trainer's own DataLoader (so the data-wait
fraction is the real one). Tiny sizes come from each trainer's configs/tiny.yaml, the file the tests train
with, so the dry run exercises what the fast test suite already keeps working.
"""

from __future__ import annotations

import contextlib
import io
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

import torch

from common.config import file_overrides

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Stepper:
    """One built trainer: `step(batch)` is one optimizer step (all of its networks), `batches()` its
    loader, endlessly. `samples` = items per step (batch x accumulation)."""

    trainer: object
    step: Callable[[object], None]
    batches: Callable[[], Iterator]
    batch_size: int
    samples: int
    precision: str
    compiled: bool


@dataclass
class TrainerSpec:
    """What gpu_check needs to know about one trainer; the methods build it."""

    name: str
    base: Path
    rtx: Path
    options: dict[str, list[str] | str] = field(default_factory=dict)  # label -> overrides, or why n/a
    plain: list[str] = field(default_factory=list)  # every speed key off: the ablation's baseline
    # label -> the row's overrides in the dry run, where the tiny config lacks what the row needs
    dry_options: dict[str, list[str]] = field(default_factory=dict)
    rtx_preset: str | None = None  # a preset the 5090 run adds on top of `rtx` (the cloning trainer's way)
    # synthetic training items at real size: 16 of the base config's batches, so that the 15 steps of a row
    # cross no epoch boundary (each one drains the loader's prefetch: the second lent H200 measured 44 % data
    # wait for the cloning trainer, which then had 3 batches an epoch)
    full_items: int = 0

    def tiny(self) -> list[str]:
        raise NotImplementedError

    def make_data(self, root: Path, dry: bool) -> Path:
        raise NotImplementedError

    def build(self, config: Path, overrides: list[str], data: Path, run: Path, device: torch.device,
              preset: str | None) -> Stepper:
        raise NotImplementedError

    def main_argv(self, config: Path, overrides: list[str], data: Path, run: Path, device: torch.device,
                  preset: str | None, steps: int) -> tuple[Callable[[list[str]], int], list[str]]:
        """The trainer's CLI `main` and argv for a `steps`-step run of `config` (exit codes: common.exit_codes)."""
        raise NotImplementedError

    def step_class(self) -> type:
        """The class whose `train_step` the dry run's forced OOM patches."""
        raise NotImplementedError

    def cli_context(self) -> contextlib.AbstractContextManager:
        """What the trainer's CLI run needs on a machine with nothing cached (the lent GPU machine)."""
        return contextlib.nullcontext()


def _sets(overrides: list[str]) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


def _cycle(loader, sampler=None) -> Iterator:
    for epoch in itertools.count():
        if sampler is not None and hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        yield from loader


def _quiet():
    """Trainers print their set-up; gpu_check keeps its log for what it measured."""
    return contextlib.redirect_stdout(io.StringIO())


# ------------------------------------------------------------------------------------------ vocoder
class Vocoder(TrainerSpec):
    def __init__(self) -> None:
        from bench.bench_vocoder import BASE, RTX

        super().__init__("vocoder", BASE, RTX, options={
            "fp16 (16-mixed + GradScaler)": ["precision=16-mixed"], "bf16 (bf16-mixed)": ["precision=bf16-mixed"],
            "TF32": ["tf32=true"],
            # the MPD's 2-D convs (the generator's are 1-D); the critics named are base's own
            "channels_last": ["model_args.discriminators=[mpd,msd]", "mpd_channels_last=true"],
            "torch.compile": ["compile=true"], "cudnn benchmark": ["cudnn_benchmark=true"],
            "torch.compile + CUDA graphs": ["compile=true", "cuda_graphs=true"]},
            plain=["precision=32-true", "tf32=false", "compile=false", "cudnn_benchmark=false",
                   "mpd_channels_last=false"], full_items=256,
            # the tiny critics are fast_mpd only and mpd_channels_last needs an MPD: the MPD alone (with base's
            # full-width MSD beside it, the dry run's slowest row by 5 s)
            dry_options={"channels_last": ["model_args.discriminators=[mpd]", "mpd_channels_last=true"]})

    def tiny(self) -> list[str]:
        return file_overrides(REPO / "vocoder" / "configs" / "tiny.yaml")

    def make_data(self, root: Path, dry: bool) -> Path:
        from bench.bench_vocoder import make_dataset

        return make_dataset(root, seconds=1.0 if dry else 2.0, n=5 if dry else self.full_items + 1)

    def _config(self, config: Path, overrides: list[str]):
        from common.config import load_config
        from vocoder.config import VocoderConfig

        return load_config(config, VocoderConfig, overrides)

    def build(self, config, overrides, data, run, device, preset) -> Stepper:
        from vocoder.train import VocoderTrainer

        cfg = self._config(config, [*overrides, "num_sanity_val_steps=0"])
        with _quiet():
            tr = VocoderTrainer(cfg, data, run, device=device.type, log=lambda *a, **k: None)
        return Stepper(tr, tr.train_step, lambda: _cycle(tr.loader, tr.sampler), cfg.batch_size, cfg.batch_size,
                       cfg.precision, cfg.compile)

    def main_argv(self, config, overrides, data, run, device, preset, steps):
        from vocoder.train import main

        return main, ["--config", str(config), "--data_dir", str(data), "--run_dir", str(run), "--device", device.type,
                      *_sets(["num_sanity_val_steps=0", f"max_updates={steps}", *overrides])]

    def step_class(self) -> type:
        from vocoder.train import VocoderTrainer

        return VocoderTrainer


# ------------------------------------------------------------------------------------------ VITS
class Vits(TrainerSpec):
    def __init__(self) -> None:
        configs = REPO / "tts" / "vits" / "configs"
        super().__init__("vits", configs / "uzbek_vits.yaml", configs / "uzbek_vits_rtx5090.yaml", options={
            "fp16 (16-mixed + GradScaler)": ["precision=16-mixed"], "bf16 (bf16-mixed)": ["precision=bf16-mixed"],
            "TF32": ["tf32=true"], "channels_last": ["channels_last=true"], "torch.compile": ["compile=true"],
            "cudnn benchmark": ["cudnn_benchmark=true"]},
            plain=["precision=32-true", "tf32=false", "channels_last=false", "compile=false", "cudnn_benchmark=false"],
            full_items=1024)

    def tiny(self) -> list[str]:
        # lr_gamma and cudnn_benchmark are in tiny.yaml only to give the tests the schema's defaults: the
        # dry run keeps the measured config's
        return file_overrides(REPO / "tts" / "vits" / "configs" / "tiny.yaml", skip=("lr_gamma", "cudnn_benchmark"))

    def make_data(self, root: Path, dry: bool) -> Path:
        from bench.bench_tts import synthetic_corpus

        return synthetic_corpus(root, 6 if dry else self.full_items + 2, seconds=2.0)

    def _config(self, config: Path, overrides: list[str], data: Path, run: Path):
        from common.config import load_config
        from tts.vits.config import TrainConfig

        sets = ["run_eval=false", "eval_at_start=false", "test_sentences=[]", "progress_bar=false", *overrides]
        return load_config(config, TrainConfig, sets, extra={"data_dir": str(data), "run_dir": str(run)})

    def build(self, config, overrides, data, run, device, preset) -> Stepper:
        from common.distributed import setup_distributed
        from tts.vits.train import VitsTrainer

        cfg = self._config(config, overrides, data, run)
        with _quiet():
            tr = VitsTrainer(cfg, setup_distributed(device.type))
        return Stepper(tr, tr.train_step, lambda: _cycle(tr.loader, tr.sampler), tr.batch_size, tr.batch_size,
                       cfg.precision, cfg.compile)

    def main_argv(self, config, overrides, data, run, device, preset, steps):
        from tts.vits.train import main

        return main, ["--config", str(config), "--data_dir", str(data), "--run_dir", str(run), "--device", device.type,
                      *_sets(["run_eval=false", "eval_at_start=false", "test_sentences=[]", "progress_bar=false",
                              f"max_steps={steps}", *overrides])]

    def step_class(self) -> type:
        from tts.vits.train import VitsTrainer

        return VitsTrainer


# ------------------------------------------------------------------------------------------ voice cloning
class Clone(TrainerSpec):
    """tts/train_main.py. Its 5090 config is clone_base.yaml with `--preset rtx5090` (the guide's way)."""

    def __init__(self) -> None:
        base = REPO / "tts" / "clone" / "configs" / "clone_base.yaml"
        super().__init__("clone", base, base, options={
            "fp16 (16-mixed + GradScaler)": ["train.precision=16-mixed"],
            "bf16 (bf16-mixed)": ["train.precision=bf16-mixed"], "TF32": ["train.tf32=true"],
            "channels_last": "no such key: a transformer with 1-D convs", "torch.compile": ["train.compile=true"],
            "cudnn benchmark": ["train.cudnn_benchmark=true"]},
            plain=["train.precision=32-true", "train.tf32=false", "train.compile=false", "train.cudnn_benchmark=false"],
            rtx_preset="rtx5090", full_items=512)

    TINY = REPO / "tts" / "clone" / "configs" / "tiny.yaml"

    def tiny(self) -> list[str]:
        return file_overrides(self.TINY, skip=("audio",))

    def audio(self) -> list[str]:
        """The synthetic corpus's 22.05 kHz settings (tiny.yaml's audio block): every run, dry or not, trains
        on that corpus (`tts.clone`'s default is 24 kHz / 100 mels)."""
        return file_overrides(self.TINY, only=("audio",))

    def make_data(self, root: Path, dry: bool) -> Path:
        from bench.bench_tts import synthetic_corpus

        return synthetic_corpus(root, 10 if dry else self.full_items + 2, seconds=2.0)

    def _argv(self, config: Path, overrides: list[str], data: Path, run: Path, device: torch.device) -> list[str]:
        # Every synthetic utterance lasts 2 s, so length buckets add nothing; and each bucket must hold a whole
        # batch (drop_last): 2 buckets. The feature cache is keyed by the audio settings: one per corpus.
        return ["--config", str(config), "--train-data", str(data), "--checkpoint-dir", str(run),
                *_sets([*self.audio(), f"data.cache_dir={Path(data).parent / 'features'}", "data.num_buckets=2", "val.sentences=[]",
                        "val.at_start=false", f"train.device={device.type}", *overrides])]

    def build(self, config, overrides, data, run, device, preset) -> Stepper:
        from common.presets import apply_preset
        from tts.clone.options import build_parser, resolve_config
        from tts.clone.presets import CARD_PRESETS
        from tts.clone.train import CloneTrainer

        res = resolve_config(build_parser().parse_args(self._argv(config, overrides, data, run, device)))
        apply_preset(res.cfg, preset, CARD_PRESETS, log=lambda _line: None)  # as main() does
        with _quiet():
            tr = CloneTrainer(res, log=lambda *a, **k: None)
        t = res.cfg.train

        def batches() -> Iterator:
            for epoch in itertools.count():
                yield from tr.data.epoch_loader(epoch, 0, t.seed)

        return Stepper(tr, lambda batch: tr.train_step(itertools.repeat(batch)), batches, t.batch_size,
                       t.batch_size * t.grad_accum, tr.precision.precision, t.compile)

    def main_argv(self, config, overrides, data, run, device, preset, steps):
        from tts.clone.train import main

        sets = [f"train.max_updates={steps}", "scheduler.warmup_steps=1", *overrides]
        return main, [*self._argv(config, sets, data, run, device), *(["--preset", preset] if preset else [])]

    def step_class(self) -> type:
        from tts.clone.train import CloneTrainer

        return CloneTrainer


# ------------------------------------------------------------------------------------------ VAE
# The keys of vae/configs/tiny.yaml that set the model's and the step's size (the dry run's VAE).
VAE_TINY_KEYS = ("channels", "z_channels", "layers_per_block", "norm_num_groups", "image_size", "batch_size",
                 "disc_channels", "disc_layers", "perceptual_weight", "num_workers", "persistent_workers", "pin_memory")


RANDOM_BACKBONE_NOTE = ("LPIPS with a random-weight VGG16 (the ImageNet backbone is not in the torchvision cache): "
                        "the same compute and memory as the real one")


def lpips_or_random(net: str = "vgg", weights_path: str | None = None, random_backbone: bool = False):
    """`vae.losses.lpips_or_random` with the GPU check's note: a machine with no network still measures the
    VAE's full step (it also stands in for FrozenLPIPS in the VAE's CLI: `Vae.cli_context`)."""
    from vae import losses

    return losses.lpips_or_random(net, weights_path, random_backbone, note=RANDOM_BACKBONE_NOTE)


class Vae(TrainerSpec):
    """vae/train_vae.py: base.yaml and the default 5090 profile, standard_1024.yaml. The tables run the
    full step (GAN and EMA on from step 0, as bench_vae does); LPIPS with a random-weight backbone when
    VGG16 is not cached (same compute)."""

    def __init__(self) -> None:
        configs = REPO / "vae" / "configs"
        super().__init__("vae", configs / "base.yaml", configs / "standard_1024.yaml", options={
            "fp16 (16-mixed + GradScaler)": ["precision=16-mixed"], "bf16 (bf16-mixed)": ["precision=bf16-mixed"],
            "TF32": ["enable_tf32=true"], "channels_last": ["channels_last=true"],
            "torch.compile": ["use_torch_compile=true"], "cudnn benchmark": ["cudnn_benchmark=true"]},
            plain=["precision=32-true", "enable_tf32=false", "channels_last=false", "use_torch_compile=false",
                   "cudnn_benchmark=false"], full_items=64)

    def tiny(self) -> list[str]:
        return file_overrides(REPO / "vae" / "configs" / "tiny.yaml", only=VAE_TINY_KEYS)

    def make_data(self, root: Path, dry: bool) -> Path:
        from bench.bench_vae import write_noise_pngs

        root.mkdir(parents=True, exist_ok=True)
        write_noise_pngs(root, 6 if dry else self.full_items + 2, 48 if dry else 1152)
        return root

    def config(self, config: Path, overrides: list[str]):
        from common.config import load_config
        from vae.config import VAEConfig

        return load_config(config, VAEConfig, ["disc_start=0", *overrides])

    def perceptual(self, cfg):
        return lpips_or_random(cfg.perceptual_net, cfg.perceptual_weights or None) if cfg.perceptual_weight > 0 else None

    def cli_context(self) -> contextlib.AbstractContextManager:
        """The CLI builds its LPIPS in vae.train_vae: there too a random-weight backbone when none is cached."""
        return mock.patch("vae.train_vae.FrozenLPIPS", lpips_or_random)

    def build(self, config, overrides, data, run, device, preset) -> Stepper:
        from common.data import ResumableSampler, make_loader
        from vae.data import ImageDataset
        from vae.step import VAEStep

        cfg = self.config(config, overrides)
        with _quiet():
            tr = VAEStep(cfg, device, total_steps=1000, perceptual=self.perceptual(cfg))
        ds = ImageDataset(sorted(Path(data).glob("*.png")), cfg.image_size)
        sampler = ResumableSampler(ds, seed=0)
        loader = make_loader(ds, batch_size=int(cfg.batch_size), sampler=sampler, num_workers=cfg.num_workers,
                             prefetch_factor=4 if cfg.num_workers else None, pin_memory=cfg.pin_memory and device.type == "cuda",
                             persistent_workers=False, seed=0, drop_last=True)
        accum, counter = cfg.accumulation_steps, itertools.count()
        return Stepper(tr, lambda x: tr.train_step([x] * accum, next(counter)), lambda: _cycle(loader, sampler),
                       int(cfg.batch_size), int(cfg.batch_size) * accum, tr.precision.precision, cfg.use_torch_compile)

    def main_argv(self, config, overrides, data, run, device, preset, steps):
        from vae.train_vae import main

        return main, ["--config", str(config), "--data_path", str(data), "--output_dir", str(run),
                      "--no-export_diffusers", "--stop_at_step", str(steps),
                      *_sets([f"device={device.type}", "fit_batch_size=false", "val_check_interval=0", "save_samples_freq=0",
                              *overrides])]

    def step_class(self) -> type:
        from vae.train_vae import VAETrainer

        return VAETrainer


TRAINERS: dict[str, TrainerSpec] = {t.name: t for t in (Vocoder(), Vits(), Clone(), Vae())}


SPEED_KEYS = ("precision=", "train.precision=")  # the tiny test sizes must not undo a config's speed keys


def _plan(spec: TrainerSpec, which: str, overrides: list[str], dry: bool) -> tuple[Path, list[str], str | None]:
    """`which` = 'base' | 'rtx5090': (config file, overrides: tiny sizes in the dry run then `overrides`, preset)."""
    tiny = [o for o in spec.tiny() if not o.startswith(SPEED_KEYS)] if dry else []
    if which == "base":
        return spec.base, [*tiny, *overrides], None
    return spec.rtx, [*tiny, *overrides], spec.rtx_preset


def build(spec: TrainerSpec, which: str, overrides: list[str], data: Path, run: Path, device: torch.device,
          dry: bool) -> Stepper:
    """The trainer of config `which`, tiny in the dry run, then `overrides`."""
    config, sets, preset = _plan(spec, which, overrides, dry)
    return spec.build(config, sets, data, run, device, preset)


def cli(spec: TrainerSpec, which: str, overrides: list[str], data: Path, run: Path, device: torch.device,
        dry: bool, steps: int = 3) -> tuple[Callable[[list[str]], int], list[str]]:
    """The trainer's CLI `main` and the argv of a `steps`-step run of config `which` (as `build`)."""
    config, sets, preset = _plan(spec, which, overrides, dry)
    return spec.main_argv(config, sets, data, run, device, preset, steps)


def tile_batch(batch, size: int):
    """`batch` (a tensor, or a dict / list of them, batch first) repeated to `size` items: a batch of
    any size from one real batch, for the batch-size finder's trials."""
    if isinstance(batch, torch.Tensor):
        if batch.dim() == 0:
            return batch
        reps = -(-size // batch.size(0))
        return batch.repeat(reps, *([1] * (batch.dim() - 1)))[:size]
    if isinstance(batch, dict):
        return {k: tile_batch(v, size) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(tile_batch(v, size) for v in batch)
    return batch
