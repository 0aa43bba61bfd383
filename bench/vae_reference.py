"""Our VAE training loop against CompVis/latent-diffusion's, side by side in one process.

    python -m bench.learning --trainer vae --reference_dir /path/to/latent-diffusion \
        --taming_dir /path/to/taming-transformers --steps 600 --eval_every 150

Both sides are built from ONE config (the demo's ``vae/configs/demo.yaml`` + ``bench.learning``'s
VAE recipe + ``REFERENCE_RECIPE`` below: fp32, Adam with latent-diffusion's fixed betas (0.5, 0.9), constant
LR without warmup, no clipping, no EMA, fixed log-variance, perceptual weight 0) and trained interleaved
step by step by ``bench.learning``'s loop on the same stored batches (our loader), with the same RNG
seed before each step, so both sides draw the same posterior noise.

The network their step trains is OUR model: a deep copy of our ``AutoencoderKL`` at step 0 (encoder,
decoder, quant_conv, post_quant_conv) grafted into their ``AutoencoderKL`` LightningModule in place of
the ldm Encoder/Decoder its constructor builds (ours is bitwise-equal to diffusers' AutoencoderKL, the
converted form of theirs; ldm's ``Normalize`` hard-codes 32 groups, which the demo's 16 cannot use).
Same architecture and initial weights by construction; with the GAN on, their critic starts from our
critic's initial tensors (same layout, ``load_state_dict``, strict).

What is THEIRS (imported from the two checkouts, never copied into this repository):
  - ldm/models/autoencoder.py ``AutoencoderKL``: ``get_input``, ``forward``/``encode``/``decode`` (the
    glue around the grafted modules), ``training_step`` (called once per optimizer, so the critic pass
    runs the encoder + decoder again), ``configure_optimizers`` (two ``Adam(lr, betas=(0.5, 0.9))``: the
    autoencoder's over encoder + decoder + quant convs, NOT the loss's logvar, which therefore never
    trains; the critic's), ``get_last_layer``;
  - ldm/modules/distributions ``DiagonalGaussianDistribution`` (their sampling and KL);
  - ldm/modules/losses/contperceptual.py ``LPIPSWithDiscriminator`` (summed NLL with the logvar, KL
    weighting, adaptive GAN weight, ``adopt_weight``) with taming's ``NLayerDiscriminator`` +
    ``weights_init`` and ``hinge_d_loss`` (taming/modules/losses/vqperceptual.py).
What is OURS: the batches (given to them as ``{"image": B x H x W x C}``, the layout ``get_input``
permutes back), the seeds, the held-out metrics (``vae.metrics.evaluate`` on both models: posterior
mode, PSNR/SSIM, LPIPS when its VGG is cached), the timing, and ``lightning_step``: the Lightning 1.4
automatic-optimization loop (the version latent-diffusion pins) for one batch, transcribed: for each
optimizer in order, ``toggle_optimizer`` (every parameter of the other optimizers frozen), their
``training_step``, ``backward``, ``step``, ``zero_grad``, ``untoggle_optimizer``; then global_step + 1.

Stubbed or bypassed, exactly:
  - ``pytorch_lightning`` (not installed here) is registered as a module whose ``LightningModule`` is
    a plain ``torch.nn.Module`` (only when the real package is missing); their class is subclassed to
    supply what Lightning's Trainer would: ``global_step`` (this loop's counter), ``log``/``log_dict``
    (no-ops);
  - taming's ``LPIPS`` (looked up by name in contperceptual.py) is replaced while their loss is
    constructed by ``NoLPIPS``, which has no weights and raises when called: their ``LPIPS.__init__``
    downloads VGG16 (torchvision) and its linear heads (heibox.uni-heidelberg.de), which this
    benchmark never does. With ``perceptual_weight`` 0 their forward never calls it (refused otherwise).
GAN: with our recipe's ``disc_weight`` 0 ours has no critic; theirs always builds one and, before its
``disc_start``, still runs it (critic on the reconstruction + the adaptive weight's two autograd.grad,
the critic pass with a second encoder + decoder forward, a zero-loss critic update) and multiplies
the result by ``adopt_weight``'s 0, exactly as in the first 50k steps of their released configs. So
their ``disc_start`` is set beyond the run: the GAN is off on both sides and NOT compared, but their
step time includes that work. With ``--set disc_weight=0.5 --set disc_start=N`` both critics join at N.
"""

from __future__ import annotations

import contextlib
import copy
import io
import sys
import types
from collections.abc import Sequence
from pathlib import Path

import torch

REQUIRED_LDM = ("ldm/models/autoencoder.py", "ldm/modules/losses/contperceptual.py",
                "ldm/modules/distributions/distributions.py", "ldm/modules/diffusionmodules/model.py", "ldm/util.py")
REQUIRED_TAMING = ("taming/modules/losses/vqperceptual.py", "taming/modules/discriminator/model.py",
                   "taming/modules/vqvae/quantize.py", "taming/util.py")
# Our config set to what their loop can express (on top of bench.learning's RECIPE["vae"]).
REFERENCE_RECIPE = ["precision=32-true", "optimizer_cls=Adam", "lr_scheduler=constant", "warmup_steps=0",
                    "clip_grad_norm=0", "ema_decay=0.0", "learn_logvar=false", "rec_loss=l1", "weight_decay=0.0",
                    "accumulation_steps=1", "disc_learning_rate=0.0"]
THEIR_BETAS = (0.5, 0.9)  # fixed in their configure_optimizers
THEIR_CRITIC_CHANNELS = 64  # LPIPSWithDiscriminator does not pass ndf: taming's default
# Their constructor builds an ldm Encoder/Decoder that the grafted modules replace: the smallest valid one.
SCRATCH_DDCONFIG = {"double_z": True, "resolution": 8, "in_channels": 3, "out_ch": 3, "ch": 32, "ch_mult": [1],
                    "num_res_blocks": 1, "attn_resolutions": [], "dropout": 0.0}
STUBBED = ("pytorch_lightning (only when not installed): LightningModule = torch.nn.Module",
           "ldm.modules.losses.contperceptual.LPIPS during their loss's construction: NoLPIPS")

_IMPORTED: dict[tuple[Path, Path], types.SimpleNamespace] = {}


def find_taming(reference_dir: str | Path, taming_dir: str | Path | None) -> Path:
    """``--taming_dir``, else where latent-diffusion's environment.yaml installs it (src/taming-transformers)."""
    if taming_dir:
        return Path(taming_dir).expanduser().resolve()
    return (Path(reference_dir).expanduser() / "src" / "taming-transformers").resolve()


def missing_files(root: Path, required: Sequence[str]) -> list[str]:
    return [f for f in required if not (root / f).is_file()]


def lightning_stand_in() -> types.ModuleType:
    """A ``pytorch_lightning`` module with the one name ldm's autoencoder.py needs at import."""
    pl = types.ModuleType("pytorch_lightning")
    pl.LightningModule = type("LightningModule", (torch.nn.Module,),
                              {"__doc__": "Stand-in (bench/vae_reference.py): a plain nn.Module."})
    pl.__bench_stand_in__ = True
    return pl


def import_reference(reference_dir: str | Path, taming_dir: str | Path | None = None) -> types.SimpleNamespace:
    """Their ``AutoencoderKL`` and loss module from the two checkouts (a clear exit when they are not)."""
    ldm_root = Path(reference_dir).expanduser().resolve()
    taming_root = find_taming(reference_dir, taming_dir)
    key = (ldm_root, taming_root)
    if key in _IMPORTED:
        return _IMPORTED[key]
    missing = missing_files(ldm_root, REQUIRED_LDM)
    if missing:
        raise SystemExit(f"error: --reference_dir {reference_dir}: not a CompVis/latent-diffusion checkout "
                         f"(missing {', '.join(missing)}); clone https://github.com/CompVis/latent-diffusion "
                         "and pass its folder")
    missing = missing_files(taming_root, REQUIRED_TAMING)
    if missing:
        raise SystemExit(f"error: taming-transformers not found at {taming_root} (missing {', '.join(missing)}); "
                         "clone https://github.com/CompVis/taming-transformers and pass --taming_dir")
    for name, root in (("ldm", ldm_root), ("taming", taming_root)):
        mod = sys.modules.get(name)
        where = [str(p) for p in getattr(mod, "__path__", [])] if mod else []
        if mod and not any(p.startswith(str(root)) for p in where):
            raise SystemExit(f"error: a module named '{name}' is already imported from elsewhere; "
                             "run the reference comparison in a fresh process")
    for root in (taming_root, ldm_root):
        sys.path.insert(0, str(root))
    try:
        import pytorch_lightning  # noqa: F401 - the real one when installed
        stubbed = False
    except ImportError:
        sys.modules["pytorch_lightning"] = lightning_stand_in()
        stubbed = True
    from ldm.models.autoencoder import AutoencoderKL
    from ldm.modules.losses import contperceptual

    _IMPORTED[key] = types.SimpleNamespace(ldm_root=ldm_root, taming_root=taming_root, AutoencoderKL=AutoencoderKL,
                                           contperceptual=contperceptual, lightning_stubbed=stubbed)
    return _IMPORTED[key]


class NoLPIPS(torch.nn.Module):
    """Stands in for taming's LPIPS while their loss is built (its __init__ downloads weights); no
    parameters, and an error if their forward ever calls it (it does not at perceptual_weight 0)."""

    def forward(self, *args, **kwargs):
        raise RuntimeError("bench/vae_reference.py: their LPIPS was bypassed (perceptual_weight must be 0)")


def reference_loss_params(cfg, steps: int) -> dict:
    """``LPIPSWithDiscriminator``'s arguments from our config (one config for both sides); refuses what
    their loop cannot express. Without a critic on our side, their ``disc_start`` lies beyond the run."""
    problems = []
    if cfg.perceptual_weight > 0:
        problems.append("perceptual_weight must be 0 (their LPIPS downloads VGG16 and its heads)")
    if cfg.rec_loss != "l1":
        problems.append("rec_loss must be l1 (theirs is L1)")
    if cfg.learn_logvar:
        problems.append("learn_logvar must be false (their logvar is in no optimizer, so it never trains)")
    if (cfg.adam_beta1, cfg.adam_beta2) != THEIR_BETAS:
        problems.append(f"adam_beta1/adam_beta2 must be {THEIR_BETAS} (fixed in their configure_optimizers)")
    gan = cfg.disc_weight > 0
    if gan and cfg.disc_channels != THEIR_CRITIC_CHANNELS:
        problems.append(f"disc_channels must be {THEIR_CRITIC_CHANNELS} (their loss builds the critic with ndf 64)")
    if gan and cfg.disc_learning_rate and cfg.disc_learning_rate != cfg.learning_rate:
        problems.append("disc_learning_rate must be 0 or learning_rate (theirs uses one lr)")
    if problems:
        raise SystemExit("error: the latent-diffusion comparison: " + "; ".join(problems))
    return {"disc_start": int(cfg.disc_start) if gan else steps + 1, "logvar_init": float(cfg.logvar_init),
            "kl_weight": float(cfg.kl_weight), "pixelloss_weight": 1.0, "disc_num_layers": int(cfg.disc_layers),
            "disc_in_channels": 3, "disc_factor": float(cfg.disc_factor), "disc_weight": float(cfg.disc_weight),
            "perceptual_weight": 0.0, "use_actnorm": False, "disc_conditional": False, "disc_loss": "hinge"}


def toggle_optimizer(optimizers: Sequence[torch.optim.Optimizer], current: torch.optim.Optimizer) -> dict:
    """Lightning's ``toggle_optimizer``: every parameter of every optimizer frozen, then the current
    optimizer's restored. Returns the saved flags for ``untoggle_optimizer``."""
    saved: dict[torch.nn.Parameter, bool] = {}
    for opt in optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                if p not in saved:
                    saved[p] = p.requires_grad
                    p.requires_grad = False
    for group in current.param_groups:
        for p in group["params"]:
            p.requires_grad = saved[p]
    return saved


def untoggle_optimizer(saved: dict) -> None:
    for p, flag in saved.items():
        p.requires_grad = flag


def lightning_step(model, optimizers: Sequence[torch.optim.Optimizer], batch, batch_idx: int) -> list[float]:
    """One batch of Lightning 1.4's automatic optimization with several optimizers (see the module
    docstring); returns each optimizer's loss. ``model._bench_step`` is the global step it reads."""
    losses = []
    for idx, opt in enumerate(optimizers):
        saved = toggle_optimizer(optimizers, opt) if len(optimizers) > 1 else {}
        loss = model.training_step(batch, batch_idx, idx)
        loss.backward()
        opt.step()
        opt.zero_grad()
        untoggle_optimizer(saved)
        losses.append(loss.detach())
    model._bench_step += 1
    return [float(v) for v in losses]


class ReferenceTrainer:
    """Their LightningModule training a copy of our initial model, stepped by ``lightning_step``."""

    def __init__(self, ref: types.SimpleNamespace, ours, steps: int):
        cfg = ours.cfg

        class Driven(ref.AutoencoderKL):  # supplies only what Lightning's Trainer would
            global_step = property(lambda self: self._bench_step)

            def log(self, *args, **kwargs):
                pass

            def log_dict(self, *args, **kwargs):
                pass

        lossconfig = {"target": "ldm.modules.losses.contperceptual.LPIPSWithDiscriminator",
                      "params": reference_loss_params(cfg, steps)}
        cp, real_lpips = ref.contperceptual, ref.contperceptual.LPIPS
        cp.LPIPS = NoLPIPS
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # their Decoder prints its z shape
                model = Driven(ddconfig={**SCRATCH_DDCONFIG, "z_channels": cfg.z_channels}, lossconfig=lossconfig,
                               embed_dim=cfg.z_channels)
        finally:
            cp.LPIPS = real_lpips
        model._bench_step = 0
        self.vae = copy.deepcopy(ours.vae)  # our class: the same evaluate() for both sides
        for name in ("encoder", "decoder", "quant_conv", "post_quant_conv"):
            setattr(model, name, getattr(self.vae, name))
        if ours.disc is not None:
            model.loss.discriminator.load_state_dict(ours.disc.state_dict())
        model.learning_rate = float(cfg.learning_rate)  # the recipe's lr (their main.py would scale by batch)
        model.train()
        self.model = model
        self.optimizers, _ = model.configure_optimizers()

    def reference_step(self, batch: torch.Tensor) -> None:
        lightning_step(self.model, self.optimizers, {"image": batch.permute(0, 2, 3, 1)}, self.model._bench_step)


def same_output_check(ours, theirs: ReferenceTrainer, batch: torch.Tensor, seed: int) -> str:
    """Step 0: both forwards on one batch under one seed (the same weights and posterior noise)."""
    with torch.no_grad():
        torch.manual_seed(seed)
        a, _ = ours.vae(batch)
        torch.manual_seed(seed)
        b, _ = theirs.model(theirs.model.get_input({"image": batch.permute(0, 2, 3, 1)}, "image"))
    return f"step 0, same batch and seed: max |ours - theirs| reconstruction = {float((a - b).abs().max()):.3g}"


def parameter_counts(ours, theirs: ReferenceTrainer) -> str:
    def count(params):
        return sum(p.numel() for p in params)
    critic = theirs.model.loss.discriminator
    return (f"autoencoder {count(ours.vae.parameters()):,} (ours) / "
            f"{count(p for g in theirs.optimizers[0].param_groups for p in g['params']):,} (theirs, in their Adam); "
            f"critic {count(ours.disc.parameters()) if ours.disc is not None else 0:,} / "
            f"{count(critic.parameters()):,} (theirs always builds it); their disc_start "
            f"{theirs.model.loss.discriminator_iter_start}; stubbed: {', '.join(STUBBED)}")
