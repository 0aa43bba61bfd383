"""Issue 10's two checks against the reference implementations, measured: (1) the *effective*
initialisation of every layer, (2) gradient work in the generator update.

    python -m bench.reference_checks vocoder --reference_dir /path/to/SingingVocoders
    python -m bench.reference_checks vits --reference_dir /path/to/jaywalnut310/vits
    python -m bench.reference_checks vae

Vocoder (``--reference_dir``: an openvpi/SingingVocoders checkout, imported by
bench/vocoder_reference.py): (1) their generator and MPD + MSD against ours, built from the reference
recipe of ``bench.learning --reference_dir``; (2) is measured there (whole steps, side by side).

VITS (``--reference_dir``: a jaywalnut310/vits checkout; its models.py, losses.py and their imports
are loaded from there, never copied): (1) builds their ``SynthesizerTrn`` and ``MultiPeriodDiscriminator``
with ljs_base's hyper-parameters and ours with the ``vits_base`` preset, and compares the std of
every weight and bias the forward uses (weight norm applied), tensor by tensor by name; (2) times
the critic part of the generator update both ways on the same weights and signals: theirs calls
``net_d(y, y_hat)`` with the critic's parameters trainable (train.py), ours freezes the critic and
runs the real half without grad (``common.training.critic_outputs_for_generator``); both then back-propagate
THEIR ``generator_loss + feature_loss``. It reports the median time, the critic parameter gradients
computed (wasted: their D step zeroes them) and the largest difference of the gradient reaching y_hat.
Their ``monotonic_align`` is a Cython extension that is not built here; it is only imported, never
called by these checks, so a stub stands in for it.

VAE: latent-diffusion's ``AutoencoderKL.training_step`` runs ``self(inputs)`` once per optimizer,
so its discriminator pass pays a second encoder+decoder forward (Lightning freezes the other
optimizer's parameters, so neither pass computes gradients it throws away); ours reuses the
generator pass's reconstruction. (2) measures that forward against our whole step on the demo
recipe; (1) needs no reference run: the model is diffusers' AutoencoderKL (tested bitwise) and the
critic's init is taming's ``weights_init`` (checked here by std).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import time
import types
from pathlib import Path

import torch
from torch.nn.utils import parametrize

REPO = Path(__file__).resolve().parent.parent


def effective(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """name -> the weight/bias tensor a forward uses, for every conv/linear/embedding/norm layer
    (old hook weight norm recomputed from weight_g/weight_v, old hook spectral norm from weight_orig and
    its u, v; a parametrization applied)."""
    out = {}
    for name, m in module.named_modules():
        if ".parametrizations" in name or (list(m.children()) and not parametrize.is_parametrized(m)):
            continue
        if hasattr(m, "weight_g") and hasattr(m, "weight_v"):
            out[f"{name}.weight"] = torch._weight_norm(m.weight_v, m.weight_g, 0).detach()
        elif hasattr(m, "weight_orig") and hasattr(m, "weight_u"):  # old hook spectral norm
            out[f"{name}.weight"] = first_spectral_weight(m)
        elif isinstance(getattr(m, "weight", None), torch.Tensor):
            out[f"{name}.weight"] = m.weight.detach()
        if isinstance(getattr(m, "bias", None), torch.Tensor):
            out[f"{name}.bias"] = m.bias.detach()
    return out


def first_spectral_weight(m: torch.nn.Module) -> torch.Tensor:
    """The weight the first training forward of an old-hook spectral-norm layer uses: its hook's own
    ``compute_weight`` with one power iteration from the random u, v (on a copy, so nothing changes)."""
    m = copy.deepcopy(m)
    hook = next(h for h in m._forward_pre_hooks.values() if hasattr(h, "compute_weight"))
    with torch.no_grad():
        return hook.compute_weight(m, do_power_iteration=True).detach()


def compare_init(ours: torch.nn.Module, theirs: torch.nn.Module, rename=lambda n: n) -> dict:
    """Per tensor: std ours / std theirs; a tensor 'differs' when the ratio is outside six standard
    errors of a sample std (or one side is all zeros and the other not)."""
    a, b = effective(ours), {rename(n): t for n, t in effective(theirs).items()}
    common = [n for n in b if n in a and a[n].shape == b[n].shape]
    differs, ratios = [], []
    for n in common:
        sa, sb = float(a[n].double().std()) if a[n].numel() > 1 else 0.0, float(b[n].double().std()) if b[n].numel() > 1 else 0.0
        if a[n].numel() < 16:
            continue
        if sa == 0.0 or sb == 0.0:
            if sa != sb:
                differs.append(f"{n}: std {sa:.4g} vs {sb:.4g}")
            continue
        r = sa / sb
        ratios.append(r)
        if abs(math.log(r)) > 6 * math.sqrt(2.0 / a[n].numel()) + 0.02:
            differs.append(f"{n}: std {sa:.4g} vs {sb:.4g} (x{r:.3f})")
    return {"compared": len(common), "only_ours": sorted(set(a) - set(b)), "only_theirs": sorted(set(b) - set(a)),
            "shape_mismatch": [n for n in b if n in a and a[n].shape != b[n].shape],
            "std_ratio_min": min(ratios, default=float("nan")), "std_ratio_max": max(ratios, default=float("nan")), "differs": differs}


def import_vits(root: Path) -> types.SimpleNamespace:
    need = ("models.py", "losses.py", "commons.py", "modules.py", "attentions.py", "transforms.py")
    missing = [f for f in need if not (root / f).is_file()]
    if missing:
        raise SystemExit(f"error: --reference_dir {root}: not a jaywalnut310/vits checkout (missing "
                         f"{', '.join(missing)}); clone https://github.com/jaywalnut310/vits and pass its folder")
    stub = types.ModuleType("monotonic_align")  # Cython, not built; never called here
    stub.maximum_path = None
    sys.modules["monotonic_align"] = stub
    sys.path.insert(0, str(root))
    import losses
    import models
    return types.SimpleNamespace(models=models, losses=losses, config=json.loads(
        (root / "configs" / "ljs_base.json").read_text())["model"])


def median_time(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def vits_checks(args) -> None:
    from bench.vits_reference import their_names
    from common.training import critic_outputs_for_generator
    from tts.text import SYMBOLS
    from tts.vits.config import model_args
    from tts.vits.discriminator import MultiPeriodDiscriminator
    from tts.vits.model import VITS
    from tts.vits.train import frozen
    from vocoder.layouts import from_legacy_names

    ref = import_vits(Path(args.reference_dir).expanduser().resolve())
    c = ref.config
    torch.manual_seed(args.seed)
    theirs = ref.models.SynthesizerTrn(len(SYMBOLS), 513, 8192 // 256, **{k: v for k, v in c.items()
                                                                            if k != "use_spectral_norm"})
    torch.manual_seed(args.seed)
    ours = VITS(len(SYMBOLS), 513, 1, model_args("vits_base"), 256)
    res = compare_init(ours, theirs, their_names)
    print(f"(1) VITS generator (vits_base vs ljs_base), effective init: {res['compared']} tensors compared, "
          f"std ratio ours/theirs {res['std_ratio_min']:.3f}..{res['std_ratio_max']:.3f}, "
          f"{len(res['differs'])} outside 6 standard errors; only ours {res['only_ours']}, only theirs "
          f"{res['only_theirs']}, shape mismatches {res['shape_mismatch']}")
    for line in res["differs"]:
        print(f"    differs: {line}")
    d_theirs = ref.models.MultiPeriodDiscriminator(use_spectral_norm=False)
    d_ours = MultiPeriodDiscriminator([2, 3, 5, 7, 11])
    res = compare_init(d_ours, d_theirs)
    print(f"    VITS discriminator: {res['compared']} tensors, std ratio {res['std_ratio_min']:.3f}.."
          f"{res['std_ratio_max']:.3f}, {len(res['differs'])} outside; only ours {res['only_ours']}, "
          f"only theirs {res['only_theirs']}")
    report = d_ours.load_state_dict(from_legacy_names(d_theirs.state_dict()), strict=False)
    if report.missing_keys or report.unexpected_keys:
        raise SystemExit(f"error: their critic's weights do not map onto ours: {report}")

    g = torch.Generator().manual_seed(args.seed)
    y = torch.randn(args.batch, 1, args.samples, generator=g) * 0.1
    y_hat0 = torch.randn(args.batch, 1, args.samples, generator=g) * 0.1
    loss_fn = ref.losses

    def theirs_step():  # train.py: D trainable, net_d(y, y_hat), backward of their G losses
        y_hat = y_hat0.clone().requires_grad_(True)
        _, y_d_hat_g, fmap_r, fmap_g = d_theirs(y, y_hat)
        loss = loss_fn.generator_loss(y_d_hat_g)[0] + loss_fn.feature_loss(fmap_r, fmap_g)
        loss.backward()
        n = sum(p.grad is not None for p in d_theirs.parameters())
        d_theirs.zero_grad(set_to_none=True)
        return y_hat.grad, n

    def ours_step():  # tts/train.py: frozen critic, real half without grad
        y_hat = y_hat0.clone().requires_grad_(True)
        with frozen(d_ours):
            (_, fmap_r), (y_d_hat_g, fmap_g) = critic_outputs_for_generator(d_ours.score, y, y_hat)
        loss = loss_fn.generator_loss(y_d_hat_g)[0] + loss_fn.feature_loss(fmap_r, fmap_g)
        loss.backward()
        return y_hat.grad, sum(p.grad is not None for p in d_ours.parameters())

    (g_t, n_t), (g_o, n_o) = theirs_step(), ours_step()
    diff = float((g_t - g_o).abs().max() / g_t.abs().max())
    t_t, t_o = [], []
    for _ in range(args.reps):  # interleaved
        t_t.append(median_time(theirs_step, 1))
        t_o.append(median_time(ours_step, 1))
    mt, mo = statistics.median(t_t), statistics.median(t_o)
    print(f"(2) VITS G-update critic part (MPD+MSD, batch {args.batch} x {args.samples} samples, fp32, "
          f"{torch.get_num_threads()} thread): theirs {mt:.3f} s, ours {mo:.3f} s ({mo / mt:.2f}x), median of "
          f"{args.reps}; critic parameter gradients computed: theirs {n_t}, ours {n_o}; "
          f"max |grad y_hat difference| / max |grad| = {diff:.1e}")


def vocoder_checks(args) -> None:
    from bench.learning_base import RECIPE
    from bench.vocoder_reference import REFERENCE_RECIPE, ReferenceTrainer, import_reference
    from common.config import load_config
    from vocoder.config import VocoderConfig
    from vocoder.demo import CONFIG
    from vocoder.train import build_discriminator, build_generator

    cfg = load_config(CONFIG, VocoderConfig, [*RECIPE["vocoder"], *REFERENCE_RECIPE, *args.set])
    ref = ReferenceTrainer(import_reference(args.reference_dir), cfg, args.seed)
    torch.manual_seed(args.seed)
    for label, ours, theirs in (("generator", build_generator(cfg), ref.generator),
                                ("MPD + MSD", build_discriminator(cfg), ref.discriminator)):
        res = compare_init(ours, theirs)
        print(f"(1) vocoder {label}, effective init: {res['compared']} tensors compared, std ratio ours/theirs "
              f"{res['std_ratio_min']:.3f}..{res['std_ratio_max']:.3f}, {len(res['differs'])} outside 6 standard "
              f"errors; only ours {res['only_ours']}, only theirs {res['only_theirs']}")
        for line in res["differs"]:
            print(f"    differs: {line}")


def vae_checks(args) -> None:
    from common.config import load_config
    from common.data import ResumableSampler, make_loader
    from vae import demo
    from vae.config import VAEConfig
    from vae.data import ImageDataset, find_training_images
    from vae.step import VAEStep

    data = REPO / "data" / "demo"
    if demo.make_dataset(data / "vae_images", data / "vae_prepared") != 0:
        raise SystemExit("error: preparing the VAE demo data failed (see above)")
    cfg = load_config(REPO / "vae" / "configs" / "demo.yaml", VAEConfig,
                      ["perceptual_weight=0.0", "ema_decay=0.0", "disc_start=0", "disc_weight=0.5",
                       "precision=32-true", *args.set])
    torch.manual_seed(cfg.seed)
    tr = VAEStep(cfg, torch.device("cpu"), total_steps=args.reps + 1)
    disc = tr.disc
    convs = [m for m in disc.modules() if isinstance(m, torch.nn.Conv2d)]
    norms = [m for m in disc.modules() if isinstance(m, (torch.nn.BatchNorm2d, torch.nn.GroupNorm))]
    conv_std = [float(m.weight.detach().std()) for m in convs]
    norm_std = [float((m.weight.detach() - 1).std()) for m in norms if m.weight.numel() > 1]
    print(f"(1) VAE critic init: {len(convs)} convs, weight std {min(conv_std):.4f}..{max(conv_std):.4f} "
          f"(taming weights_init: N(0, 0.02)); {len(norms)} norms, weight-1 std "
          f"{min(norm_std, default=float('nan')):.4f}..{max(norm_std, default=float('nan')):.4f} (N(1, 0.02))")
    ds = ImageDataset(find_training_images(data / "vae_prepared" / "train"), cfg.image_size, train=True,
                      random_flip=cfg.random_flip, max_pixels=cfg.max_pixels)
    loader = make_loader(ds, batch_size=int(cfg.batch_size), sampler=ResumableSampler(ds, shuffle=True, seed=cfg.seed),
                         num_workers=0, seed=cfg.seed, drop_last=True)
    x = next(iter(loader))
    tr.train_step([x], 0)  # warm-up
    vae = tr.vae

    def extra_forward():  # ldm's second self(inputs) in the D pass (AE parameters frozen there)
        with torch.no_grad():
            vae(x)
    t_step, t_fwd = [], []
    for i in range(args.reps):
        t_step.append(median_time(lambda i=i: tr.train_step([x], i + 1), 1))
        t_fwd.append(median_time(extra_forward, 1))
    ms, mf = statistics.median(t_step), statistics.median(t_fwd)
    print(f"(2) VAE (demo.yaml, batch {x.shape[0]} x {x.shape[-2]}x{x.shape[-1]}, GAN on (disc_weight 0.5, disc_start 0), no LPIPS, fp32): our step "
          f"{ms:.3f} s; latent-diffusion's extra encoder+decoder forward in its D pass {mf:.3f} s (+{mf / ms:.0%} of "
          f"our step), median of {args.reps}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", choices=["vocoder", "vits", "vae"])
    p.add_argument("--reference_dir", default=None, help="vocoder: an openvpi/SingingVocoders checkout; "
                   "vits: a jaywalnut310/vits checkout")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--batch", type=int, default=2, help="vits (2): batch of the critic timing")
    p.add_argument("--samples", type=int, default=8192, help="vits (2): samples per item (ljs_base's segment_size)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="vocoder / vae: config override")
    args = p.parse_args(argv)
    if args.model != "vae" and not args.reference_dir:
        p.error(f"{args.model} needs --reference_dir (the reference checkout)")
    torch.set_num_threads(args.threads)
    {"vocoder": vocoder_checks, "vits": vits_checks, "vae": vae_checks}[args.model](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
