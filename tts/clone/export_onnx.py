"""Export the voice-cloning acoustic model (text + reference mel → mel + f0) to ONNX and check it.

    python tts/export_clone_onnx.py --checkpoint runs/tts_clone/checkpoints/best.pt --out clone.onnx [--reference voice.wav]

The graph is `VoiceCloneTTS.infer` with tensor inputs, so any ONNX runtime can drive it:
inputs ``text`` [B, T] int64 symbol ids (normalised text, `OUT.json`'s ``symbols``),
``text_lengths`` [B] int64, ``ref_mel`` [B, n_mels, T_ref] float32 (the reference clip's raw
log-mel with `OUT.json`'s ``audio`` settings, as `tts.clone.data.load_reference` computes it),
``ref_lengths`` [B] int64 and ``length_scale`` [1] float32 (>1 speaks slower); outputs ``mel``
[B, n_mels, T] (the vocoder's units), ``f0`` [B, T] in Hz and ``mel_lengths`` [B] int64.
The vocoder exports separately (`vocoder/export.py --onnx`); mel + f0 are exactly its inputs.
``OUT.README.md`` is the model card (`common.model_card`): steps, held-out figures, data and licences.

The check runs the same inputs through PyTorch and onnxruntime (when installed) and fails when
the mels differ by more than ``--tolerance`` (log-mel units) or f0 by more than that fraction.
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
from tts.clone.config import CloneConfig
from tts.clone.data import load_reference
from tts.clone.infer import load_clone_model, text_ids
from tts.clone.model import VoiceCloneTTS
from tts.text import SYMBOLS

INPUTS = ["text", "text_lengths", "ref_mel", "ref_lengths", "length_scale"]
OUTPUTS = ["mel", "f0", "mel_lengths"]
# the config keys the model card lists first
CARD_KEYS = ("model.size", "audio.sample_rate", "audio.hop_length", "audio.n_mels", "audio.f0_method",
             "train.batch_size", "optim.optimizer", "optim.lr", "train.precision", "train.seed")
CHECK_SENTENCES = ["Salom, dunyo!", "Toshkentda 2024-yil 5-sentabrda havo 25 daraja boʻldi."]


def lengths_to_mask(lengths: torch.Tensor, size: int | torch.Tensor) -> torch.Tensor:
    return torch.arange(size, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)


class OnnxCloneAcoustic(nn.Module):
    """`VoiceCloneTTS.infer` with lengths instead of masks (what an ONNX graph takes)."""

    def __init__(self, model: VoiceCloneTTS) -> None:
        super().__init__()
        self.model = model

    def forward(self, text: torch.Tensor, text_lengths: torch.Tensor, ref_mel: torch.Tensor,
                ref_lengths: torch.Tensor, length_scale: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model.infer(text, lengths_to_mask(text_lengths, text.size(1)), ref_mel,
                               lengths_to_mask(ref_lengths, ref_mel.size(2)), length_scale=length_scale[0])
        return out["mel"], out["f0"], out["mel_mask"].sum(1)


def export(model: VoiceCloneTTS, out: str | Path, opset: int = 17) -> Path:
    """Traces `OnnxCloneAcoustic` (legacy exporter: the frame count stays a dynamic tensor)."""
    out = Path(out)
    model = model.eval()
    ids = text_ids("salom dunyo")
    ref = torch.randn(1, model.n_mels, 40)
    args = (ids, torch.tensor([ids.size(1)]), ref, torch.tensor([ref.size(2)]), torch.tensor([1.0]))
    with warnings.catch_warnings(), atomic_output(out) as tmp:  # never a partial .onnx (common.atomic_write)
        warnings.simplefilter("ignore")  # tracer warnings about Python values in the graph
        torch.onnx.export(
            OnnxCloneAcoustic(model), args, str(tmp), dynamo=False, opset_version=opset,
            input_names=INPUTS, output_names=OUTPUTS,
            dynamic_axes={"text": {0: "batch", 1: "symbols"}, "text_lengths": {0: "batch"},
                          "ref_mel": {0: "batch", 2: "ref_frames"}, "ref_lengths": {0: "batch"},
                          "mel": {0: "batch", 2: "frames"}, "f0": {0: "batch", 1: "frames"},
                          "mel_lengths": {0: "batch"}})
    return out


def metadata(cfg: CloneConfig) -> dict:
    """What a runtime needs beside the graph: the text symbols and the mel settings of ref_mel."""
    return {"symbols": list(SYMBOLS), "pad_id": 0, "audio": vars(cfg.audio).copy(), "model_size": cfg.model.size,
            "inputs": INPUTS, "outputs": OUTPUTS, "text": "tts.text.normalize, then one id per symbol"}


def check(model: VoiceCloneTTS, onnx_path: str | Path, ref_mel: torch.Tensor,
          sentences: list[str] = CHECK_SENTENCES, tolerance: float = 1e-3) -> dict[str, float]:
    """Max |ONNX − PyTorch| of mel (log-mel units) and relative f0 over the sentences, with the
    reference `ref_mel` [1, n_mels, T_ref] at length scales 1.0 and 1.3; raises above tolerance."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    wrapper = OnnxCloneAcoustic(model.eval())
    worst = {"mel": 0.0, "f0_rel": 0.0}
    for text in sentences:
        ids = text_ids(text)
        for scale in (1.0, 1.3):
            args = (ids, torch.tensor([ids.size(1)]), ref_mel.float(), torch.tensor([ref_mel.size(2)]),
                    torch.tensor([scale]))
            with torch.no_grad():
                ref = [t.numpy() for t in wrapper(*args)]
            got = session.run(None, {name: a.numpy() for name, a in zip(INPUTS, args, strict=True)})
            if got[0].shape != ref[0].shape or not np.array_equal(got[2], ref[2]):
                raise RuntimeError(f"ONNX mel shape {got[0].shape} != PyTorch {ref[0].shape} for {text!r}")
            worst["mel"] = max(worst["mel"], float(np.abs(got[0] - ref[0]).max()))
            worst["f0_rel"] = max(worst["f0_rel"], float((np.abs(got[1] - ref[1]) / np.maximum(ref[1], 1.0)).max()))
    if max(worst.values()) > tolerance:
        raise RuntimeError(f"ONNX and PyTorch differ: mel up to {worst['mel']:.2e}, f0 up to "
                           f"{worst['f0_rel']:.2e} relative (> tolerance {tolerance:g})")
    return worst


def main(argv: list[str] | None = None) -> int:
    p = FlagParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", "--ckpt", dest="checkpoint", required=True, help="checkpoint of tts/train_main.py, or its run folder (best.pt, else the newest)")
    p.add_argument("--out", required=True, help="model.onnx (model.onnx.json is written beside it)")
    p.add_argument("--overwrite", action="store_true", help="replace --out and its .json if it exists")
    p.add_argument("--reference", help="a clip to check with (default: a synthetic reference mel)")
    p.add_argument("--opset", type=int, default=17)
    p.add_argument("--tolerance", type=float, default=None, help="max |ONNX - PyTorch| (log-mel; f0 relative; default 1e-3)")
    p.add_argument("--no_check", action="store_true", help="skip the onnxruntime comparison")
    args = p.parse_args(argv)
    args.checkpoint = str(resolve_checkpoint_arg(args.checkpoint))  # a run folder: its best.pt, else the newest
    unused = [f for f, v in (("--tolerance", args.tolerance), ("--reference", args.reference)) if v is not None]
    if args.no_check and unused:  # they only shape the check
        p.error(f"{', '.join(unused)} with --no_check: the check they set is skipped; drop one")
    args.tolerance = 1e-3 if args.tolerance is None else args.tolerance

    def body() -> int:
        for written in (args.out, args.out + ".json", card_path(args.out)):
            check_apart(written, "--out", {"--checkpoint": args.checkpoint, "--reference": args.reference}, "_onnx")
        check_output_file(args.out, "--out")
        for existing in (args.out, args.out + ".json", card_path(args.out)):
            refuse_to_replace(existing, args.overwrite, "--out")
        model, cfg = load_clone_model(args.checkpoint, "cpu")
        ref_mel = (load_reference(args.reference, cfg.audio, cfg.data).mel if args.reference else
                   model.mel_mean.view(1, -1, 1) + model.mel_std.view(1, -1, 1) * torch.randn(
                       1, cfg.audio.n_mels, 100, generator=torch.Generator().manual_seed(0)))
        t0 = time.time()
        out = export(model, args.out, args.opset)
        write_text(str(out) + ".json", json.dumps(metadata(cfg), ensure_ascii=False, indent=1))
        card = write_model_card(out, **checkpoint_facts(load_checkpoint(args.checkpoint), args.checkpoint),
                                export="tts/export_clone_onnx.py", key_config=CARD_KEYS)
        print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB), {out}.json and {card} in {time.time() - t0:.1f} s")
        if args.no_check:
            return 0
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            print("check skipped: onnxruntime is not installed (pip install onnxruntime)", file=sys.stderr)
            return 0
        try:
            worst = check(model, out, ref_mel, tolerance=args.tolerance)
        except RuntimeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print(f"onnxruntime matches PyTorch on {len(CHECK_SENTENCES)} sentences x 2 length scales: "
              f"mel max |difference| {worst['mel']:.2e}, f0 {worst['f0_rel']:.2e} relative")
        return 0

    return exit_codes.run_main(body)


if __name__ == "__main__":
    sys.exit(main())
