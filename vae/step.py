"""The VAE's models, optimizers, loss and ONE optimisation step, without data or a run folder.

What a run (`vae.train_vae.VAETrainer`) trains, and what `--batch_size auto`, `--profile_memory`
(`vae.memory`, through `new_step`) and the benchmarks build alone, so they measure the very step
training runs. Build order (the shared one): models -> channels_last -> DDP -> compile -> optimizers.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from common.config import config_to_dict
from common.distributed import DistInfo, all_reduce_mean, no_sync, wrap_ddp
from common.guards import DivergenceGuard, NonFiniteGuard
from common.muon import build_optimizer
from common.precision import Precision
from common.schedulers import step_schedulers
from common.training import EMA, BufferSnapshot, backward, frozen, step_optimizer
from vae.config import VAEConfig
from vae.losses import FrozenLPIPS, PatchDiscriminator, VAELoss
from vae.model import AutoencoderKL, build_vae
from vae.startup import build_lr_schedules


class VAEStep:
    """The models (`models`, by the names the checkpoint holds), `optimizers` and `schedulers` (by
    optimizer name), their guards, the EMA, and `train_step`; the LR schedules span `total_steps`."""

    def __init__(self, cfg: VAEConfig, device: torch.device, info: DistInfo | None = None,
                 total_steps: int = 1, perceptual: FrozenLPIPS | None = None) -> None:
        self.cfg, self.device = cfg, device
        self.info = info or DistInfo(0, 1, 0, device, False)
        self.precision = Precision(cfg.precision, device, tf32=cfg.enable_tf32,
                                   cudnn_benchmark=cfg.cudnn_benchmark, channels_last=cfg.channels_last,
                                   compile=cfg.use_torch_compile)
        fmt = torch.channels_last if cfg.channels_last else torch.contiguous_format
        vae = build_vae({**config_to_dict(cfg)}).to(device)
        vae.set_gradient_checkpointing(cfg.gradient_checkpointing)
        if cfg.train_decoder_only:  # before DDP and the optimizer: they take only what trains
            vae.freeze_encoder()
        self.vae: AutoencoderKL = vae.to(memory_format=fmt)
        # channels_last before DDP (its gradient buckets copy the parameter layout), compile after.
        self.vae_ddp = self.precision.prepare_model(self.vae, self.info)
        if cfg.perceptual_weight > 0 and perceptual is None:
            perceptual = FrozenLPIPS(cfg.perceptual_net, cfg.perceptual_weights or None)
        self.perceptual = perceptual.to(device) if perceptual is not None else None
        self.loss = VAELoss(cfg.kl_weight, cfg.perceptual_weight, self.perceptual, cfg.rec_loss, cfg.learn_logvar,
                            cfg.logvar_init, cfg.disc_start, cfg.disc_weight, cfg.disc_factor).to(device)
        self.disc: nn.Module | None = (PatchDiscriminator(3, cfg.disc_channels, cfg.disc_layers).to(device)
                                              .to(memory_format=fmt) if cfg.disc_weight > 0 else None)
        self.disc_ddp = wrap_ddp(self.disc, self.info) if self.disc is not None else None
        betas = (cfg.adam_beta1, cfg.adam_beta2)
        g_model = nn.ModuleDict({"vae": self.vae, "logvar": self.loss.logvar})
        self.g_params = [p for p in g_model.parameters() if p.requires_grad]
        fast = {"fused": cfg.optimizer_fused, "batched_ns": cfg.optimizer_batched_ns, "prefix": "optimizer_"}
        self.g_opt = build_optimizer(cfg.optimizer_cls, g_model, lr=cfg.learning_rate, betas=betas,
                                     weight_decay=cfg.weight_decay, **fast)
        self.optimizers = {"vae": self.g_opt}
        self.d_opt = None
        if self.disc is not None:
            self.d_opt = build_optimizer(cfg.optimizer_cls, self.disc, betas=betas,
                                         lr=cfg.disc_learning_rate or cfg.learning_rate, weight_decay=cfg.weight_decay,
                                         **fast)
            self.optimizers["disc"] = self.d_opt
        self.schedulers = build_lr_schedules(cfg, self.optimizers, max(1, int(total_steps)))
        self.ema: EMA | None = None
        self.reset_ema()
        self.guard = NonFiniteGuard(cfg.max_nonfinite)
        self.d_guard = NonFiniteGuard(cfg.max_nonfinite)  # the critic's own streak: a NaN critic must stop the run too
        self.guards = {"vae": self.guard, **({"disc": self.d_guard} if self.d_opt else {})}  # one per optimizer
        self.divergence = DivergenceGuard([*self.g_params, *(self.disc.parameters() if self.disc else ())],
                                          cfg.max_nonfinite, across_ranks=self.info.enabled)
        self.buffers = BufferSnapshot(self.vae, self.disc)  # the discriminator's BatchNorm stats
        self.models = {"vae": self.vae, "logvar": self.loss.logvar}  # by name, as the checkpoint holds them
        self.models.update({"disc": self.disc} if self.disc is not None else {})

    def reset_ema(self) -> None:
        """A fresh EMA of the weights that train now: the whole VAE, or its decoder side (`train_decoder_only`)."""
        if self.cfg.ema_decay > 0:
            self.ema = EMA(self.vae, self.cfg.ema_decay,
                           only=AutoencoderKL.DECODER_SIDE if self.cfg.train_decoder_only else ())

    @property
    def eval_model(self) -> AutoencoderKL:
        """The weights to evaluate/export: the EMA copy (refreshed from its shadow) when EMA is on."""
        return self.ema.model(self.vae) if self.ema is not None else self.vae

    def train_step(self, micro_batches: list[torch.Tensor], global_step: int = 0) -> dict:
        """One optimizer step over `len(micro_batches)` accumulated micro-batches (the loss of each is
        divided by their number, so the gradient is the mean over the whole effective batch) at the run's
        `global_step` (what `disc_start` counts). The logs hold "stepped": whether the VAE's optimizer
        stepped (False: a skipped non-finite step)."""
        cfg, scaler = self.cfg, self.precision.scaler
        n = len(micro_batches)
        gan = self.disc is not None and self.loss.gan_active(global_step)
        # the scale as a tensor (GradScaler.scale of a one): get_scale() reads it on the host
        grad_scale = scaler.scale(torch.ones((), device=self.device)) if scaler.is_enabled() else 1.0
        logs: dict[str, torch.Tensor] = {}
        recs = []
        self.buffers.take()
        with frozen(self.disc) if gan else contextlib.nullcontext():  # the generator's GAN term must not train D
            for i, x in enumerate(micro_batches):
                x = self.precision.prepare_input(x.to(self.device, non_blocking=True))
                with no_sync(self.vae_ddp, i < n - 1):
                    with self.precision.autocast():
                        x_rec, posterior = self.vae_ddp(x)
                        loss, parts = self.loss.generator_loss(x, x_rec, posterior, global_step,
                                                               self.disc if gan else None,
                                                               self.vae.last_layer, grad_scale)
                    backward(loss / n, scaler)
                recs.append((x, x_rec.detach()))
                for k, v in parts.items():
                    logs[k] = logs.get(k, 0) + v / n
        logvar = self.loss.logvar.logvar
        if self.info.enabled and logvar.requires_grad and logvar.grad is not None:
            logvar.grad.copy_(all_reduce_mean(logvar.grad))  # not inside the DDP module: average by hand
        clip = cfg.clip_grad_norm or None
        self.divergence.observe(logs[f"rec_{cfg.rec_loss}"])  # the weights that made this loss, before the update
        g_norm, stepped = step_optimizer(None, self.g_opt, self.g_params, scaler, clip, self.guard)
        logs["grad_norm"] = g_norm
        # What follows the generator's step is decided on the device, never by the host (no sync in a step):
        # a skipped generator step skips the critic's step, the BatchNorm statistics and the EMA too.
        kept = stepped  # the critic's step, when it runs, is called off with the generator's (also=)
        if gan:
            for i, (x, x_rec) in enumerate(recs):
                with no_sync(self.disc_ddp, i < n - 1):
                    with self.precision.autocast():
                        d_loss, parts = self.loss.discriminator_loss(self.disc_ddp, x, x_rec, global_step)
                    backward(d_loss / n, scaler)
                for k, v in parts.items():
                    logs[k] = logs.get(k, 0) + v / n
            d_norm, kept = step_optimizer(None, self.d_opt, self.disc.parameters(), scaler, clip, self.d_guard,
                                          also=stepped)
            logs["disc_grad_norm"] = d_norm
        self.buffers.keep_where(kept)  # no BatchNorm statistics from a skipped step
        scaler.update()
        step_schedulers(self.schedulers.values())
        if self.ema is not None:
            self.ema.update(self.vae, where=stepped)
        logs["stepped"] = stepped  # a 0-d bool on the device: read at log time
        return logs


def new_step(cfg: VAEConfig, device: torch.device, perceptual: FrozenLPIPS | None):
    """A fresh model's training step for `cfg`: what `vae.memory` measures."""
    return VAEStep(cfg, device, perceptual=perceptual).train_step
