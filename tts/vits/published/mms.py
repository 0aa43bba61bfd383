"""Read a transformers `VitsModel` folder (MMS-TTS and the voices fine-tuned from it) as a `SourceVoice`.

The folder is what `VitsModel.save_pretrained` writes: `config.json` (model_type "vits"), `model.safetensors`
and, from the tokenizer, `vocab.json` (+ `tokenizer_config.json`). Why a table of our own: transformers
ships a conversion only from jaywalnut310's layout to theirs; this module goes the other way, name by
name (`_RENAMES`), and checks the result against the `VITS` the shape describes (built on the meta device:
no memory, no draw from the global RNG), so a missing or misshapen tensor is one clear error.

Why MMS fits `VITS` as it is: every MMS-TTS checkpoint is jaywalnut310's vits_base (MMS was trained with
that code) at 16 kHz with its own character vocabulary. The config keys our model has no option for
(`_BUILT_IN`) are checked against the values built into our model; a folder with other values is refused
with the key named, rather than loaded into a model that computes something else. (transformers' own SDP
training pass flips its flows in another order than its inference pass; ours is jaywalnut310's, the code
MMS was trained with, and its inference is the same as transformers': the test compares waveforms.)

The discriminator: MMS-TTS ships none (it starts fresh); the training folders of ylacombe/finetune-hf-vits
(VitsModelForPreTraining) carry one under `discriminator.*`, which is read into our MultiPeriodDiscriminator.

Text: MMS Uzbek reads Cyrillic characters; each row of its token embedding is mapped onto our Latin
front-end symbol through `tts.text.cyrillic` (the letter as it reads inside a word), so a user writes
Latin Uzbek and fine-tunes the MMS voice. Row 0 is MMS's blank (VitsTokenizer intersperses id 0), which
is our pad/blank `_`.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import torch

from common.checkpoint import compare_state
from common.config import ConfigError
from common.safetensors_io import SafetensorsError, load_safetensors
from tts.text.cyrillic import cyrillic_to_latin
from tts.text.symbols import PAD, SYMBOL_TO_ID, tokenize
from tts.vits.config import model_args
from tts.vits.discriminator import MultiPeriodDiscriminator
from tts.vits.model import VITS
from tts.vits.published.source import SourceError, SourceVoice
from vocoder.layouts import from_legacy_names

# config.json keys whose value is built into our VITS (jaywalnut310's), with that value. MMS has them all.
_BUILT_IN: dict[str, Any] = {
    "duration_predictor_flow_bins": 10, "duration_predictor_tail_bound": 5.0, "duration_predictor_kernel_size": 3,
    "duration_predictor_num_flows": 4, "depth_separable_channels": 2, "depth_separable_num_layers": 3,
    "wavenet_dilation_rate": 1, "layer_norm_eps": 1e-5, "leaky_relu_slope": 0.1, "hidden_act": "relu",
}
# training-only keys: another value changes how the model trains here, not what it computes
# (not shape: the run's own p_dropout stays; vits_base and the MMS recipe have MMS's 0.1)
_TRAINING_ONLY = {"hidden_dropout": 0.1, "attention_dropout": 0.1, "activation_dropout": 0.1,
                  "duration_predictor_dropout": 0.5, "wavenet_dropout": 0.0, "layerdrop": 0.0}
# finetune-hf-vits' discriminator config keys (its VitsConfig) with the values of our MultiPeriodDiscriminator
_DISC_LAYOUT = {"discriminator_kernel_size": [5], "discriminator_stride": [3],
                "discriminator_period_channels": [1, 32, 128, 512, 1024],
                "discriminator_scale_channels": [1, 16, 64, 256, 1024]}
# MMS-TTS's licence (facebook/mms-tts-* model cards), assumed for a folder named mms-tts-* that declares none
MMS_LICENCE = "cc-by-nc-4.0"
# When two rows transliterate to one Latin symbol, the row of the letter that spells it in Uzbek Cyrillic wins
# (с over ц for s, е over э for e, ш over щ for sh, и over ы for i), then a Latin row of that symbol, then others
_UZBEK_CYRILLIC = set("абвгдеёжзийклмнопрстуфхчшъьюяўқғҳ")
_SECOND_SPELLING = set("цэ")  # Uzbek letters whose reading another letter spells first
_CYRILLIC_LETTER = re.compile(r"[\u0400-\u052f]")

# transformers' module path -> ours (applied in order, on the key without its last part)
_RENAMES = [
    (r"^text_encoder\.embed_tokens", "enc_p.emb"),
    (r"^text_encoder\.project", "enc_p.proj"),
    (r"^text_encoder\.encoder\.layers\.(\d+)\.attention\.(q|k|v)_proj", r"enc_p.encoder.attn_layers.\1.conv_\2"),
    (r"^text_encoder\.encoder\.layers\.(\d+)\.attention\.out_proj", r"enc_p.encoder.attn_layers.\1.conv_o"),
    (r"^text_encoder\.encoder\.layers\.(\d+)\.attention", r"enc_p.encoder.attn_layers.\1"),
    (r"^text_encoder\.encoder\.layers\.(\d+)\.layer_norm", r"enc_p.encoder.norm_layers_1.\1"),
    (r"^text_encoder\.encoder\.layers\.(\d+)\.feed_forward", r"enc_p.encoder.ffn_layers.\1"),
    (r"^text_encoder\.encoder\.layers\.(\d+)\.final_layer_norm", r"enc_p.encoder.norm_layers_2.\1"),
    (r"^posterior_encoder\.conv_pre", "enc_q.pre"),
    (r"^posterior_encoder\.conv_proj", "enc_q.proj"),
    (r"^posterior_encoder\.wavenet", "enc_q.enc"),
    (r"^flow\.flows\.(\d+)\.conv_pre", r"flow.flows.\1.pre"),
    (r"^flow\.flows\.(\d+)\.conv_post", r"flow.flows.\1.post"),
    (r"^flow\.flows\.(\d+)\.wavenet", r"flow.flows.\1.enc"),
    (r"^decoder\.upsampler", "dec.ups"),
    (r"^decoder\.", "dec."),
    (r"^embed_speaker", "emb_g"),
    # stochastic duration predictor: their flows have no Flip modules, ours (jaywalnut310's) do:
    # their flows.k (k >= 1) is our flows.(2k - 1); the ElementwiseAffine stays at 0
    (r"^duration_predictor\.(post_)?flows\.(\d+)", lambda m: f"dp.{m[1] or ''}flows.{max(0, 2 * int(m[2]) - 1)}"),
    (r"^duration_predictor\.post_conv_(pre|proj)", r"dp.post_\1"),
    (r"^duration_predictor\.post_conv_dds", "dp.post_convs"),
    (r"^duration_predictor\.conv_(pre|proj)", r"dp.\1"),
    (r"^duration_predictor\.conv_dds", "dp.convs"),
    (r"^duration_predictor\.", "dp."),
    (r"^(dp\.(post_)?flows\.\d+)\.conv_(pre|proj)$", r"\1.\3"),  # inside the SDP's ConvFlows
    (r"^(dp\.(post_)?flows\.\d+)\.conv_dds", r"\1.convs"),
    (r"\.convs_dilated\.", ".convs_sep."),
    (r"\.convs_pointwise\.", ".convs_1x1."),
]
# our layers under weight norm (parametrizations.weight.original0/1); transformers' decoder has none
_WEIGHT_NORMED = re.compile(r"(^dec\.ups\.\d+|^dec\.resblocks\.\d+\.convs[12]\.\d+|\.enc\.(in_layers\.\d+|"
                            r"res_skip_layers\.\d+|cond_layer))$")
_LAYER_NORMS = re.compile(r"(norm_layers_[12]\.\d+|norms_[12]\.\d+|norm_[12])$")


def _error(path: Path, what: str) -> SourceError:
    return SourceError(f"--init_from {path}: {what}")


def _read_json(path: Path, folder: Path, what_to_do: str) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _error(folder, f"{path.name} is not readable JSON ({exc}); {what_to_do}") from None
    if not isinstance(data, dict):
        raise _error(folder, f"{path.name} is not a JSON object; {what_to_do}")
    return data


def read_config(folder: Path) -> dict:
    """config.json of a VitsModel, or a SourceError saying what the folder is instead."""
    if not folder.is_dir():
        raise _error(folder, "not a folder; a transformers VitsModel (MMS-TTS) is a folder with config.json and "
                             "model.safetensors, as VitsModel.save_pretrained writes it")
    path = folder / "config.json"
    if not path.is_file():
        raise _error(folder, "no config.json; give the folder VitsModel.save_pretrained wrote (config.json + "
                             "model.safetensors), e.g. a download of facebook/mms-tts-uzb-script_cyrillic")
    cfg = _read_json(path, folder, "download the model folder again")
    if cfg.get("model_type") != "vits":
        raise _error(folder, f"config.json is for model_type {cfg.get('model_type')!r}, not 'vits': this is not a "
                             "transformers VitsModel (MMS-TTS) folder")
    return cfg


def _built_in_mismatch(cfg: dict) -> list[str]:
    out = [f"{k} {cfg[k]!r} (ours: {v!r})" for k, v in _BUILT_IN.items() if k in cfg and cfg[k] != v]
    if cfg.get("ffn_kernel_size", 3) % 2 == 0:
        out.append(f"ffn_kernel_size {cfg['ffn_kernel_size']} (ours pads both sides alike: odd sizes only)")
    if not cfg.get("window_size", 4):
        out.append("window_size 0/None (ours always uses relative attention: window_size >= 1)")
    if cfg.get("num_speakers", 1) <= 1 and cfg.get("speaker_embedding_size", 0):
        out.append("speaker_embedding_size without num_speakers > 1 (ours conditions on speakers only when there "
                   "are several)")
    return out


def shape_from_config(cfg: dict) -> tuple[dict[str, Any], dict[str, Any]]:
    """(`VitsArgs` keys, `AudioConfig` keys) that config.json fixes; transformers' defaults fill what it omits
    (they are VitsConfig's, i.e. MMS's)."""
    c = {"hidden_size": 192, "flow_size": 192, "ffn_dim": 768, "num_attention_heads": 2, "num_hidden_layers": 6,
         "ffn_kernel_size": 3, "hidden_dropout": 0.1, "window_size": 4, "resblock_kernel_sizes": [3, 7, 11],
         "resblock_dilation_sizes": [[1, 3, 5]] * 3, "upsample_rates": [8, 8, 2, 2], "upsample_initial_channel": 512,
         "upsample_kernel_sizes": [16, 16, 4, 4], "wavenet_kernel_size": 5, "posterior_encoder_num_wavenet_layers": 16,
         "prior_encoder_num_flows": 4, "prior_encoder_num_wavenet_layers": 4, "use_stochastic_duration_prediction": True,
         "duration_predictor_filter_channels": 256, "num_speakers": 1, "speaker_embedding_size": 0,
         "spectrogram_bins": 513, "sampling_rate": 16000, **cfg}
    args = {
        "hidden_channels": c["hidden_size"], "inter_channels": c["flow_size"], "filter_channels": c["ffn_dim"],
        "n_heads": c["num_attention_heads"], "n_layers": c["num_hidden_layers"], "kernel_size": c["ffn_kernel_size"],
        "window_size": c["window_size"], "resblock": "1",
        "resblock_kernel_sizes": list(c["resblock_kernel_sizes"]),
        "resblock_dilation_sizes": [list(d) for d in c["resblock_dilation_sizes"]],
        "upsample_rates": list(c["upsample_rates"]), "upsample_initial_channel": c["upsample_initial_channel"],
        "upsample_kernel_sizes": list(c["upsample_kernel_sizes"]), "posterior_kernel_size": c["wavenet_kernel_size"],
        "n_layers_q": c["posterior_encoder_num_wavenet_layers"], "n_flows": c["prior_encoder_num_flows"],
        "flow_n_layers": c["prior_encoder_num_wavenet_layers"], "flow_kernel_size": c["wavenet_kernel_size"],
        "use_sdp": bool(c["use_stochastic_duration_prediction"]),
    }
    if not args["use_sdp"]:  # the stochastic one works at hidden_channels
        args["dp_filter_channels"] = c["duration_predictor_filter_channels"]
    if c["num_speakers"] > 1:
        args["gin_channels"] = c["speaker_embedding_size"]
    n_fft = 2 * (c["spectrogram_bins"] - 1)
    audio = {"sample_rate": c["sampling_rate"], "n_fft": n_fft, "win_length": n_fft,
             "hop_length": math.prod(c["upsample_rates"])}
    return args, audio


def _split_key(key: str) -> tuple[str, str]:
    """A source key (torch's old `weight_g`/`weight_v` of 2023 hub files already renamed by
    `from_legacy_names`) -> (module path, leaf), weight norm's two tensors as leaf "original0"/"original1"."""
    if ".parametrizations.weight." in key:
        module, _, part = key.partition(".parametrizations.weight.")
        return module, part
    module, _, leaf = key.rpartition(".")
    return module, leaf


def _put(out: dict[str, torch.Tensor], module: str, leaf: str, t: torch.Tensor, weight_normed: bool) -> None:
    """Store under our name; a plain weight of a layer that is weight-normed here is split as torch's
    weight_norm splits it (magnitude over dim 0, direction), which gives back the same weight."""
    if leaf in ("original0", "original1"):
        out[f"{module}.parametrizations.weight.{leaf}"] = t
    elif leaf == "weight" and weight_normed:
        out[f"{module}.parametrizations.weight.original0"] = torch.linalg.vector_norm(
            t, dim=tuple(range(1, t.dim())), keepdim=True)
        out[f"{module}.parametrizations.weight.original1"] = t
    else:
        out[f"{module}.{leaf}"] = t


def convert_state(source: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """transformers VitsModel tensors -> our VITS names (the keys of no generator part returned, unread)."""
    out: dict[str, torch.Tensor] = {}
    others = []
    known = ("text_encoder.", "posterior_encoder.", "flow.", "decoder.", "duration_predictor.", "embed_speaker.")
    for key, t in from_legacy_names(source).items():
        if not key.startswith(known):
            others.append(key)
            continue
        module, leaf = _split_key(key)
        for pattern, repl in _RENAMES:
            module = re.sub(pattern, repl, module)
        t = t.float()
        if leaf in ("translate", "log_scale"):  # ElementwiseAffine
            leaf = {"translate": "m", "log_scale": "logs"}[leaf]
        elif _LAYER_NORMS.search(module):
            leaf = {"weight": "gamma", "bias": "beta"}.get(leaf, leaf)
        elif leaf == "weight" and re.search(r"attn_layers\.\d+\.conv_[qkvo]$", module):
            t = t.unsqueeze(-1)  # Linear [C, C] -> Conv1d k=1 [C, C, 1]
        elif leaf in ("emb_rel_k", "emb_rel_v"):
            t = t.reshape(t.shape[-2], t.shape[-1])  # [1, 2w+1, D] -> [2w+1, D]
        _put(out, module, leaf, t, bool(_WEIGHT_NORMED.search(module)))
    return out, others


def convert_discriminator(source: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """finetune-hf-vits' `discriminator.*` (VitsModelForPreTraining: the scale critic, then one per period)
    -> our MultiPeriodDiscriminator names; every layer of ours is weight-normed."""
    out: dict[str, torch.Tensor] = {}
    for key, t in from_legacy_names(source).items():
        if key.startswith("discriminator."):
            module, leaf = _split_key(key.removeprefix("discriminator."))
            _put(out, module.replace(".final_conv", ".conv_post"), leaf, t.float(), True)
    return out


def map_symbols(vocab: dict[str, int], rows: int, add_blank: bool) -> tuple[list[str | None], list[str]]:
    """Row -> our Latin text symbol (None: no single counterpart), and the note lines saying what was decided."""
    claims: dict[str, tuple[int, int]] = {}  # our symbol -> (rank, row); lower rank wins, then lower row
    by_row = {i: tok for tok, i in vocab.items()}
    for row, tok in by_row.items():
        low = tok.lower()
        if add_blank and row == 0:
            latin, rank = PAD, -1
        elif low in SYMBOL_TO_ID:
            latin, rank = low, 2
        elif _CYRILLIC_LETTER.fullmatch(low):  # read as inside a word after a consonant (е -> e, ц -> s, ь -> none)
            pieces = [p for p, _ in tokenize(cyrillic_to_latin("б" + low)[1:])]
            latin = pieces[0] if len(pieces) == 1 else None
            rank = 0 if low in _UZBEK_CYRILLIC else 1 if low in _SECOND_SPELLING else 3
        else:
            latin, rank = None, 4
        if latin is not None and latin in SYMBOL_TO_ID and (latin not in claims or (rank, row) < claims[latin]):
            claims[latin] = (rank, row)
    symbols: list[str | None] = [None] * rows
    for latin, (_, row) in claims.items():
        symbols[row] = latin
    notes = []
    if add_blank and 0 in by_row:
        notes.append(f"row 0 ({by_row[0]!r}) is MMS's blank (its tokenizer puts id 0 between characters): our blank "
                     f"{PAD!r}")
    unmapped = [by_row[r] for r in range(rows) if symbols[r] is None]
    notes.append(f"text: {rows - len(unmapped)} of {rows} rows map onto our Latin symbols"
                 + (f"; no single Latin symbol for {' '.join(unmapped)}" if unmapped else ""))
    return symbols, notes


def read_vocab(folder: Path, rows: int) -> tuple[list[str | None], list[str]]:
    path = folder / "vocab.json"
    if not path.is_file():
        return [None] * rows, ["no vocab.json: every row of the text embedding starts fresh"]
    vocab = _read_json(path, folder, "copy the tokenizer files (vocab.json, tokenizer_config.json) from the model again")
    ids = sorted(vocab.values()) if all(isinstance(v, int) for v in vocab.values()) else None
    if ids != list(range(rows)):
        raise _error(folder, f"vocab.json has {len(vocab)} entries whose ids are not 0..{rows - 1}, but "
                             f"model.safetensors' text embedding has {rows} rows: the vocabulary is not this "
                             "model's; copy the model's own vocab.json beside it")
    tok_cfg = folder / "tokenizer_config.json"
    add_blank = True
    if tok_cfg.is_file():
        add_blank = bool(_read_json(tok_cfg, folder, "copy the tokenizer files again").get("add_blank", True))
    symbols, notes = map_symbols(vocab, rows, add_blank)
    if not add_blank:
        notes.append("tokenizer_config.json: add_blank false: the source was trained without blanks between "
                     "characters (set data.add_blank: false to match it)")
    return symbols, notes


def read_licence(folder: Path) -> tuple[str | None, str]:
    """The licence README.md's front matter declares, else MMS's for a folder named mms-tts-*, else None."""
    readme = folder / "README.md"
    if readme.is_file():
        text = readme.read_text(encoding="utf-8", errors="replace")
        front = re.match(r"---\s*\n(.*?)\n---", text, re.S)
        found = re.search(r"^license:\s*['\"]?([^'\"\n]+)", front[1], re.M) if front else None
        if found:
            return found[1].strip(), f"licence: {found[1].strip()} (README.md)"
    if "mms-tts" in folder.resolve().name.lower():
        return MMS_LICENCE, (f"licence: {MMS_LICENCE} assumed: the folder declares none (no README.md front matter) "
                             "and its name says MMS-TTS, whose weights Meta releases under CC-BY-NC 4.0")
    return None, ""  # the start-up says that no licence is declared


def _discriminator(folder: Path, cfg: dict, source: dict[str, torch.Tensor]) -> tuple[dict | None, dict, str]:
    """(our critic's tensors or None, the `VitsArgs` keys they fix, the note line). Only finetune-hf-vits'
    training folders ("-train", VitsModelForPreTraining) carry one; MMS-TTS itself ships none."""
    disc = convert_discriminator(source)
    if not disc:
        return None, {}, ""  # MMS-TTS ships none; the start-up says the critics start fresh
    differs = [f"{k} {cfg[k]}" for k, v in _DISC_LAYOUT.items() if k in cfg and _as_list(cfg[k]) != v]
    if differs:
        return None, {}, f"discriminator not read, its layout is not ours ({', '.join(differs)}): it starts fresh"
    periods = [int(p) for p in cfg.get("discriminator_periods", [2, 3, 5, 7, 11])]
    with torch.device("meta"):
        _check_names(folder, disc, MultiPeriodDiscriminator(periods, 1.0, False), "the critic its config.json describes")
    return disc, {"mpd_periods": periods, "disc_channel_scale": 1.0, "use_spectral_norm": False}, (
        f"discriminator: {len(disc)} tensors (scale critic + periods {periods})")


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def read(folder: str | Path) -> SourceVoice:
    """Validate a transformers VitsModel folder and convert it; touches nothing outside it."""
    folder = Path(folder)
    cfg = read_config(folder)
    bad = _built_in_mismatch(cfg)
    if bad:
        raise _error(folder, "config.json sets what this trainer's VITS has built in: " + "; ".join(bad))
    try:
        args, audio = shape_from_config(cfg)
        vits_args = model_args("vits_base", args)
        with torch.device("meta"):  # the shape is built once here, so a value it cannot take is said now
            ours = VITS(max(1, cfg.get("vocab_size", 1)), audio["n_fft"] // 2 + 1, max(1, cfg.get("num_speakers", 1)),
                        vits_args, audio["hop_length"])
    except (ConfigError, TypeError, ValueError) as exc:
        raise _error(folder, f"config.json gives a shape this trainer's VITS cannot take: {exc}") from None
    weights = folder / "model.safetensors"
    if not weights.is_file():
        other = ", ".join(p.name for p in sorted(folder.glob("*.bin")) + sorted(folder.glob("*.safetensors*")))
        hint = (f" (it has {other}: a .bin is a pickle, never read here; in Python, VitsModel.from_pretrained(folder)"
                ".save_pretrained(folder) writes one model.safetensors)" if other else "")
        raise _error(folder, f"no model.safetensors{hint}; download the model's model.safetensors into the folder")
    try:
        source = load_safetensors(weights)
    except SafetensorsError as exc:
        raise _error(folder, f"model.safetensors is damaged: {exc}; download it again") from None
    state, others = convert_state(source)
    n_speakers = cfg.get("num_speakers", 1)
    rows = state["enc_p.emb.weight"].shape[0] if "enc_p.emb.weight" in state else 0
    notes = []
    if not cfg.get("use_bias", True):  # our attention convs keep a bias: at zero it is the same layer
        for key in [k for k in state if re.search(r"\.conv_[qkvo]\.weight$", k)]:
            state[key.removesuffix("weight") + "bias"] = torch.zeros(state[key].shape[0])
        notes.append("use_bias false: the attention's q/k/v/out biases start at zero (trainable here)")
    _check_names(folder, state, ours, "its config.json")
    disc, disc_args, disc_note = _discriminator(folder, cfg, source)
    args.update(disc_args)
    symbols, text_notes = read_vocab(folder, rows)
    licence, licence_note = read_licence(folder)
    notes += [f"read {len(source)} tensors of a transformers VitsModel ({'multi' if n_speakers > 1 else 'single'}"
              f"-speaker, {audio['sample_rate']} Hz, hop {audio['hop_length']})", disc_note,
              f"audio.win_length {audio['win_length']}: config.json has none; MMS and VITS use the FFT size",
              *text_notes, licence_note]
    unread = [k for k in others if not k.startswith("discriminator.")]
    if unread:
        notes.append(f"not read: {len(unread)} tensors that are no part of VITS (e.g. {unread[0]})")
    off = {k: cfg[k] for k, v in _TRAINING_ONLY.items() if k in cfg and cfg[k] != v}
    if off:
        notes.append("training-only settings not carried over (model_args.p_dropout is the run's): "
                     + ", ".join(f"{k} {v}" for k, v in off.items()))
    notes.append(f"its synthesis defaults: noise_scale {cfg.get('noise_scale', 0.667)}, noise_scale_w "
                 f"{cfg.get('noise_scale_duration', 0.8)}, length_scale {1 / cfg.get('speaking_rate', 1.0):g}")
    return SourceVoice(path=folder, kind="mms", model_args=args, audio=audio, symbols=symbols, generator=state,
                       discriminator=disc, speakers={str(i): i for i in range(n_speakers)} if n_speakers > 1 else {},
                       licence=licence, phoneme_type="text", notes=[n for n in notes if n])


def _check_names(folder: Path, state: dict[str, torch.Tensor], model: torch.nn.Module, against: str) -> None:
    """Every tensor `model` (built on meta: no memory, no RNG draw) has is in `state` with its shape, and no other."""
    fit = compare_state(model.state_dict(), state)
    parts = [f"{len(items)} {title} (e.g. {items[0]})" for items, title in (
        (fit.missing, "tensors missing"), (fit.mismatched, "of another shape"), (fit.unexpected, "unknown")) if items]
    if parts:
        raise _error(folder, f"model.safetensors does not match {against}: " + "; ".join(parts)
                     + "; the folder's files do not belong together: download the model again")
