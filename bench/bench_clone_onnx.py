"""ONNX export of the voice-cloning acoustic model per size: file size, export + check time, and the
acoustic model's time in PyTorch vs onnxruntime on one sentence (1 thread each, CPU).

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.bench_clone_onnx [--sizes tiny small normal]

The weights are random (the duration bias is set so each symbol gets ~3 frames, like a trained
model): speed and export fidelity do not depend on what the weights learned.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from bench.timing import seconds_per_step
from common.config import config_to_dict
from tts.clone.config import CloneConfig
from tts.clone.export_onnx import INPUTS, OnnxCloneAcoustic, main
from tts.clone.infer import text_ids
from tts.clone.model import VoiceCloneTTS
from tts.text import SYMBOLS

SENTENCE = "Men o'zbek tilida gapirishni yaxshi ko'raman."


def bench(size: str, folder: Path) -> str:
    import onnxruntime as ort

    torch.manual_seed(0)
    cfg = CloneConfig()
    cfg.model.size = size
    model = VoiceCloneTTS(cfg.model, len(SYMBOLS), cfg.audio.n_mels).eval()
    with torch.no_grad():
        model.duration_predictor.out.bias.fill_(1.5)
    ckpt, out = folder / f"{size}.pt", folder / f"{size}.onnx"
    torch.save({"models": {"model": model.state_dict()}, "config": config_to_dict(cfg)}, ckpt)
    t0 = time.perf_counter()
    if main(["--checkpoint", str(ckpt), "--out", str(out)]) != 0:
        return f"{size}: export or check failed"
    export_s = time.perf_counter() - t0
    ids = text_ids(SENTENCE)
    args = (ids, torch.tensor([ids.size(1)]), torch.randn(1, cfg.audio.n_mels, 259), torch.tensor([259]),
            torch.tensor([1.0]))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    session = ort.InferenceSession(str(out), opts, providers=["CPUExecutionProvider"])
    feeds = {n: a.numpy() for n, a in zip(INPUTS, args, strict=True)}
    wrapper = OnnxCloneAcoustic(model)
    with torch.no_grad():
        frames = wrapper(*args)[0].shape[-1]
        pt = seconds_per_step(lambda: wrapper(*args), 5, torch.device("cpu"))
    ox = seconds_per_step(lambda: session.run(None, feeds), 5, torch.device("cpu"))
    return (f"{size}: {out.stat().st_size / 1e6:.1f} MB, export + check {export_s:.1f} s, {frames} frames: "
            f"PyTorch {pt:.3f} s, onnxruntime {ox:.3f} s ({pt / ox:.2f}x)")


def run(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", default=["tiny", "small", "normal"])
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        lines = [bench(size, Path(tmp)) for size in args.sizes]
    print("\n".join(lines))


if __name__ == "__main__":
    run()
