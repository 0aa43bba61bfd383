"""Export the VITS inference graph to ONNX and check it against PyTorch with onnxruntime.

    python tts/export_onnx.py --checkpoint runs/uzbek_vits/checkpoints/best.pt --out uzbek.onnx

Graph (Piper's layout, so Piper-style runtimes can drive it): inputs ``input`` [B, T] int64 token
ids (normalised text, blanks interspersed when the config's ``data.add_blank``), ``input_lengths``
[B] int64, ``scales`` [3] float32 = (noise_scale, length_scale, noise_scale_w), ``sid`` [B] int64
(used when the model has several speakers); output ``output`` [B, 1, samples] float32.
Weight norm is folded into plain weights first. ``OUT.json`` next to the model holds the sample
rate, symbols, speakers and add_blank. The check runs the same inputs through both with the
noise scales at 0 (deterministic) and fails when they differ by more than ``--tolerance``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from common.checkpoint import CheckpointError
from common.run_dir import check_output_file
from tts.models.vits import VITS
from tts.synthesize import load_generator, text_to_input
from tts.text import SYMBOLS


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
    out.parent.mkdir(parents=True, exist_ok=True)
    wrapper = OnnxVits(model).eval()
    x = text_to_input("salom dunyo", add_blank=True)
    args = (x, torch.tensor([x.size(1)]), torch.tensor([0.667, 1.0, 0.8]), torch.tensor([0]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about Python values in the graph
        torch.onnx.export(
            wrapper, args, str(out), dynamo=False, opset_version=opset,
            input_names=["input", "input_lengths", "scales", "sid"], output_names=["output"],
            dynamic_axes={"input": {0: "batch", 1: "phonemes"}, "input_lengths": {0: "batch"},
                          "sid": {0: "batch"}, "output": {0: "batch", 2: "time"}})
    return out


def run_onnx(session, x: torch.Tensor, scales: tuple[float, float, float], sid: int = 0) -> np.ndarray:
    feeds = {"input": x.numpy(), "input_lengths": np.array([x.shape[1]], dtype=np.int64),
             "scales": np.array(scales, dtype=np.float32), "sid": np.array([sid], dtype=np.int64)}
    names = {i.name for i in session.get_inputs()}
    return session.run(None, {k: v for k, v in feeds.items() if k in names})[0]


def check(model: VITS, onnx_path: str | Path, sentences: list[str], add_blank: bool, n_speakers: int,
          tolerance: float = 1e-3) -> float:
    """Max |ONNX − PyTorch| over the sentences (noise 0, every speaker id 0..min(n, 2)); raises above tolerance."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    worst = 0.0
    for text in sentences:
        x = text_to_input(text, add_blank)
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
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--out", required=True, help="model.onnx (model.onnx.json is written beside it)")
    p.add_argument("--opset", type=int, default=17)
    p.add_argument("--tolerance", type=float, default=1e-3, help="max |ONNX - PyTorch| sample difference")
    p.add_argument("--no_check", action="store_true")
    args = p.parse_args(argv)
    try:
        check_output_file(args.out, "--out")
        model, cfg, speakers = load_generator(args.checkpoint, "cpu", remove_wn=True)
    except (CheckpointError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    t0 = time.time()
    out = export(model, args.out, args.opset)
    meta = {"audio": {"sample_rate": cfg.audio.sample_rate}, "symbols": list(SYMBOLS), "pad_id": 0,
            "add_blank": cfg.data.add_blank, "speakers": speakers, "model": cfg.model,
            "inference": {"noise_scale": cfg.noise_scale, "length_scale": cfg.length_scale,
                          "noise_scale_w": cfg.noise_scale_w}}
    Path(str(out) + ".json").write_text(json.dumps(meta, ensure_ascii=False, indent=1), encoding="utf-8")
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB) and {out}.json in {time.time() - t0:.1f} s")
    if not args.no_check:
        sentences = ["Salom, dunyo!", "Toshkentda 2024-yil 5-sentabrda havo 25 daraja boʻldi.",
                     *cfg.test_sentences[:2]]
        try:
            worst = check(model, out, sentences, cfg.data.add_blank, len(speakers), args.tolerance)
        except RuntimeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print(f"onnxruntime matches PyTorch on {len(sentences)} sentences: max |difference| {worst:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
