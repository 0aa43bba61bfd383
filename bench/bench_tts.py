"""Uzbek VITS benchmark: training step time / samples/s per preset, data-wait fraction, inference
RTF per preset (single-threaded CPU, and GPU when present), ONNX Runtime vs PyTorch RTF.

    python -m bench.bench_tts [--presets tiny x_low medium vits_base] [--steps 2] [--device cpu|cuda]

On a CPU the training steps are SCALED DOWN (batch 2 of 2-second utterances, latent window 16
frames) so the default run stays under ~3 minutes; the table says so. On a GPU they use the
recipe's window (32 frames) and batch 16. Inference uses random weights with durations pinned to
4 frames per token (length_scale 4 on an untrained duration predictor), on one ~50-character
Uzbek sentence; RTF = synthesis seconds / audio seconds (text processing included).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.timing import seconds_per_step
from tts.vits.config import TrainConfig, model_args

SENTENCE = "Bugun havo juda yaxshi, biz bogʻda uzoq sayr qildik."


def _models(preset: str, n_speakers: int = 1, **over):
    from tts.text import SYMBOLS
    from tts.vits.discriminator import MultiPeriodDiscriminator
    from tts.vits.model import VITS

    args = model_args(preset, over)
    torch.manual_seed(0)
    return (VITS(len(SYMBOLS), 513, n_speakers, args, 256),
            MultiPeriodDiscriminator(args.mpd_periods, args.disc_channel_scale))


def train_step_time(preset: str, device: torch.device, steps: int, batch: int, seconds: float,
                    segment: int) -> tuple[float, float]:
    """Seconds per full G+D step and utterances/s, on a synthetic batch (after one warm-up step)."""
    from common.training import step_optimizer
    from speech.audio import MelSpectrogram
    from tts.vits.losses import discriminator_loss, feature_loss, generator_loss, kl_loss
    from tts.vits.model import slice_segments

    gen, disc = _models(preset, segment_frames=segment)
    gen.to(device).train()
    disc.to(device).train()
    mel = MelSpectrogram(22050, 1024, 1024, 256, 80).to(device)
    opt_g = torch.optim.AdamW(gen.parameters(), 2e-4, betas=(0.8, 0.99))
    opt_d = torch.optim.AdamW(disc.parameters(), 2e-4, betas=(0.8, 0.99))
    frames = int(seconds * 22050 / 256)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(1, 39, (batch, int(seconds * 14) * 2 + 1), generator=g).to(device)
    x_len = torch.full((batch,), x.size(1), device=device)
    spec = torch.rand(batch, 513, frames, generator=g).to(device)
    y_len = torch.full((batch,), frames, device=device)
    wav = (torch.rand(batch, frames * 256, generator=g) - 0.5).to(device)

    def step():
        out = gen(x, x_len, spec, y_len)
        y = slice_segments(wav.unsqueeze(1), out["starts"] * 256, segment * 256)
        y_hat = out["wav"]
        opt_d.zero_grad(set_to_none=True)
        r, f, _, _ = disc(y, y_hat.detach())
        step_optimizer(discriminator_loss(r, f), opt_d, disc.parameters(), None, 1.0)
        opt_g.zero_grad(set_to_none=True)
        _, f, fr, fg = disc(y, y_hat)
        loss = (45 * torch.nn.functional.l1_loss(mel(y_hat.squeeze(1)), mel(y.squeeze(1)))
                + kl_loss(out["z_p"], out["logs_q"], out["m_p"], out["logs_p"], out["y_mask"])
                + out["l_length"].sum() + feature_loss(fr, fg) + generator_loss(f))
        step_optimizer(loss, opt_g, gen.parameters(), None, 1.0)

    dt = seconds_per_step(step, steps, device, warmup=1)
    return dt, batch / dt


def inference_rtf(preset: str, device: torch.device, repeats: int = 2):
    """(PyTorch RTF, ONNX Runtime RTF or None, audio seconds) with weight norm removed."""
    from tts.vits.synthesize import text_to_input

    gen, _ = _models(preset)
    gen.eval().remove_weight_norm()
    gen.to(device)
    x = text_to_input(SENTENCE, add_blank=True).to(device)
    x_len = torch.tensor([x.size(1)], device=device)

    def run():
        with torch.no_grad():
            return gen.infer(text_to_input(SENTENCE, True).to(device), x_len, None, 0.667, 4.0, 0.0)[0]

    wav = run()
    secs = wav.size(-1) / 22050
    t0 = time.perf_counter()
    for _ in range(repeats):
        run()
    if device.type == "cuda":
        torch.cuda.synchronize()
    rtf_pt = (time.perf_counter() - t0) / repeats / secs
    rtf_ort = None
    if device.type == "cpu":
        import onnxruntime as ort

        from tts.vits.export_onnx import export, run_onnx

        with tempfile.TemporaryDirectory() as tmp:
            path = export(gen, Path(tmp) / "m.onnx")
            so = ort.SessionOptions()
            so.intra_op_num_threads = 1
            so.inter_op_num_threads = 1
            sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
            run_onnx(sess, x.cpu(), (0.667, 4.0, 0.0))
            t0 = time.perf_counter()
            for _ in range(repeats):
                run_onnx(sess, text_to_input(SENTENCE, True), (0.667, 4.0, 0.0))
            rtf_ort = (time.perf_counter() - t0) / repeats / secs
    return rtf_pt, rtf_ort, secs


def synthetic_corpus(root: Path, n: int, seconds: float = 2.0, text: str = "bugun havo juda yaxshi edi") -> Path:
    """`n` sine-tone utterances (one text, one speaker, 22.05 kHz) prepared by tts/prepare_data.py into
    `root/p` (1 held out): a corpus for timing the VITS and cloning loops, not for learning anything.
    Longer items need a longer `text`: prepare_data drops items spoken slower than 4 letters a second."""
    import soundfile as sf

    from tts.prepare_data import prepare

    (root / "a").mkdir(parents=True)
    t = np.arange(int(seconds * 22050)) / 22050
    lines = []
    for i in range(n):
        sf.write(root / "a" / f"{i}.wav", (0.3 * np.sin(2 * np.pi * (100 + 5 * (i % 40)) * t)).astype(np.float32),
                 22050)
        lines.append(f"{i}|{text}")
    (root / "m.csv").write_text("\n".join(lines) + "\n")
    cfg = TrainConfig()
    cfg.data.eval_split_size = 1
    cfg.data.trim_silence = False  # tones: no speech for the Silero VAD to keep
    prepare(root / "m.csv", root / "a", root / "p", cfg, quiet=True)
    return root / "p"


def data_wait_fraction(steps: int = 12) -> tuple[float, str]:
    """Fraction of a tiny-preset training loop spent waiting for batches (num_workers 0),
    over the demo's prepared data (made if missing: a small synthetic set)."""
    from common.config import load_config
    from common.distributed import setup_distributed
    from tts.vits.train import VitsTrainer

    data = Path("data/demo/tts_prepared")
    tmp = None
    if not (data / "train.jsonl").is_file():
        tmp = tempfile.TemporaryDirectory()
        data = synthetic_corpus(Path(tmp.name), 16)
    sets = ["model=tiny", "batch_size=8", "num_workers=0", "persistent_workers=false", "pin_memory=false",
            "precision=32-true", "run_eval=false", "test_sentences=[]", f"max_steps={steps}",
            "progress_bar=false", "save_step=100000", "print_step=100000", "max_minutes=null"]
    with tempfile.TemporaryDirectory() as run_dir:
        cfg = load_config(str(Path(__file__).resolve().parents[1] / "tts/vits/configs/demo.yaml"), TrainConfig, sets,
                          extra={"data_dir": str(data), "run_dir": run_dir})
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()):
            trainer = VitsTrainer(cfg, setup_distributed("cpu"))
            waits, busy = [], []
            it = iter(trainer.loader)
            for _ in range(min(steps, len(trainer.sampler))):
                t0 = time.perf_counter()
                batch = next(it)
                t1 = time.perf_counter()
                trainer.train_step(batch)
                waits.append(t1 - t0)
                busy.append(time.perf_counter() - t1)
    if tmp is not None:
        tmp.cleanup()
    return sum(waits) / (sum(waits) + sum(busy)), str(data if tmp is None else "synthetic")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", nargs="+", default=["tiny", "x_low", "medium", "vits_base"])
    p.add_argument("--steps", type=int, default=2, help="timed training steps per preset (after 1 warm-up)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=2, help="CPU threads for the training steps")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    cpu = device.type == "cpu"
    batch, seconds, segment = (2, 2.0, 16) if cpu else (16, 4.0, 32)
    t_all = time.perf_counter()
    rows = []
    for preset in args.presets:
        torch.set_num_threads(args.threads)
        step_s, ups = train_step_time(preset, device, args.steps, batch, seconds, segment)
        torch.set_num_threads(1)
        rtf_pt, rtf_ort, secs = inference_rtf(preset, torch.device("cpu"))
        rtf_gpu = inference_rtf(preset, device)[0] if not cpu else None
        gen, disc = _models(preset)
        rows.append((preset, sum(p.numel() for p in gen.parameters()) / 1e6,
                     sum(p.numel() for p in disc.parameters()) / 1e6, step_s, ups, rtf_pt, rtf_ort, rtf_gpu))
        print(f"  {preset}: done ({time.perf_counter() - t_all:.0f} s)", flush=True)
    torch.set_num_threads(args.threads)
    wait, data_src = data_wait_fraction()
    scale = (f"SCALED for CPU: batch {batch} x {seconds:.0f} s utterances, {segment}-frame window, "
             f"{args.threads} threads" if cpu else f"batch {batch} x {seconds:.0f} s, {segment}-frame window")
    print(f"\nUzbek VITS benchmark on {device} ({scale}); inference RTF on 1 CPU thread, "
          f"{SENTENCE!r} at 4 frames/token")
    head = f"{'preset':<10}{'G (M)':>8}{'D (M)':>8}{'step s':>9}{'utt/s':>8}{'RTF torch':>11}{'RTF onnx':>10}" \
           f"{'onnx speed-up':>15}" + ("" if cpu else f"{'RTF gpu':>10}")
    print(head)
    print("-" * len(head))
    for preset, g, d, step_s, ups, rtf_pt, rtf_ort, rtf_gpu in rows:
        line = (f"{preset:<10}{g:>8.2f}{d:>8.2f}{step_s:>9.2f}{ups:>8.2f}{rtf_pt:>11.3f}"
                f"{(rtf_ort or float('nan')):>10.3f}{(rtf_pt / rtf_ort if rtf_ort else float('nan')):>14.2f}x")
        print(line + ("" if cpu else f"{rtf_gpu:>10.4f}"))
    print(f"data-wait fraction (tiny preset, batch 8, num_workers 0, {data_src}): {wait:.1%}")
    print(f"total {time.perf_counter() - t_all:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
