"""Learning benchmark: how fast each trainer learns *per step*, two settings side by side.

    python -m bench.learning --trainer vocoder [--compare init=old,new] [--steps 200] [--eval_every 50]
    python -m bench.learning --trainer vits --compare lr=0.001,0.002
    python -m bench.learning --trainer vits --compare phoneme_type=text,espeak --steps 300
    python -m bench.learning --trainer vae                 # default: --compare precision=32-true,bf16-mixed
    python -m bench.learning --trainer vocoder --reference_dir /path/to/SingingVocoders --steps 600
    python -m bench.learning --trainer vae --reference_dir /path/to/latent-diffusion --taming_dir /path/to/taming-transformers
    python -m bench.learning --trainer vits --reference_dir /path/to/jaywalnut310-vits --same_init --steps 300
    make bench-learning                                    # all three, default settings

For one trainer: its demo data (made by the demo's own data functions, reused when present), a small
fixed recipe (the demo config + learning_base.RECIPE), a fixed seed, and ONE stored sequence of batches that
both settings train on, interleaved step by step in this process (so machine load hits both alike;
the same RNG seed before each step, so noise draws match too). Prints the held-out metric curve
(vocoder: MR-STFT distance, its log-magnitude part, mel L1, MCD-DTW, F0 RMSE and V/UV error; VITS: MCD-DTW and alignment sharpness of
tts/vits/evaluation.py; VAE: PSNR / SSIM, LPIPS when its VGG backbone is cached) and the median step time.

``--compare KEY=A,B``: ``init=old,new`` compares initialisations (``new`` = the models' deliberate
effective init; ``old`` = weights of the HiFi-GAN parts really drawn N(0, 0.01) under weight norm, the
vocoder's pre-issue-10 init), any other KEY is a config key set to A and to B (``--set`` applies to both).
``--reference_dir`` trains ours against a reference implementation instead: the vocoder against
openvpi/SingingVocoders' own networks, losses and step order (bench/vocoder_reference.py), VITS against
jaywalnut310/vits' (bench/vits_reference.py), the VAE against CompVis/latent-diffusion's
``AutoencoderKL.training_step`` + ``LPIPSWithDiscriminator`` (bench/vae_reference.py); each says
exactly what is theirs and what is ours.
A benchmark, not a test: it never runs in the test suite. Use ``--steps 600`` for the issue's length.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.nn.utils import parametrize

from bench.learning_base import DATA, RECIPE, REPO, Runner, take_batches

TRAINERS = ("vocoder", "vits", "vae")
DEFAULT_COMPARE = {"vocoder": "init=old,new", "vits": "init=old,new", "vae": "precision=32-true,bf16-mixed"}
DEFAULT_STEPS = {"vocoder": 200, "vits": 300, "vae": 300}
OLD_INIT_STD = 0.01


def redraw_old_init(model: torch.nn.Module, prefixes: tuple[str, ...], seed: int) -> int:
    """Weight-normed layers under ``prefixes`` get weights really N(0, 0.01) (direction and magnitude
    consistent, g = ||v||): the effective init the vocoder had before issue 10. Returns the count."""
    gen = torch.Generator().manual_seed(seed)
    n = 0
    with torch.no_grad():
        for name, m in model.named_modules():
            if name.startswith(prefixes) and parametrize.is_parametrized(m, "weight"):
                p = m.parametrizations.weight
                v = torch.randn(p.original1.shape, generator=gen) * OLD_INIT_STD
                p.original1.copy_(v)
                p.original0.copy_(v.flatten(1).norm(dim=1).view_as(p.original0))
                n += 1
    return n


def parse_compare(text: str) -> tuple[str, list[str]]:
    key, sep, values = text.partition("=")
    vals = [v.strip() for v in values.split(",")]
    if not sep or len(vals) != 2 or not all(vals):
        raise SystemExit(f"error: --compare {text!r}: write KEY=A,B (e.g. init=old,new or lr=0.001,0.002)")
    if key == "init" and set(vals) - {"old", "new"}:
        raise SystemExit("error: --compare init=...: the values are old and new")
    return key, vals


def setting_overrides(key: str, value: str) -> tuple[list[str], str]:
    """(config overrides, init) for one side of --compare."""
    return ([], value) if key == "init" else ([f"{key}={value}"], "new")


# ----------------------------------------------------------------------------------- trainers
# The held-out vocoder metric: our MR-STFT distance at the demo's three loss resolutions; "logmag" is
# its log-magnitude L1 part alone (the issue's figure), "mrstft" adds spectral convergence (validate()'s).
EVAL_STFT = ([1024, 2048, 512], [120, 240, 50], [600, 1200, 240])


@torch.no_grad()
def vocoder_held_out(generator: torch.nn.Module, tr, limit: int | None, seed: int) -> dict:
    """One function for every vocoder under test (ours or the reference's): whole held-out files
    of ``tr.valid_set`` through ``generator(mel, f0)`` (fp32, no autocast: every setting is judged by
    the same inference) under a fixed RNG; MR-STFT, log-magnitude L1, mel L1, MCD-DTW (speech.mcd's
    measure) and the pitch errors of validation (F0 RMSE in cents, V/UV error: speech.pitch_metrics)
    against the ground truth. F0 RMSE is the mean over the files with a frame voiced in both."""
    from speech.mcd import compare_speech
    from speech.pitch_metrics import nanmean, pitch_errors
    from vocoder.losses import MultiResolutionSTFTLoss

    stft = MultiResolutionSTFTLoss(*EVAL_STFT)
    items = [tr.valid_set[i] for i in range(len(tr.valid_set) if not limit else min(limit, len(tr.valid_set)))]
    sums = dict.fromkeys(("mrstft", "logmag", "mel_l1", "mcd"), 0.0)
    pitch: dict[str, list[float]] = {"f0_rmse": [], "vuv_error": []}
    a = tr.cfg.audio
    generator.eval()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        for item in items:
            wav = generator(item["mel"][None], item["f0"][None]).float().reshape(1, -1)
            real = item["audio"].reshape(1, -1)[:, : wav.shape[1]]
            sc, mag = stft(wav, real)
            sums["mrstft"] += float(sc + mag)
            sums["logmag"] += float(mag)
            sums["mel_l1"] += float(torch.nn.functional.l1_loss(tr.input_mel(wav), item["mel"][None]))
            sums["mcd"] += compare_speech("", wav[0].numpy(), real[0].numpy(), tr.input_mel).mcd
            errors = pitch_errors(wav[0].numpy(), real[0].numpy(), a.sample_rate, a.hop_length, tr.cfg.f0_min,
                                  tr.cfg.f0_max)
            for k in pitch:
                pitch[k].append(errors[k])
    generator.train()
    return {k: v / len(items) for k, v in sums.items()} | {k: nanmean(v) for k, v in pitch.items()}


def vocoder_runners(key: str, values: list[str], args, tmp: Path) -> tuple[list[Runner], list]:
    from common.config import load_config
    from vocoder.config import VocoderConfig
    from vocoder.demo import CONFIG, make_dataset
    from vocoder.train import VocoderTrainer

    base = [*RECIPE["vocoder"], *args.set]
    if args.reference_dir:
        from bench.vocoder_reference import REFERENCE_RECIPE
        base = [*RECIPE["vocoder"], *REFERENCE_RECIPE, *args.set]
    make_dataset(load_config(CONFIG, VocoderConfig, base), wavs=DATA / "vocoder_wavs", data=DATA / "vocoder_bin")
    runners, batches = [], None
    for value in values:
        overrides, init = setting_overrides(key, value)
        cfg = load_config(CONFIG, VocoderConfig, [*base, *overrides])
        tr = VocoderTrainer(cfg, DATA / "vocoder_bin", tmp / f"vocoder_{value}", device="cpu", log=lambda *a: None)
        if args.reference_dir:
            return reference_runners(tr, args), take_batches(tr.loader, tr.sampler, args.steps)
        if init == "old":
            redraw_old_init(tr.generator, ("ups.", "resblocks.", "conv_post"), args.seed)
        if batches is None:
            batches = take_batches(tr.loader, tr.sampler, args.steps)
        runners.append(Runner(f"{key}={value}", lambda b, tr=tr: our_vocoder_step(tr, b),
                              lambda tr=tr: vocoder_held_out(tr.generator, tr, args.eval_items, tr.cfg.seed)))
    return runners, batches


TOKEN_KEYS = ("phoneme_type", "espeak_voice", "data.add_blank")  # settings that change the token ids of a batch


def retokenize(batch: dict, dataset) -> dict:
    """The stored batch with its token ids as ``dataset``'s front-end makes them (same audio, same items)."""
    index = {it["id"]: i for i, it in enumerate(dataset.items)}
    ids = [dataset.tokens(dataset.items[index[name]]["text"]) for name in batch["id"]]
    x = torch.zeros(len(ids), max(len(t) for t in ids), dtype=torch.long)
    for i, t in enumerate(ids):
        x[i, : len(t)] = t
    return {**batch, "ids": x, "ids_len": torch.tensor([len(t) for t in ids])}


def our_vocoder_step(tr, batch) -> float:
    """One step of our trainer; returns its training mel L1 (unweighted)."""
    return float(tr.train_step(batch)["loss_mel"]) / tr.cfg.lab_aux_melloss


def reference_runners(tr, args) -> list[Runner]:
    """Ours (``tr``) and SingingVocoders' trainer built from the same config (bench/vocoder_reference.py)."""
    from bench.vocoder_reference import (
        ReferenceTrainer,
        copy_initial_weights,
        import_reference,
        parameter_counts,
    )

    ref = ReferenceTrainer(import_reference(args.reference_dir), tr.cfg, tr.cfg.seed)
    print(f"  [vocoder] {parameter_counts(tr, ref)}", flush=True)
    if args.same_init:
        print(f"  [vocoder] {copy_initial_weights(ref, tr)}", flush=True)
    return [Runner("ours", lambda b: our_vocoder_step(tr, b),
                   lambda: vocoder_held_out(tr.generator, tr, args.eval_items, tr.cfg.seed)),
            Runner("SingingVocoders", ref.reference_step,
                   lambda: vocoder_held_out(ref.generator, tr, args.eval_items, tr.cfg.seed))]


def vits_runners(key: str, values: list[str], args, tmp: Path) -> tuple[list[Runner], list]:
    from common.config import load_config
    from common.distributed import setup_distributed
    from tts.vits import demo
    from tts.vits.evaluation import evaluate
    from tts.vits.train import TrainConfig, VitsTrainer, build_mel

    if args.reference_dir:  # ours against jaywalnut310/vits (bench/vits_reference.py)
        from bench.vits_reference import runners
        return runners(args, tmp)
    if demo.prepare(demo.build_corpus(DATA / "tts_raw"), DATA / "tts_prepared") != 0:
        raise SystemExit("error: preparing the TTS demo data failed (see above)")
    info = setup_distributed("cpu")
    runners, batches = [], None
    for value in values:
        overrides, init = setting_overrides(key, value)
        cfg = load_config(str(demo.CONFIG), TrainConfig, [*RECIPE["vits"], *args.set, *overrides],
                          extra={"data_dir": str(DATA / "tts_prepared"), "run_dir": str(tmp / f"vits_{value}")})
        tr = VitsTrainer(cfg, info)
        if init == "old":
            redraw_old_init(tr.generator, ("dec.ups.", "dec.resblocks."), args.seed)
        if batches is None:
            batches = take_batches(tr.loader, tr.sampler, args.steps)

        def step(batch, tr=tr):
            if key in TOKEN_KEYS:  # the stored batches hold the first setting's tokens
                batch = retokenize(batch, tr.train_set)
            tr.train_step(batch)
            tr.step += 1  # the MAS prior fades with the step count

        def metrics(tr=tr):
            m = evaluate(tr.generator, tr.eval_set, build_mel(tr.cfg), tr.device, args.eval_items or tr.cfg.eval_max_items,
                         noise_scale=tr.cfg.noise_scale, seed=tr.cfg.seed)
            tr.generator.train()
            return {k: m[k] for k in ("mcd", "align_sharpness", "dur_err")}
        runners.append(Runner(f"{key}={value}", step, metrics))
    return runners, batches


def vae_runners(key: str, values: list[str], args, tmp: Path) -> tuple[list[Runner], list]:
    from common.config import load_config
    from common.data import ResumableSampler, make_loader
    from vae import demo
    from vae.config import VAEConfig
    from vae.data import ImageDataset, eval_loader, find_training_images
    from vae.losses import FrozenLPIPS, backbone_cache_path
    from vae.metrics import evaluate
    from vae.step import VAEStep

    if demo.make_dataset(DATA / "vae_images", DATA / "vae_prepared") != 0:
        raise SystemExit("error: preparing the VAE demo data failed (see above)")
    lpips = FrozenLPIPS("vgg") if backbone_cache_path("vgg").is_file() else None
    device = torch.device("cpu")
    base = [*RECIPE["vae"], *args.set]
    if args.reference_dir:
        from bench.vae_reference import REFERENCE_RECIPE
        base = [*RECIPE["vae"], *REFERENCE_RECIPE, *args.set]
    runners, batches = [], None
    for value in values:
        overrides, init = setting_overrides(key, value)
        if init == "old":
            raise SystemExit("error: the VAE has no old init (its model equals diffusers' AutoencoderKL); "
                             "compare config keys instead, e.g. --compare precision=32-true,bf16-mixed")
        cfg = load_config(REPO / "vae" / "configs" / "demo.yaml", VAEConfig, [*base, *overrides])
        torch.manual_seed(cfg.seed)
        tr = VAEStep(cfg, device, total_steps=args.steps)
        if batches is None:
            ds = ImageDataset(find_training_images(DATA / "vae_prepared" / "train"), cfg.image_size, train=True,
                              random_flip=cfg.random_flip, max_pixels=cfg.max_pixels)
            sampler = ResumableSampler(ds, shuffle=True, seed=cfg.seed)
            loader = make_loader(ds, batch_size=int(cfg.batch_size), sampler=sampler, num_workers=0, seed=cfg.seed,
                                 drop_last=True)
            batches = take_batches(loader, sampler, args.steps)
            val = list(eval_loader(find_training_images(DATA / "vae_prepared" / "val"), cfg.image_size,
                                   cfg.max_pixels, cfg.seed, batch_size=4, limit=args.eval_items or None))
        if args.reference_dir:
            return vae_reference_runners(tr, batches, val, lpips, args), batches

        def step(batch, tr=tr, counter=[0]):  # noqa: B006 - the per-runner step counter
            tr.train_step([batch], counter[0])
            counter[0] += 1

        def metrics(tr=tr, val=val):
            m = evaluate(tr.eval_model, val, device, tr.precision.autocast, lpips)
            return {k: m[k] for k in ("psnr", "ssim", "lpips") if k in m}
        runners.append(Runner(f"{key}={value}", step, metrics))
    return runners, batches


def vae_reference_runners(tr, batches: list, val: list, lpips, args) -> list[Runner]:
    """Ours (``tr``) and latent-diffusion's loop on a copy of our initial model (bench/vae_reference.py)."""
    from bench.vae_reference import ReferenceTrainer, import_reference, parameter_counts, same_output_check
    from vae.metrics import evaluate

    ref = ReferenceTrainer(import_reference(args.reference_dir, args.taming_dir), tr, args.steps)
    print(f"  [vae] {parameter_counts(tr, ref)}", flush=True)
    print(f"  [vae] {same_output_check(tr, ref, batches[0], args.seed)}", flush=True)
    counter = [0]

    def ours(batch):
        tr.train_step([batch], counter[0])
        counter[0] += 1

    def metrics(model):
        m = evaluate(model, val, tr.device, tr.precision.autocast, lpips)
        return {k: m[k] for k in ("psnr", "ssim", "lpips") if k in m}
    return [Runner("ours", ours, lambda: metrics(tr.eval_model)),
            Runner("latent-diffusion", ref.reference_step, lambda: metrics(ref.vae))]


BUILDERS = {"vocoder": vocoder_runners, "vits": vits_runners, "vae": vae_runners}


# ----------------------------------------------------------------------------------- the loop
def run(trainer: str, args) -> list[str]:
    key, values = parse_compare(args.compare or DEFAULT_COMPARE[trainer])
    args.steps = args.steps or DEFAULT_STEPS[trainer]
    eval_every = args.eval_every or max(1, args.steps // 4)
    with tempfile.TemporaryDirectory(prefix=f"bench_learning_{trainer}_") as tmp:
        runners, batches = BUILDERS[trainer](key, values, args, Path(tmp))
        curve: list[tuple[int, list[dict]]] = [(0, [r.evaluate() for r in runners])]
        t_start = time.time()
        for i, batch in enumerate(batches, start=1):
            for r in runners:
                torch.manual_seed(args.seed * 100_003 + i)  # the same noise draws for both settings
                t0 = time.perf_counter()
                out = r.step(batch)
                r.times.append(time.perf_counter() - t0)
                if isinstance(out, float):
                    r.train_loss.append(out)
            if i % eval_every == 0 or i == len(batches):
                curve.append((i, [r.evaluate() for r in runners]))
                print(f"  [{trainer}] step {i}/{len(batches)} ({time.time() - t_start:.0f} s): " + "; ".join(
                    f"{r.label} " + " ".join(f"{k} {v:.4f}" for k, v in m.items())
                    + f" median step {statistics.median(r.times):.3f} s" for r, m in zip(runners, curve[-1][1])),
                    flush=True)
    return format_table(trainer, runners, curve)


def format_table(trainer: str, runners: list[Runner], curve: list[tuple[int, list[dict]]]) -> list[str]:
    names = list(curve[0][1][0])
    head = f"{'step':>6} " + " ".join(f"{f'{n} [{r.label}]':>26}" for n in names for r in runners)
    lines = [f"== {trainer}: held-out metrics, same batches and seed ==", head]
    for step, ms in curve:
        lines.append(f"{step:>6} " + " ".join(f"{m[n]:>26.4f}" for n in names for m in ms))
    for r in runners:
        if r.train_loss:  # the last quarter of the steps (451-600 of 600)
            first = len(r.train_loss) - max(1, len(r.train_loss) // 4)
            tail = r.train_loss[first:]
            lines.append(f"training mel L1 [{r.label}]: mean {statistics.mean(tail):.4f} over steps "
                         f"{first + 1}-{len(r.train_loss)}")
    for r in runners:
        t = r.times[1:] or r.times  # the first step pays one-off allocations
        lines.append(f"step time [{r.label}]: median {statistics.median(t):.3f} s, mean {statistics.mean(t):.3f} s "
                     f"over {len(r.times)} steps")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trainer", choices=[*TRAINERS, "all"], default="all")
    p.add_argument("--compare", default=None, help="KEY=A,B (default per trainer: " +
                   ", ".join(f"{k} {v}" for k, v in DEFAULT_COMPARE.items()) + ")")
    p.add_argument("--steps", type=int, default=None, help="training steps (default per trainer: " +
                   ", ".join(f"{k} {v}" for k, v in DEFAULT_STEPS.items()) + "; the issue used 600)")
    p.add_argument("--eval_every", type=int, default=None, help="held-out evaluation interval (default steps/4)")
    p.add_argument("--eval_items", type=int, default=0, help="held-out items per evaluation (0 = the recipe's)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: comparable on a shared machine)")
    p.add_argument("--reference_dir", default=None, help="vocoder: an openvpi/SingingVocoders checkout; trains "
                   "ours against its networks, losses and step order (see bench/vocoder_reference.py); vits: a "
                   "jaywalnut310/vits checkout (bench/vits_reference.py); vae: a "
                   "CompVis/latent-diffusion checkout, its training_step and loss (see bench/vae_reference.py)")
    p.add_argument("--taming_dir", default=None, help="vae with --reference_dir: a CompVis/taming-transformers "
                   "checkout (default: REFERENCE_DIR/src/taming-transformers)")
    p.add_argument("--same_init", action="store_true", help="with --reference_dir: ours starts from the "
                   "reference's initial weights (isolates the training code from the luck of the init draw)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override for both settings")
    args = p.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        p.error("--steps must be >= 1")
    if args.reference_dir and args.trainer not in ("vocoder", "vits", "vae"):
        p.error("--reference_dir needs --trainer vocoder (openvpi/SingingVocoders), vits (jaywalnut310/vits) "
                "or vae (CompVis/latent-diffusion)")
    if args.reference_dir and args.trainer == "vits":
        from bench.vits_reference import missing_files
        if missing := missing_files(args.reference_dir):
            p.error(f"--reference_dir {args.reference_dir}: not a jaywalnut310/vits checkout (missing {', '.join(missing)})")
    if args.same_init and (not args.reference_dir or args.trainer not in ("vocoder", "vits")):
        p.error("--same_init needs --trainer vocoder|vits --reference_dir (the VAE comparison always starts both alike)")
    if args.taming_dir and (not args.reference_dir or args.trainer != "vae"):
        p.error("--taming_dir needs --trainer vae --reference_dir")
    torch.set_num_threads(args.threads)
    os.chdir(REPO)  # the demo data functions write under data/demo like the demos do
    out = []
    for trainer in TRAINERS if args.trainer == "all" else (args.trainer,):
        t0 = time.time()
        lines = run(trainer, argparse.Namespace(**vars(args)))
        lines.append(f"({trainer}: {time.time() - t0:.0f} s wall, {args.threads} thread(s), "
                     f"{time.strftime('%Y-%m-%d')})")
        print("\n".join(lines), flush=True)
        out += lines
    return 0


if __name__ == "__main__":
    sys.exit(main())
