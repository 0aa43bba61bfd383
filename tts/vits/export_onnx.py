"""Export the VITS inference graph to ONNX and check it against PyTorch with onnxruntime.

    python tts/export_onnx.py --checkpoint runs/uzbek_vits/checkpoints/best.pt --out uzbek.onnx

Graph (Piper's layout, so Piper-style runtimes can drive it): inputs ``input`` [B, T] int64 token
ids (normalised text, blanks interspersed when the config's ``data.add_blank``), ``input_lengths``
[B] int64, ``scales`` [3] float32 = (noise_scale, length_scale, noise_scale_w), ``sid`` [B] int64
(used when the model has several speakers); output ``output`` [B, 1, samples] float32.
Weight norm is folded into plain weights first. The check runs the same inputs through both with
the noise scales at 0 (deterministic) and fails when they differ by more than ``--tolerance``.

``OUT.json`` next to the model is a Piper voice config (the keys rhasspy/piper's runtime and the
``piper-tts`` package read): ``audio.sample_rate``, ``espeak.voice``, ``phoneme_type`` (``text`` or
``espeak``, the model's front-end), ``phoneme_id_map`` (one codepoint → [ids]), ``num_symbols``,
``num_speakers``, ``speaker_id_map``, ``inference`` (noise_scale, length_scale, noise_w) and
``hop_length``. Piper builds ``^ _ p1 _ p2 ... _ $`` from the map; we map ``^`` and ``$`` to no id
and ``_`` to the blank (no id without ``data.add_blank``), which is exactly our model's input. Our
own keys (symbols, add_blank, speakers, model, and ``licence`` when the run started from a published
voice that declares one) are kept beside them. ``OUT.README.md`` is the model card (`common.model_card`):
steps, held-out figures, the data's sources and licence, the weights' and the code's licences. Piper reads the text as given
(no Uzbek normaliser): feed it normalised Latin text. A ``text`` model's digraph tokens (sh, ch,
oʻ, gʻ) cannot be a Piper map key (one codepoint each), so Piper reads them as two letters: voices
meant for Piper are trained with ``phoneme_type: espeak``.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from common import exit_codes
from common.atomic_write import atomic_output, write_text
from common.checkpoint import load_checkpoint, resolve_checkpoint_arg
from common.cli import FlagParser
from common.model_card import card_path, checkpoint_facts, write_model_card
from common.run_dir import check_apart, check_output_file, refuse_to_replace
from tts.text.phonemes import Frontend
from tts.text.symbols import PAD
from tts.vits.config import TrainConfig
from tts.vits.model import VITS
from tts.vits.synthesize import load_generator, text_to_input

PIPER_BOS, PIPER_EOS = "^", "$"
# the config keys the model card lists first
CARD_KEYS = ("model", "phoneme_type", "espeak_voice", "audio.sample_rate", "audio.hop_length", "data.add_blank",
             "batch_size", "lr", "precision", "seed")


class OnnxVits(nn.Module):
    """VITS.infer with tensor inputs only (what an ONNX graph can take)."""

    def __init__(self, model: VITS):
        super().__init__()
        self.model = model

    def forward(self, input: torch.Tensor, input_lengths: torch.Tensor, scales: torch.Tensor,
                sid: torch.Tensor) -> torch.Tensor:
        wav, _, _ = self.model.infer(input, input_lengths, sid, noise_scale=scales[0], length_scale=scales[1],
                                     noise_scale_w=scales[2])
        return wav


def export(model: VITS, out: str | Path, opset: int = 17) -> Path:
    out = Path(out)
    wrapper = OnnxVits(model).eval()
    x = text_to_input("salom dunyo", add_blank=True)
    args = (x, torch.tensor([x.size(1)]), torch.tensor([0.667, 1.0, 0.8]), torch.tensor([0]))
    with warnings.catch_warnings(), atomic_output(out) as tmp:  # never a partial .onnx (common.atomic_write)
        warnings.simplefilter("ignore")  # tracer warnings about Python values in the graph
        torch.onnx.export(
            wrapper, args, str(tmp), dynamo=False, opset_version=opset,
            input_names=["input", "input_lengths", "scales", "sid"], output_names=["output"],
            dynamic_axes={"input": {0: "batch", 1: "phonemes"}, "input_lengths": {0: "batch"},
                          "sid": {0: "batch"}, "output": {0: "batch", 2: "time"}})
    return out


def run_onnx(session, x: torch.Tensor, scales: tuple[float, float, float], sid: int = 0) -> np.ndarray:
    feeds = {"input": x.numpy(), "input_lengths": np.array([x.shape[1]], dtype=np.int64),
             "scales": np.array(scales, dtype=np.float32), "sid": np.array([sid], dtype=np.int64)}
    names = {i.name for i in session.get_inputs()}
    return session.run(None, {k: v for k, v in feeds.items() if k in names})[0]


def piper_config(cfg: TrainConfig, speakers: dict[str, int], licence: str | None = None) -> dict:
    """The ``.onnx.json`` of a Piper voice for this model (see the module docstring); ``licence``: of the
    weights the run started from (a published voice's, carried in the checkpoint), when there is one."""
    frontend = Frontend.of(cfg)
    symbols = frontend.symbols
    id_map = {PIPER_BOS: [], PIPER_EOS: [], PAD: [0] if cfg.data.add_blank else []}
    id_map.update({s: [i] for i, s in enumerate(symbols) if len(s) == 1 and s != PAD})
    if frontend.phoneme_type == "text":  # Piper does not lower-case: capitals read as their letters
        id_map.update({s.upper(): [i] for i, s in enumerate(symbols) if len(s) == 1 and s.upper() not in id_map})
    return {
        "audio": {"sample_rate": cfg.audio.sample_rate, "quality": cfg.model},
        "espeak": {"voice": cfg.espeak_voice},
        "language": {"code": cfg.espeak_voice},
        "phoneme_type": frontend.phoneme_type,
        "phoneme_map": {},
        "phoneme_id_map": id_map,
        "num_symbols": len(symbols),
        "num_speakers": len(speakers),
        "speaker_id_map": dict(speakers) if len(speakers) > 1 else {},
        "inference": {"noise_scale": cfg.noise_scale, "length_scale": cfg.length_scale, "noise_w": cfg.noise_scale_w},
        "hop_length": cfg.audio.hop_length,
        "piper_version": "1.0.0",
        # ours (Piper ignores them): what synthesize.py-style callers need beyond Piper's keys
        "symbols": list(symbols), "pad_id": 0, "add_blank": cfg.data.add_blank, "speakers": speakers,
        "model": cfg.model,
        **({"licence": licence} if licence else {}),
    }


def check(model: VITS, onnx_path: str | Path, sentences: list[str], add_blank: bool, n_speakers: int,
          tolerance: float = 1e-3, frontend: Frontend | None = None) -> float:
    """Max |ONNX − PyTorch| over the sentences (noise 0, every speaker id 0..min(n, 2)); raises above tolerance."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    worst = 0.0
    for text in sentences:
        x = text_to_input(text, add_blank, frontend)
        for sid in range(min(n_speakers, 2)):
            with torch.no_grad():
                ref, _, _ = model.infer(x, torch.tensor([x.size(1)]), torch.tensor([sid]), 0.0, 1.0, 0.0)
            got = run_onnx(session, x, (0.0, 1.0, 0.0), sid)
            if got.shape != tuple(ref.shape):
                raise RuntimeError(f"ONNX output shape {got.shape} != PyTorch {tuple(ref.shape)} for {text!r}")
            worst = max(worst, float(np.abs(got - ref.numpy()).max()))
    if worst > tolerance:
        raise RuntimeError(f"ONNX and PyTorch outputs differ by up to {worst:.2e} (> tolerance {tolerance:g})")
    return worst


def main(argv: list[str] | None = None) -> int:
    p = FlagParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", "--ckpt", dest="checkpoint", required=True)
    p.add_argument("--out", required=True, help="model.onnx (model.onnx.json is written beside it)")
    p.add_argument("--overwrite", action="store_true", help="replace --out and its .json if it exists")
    p.add_argument("--opset", type=int, default=17)
    p.add_argument("--tolerance", type=float, default=None, help="max |ONNX - PyTorch| sample difference (default 1e-3)")
    p.add_argument("--no_check", action="store_true")
    args = p.parse_args(argv)
    args.checkpoint = str(resolve_checkpoint_arg(args.checkpoint))  # a run folder: its best.pt, else the newest
    if args.no_check and args.tolerance is not None:  # it only shapes the check
        p.error("--tolerance with --no_check: the check it sets is skipped; drop one")
    args.tolerance = 1e-3 if args.tolerance is None else args.tolerance

    def body() -> int:
        for written in (args.out, args.out + ".json", card_path(args.out)):
            check_apart(written, "--out", {"--checkpoint": args.checkpoint}, "_onnx")
        check_output_file(args.out, "--out")
        for existing in (args.out, args.out + ".json", card_path(args.out)):
            refuse_to_replace(existing, args.overwrite, "--out")
        ckpt = load_checkpoint(args.checkpoint)
        model, cfg, speakers = load_generator(args.checkpoint, "cpu", remove_wn=True, ckpt=ckpt)
        t0 = time.time()
        licence = ckpt.get("extra", {}).get("licence")
        meta = piper_config(cfg, speakers, licence)
        out = export(model, args.out, args.opset)
        write_text(str(out) + ".json", json.dumps(meta, ensure_ascii=False, indent=1))
        card = write_model_card(out, **checkpoint_facts(ckpt, args.checkpoint), export="tts/export_onnx.py",
                                key_config=CARD_KEYS)
        print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB), {out}.json (Piper voice config, phoneme_type "
              f"{meta['phoneme_type']}) and {card} in {time.time() - t0:.1f} s")
        if licence:
            print(f"licence of the weights: {licence} (written into {out}.json)")
        if meta["phoneme_type"] == "text":
            print("note: Piper reads a phoneme_type text voice codepoint by codepoint, so it says sh, ch, oʻ, gʻ as two "
                  "letters and does not normalise numbers: for Piper, train with phoneme_type: espeak and feed it "
                  "normalised text")
        if not args.no_check:
            sentences = ["Salom, dunyo!", "Toshkentda 2024-yil 5-sentabrda havo 25 daraja boʻldi.",
                         *cfg.test_sentences[:2]]
            try:
                worst = check(model, out, sentences, cfg.data.add_blank, len(speakers), args.tolerance,
                              Frontend.of(cfg))
            except RuntimeError as e:
                print(f"error: {e}", file=sys.stderr)
                return 1
            print(f"onnxruntime matches PyTorch on {len(sentences)} sentences: max |difference| {worst:.2e}")
        return 0

    return exit_codes.run_main(body)


if __name__ == "__main__":
    sys.exit(main())
