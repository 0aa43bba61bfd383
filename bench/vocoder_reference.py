"""Our vocoder trainer against openvpi/SingingVocoders, side by side in one process.

    python -m bench.learning --trainer vocoder --reference_dir /path/to/SingingVocoders [--steps 600]

Both sides are built from ONE config (``REFERENCE_RECIPE`` on top of the demo config: classic
NSF-HiFiGAN, full NSF source, HiFi-GAN V1 resblocks, 128 generator channels, MPD + MSD, AdamW 2e-4
betas (0.8, 0.99), constant LR without warmup, no clipping, fp32, no STFT loss) and trained interleaved step by step
by ``bench.learning``'s loop on the same stored batches of the demo's espeak corpus, with the same
RNG seed before each step.

What is THEIRS (imported from ``--reference_dir``, never copied into this repository):
  - the networks: ``Generator``, ``MultiScaleDiscriminator``, ``MultiPeriodDiscriminator``
    (models/nsf_HiFigan/models.py), with their own initialisation;
  - the losses: ``HiFiloss.Dloss`` / ``GDloss`` / ``Auxloss`` (modules/loss/HiFiloss.py, its mel
    from utils/wav2mel.py);
  - the order of one training step: ``reference_step`` below is training/nsf_HiFigan_task.py's
    ``_training_step`` (pc_aug off) transcribed statement for statement, because that file imports
    Lightning, torchaudio and pyworld, which are not installed here. Lightning's ``manual_backward``
    at 32-true precision is ``loss.backward()``.
What is OURS: the batches (our loader; both sides get the same tensors), building their AdamW the
way their ``build_optimizer`` does (``betas=(beta1, beta2)``, ``weight_decay``), the seeds, the
held-out metrics (``bench.learning.vocoder_held_out``, the same function for both sides) and the
timing. Their ``utils/__init__.py`` imports Lightning, so ``utils`` is registered as a bare package
path before their loss module is imported (only ``utils/wav2mel.py`` is loaded from it).
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import torch

REQUIRED = ("models/nsf_HiFigan/models.py", "modules/loss/HiFiloss.py", "modules/loss/stft_loss.py",
            "utils/wav2mel.py")
REFERENCE_RECIPE = [
    "task_cls=nsf_HiFigan_task.nsf_HiFigan", "model_args.discriminators=[mpd,msd]",
    "model_args.mini_nsf=false", "model_args.upsample_initial_channel=128", "model_args.resblock=\"1\"",
    "model_args.resblock_kernel_sizes=[3,7,11]", "model_args.resblock_dilation_sizes=[[1,3,5],[1,3,5],[1,3,5]]",
    "use_stftloss=false", "clip_grad_norm=null", "lr_scheduler_args.scheduler_cls=constant",
    "lr_scheduler_args.warmup_steps=0",
    *(f"{n}_optimizer_args.{k}={v}" for n in ("generator", "discriminator")
      for k, v in (("lr", 0.0002), ("beta1", 0.8), ("beta2", 0.99), ("weight_decay", 0.0))),
]


_IMPORTED: dict[Path, types.SimpleNamespace] = {}


def import_reference(reference_dir: str | Path) -> types.SimpleNamespace:
    """Their networks and loss class from a SingingVocoders checkout (a clear exit when it is not one)."""
    root = Path(reference_dir).expanduser().resolve()
    if root in _IMPORTED:
        return _IMPORTED[root]
    missing = [f for f in REQUIRED if not (root / f).is_file()]
    if missing:
        raise SystemExit(f"error: --reference_dir {reference_dir}: not an openvpi/SingingVocoders checkout "
                         f"(missing {', '.join(missing)}); clone https://github.com/openvpi/SingingVocoders "
                         "and pass its folder")
    for name in ("models", "modules", "utils"):
        if name in sys.modules and not str(getattr(sys.modules[name], "__file__", "") or "").startswith(str(root)):
            raise SystemExit(f"error: a module named '{name}' is already imported from elsewhere; "
                             "run the reference comparison in a fresh process")
    sys.path.insert(0, str(root))
    utils = types.ModuleType("utils")  # their utils/__init__.py imports Lightning; only wav2mel is needed
    utils.__path__ = [str(root / "utils")]
    sys.modules["utils"] = utils
    from models.nsf_HiFigan.models import (
        AttrDict,
        Generator,
        MultiPeriodDiscriminator,
        MultiScaleDiscriminator,
    )
    from modules.loss.HiFiloss import HiFiloss
    _IMPORTED[root] = types.SimpleNamespace(root=root, AttrDict=AttrDict, Generator=Generator, HiFiloss=HiFiloss,
                                            MPD=MultiPeriodDiscriminator, MSD=MultiScaleDiscriminator)
    return _IMPORTED[root]


def reference_config(cfg) -> dict:
    """The keys their Generator / HiFiloss read, from our VocoderConfig (the same values both sides use)."""
    m, a = cfg.model_args, cfg.audio
    return {
        "audio_sample_rate": a.sample_rate, "audio_num_mel_bins": a.n_mels,
        "hop_size": a.hop_length, "fft_size": a.n_fft, "win_size": a.win_length, "fmin": a.fmin,
        "fmax_for_loss": cfg.fmax_for_loss, "lab_aux_melloss": cfg.lab_aux_melloss,
        "lab_aux_stftloss": cfg.lab_aux_stftloss, "use_stftloss": cfg.use_stftloss,
        "loss_fft_sizes": cfg.loss_fft_sizes, "loss_hop_sizes": cfg.loss_hop_sizes,
        "loss_win_lengths": cfg.loss_win_lengths,
        "model_args": {"mini_nsf": m.mini_nsf, "noise_sigma": m.noise_sigma, "upsample_rates": m.upsample_rates,
                       "upsample_kernel_sizes": m.upsample_kernel_sizes,
                       "upsample_initial_channel": m.upsample_initial_channel, "resblock": m.resblock,
                       "resblock_kernel_sizes": m.resblock_kernel_sizes,
                       "resblock_dilation_sizes": m.resblock_dilation_sizes,
                       "discriminator_periods": m.discriminator_periods,
                       "sampling_rate": a.sample_rate, "num_mels": a.n_mels,
                       "hop_size": a.hop_length},
    }


class ReferenceTrainer:
    """Their generator, critics and losses, stepped in their order (see the module docstring)."""

    def __init__(self, ref: types.SimpleNamespace, cfg, seed: int):
        conf = reference_config(cfg)
        if conf["model_args"]["mini_nsf"] or cfg.pc_aug:
            raise SystemExit("error: the reference comparison covers the classic recipe (mini_nsf false, pc_aug off)")
        torch.manual_seed(seed)
        self.generator = ref.Generator(ref.AttrDict(conf["model_args"]))
        self.discriminator = torch.nn.ModuleDict({"msd": ref.MSD(),
                                                  "mpd": ref.MPD(periods=conf["model_args"]["discriminator_periods"])})
        self.mix_loss = ref.HiFiloss(conf)
        self.mel_weight = float(cfg.lab_aux_melloss)

        def adamw(model, a):  # their build_optimizer: betas from beta1/beta2
            return torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps,
                                     weight_decay=a.weight_decay)
        self.opt_g = adamw(self.generator, cfg.generator_optimizer_args)
        self.opt_d = adamw(self.discriminator, cfg.discriminator_optimizer_args)

    def critics(self, wav: torch.Tensor):
        """Both critics on ``wav``, as the pairs (scores, features) their loss functions take."""
        return self.discriminator["msd"](wav), self.discriminator["mpd"](wav)

    def reference_step(self, batch: dict) -> float:
        """One update in the reference's order (pc_aug off): critic update on the detached fake, then
        the generator update with the critics frozen, real audio through them again with grad and the
        reference's adversarial + feature-matching + auxiliary losses. Returns the training mel L1
        (their auxiliary mel term divided by its weight)."""
        sample = {"mel": batch["mel"], "f0": batch["f0"], "audio": batch["audio"]}
        fake = self.generator(x=sample["mel"], f0=sample["f0"])

        critic_loss, _ = self.mix_loss.Dloss(Dfake=self.critics(fake.detach()), Dtrue=self.critics(sample["audio"]))
        self.opt_d.zero_grad()
        critic_loss.backward()
        self.opt_d.step()

        trainable = [p for p in self.discriminator.parameters() if p.requires_grad]
        for p in trainable:
            p.requires_grad_(False)
        adversarial, _ = self.mix_loss.GDloss(GDfake=self.critics(fake), GDtrue=self.critics(sample["audio"]))
        auxiliary, aux_parts = self.mix_loss.Auxloss(Goutput={"audio": fake}, sample=sample)
        self.opt_g.zero_grad()
        (adversarial + auxiliary).backward()
        self.opt_g.step()
        for p in trainable:
            p.requires_grad_(True)
        return float(aux_parts["aux_mel_loss"].detach()) / self.mel_weight


def copy_initial_weights(theirs: ReferenceTrainer, ours) -> str:
    """``--same_init``: our generator and critics start from the reference's initial tensors (via the
    checkpoint importer's name mapping), so the two runs differ only in the training code."""
    from common.checkpoint import load_matching
    from vocoder.layouts import from_legacy_names

    reports = [load_matching(mine, from_legacy_names({k: v.clone() for k, v in their.state_dict().items()}))
               for mine, their in ((ours.generator, theirs.generator), (ours.discriminator, theirs.discriminator))]
    bad = [r for r in reports if r.missing or r.unexpected or r.mismatched]
    if bad:
        raise SystemExit(f"error: --same_init: the reference's weights do not map onto ours:\n{bad[0]}")
    return f"same initial weights: {sum(len(r.loaded) for r in reports)} tensors copied from the reference"


def parameter_counts(ours, theirs: ReferenceTrainer) -> str:
    """One line: both sides' parameter counts (they must match for a like-for-like comparison)."""
    def count(m):
        return sum(p.numel() for p in m.parameters())
    return (f"generator {count(ours.generator):,} (ours) / {count(theirs.generator):,} (SingingVocoders); "
            f"critics {count(ours.discriminator):,} / {count(theirs.discriminator):,}")
