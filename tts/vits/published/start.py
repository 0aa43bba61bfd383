"""Starting a run from a published voice (`--init_from` a Piper `.ckpt` or a transformers VitsModel
folder): everything after the reader, written once for every `SourceVoice`.

The order is the point: `open_source` reads and validates the source, `adopt_source_shape` puts its
shape into the config, `plan_start` maps every tensor onto the model the config builds (text
embedding by symbol, speakers) and checks that all of them fit, and only then does `train.run` touch
the run folder. `load_start` (in the trainer, on the real models) copies the weights.

Speakers: a multi-speaker source into a single-speaker run keeps one speaker (`--init_speaker NAME|ID`,
default the mean of the source's embeddings). Our single-speaker model has no speaker inputs, so
that speaker's constant contribution to every speaker-conditioned layer (`cond(g)`: a 1×1 convolution
of one vector) is folded into the bias it is added to: the model speaks exactly as the source did
for that speaker (the deterministic duration predictor adds it before a width-3 convolution, so
there it is exact except at the first and last token).
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from common.checkpoint import compare_state, inflating_records
from common.config import ConfigError, explicit_keys
from tts.text.phonemes import Frontend
from tts.vits.data import check_prepared_audio
from tts.vits.published import mms, piper
from tts.vits.published.source import SourceError, SourceVoice

SPEAKER_KEYS = ("emb_g.", "dec.cond.", "dp.cond.", "cond_layer.")  # the speaker embedding and its inputs


def is_piper_checkpoint(path: Path) -> bool:
    """Whether `path` is a Lightning checkpoint of piper (its pickle names `model_g.` weights), told from
    this trainer's own checkpoints without unpickling anything: the pickle of a torch zip file holds
    the names, the tensors live in other records."""
    try:
        with zipfile.ZipFile(path) as archive:
            if inflating_records(archive, path.stat().st_size):  # load_checkpoint names the file and refuses it
                return False
            pickle = next((n for n in archive.namelist() if n.endswith("/data.pkl")), None)
            return pickle is not None and b"model_g." in archive.read(pickle)
    except (OSError, zipfile.BadZipFile, zipfile.LargeZipFile):
        return False


def open_source(path: str | Path, config_path: str | Path | None = None) -> SourceVoice | None:
    """The published voice at `path`, validated; None when `path` is a checkpoint of this trainer (or
    not a readable file: the own-checkpoint path says what is wrong with it). A folder is a
    transformers VitsModel (MMS-TTS); a file whose pickle names `model_g.*` weights a Piper `.ckpt`."""
    path = Path(path)
    if path.is_dir():
        return mms.read(path)
    if path.suffix == ".ckpt" or is_piper_checkpoint(path):
        return piper.read(path, config_path)
    if config_path is not None:
        raise ConfigError(f"--init_config is for published voices (a Piper .ckpt); {path} is read as a "
                          "checkpoint of this trainer, which carries its own config")
    return None


def _current(cfg, group: str, key: str):
    return getattr(cfg.args() if group == "model_args" else cfg.audio, key)


def adopt_source_shape(cfg, voice: SourceVoice) -> list[str]:
    """The source's model shape, audio settings and front-end replace the recipe's (in `cfg`); one line
    per changed key. A value typed on the command line that contradicts the source is ConfigError
    naming both (a recipe's value is replaced: the recipe did not know the source)."""
    typed = explicit_keys(cfg)
    lines = []
    changes = [("model_args", k, v) for k, v in voice.model_args.items()]
    changes += [("audio", k, v) for k, v in voice.audio.items()]
    if voice.phoneme_type is not None:
        changes.append(("", "phoneme_type", voice.phoneme_type))
    for group, key, value in changes:
        dotted = f"{group}.{key}" if group else key
        current = _current(cfg, group, key) if group else getattr(cfg, key)
        if current == value:
            continue
        if dotted in typed:
            raise ConfigError(f"{typed[dotted]} contradicts --init_from {voice.path}, whose {dotted} is {value!r}: "
                              "leave it out (the model's shape comes from the source voice), or start from "
                              "another voice")
        if group == "model_args":
            cfg.model_args[key] = value
        else:
            setattr(cfg.audio if group else cfg, key, value)
        lines.append(f"{dotted}: {current!r} -> {value!r} (from the source voice)")
    cfg.args()  # the merged arguments are checked like a recipe's (types, ranges)
    return lines


def check_data_fits(cfg, voice: SourceVoice) -> None:
    """The prepared data must be at the source's sample rate and STFT (DataError, exit 2, before the run starts)."""
    check_prepared_audio(cfg.data_dir, cfg.audio, source=voice.path)


@dataclass
class SourceStart:
    """What `load_start` copies into the run's models, decided and checked before the run folder changes."""

    voice: SourceVoice
    generator: dict[str, torch.Tensor]  # our names; enc_p.emb.weight = the source's rows (mapped by `rows`)
    rows: dict[int, int]  # our text-embedding row -> the source's row of the same symbol
    fresh: list[str] = field(default_factory=list)  # our keys that start from the model's own init
    lines: list[str] = field(default_factory=list)  # the start-up report


def _effective_weight(state: dict[str, torch.Tensor], prefix: str) -> torch.Tensor:
    """A conv's weight [out, in] (1×1), through weight norm (`parametrizations.weight.original0/1`) if any."""
    if prefix + "weight" in state:
        return state[prefix + "weight"][:, :, 0]
    g, v = state[prefix + "parametrizations.weight.original0"], state[prefix + "parametrizations.weight.original1"]
    return (g * v / v.flatten(1).norm(dim=1).view(-1, *[1] * (v.dim() - 1)))[:, :, 0]


def fold_speaker(state: dict[str, torch.Tensor], g: torch.Tensor, use_sdp: bool) -> dict[str, torch.Tensor]:
    """`state` of a multi-speaker generator -> the speaker-free one that speaks as speaker vector `g`:
    each `cond(g)` is added to the bias of the layer whose output it joins (see the module docstring)."""
    out = {k: v.clone() for k, v in state.items() if not any(s in k for s in SPEAKER_KEYS)}
    for prefix in {k[: k.index("cond")] for k in state if "cond" in k and not k.startswith("emb_g")}:
        cond = "cond_layer." if prefix + "cond_layer.bias" in state else "cond."
        offset = _effective_weight(state, prefix + cond) @ g + state[prefix + cond + "bias"]
        if cond == "cond_layer.":  # WN: layer i reads slice i of the output
            width = out[prefix + "in_layers.0.bias"].numel()
            for i in range(offset.numel() // width):
                out[f"{prefix}in_layers.{i}.bias"] += offset[i * width:(i + 1) * width]
        elif prefix == "dec.":
            out["dec.conv_pre.bias"] += offset
        elif use_sdp:  # x = pre(x) + cond(g)
            out["dp.pre.bias"] += offset
        else:  # x = x + cond(g), then conv_1: exact away from the sequence's two ends
            out["dp.conv_1.bias"] += out["dp.conv_1.weight"].sum(-1) @ offset
    return out


def _speaker_vector(voice: SourceVoice, init_speaker: str | None) -> tuple[torch.Tensor, str]:
    table = voice.generator["emb_g.weight"]
    if init_speaker is None:
        return table.mean(0), (f"speaker: the mean of the source's {table.size(0)} speaker embeddings (pick one "
                               "with --init_speaker NAME|ID)")
    row = voice.speakers.get(init_speaker)
    if row is None and init_speaker.isdigit() and int(init_speaker) < table.size(0):
        row = int(init_speaker)
    if row is None:
        names = ", ".join(list(voice.speakers)[:10])
        raise ConfigError(f"--init_speaker {init_speaker}: {voice.path} has no such speaker; its speakers are "
                          f"{names}{' ...' if len(voice.speakers) > 10 else ''} (a name, or an id 0..{table.size(0) - 1})")
    name = next((n for n, i in voice.speakers.items() if i == row), str(row))
    return table[row], f"speaker: the source's speaker '{name}' (row {row}, --init_speaker)"


def _speakers(voice: SourceVoice, state: dict[str, torch.Tensor], own: dict[str, torch.Tensor],
              run_speakers: dict[str, int], init_speaker: str | None, use_sdp: bool
              ) -> tuple[dict[str, torch.Tensor], list[str], list[str]]:
    """(generator state for this run's speakers, keys that start fresh, report lines)."""
    multi_source, multi_run = bool(voice.speakers), len(run_speakers) > 1
    if init_speaker is not None and not (multi_source and not multi_run):
        raise ConfigError(f"--init_speaker picks one speaker of a multi-speaker source for a single-speaker run; "
                          f"here the source has {len(voice.speakers) or 1} speaker(s) and the data "
                          f"{len(run_speakers)}: leave it out")
    if multi_source and not multi_run:
        g, line = _speaker_vector(voice, init_speaker)
        return fold_speaker(state, g, use_sdp), [], [line + ", folded into the speaker-free model's biases"]
    if not multi_source and multi_run:
        fresh = [k for k in own if any(s in k for s in SPEAKER_KEYS)]
        return state, fresh, [f"no speaker embedding in the source: the speaker table and the {len(fresh)} "
                              "speaker-input tensors start fresh"]
    if not multi_run:
        return state, [], []
    if dict(voice.speakers) == dict(run_speakers):
        return state, [], [f"speakers: the source's {len(run_speakers)} speakers carry over (same names and ids)"]
    table = voice.generator["emb_g.weight"]
    rows = torch.empty(len(run_speakers), table.size(1))
    kept = []
    for name, i in run_speakers.items():
        rows[i] = table[voice.speakers[name]] if name in voice.speakers else table.mean(0)
        kept += [name] if name in voice.speakers else []
    state = {**state, "emb_g.weight": rows}
    return state, [], [f"speakers: {len(kept)} of the data's {len(run_speakers)} speakers take the source's "
                       f"embedding of the same name; the others start at the source's mean speaker"]


def _check_fit(voice: SourceVoice, what: str, state: dict[str, torch.Tensor], own: dict[str, torch.Tensor],
               fresh: list[str]) -> None:
    """Every tensor of the model comes from the source (or is listed fresh) with its shape, and every
    tensor of the source is used: else the reader does not know this variant of the source."""
    fit = compare_state(own, state)
    missing = [k for k in fit.missing if k not in fresh]
    shapes = [m for m in fit.mismatched if not m.startswith("enc_p.emb.weight:")]  # rows are mapped by symbol
    problems = [f"{len(items)} {title}: {', '.join(items[:4])}{' ...' if len(items) > 4 else ''}"
                for items, title in ((missing, "not in the source"), (fit.unexpected, "left over in the source"),
                                     (shapes, "of another shape")) if items]
    if problems:
        raise SourceError(f"--init_from {voice.path}: its {what} does not map onto this trainer's VITS "
                          f"({'; '.join(problems)}); this variant of a {voice.kind} voice is not supported")


def plan_start(cfg, voice: SourceVoice, own_generator: dict[str, torch.Tensor],
               own_discriminator: dict[str, torch.Tensor], run_speakers: dict[str, int],
               init_speaker: str | None, lines: list[str]) -> SourceStart:
    """Maps the source onto the models `cfg` builds (`own_*`: their state dicts, e.g. on the meta device)
    and checks that every tensor fits; nothing is loaded yet (`load_start` does, in the trainer)."""
    lines = [f"--init_from {voice.path} ({voice.kind} voice)", *lines, *voice.notes]
    ours = Frontend.of(cfg).symbols
    source_rows = {s: i for i, s in enumerate(voice.symbols) if s is not None}
    rows = {i: source_rows[s] for i, s in enumerate(ours) if s in source_rows}
    if len(rows) < 2:
        raise SourceError(f"--init_from {voice.path}: its text symbols and this run's ({cfg.phoneme_type}, "
                          f"{len(ours)} symbols) share {len(rows)}: give the voice's own config with --init_config, "
                          "or set phoneme_type to the source's")
    fresh_symbols = [s for s in ours if s not in source_rows]
    unused = [s for s in source_rows if s not in set(ours)]
    lines.append(f"text embedding: {len(rows)} of this run's {len(ours)} symbols take the source's row of the same "
                 f"symbol; {len(fresh_symbols)} start fresh" + (": " + " ".join(map(repr, fresh_symbols))
                                                                if fresh_symbols else ""))
    if unused:
        lines.append(f"{len(unused)} source symbol(s) have no counterpart here: " + " ".join(map(repr, unused)))
    state, fresh, speaker_lines = _speakers(voice, voice.generator, own_generator, run_speakers, init_speaker,
                                            cfg.args().use_sdp)
    lines += speaker_lines
    _check_fit(voice, "generator", state, own_generator, fresh)
    if voice.discriminator is None:
        lines.append("no discriminator in the source: the critics start fresh")
    else:
        _check_fit(voice, "discriminator", voice.discriminator, own_discriminator, [])
    lines.append(f"licence: {voice.licence} (carried into the checkpoints and the exported .onnx.json)"
                 if voice.licence else "licence: the source declares none here; check the voice's model card "
                                       "before you publish what you train from it")
    return SourceStart(voice, state, rows, fresh, lines)


def load_start(start: SourceStart, generator: torch.nn.Module, discriminator: torch.nn.Module) -> None:
    """Copies the planned weights into the run's models (strict: `plan_start` checked every name and shape)."""
    own = generator.state_dict()
    state = {**start.generator, **{k: own[k] for k in start.fresh}}
    emb = own["enc_p.emb.weight"].clone()  # rows without a source symbol keep the model's fresh init
    source_emb = start.generator["enc_p.emb.weight"].to(emb)
    for ours, theirs in start.rows.items():
        emb[ours] = source_emb[theirs]
    state["enc_p.emb.weight"] = emb
    generator.load_state_dict(state, strict=True)
    if start.voice.discriminator is not None:
        discriminator.load_state_dict(start.voice.discriminator, strict=True)
