"""Starting from weights trained elsewhere: fine-tuning / ``--init_from`` (weights only, from any
checkpoint layout ``vocoder.layouts.split_checkpoint`` reads) and ``frozen_params``.

Kept out of ``train.py`` so the trainer reads as builders -> one step -> the loop; the trainer
calls these once, before it builds the optimizers (frozen parameters stay out of them).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from common.checkpoint import load_checkpoint, load_matching, refuse_other_kind
from common.config import ConfigError
from vocoder.config import VocoderConfig
from vocoder.layouts import split_checkpoint


def apply_freezing(cfg: VocoderConfig, generator: torch.nn.Module, discriminator: torch.nn.Module) -> list[str]:
    """``frozen_params`` (with ``freezing_enabled``): name prefixes like ``discriminator.mpd`` or
    ``generator.conv_pre``; matching parameters get requires_grad=False and stay out of the
    optimizers. A prefix that matches nothing is an error (it would silently freeze nothing)."""
    if not cfg.freezing_enabled:
        return []
    named = [(f"generator.{n}", p) for n, p in generator.named_parameters()]
    named += [(f"discriminator.{n}", p) for n, p in discriminator.named_parameters()]
    frozen = []
    for prefix in cfg.frozen_params:
        hits = [(n, p) for n, p in named if n == prefix or n.startswith(prefix.rstrip(".") + ".")]
        if not hits:
            raise ConfigError(f"frozen_params entry '{prefix}' matches no parameter; names look like "
                              f"'{named[0][0]}' or 'discriminator.<critic>...'")
        for n, p in hits:
            p.requires_grad_(False)
            frozen.append(n)
    return frozen


def load_pretrained(path: str | Path, generator: torch.nn.Module, discriminator: torch.nn.Module,
                    ignore: tuple[str, ...] = (), strict_shapes: bool = False) -> str:
    """Weights only (fine-tuning / --init_from) from any supported checkpoint layout; returns the
    report. ``ignore`` = name substrings not loaded (``finetune_ignored_params``; a
    ``generator.`` / ``discriminator.`` prefix is allowed)."""
    ckpt = load_checkpoint(path)
    refuse_other_kind(path, ckpt, "vocoder", "vocoder_export")
    gen_state, disc_state, _ = split_checkpoint(ckpt)

    def strip(prefix: str) -> tuple[str, ...]:
        return tuple(i[len(prefix):] if i.startswith(prefix) else i for i in ignore
                     if not (i.startswith("generator.") or i.startswith("discriminator.")) or i.startswith(prefix))

    lines = ["generator " + str(load_matching(generator, gen_state, strip("generator."), strict_shapes,
                                              source=path, ckpt=ckpt))]
    if disc_state:
        lines.append("discriminator " + str(load_matching(discriminator, disc_state, strip("discriminator."),
                                                          strict_shapes=False)))
    else:
        lines.append("discriminator: not in the checkpoint (starts from scratch)")
    return "\n".join(lines)


def load_start_weights(cfg: VocoderConfig, init_from: str | None, generator: torch.nn.Module,
                       discriminator: torch.nn.Module, log: Callable[[str], None]) -> None:
    """A new run's weights from elsewhere: ``finetune_ckpt_path`` (with ``finetune_enabled``), then
    ``--init_from``; each load's report goes to ``log``."""
    if cfg.finetune_enabled:
        if not cfg.finetune_ckpt_path:
            raise ConfigError("finetune_enabled is true but finetune_ckpt_path is empty")
        log(f"fine-tuning from {cfg.finetune_ckpt_path}")
        log(load_pretrained(cfg.finetune_ckpt_path, generator, discriminator,
                            tuple(cfg.finetune_ignored_params), cfg.finetune_strict_shapes))
    if init_from:
        log(f"--init_from {init_from}")
        log(load_pretrained(init_from, generator, discriminator))
