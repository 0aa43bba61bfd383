"""Our VITS trainer against jaywalnut310/vits, side by side in one process.

    python -m bench.learning --trainer vits --reference_dir /path/to/jaywalnut310-vits [--same_init] [--steps 450]

Both sides are built from ONE config: the TTS demo config + ``bench.learning_base.RECIPE["vits"]`` +
``REFERENCE_RECIPE`` below (fp32; AdamW lr 2e-4, betas (0.8, 0.99), eps 1e-9, weight decay 0.01 (torch's
AdamW default, which theirs uses); constant LR (lr_gamma 1: their per-epoch ExponentialLR is left out on
both sides); no gradient clipping (theirs only measures the norm); the paper's objective: c_mel 45, c_kl 1,
no MR-STFT term, no MAS prior; a small model both codes can express: the sizes their ``SynthesizerTrn``
takes as arguments are set small, the ones it hard-codes (16-layer posterior WaveNet, 4 couplings of 4
layers, kernel 5, SDP with 192 filters, the full-width MPD [2, 3, 5, 7, 11] + MSD) are set to theirs on
our side). ``bench.learning``'s loop trains them interleaved step by step on the same stored batches of
the demo's 3-speaker Uzbek corpus (our loader, our token ids: their SynthesizerTrn takes ``n_vocab``),
with the same RNG seed before each step.

What is THEIRS (imported from ``--reference_dir``, never copied into this repository):
  - the networks: ``SynthesizerTrn`` (text encoder, posterior encoder, flow, stochastic duration
    predictor, HiFi-GAN decoder, speaker embedding) and ``MultiPeriodDiscriminator`` (models.py), with
    their own initialisation;
  - the losses: ``generator_loss``, ``discriminator_loss``, ``feature_loss``, ``kl_loss`` (losses.py);
  - their ``commons`` (slicing, ``clip_grad_value_``) and ``mel_processing`` (the mel of the loss);
  - the alignment search: their Cython ``monotonic_align`` when it is built in the checkout
    (``cd monotonic_align && mkdir -p monotonic_align && python setup.py build_ext --inplace``);
    when it is not, OUR ``tts.alignment.maximum_path`` stands in for it (same algorithm; a line says so);
  - the order of one training step: ``ReferenceTrainer.reference_step`` is train_ms.py's
    ``train_and_evaluate`` body (fp16_run false) transcribed statement for statement: train_ms.py
    imports tensorboard, apex-era utils and torch.distributed, so it is not imported. A disabled
    GradScaler's ``scale``/``unscale_``/``step`` are ``backward()``/nothing/``optimizer.step()``.
What is OURS: the batches (our loader: token ids, the cached linear spectrograms, waveforms, speaker
ids; both sides get the same tensors), building their AdamW as train_ms.py does, the seeds, the
held-out metrics (``tts.vits.evaluation.evaluate``, the same function for both sides: ``TheirsForEval``
gives it their networks through the interface it calls, with their ``infer``'s statements, the
evaluation's per-item noise and frame cap, and its teacher-forced alignment computed by our
log-likelihood and MAS from their encoders and flow) and the timing. Two compatibility shims for
their 2021 code on today's libraries, nothing else changed: ``mel_processing`` calls
``librosa.filters.mel`` with positional arguments (keyword-only since librosa 0.10) and
``torch.stft`` without ``return_complex`` (required since torch 2.0); the shims pass the same
values by keyword and return ``view_as_real`` of the complex result, which is what their code expects.
"""

from __future__ import annotations

import importlib
import re
import sys
import types
from pathlib import Path

import torch

REQUIRED = ("models.py", "losses.py", "commons.py", "modules.py", "attentions.py", "transforms.py",
            "mel_processing.py", "monotonic_align/__init__.py")
THEIR_MODULES = ("commons", "modules", "attentions", "transforms", "models", "losses", "mel_processing",
                 "monotonic_align")
# What their SynthesizerTrn / MultiPeriodDiscriminator hard-code, as our config keys (ours must match).
THEIR_FIXED = {"posterior_kernel_size": 5, "n_layers_q": 16, "n_flows": 4, "flow_n_layers": 4,
               "flow_kernel_size": 5, "window_size": 4, "use_sdp": True, "mpd_periods": [2, 3, 5, 7, 11],
               "disc_channel_scale": 1.0, "use_spectral_norm": False}
REFERENCE_RECIPE = [
    "lr=0.0002", "betas=[0.8,0.99]", "eps=1e-9", "weight_decay=0.01", "lr_gamma=1.0", "clip_grad_norm=null",
    "c_mel=45.0", "c_kl=1.0", "c_stft=0.0", "mas_prior_steps=0", "batch_size=4",
    # small sizes both codes take as arguments (tiny preset: 32 hidden, 2 layers; decoder 64 ch, resblock 2)
    "model_args.hidden_channels=64", "model_args.inter_channels=64", "model_args.filter_channels=256",
    "model_args.p_dropout=0.1", "model_args.segment_frames=16", "model_args.gin_channels=64",
    *(f"model_args.{k}={v}".replace(" ", "") for k, v in THEIR_FIXED.items()),
]


def missing_files(reference_dir: str | Path) -> list[str]:
    """The files of a jaywalnut310/vits checkout that ``reference_dir`` lacks (empty: it is one)."""
    root = Path(reference_dir).expanduser()
    return [f for f in REQUIRED if not (root / f).is_file()]


def shared_mas(maximum_path) -> types.ModuleType:
    """A ``monotonic_align`` module with their calling convention (neg_cent, mask [B, T_frames, T_text])
    around OUR ``tts.alignment.maximum_path`` ([B, T_text, T_frames]): the fallback when their Cython
    extension is not built."""
    mod = types.ModuleType("monotonic_align")

    def their_layout(neg_cent: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return maximum_path(neg_cent.transpose(1, 2), mask.transpose(1, 2)).transpose(1, 2)
    mod.maximum_path = their_layout
    mod.shared = True
    return mod


class _TorchWithOldStft(types.ModuleType):
    """``torch`` for their mel_processing: ``stft`` as torch < 2.0 returned it (real [..., 2])."""

    def __init__(self):
        super().__init__("torch")

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def stft(*args, **kwargs):
        return torch.view_as_real(torch.stft(*args, return_complex=True, **kwargs))


_IMPORTED: dict[Path, types.SimpleNamespace] = {}


def import_reference(reference_dir: str | Path) -> types.SimpleNamespace:
    """Their models, losses, commons and mel code from a jaywalnut310/vits checkout."""
    root = Path(reference_dir).expanduser().resolve()
    if root in _IMPORTED:
        return _IMPORTED[root]
    missing = missing_files(root)
    if missing:
        raise SystemExit(f"error: --reference_dir {reference_dir}: not a jaywalnut310/vits checkout (missing "
                         f"{', '.join(missing)}); clone https://github.com/jaywalnut310/vits and pass its folder")
    for name in THEIR_MODULES:
        if name in sys.modules and not str(getattr(sys.modules[name], "__file__", "") or "").startswith(str(root)):
            raise SystemExit(f"error: a module named '{name}' is already imported from elsewhere; "
                             "run the reference comparison in a fresh process")
    sys.path.insert(0, str(root))
    try:
        mas = importlib.import_module("monotonic_align")
        mas_note = "their Cython monotonic_align"
    except ImportError:  # the extension is not built: our MAS in their calling convention
        from tts.alignment import maximum_path
        sys.modules.pop("monotonic_align", None)
        mas = sys.modules["monotonic_align"] = shared_mas(maximum_path)
        mas_note = ("OUR tts.alignment.maximum_path (their Cython monotonic_align is not built in "
                    f"{root}/monotonic_align): the alignment search is shared")
    import commons
    import librosa
    import losses
    import mel_processing
    import models
    mel_processing.librosa_mel_fn = (lambda sr, n_fft, n_mels, fmin, fmax:
                                     librosa.filters.mel(sr=sr, n_fft=n_fft, n_mels=n_mels, fmin=fmin, fmax=fmax))
    mel_processing.torch = _TorchWithOldStft()
    _IMPORTED[root] = types.SimpleNamespace(root=root, models=models, losses=losses, commons=commons,
                                            mel=mel_processing, mas=mas, mas_note=mas_note)
    return _IMPORTED[root]


def check_expressible(args) -> None:
    """Our model_args must equal what their classes hard-code, or the two sides differ in size."""
    wrong = [f"model_args.{k}={getattr(args, k)!r} (theirs: {v!r})" for k, v in THEIR_FIXED.items()
             if (list(getattr(args, k)) if isinstance(v, list) else getattr(args, k)) != v]
    if wrong:
        raise SystemExit("error: jaywalnut310/vits hard-codes these; the comparison needs ours equal: " + ", ".join(wrong))


class ReferenceTrainer:
    """Their SynthesizerTrn, MultiPeriodDiscriminator and losses, stepped in train_ms.py's order."""

    def __init__(self, ref: types.SimpleNamespace, cfg, n_vocab: int, n_speakers: int, seed: int):
        a = cfg.args()
        check_expressible(a)
        self.ref, self.cfg = ref, cfg
        torch.manual_seed(seed)
        self.net_g = ref.models.SynthesizerTrn(
            n_vocab, cfg.audio.n_fft // 2 + 1, a.segment_frames, inter_channels=a.inter_channels,
            hidden_channels=a.hidden_channels, filter_channels=a.filter_channels, n_heads=a.n_heads,
            n_layers=a.n_layers, kernel_size=a.kernel_size, p_dropout=a.p_dropout, resblock=a.resblock,
            resblock_kernel_sizes=a.resblock_kernel_sizes, resblock_dilation_sizes=a.resblock_dilation_sizes,
            upsample_rates=a.upsample_rates, upsample_initial_channel=a.upsample_initial_channel,
            upsample_kernel_sizes=a.upsample_kernel_sizes, n_speakers=n_speakers if n_speakers > 1 else 0,
            gin_channels=a.gin_channels if n_speakers > 1 else 0, use_sdp=a.use_sdp)
        self.net_d = ref.models.MultiPeriodDiscriminator(a.use_spectral_norm)
        # train_ms.py: AdamW(params, learning_rate, betas=betas, eps=eps) (torch's weight decay 0.01)
        kw = {"betas": tuple(cfg.betas), "eps": cfg.eps, "weight_decay": cfg.weight_decay}
        self.optim_g = torch.optim.AdamW(self.net_g.parameters(), cfg.lr, **kw)
        self.optim_d = torch.optim.AdamW(self.net_d.parameters(), cfg.lr, **kw)
        self.net_g.train()
        self.net_d.train()

    def reference_step(self, batch: dict) -> float:
        """One step of train_ms.py's train_and_evaluate (fp16_run false, no scheduler: constant LR).
        Returns the training mel L1 (their loss_mel divided by c_mel)."""
        c, a, lo, commons, mel = self.cfg, self.cfg.audio, self.ref.losses, self.ref.commons, self.ref.mel
        hop, segment_size = a.hop_length, self.cfg.args().segment_frames * a.hop_length
        x, x_lengths, spec, spec_lengths = batch["ids"], batch["ids_len"], batch["spec"], batch["spec_len"]
        y, speakers = batch["wav"].unsqueeze(1), batch["sid"]

        y_hat, l_length, attn, ids_slice, x_mask, z_mask, (z, z_p, m_p, logs_p, m_q, logs_q) = self.net_g(
            x, x_lengths, spec, spec_lengths, speakers if self.net_g.n_speakers > 0 else None)
        mel_ = mel.spec_to_mel_torch(spec, a.n_fft, a.n_mels, a.sample_rate, a.fmin, a.fmax)
        y_mel = commons.slice_segments(mel_, ids_slice, segment_size // hop)
        y_hat_mel = mel.mel_spectrogram_torch(y_hat.squeeze(1), a.n_fft, a.n_mels, a.sample_rate, hop, a.win_length,
                                              a.fmin, a.fmax)
        y = commons.slice_segments(y, ids_slice * hop, segment_size)

        # Discriminator
        y_d_hat_r, y_d_hat_g, _, _ = self.net_d(y, y_hat.detach())
        loss_disc, _, _ = lo.discriminator_loss(y_d_hat_r, y_d_hat_g)
        self.optim_d.zero_grad()
        loss_disc.backward()
        commons.clip_grad_value_(self.net_d.parameters(), None)
        self.optim_d.step()

        # Generator
        y_d_hat_r, y_d_hat_g, fmap_r, fmap_g = self.net_d(y, y_hat)
        loss_dur = torch.sum(l_length.float())
        loss_mel = torch.nn.functional.l1_loss(y_mel, y_hat_mel) * c.c_mel
        loss_kl = lo.kl_loss(z_p, logs_q, m_p, logs_p, z_mask) * c.c_kl
        loss_fm = lo.feature_loss(fmap_r, fmap_g)
        loss_gen, _ = lo.generator_loss(y_d_hat_g)
        loss_gen_all = loss_gen + loss_fm + loss_mel + loss_dur + loss_kl
        self.optim_g.zero_grad()
        loss_gen_all.backward()
        commons.clip_grad_value_(self.net_g.parameters(), None)
        self.optim_g.step()
        return float(loss_mel.detach()) / c.c_mel


class TheirsForEval(torch.nn.Module):
    """Their generator behind the interface ``tts.vits.evaluation.evaluate`` calls on ours (enc_p, align,
    predict_durations, speaker_cond, infer, args.inter_channels, hop_length), so ONE evaluation function
    measures both sides. ``infer`` is their SynthesizerTrn.infer statement for statement, except the
    evaluation's per-item noise for ``randn_like`` and its per-item frame cap; items come one at a time
    (the benchmark's eval batch is 1), so no decoder mask is needed."""

    def __init__(self, net_g: torch.nn.Module, commons, inter_channels: int, hop_length: int):
        super().__init__()
        self.net = net_g
        self.commons = commons
        self.args = types.SimpleNamespace(inter_channels=inter_channels)
        self.hop_length = hop_length

    def enc_p(self, x, x_lengths):
        return self.net.enc_p(x, x_lengths)

    def speaker_cond(self, sid):
        return self.net.emb_g(sid).unsqueeze(-1) if self.net.n_speakers > 0 else None

    def predict_durations(self, h, x_mask, g, noise_scale_w: float = 0.8, length_scale: float = 1.0):
        if self.net.use_sdp:
            logw = self.net.dp(h, x_mask, g=g, reverse=True, noise_scale=noise_scale_w)
        else:
            logw = self.net.dp(h, x_mask, g=g)
        return torch.ceil(torch.exp(logw) * x_mask * length_scale)

    @torch.no_grad()
    def align(self, x, x_lengths, spec, spec_lengths, sid=None):
        """As our VITS.align: posterior mean through their flow, our log-likelihood matrix and MAS."""
        from tts.alignment import maximum_path
        from tts.vits.model import log_likelihood_matrix
        _, m_p, logs_p, x_mask = self.net.enc_p(x, x_lengths)
        g = self.speaker_cond(sid)
        _, m_q, _, y_mask = self.net.enc_q(spec, spec_lengths, g=g)
        z_p = self.net.flow(m_q * y_mask, y_mask, g=g)
        neg_cent = log_likelihood_matrix(z_p, m_p, logs_p)
        mask = x_mask.transpose(1, 2) * y_mask
        return neg_cent, maximum_path(neg_cent, mask), x_mask, y_mask

    @torch.no_grad()
    def infer(self, x, x_lengths, sid=None, noise_scale=0.667, length_scale=1.0, noise_scale_w=0.8,
              max_frames=None, noise=None, mask_decoder=False):
        if x.size(0) != 1:
            raise ValueError("TheirsForEval.infer decodes one item at a time (their decoder has no mask)")
        commons = self.commons
        x, m_p, logs_p, x_mask = self.net.enc_p(x, x_lengths)
        g = self.speaker_cond(sid)
        w_ceil = self.predict_durations(x, x_mask, g, noise_scale_w, length_scale)
        y_lengths = torch.clamp_min(torch.sum(w_ceil, [1, 2]), 1).long()
        if max_frames is not None:
            y_lengths = y_lengths.clamp_max(max_frames)
        y_mask = torch.unsqueeze(commons.sequence_mask(y_lengths, None), 1).to(x_mask.dtype)
        attn_mask = torch.unsqueeze(x_mask, 2) * torch.unsqueeze(y_mask, -1)
        attn = commons.generate_path(w_ceil, attn_mask)
        m_p = torch.matmul(attn.squeeze(1), m_p.transpose(1, 2)).transpose(1, 2)
        logs_p = torch.matmul(attn.squeeze(1), logs_p.transpose(1, 2)).transpose(1, 2)
        eps = torch.randn_like(m_p) if noise is None else noise[:, :, : m_p.size(2)].to(m_p)
        z_p = m_p + eps * torch.exp(logs_p) * noise_scale
        z = self.net.flow(z_p, y_mask, g=g, reverse=True)
        o = self.net.dec(z * y_mask, g=g)
        return o, attn.squeeze(1).transpose(1, 2), y_mask


def their_names(name: str) -> str:
    """Their generator's parameter name → ours: a parameter-free Flip sits between their couplings
    (flow.flows.0, 2, 4, 6 hold weights; ours flips inside the coupling: flow.flows.0..3)."""
    return re.sub(r"^flow\.flows\.(\d+)\.", lambda m: f"flow.flows.{int(m.group(1)) // 2}.", name)


def copy_initial_weights(theirs: ReferenceTrainer, gen: torch.nn.Module, disc: torch.nn.Module) -> str:
    """``--same_init``: our generator and critics start from their initial tensors, matched by name
    (old weight-norm names mapped to our parametrization's; their relative-position embeddings
    [1, 2w+1, d] to ours [2w+1, d]) and shape; says how many of each side's tensors found a partner."""
    from common.checkpoint import load_matching
    from vocoder.layouts import from_legacy_names

    lines, total = [], 0
    for label, mine, their, rename in (("generator", gen, theirs.net_g, their_names),
                                       ("critics", disc, theirs.net_d, lambda n: n)):
        own = mine.state_dict()
        state = {k: v.reshape(own[k].shape) if k in own and v.dim() == own[k].dim() + 1 and v.size(0) == 1 else v
                 for k, v in from_legacy_names({rename(k): v.clone() for k, v in their.state_dict().items()}).items()}
        r = load_matching(mine, state)
        total += len(r.loaded)
        lines.append(f"{label}: {len(r.loaded)} of {len(mine.state_dict())} tensors copied, "
                     f"{len(r.unexpected)} of theirs without a partner, {len(r.mismatched)} shape mismatches"
                     + (f" (e.g. {(r.unexpected + r.mismatched)[:3]}; ours kept {r.missing[:3]})"
                        if r.unexpected or r.mismatched or r.missing else ""))
    return f"same initial weights: {total} tensors copied from the reference; " + "; ".join(lines)


def parameter_counts(gen: torch.nn.Module, disc: torch.nn.Module, theirs: ReferenceTrainer) -> str:
    def count(m):
        return sum(p.numel() for p in m.parameters())
    return (f"generator {count(gen):,} (ours) / {count(theirs.net_g):,} (jaywalnut310); "
            f"critics {count(disc):,} / {count(theirs.net_d):,}")


def runners(args, tmp: Path):
    """(Runner ours, Runner theirs), the stored batches: ``bench.learning``'s --trainer vits --reference_dir."""
    from bench.learning_base import DATA, RECIPE, Runner, take_batches
    from common.config import load_config
    from common.distributed import setup_distributed
    from tts.vits import demo
    from tts.vits.evaluation import evaluate
    from tts.vits.train import TrainConfig, VitsTrainer, build_mel

    if demo.prepare(demo.build_corpus(DATA / "tts_raw"), DATA / "tts_prepared") != 0:
        raise SystemExit("error: preparing the TTS demo data failed (see above)")
    ref = import_reference(args.reference_dir)
    print(f"  [vits] alignment search of the reference: {ref.mas_note}", flush=True)
    cfg = load_config(str(demo.CONFIG), TrainConfig, [*RECIPE["vits"], *REFERENCE_RECIPE, *args.set],
                      extra={"data_dir": str(DATA / "tts_prepared"), "run_dir": str(tmp / "vits_ours")})
    tr = VitsTrainer(cfg, setup_distributed("cpu"))
    theirs = ReferenceTrainer(ref, cfg, tr.generator.n_vocab, len(tr.speakers), cfg.seed)
    print(f"  [vits] {parameter_counts(tr.generator, tr.discriminator, theirs)}", flush=True)
    if args.same_init:
        print(f"  [vits] {copy_initial_weights(theirs, tr.generator, tr.discriminator)}", flush=True)
    batches = take_batches(tr.loader, tr.sampler, args.steps)
    their_eval = TheirsForEval(theirs.net_g, ref.commons, cfg.args().inter_channels, cfg.audio.hop_length)
    items = args.eval_items or cfg.eval_max_items

    def ours_step(batch) -> float:
        out = tr.train_step(batch)
        tr.step += 1
        return float(out["loss_mel"]) / cfg.c_mel

    def metrics(model) -> dict:
        m = evaluate(model, tr.eval_set, build_mel(cfg), tr.device, items, noise_scale=cfg.noise_scale, seed=cfg.seed)
        return {k: m[k] for k in ("mcd", "align_sharpness", "dur_err")}
    return [Runner("ours", ours_step, lambda: metrics(tr.generator)),
            Runner("jaywalnut310", theirs.reference_step, lambda: metrics(their_eval))], batches
