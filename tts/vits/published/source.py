"""What `--init_from` needs from any published voice, already in this repo's names.

A reader (Piper `.ckpt` + voice config, transformers `VitsModel` folder) validates its files and
returns one `SourceVoice`; it never touches the run folder. Everything after that (replacing the
recipe's shape, mapping the text embedding by symbol, picking a speaker, printing the licence) works
on this object only, so it is written once for every source.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from common.checkpoint import CheckpointError


class SourceError(CheckpointError):
    """A published voice that cannot start this run: the message names the file (or folder) and what to
    do. Raised before the run folder changes (exit 2, like every bad input)."""


@dataclass
class SourceVoice:
    """A published voice, converted: weights under our `VITS`/`MultiPeriodDiscriminator` key names."""

    path: Path  # the file or folder the user gave to --init_from (named in every message)
    kind: str  # "piper" | "mms": which reader made it
    model_args: dict[str, Any]  # `VitsArgs` keys fixed by the source (sizes, layers, flows, upsampling)
    audio: dict[str, Any]  # `AudioConfig` keys fixed by the source (sample_rate, hop_length, filter_length...)
    symbols: list[str | None]  # the text symbol of each row of the source's token embedding (None: unused row)
    generator: dict[str, torch.Tensor]  # `VITS.state_dict()` names; `enc_p.emb.weight` rows follow `symbols`
    discriminator: dict[str, torch.Tensor] | None = None  # `MultiPeriodDiscriminator` names; None if not shipped
    speakers: dict[str, int] = field(default_factory=dict)  # speaker name -> row of `emb_g.weight`; {} = one
    licence: str | None = None  # what the source declares (printed at start, carried into the export)
    phoneme_type: str | None = None  # "espeak" / "text" when the source's symbols are one of ours
    notes: list[str] = field(default_factory=list)  # one line each, printed at start (what the reader decided)
