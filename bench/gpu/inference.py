"""`make gpu-check` section 5: inference speed of the vocoder and VITS (eager, compiled, ONNX Runtime)
and the VAE's tiled reconstruction of a 2048² image. bench/gpu/check.py runs it."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from bench.gpu.base import NA_CPU, Check, OverBudget, Section, fmt
from bench.gpu.trainers import TRAINERS
from bench.timing import seconds_per_step


def _onnx_session(path: Path, cuda: bool):
    import onnxruntime as ort

    providers = ort.get_available_providers()
    if cuda and "CUDAExecutionProvider" in providers:
        return ort.InferenceSession(str(path), providers=["CUDAExecutionProvider", "CPUExecutionProvider"]), "CUDA EP"
    why = "dry run" if not cuda else "onnxruntime has no CUDA EP here (pip install onnxruntime-gpu to measure it)"
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]), f"CPU EP ({why})"


def _inference_row(chk: Check, sec: Section, what: str, audio_s: float, eager: Callable,
                   compiled: Callable | None, onnx: Callable[[], tuple[Callable, str]], repeats: int) -> dict:
    row: dict = {"what": what, "audio_s": audio_s}
    row["eager_s"] = seconds_per_step(eager, repeats, chk.device)
    if compiled is None:
        row["compiled_s"] = NA_CPU["torch.compile"]
    elif why := chk.compile_skip(sec, f"compiled {what}"):
        row["compiled_s"] = why
        sec.partial(why)
    else:
        t0 = time.monotonic()
        row["compiled_s"] = seconds_per_step(compiled, repeats, chk.device, warmup=2)
        chk.compiled(time.monotonic() - t0)
    run_onnx, row["onnx_provider"] = onnx()
    row["onnx_s"] = seconds_per_step(run_onnx, repeats, torch.device("cpu"))
    return row


def vocoder_inference(chk: Check, sec: Section, repeats: int) -> dict:
    from vocoder.export import export_onnx
    from vocoder.infer import VocoderInference
    from vocoder.layouts import export_info
    from vocoder.train import build_generator

    spec = TRAINERS["vocoder"]
    cfg = spec._config(spec.base, spec.tiny() if chk.dry else [])
    voc = VocoderInference(build_generator(cfg), export_info(cfg), chk.device)
    seconds = 0.25 if chk.dry else 2.0
    frames = int(seconds * cfg.audio.sample_rate / cfg.audio.hop_length)
    mel = torch.randn(1, cfg.audio.n_mels, frames, device=chk.device) - 5
    f0 = torch.full((1, frames), 200.0, device=chk.device)
    compiled = None
    if chk.device.type == "cuda":
        gen = torch.compile(voc.generator)

        def compiled():
            with torch.no_grad():
                return gen(mel, f0)

    def onnx():
        path = export_onnx(voc.generator.cpu(), export_info(cfg), chk.tmp)
        voc.generator.to(chk.device)
        sess, provider = _onnx_session(path, chk.device.type == "cuda")
        feeds = {"mel": mel.transpose(1, 2).cpu().numpy(), "f0": f0.cpu().numpy()}
        return (lambda: sess.run(None, feeds)), provider

    return _inference_row(chk, sec, f"vocoder base_hifi_gpu generator, {seconds} s of audio", seconds,
                          lambda: voc(mel, f0), compiled, onnx, repeats)


def vits_inference(chk: Check, sec: Section, preset: str, repeats: int) -> dict:
    from bench.bench_tts import SENTENCE, _models
    from tts.vits.export_onnx import export, run_onnx
    from tts.vits.synthesize import text_to_input

    gen, _ = _models(preset)
    gen.eval().remove_weight_norm()
    gen.to(chk.device)
    x = text_to_input(SENTENCE, add_blank=True).to(chk.device)
    x_len = torch.tensor([x.size(1)], device=chk.device)

    def eager():
        with torch.no_grad():
            return gen.infer(x, x_len, None, 0.667, 4.0, 0.0)[0]

    audio_s = eager().size(-1) / 22050
    compiled = None
    if chk.device.type == "cuda":  # the HiFi-GAN decoder is 90-95 % of inference; lengths vary: dynamic
        gen_c, _ = _models(preset)
        gen_c.eval().remove_weight_norm()
        gen_c.load_state_dict(gen.state_dict())
        gen_c.to(chk.device)
        gen_c.dec = torch.compile(gen_c.dec, dynamic=True)

        def compiled():
            with torch.no_grad():
                return gen_c.infer(x, x_len, None, 0.667, 4.0, 0.0)[0]

    def onnx():
        path = export(gen.cpu(), chk.tmp / f"vits_{preset}.onnx")
        gen.to(chk.device)
        sess, provider = _onnx_session(path, chk.device.type == "cuda")
        return (lambda: run_onnx(sess, x.cpu(), (0.667, 4.0, 0.0))), provider

    return _inference_row(chk, sec, f"VITS {preset} (random weights, 4 frames/token)", audio_s, eager, compiled, onnx,
                          repeats)


def vae_tiled(chk: Check, side: int) -> dict:
    from common.config import config_to_dict
    from vae.model import build_vae
    from vae.reconstruct import reconstruct_tiled

    spec = TRAINERS["vae"]
    cfg = spec.config(spec.rtx, spec.tiny() if chk.dry else [])
    model = build_vae(config_to_dict(cfg)).to(chk.device).eval()
    x = torch.rand(1, 3, side, side, device=chk.device) * 2 - 1
    tile, overlap = (64, 16) if chk.dry else (512, 64)
    row: dict = {"what": f"VAE {spec.rtx.stem} reconstruction of a {side}² image, {tile}-px tiles, overlap {overlap}"}
    for label, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
        with torch.autocast(chk.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            reconstruct_tiled(model, x, tile, overlap)  # warm-up: cuDNN's first calls try algorithms with
            chk.sync()  # workspaces as large as the card allows (an H200 showed a 130 GiB fp32 peak here)
            chk.reset_memory()
            row[f"{label}_s"] = seconds_per_step(lambda: reconstruct_tiled(model, x, tile, overlap), 1, chk.device,
                                                 warmup=0)
        row[f"{label}_peak_gib"] = chk.peak_gib()
    return row


def section_inference(chk: Check, sec: Section) -> None:
    repeats = 2 if chk.dry else 10
    rows = sec.data.setdefault("rows", [])
    jobs: list[tuple[str, Callable[[], dict]]] = [("vocoder", lambda: vocoder_inference(chk, sec, repeats))]
    for preset in (["tiny"] if chk.dry else ["tiny", "medium", "vits_base"]):
        jobs.append((f"vits {preset}", lambda p=preset: vits_inference(chk, sec, p, repeats)))
    for label, job in jobs:
        try:
            sec.check_time(label)
            rows.append(job())
            chk.progress()
        except OverBudget as e:
            sec.partial(str(e))
        except Exception:
            sec.partial(chk.error(f"inference {label}"))
    sec.markdown += ["| what | eager s | compiled s | ONNX Runtime s | ONNX provider | RTF eager |",
                     "|---|---|---|---|---|---|"]
    for r in rows:
        sec.markdown.append(f"| {r['what']} | {r['eager_s']:.4f} | {fmt(r['compiled_s'], '.4f')} | {r['onnx_s']:.4f} "
                            f"| {r['onnx_provider']} | {r['eager_s'] / r['audio_s']:.4f} |")
    try:
        sec.check_time("VAE tiled reconstruction")
        vae = vae_tiled(chk, 128 if chk.dry else 2048)
        sec.data["vae_tiled"] = vae
        sec.markdown += ["", f"{vae['what']}: fp32 {vae['fp32_s']:.3f} s (peak GiB: {fmt(vae['fp32_peak_gib'], '.2f')}), "
                             f"bf16 {vae['bf16_s']:.3f} s (peak GiB: {fmt(vae['bf16_peak_gib'], '.2f')})"]
    except OverBudget as e:
        sec.partial(str(e))
    except Exception:
        sec.partial(chk.error("inference VAE tiled"))
