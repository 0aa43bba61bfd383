"""common.muon: parity with torch.optim.Muon / torch.optim.AdamW, the parameter split, and the training plumbing."""

import copy
import io

import pytest
import torch
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from common.muon import (
    Muon,
    Muon_AdamW,
    MuonAdamW,
    adjust_lr,
    build_optimizer,
    check_split,
    ns_compute_dtype,
    split_params,
    zeropower_via_newtonschulz,
)

SHAPES_2D = [(16, 16), (32, 8), (8, 24)]  # square, tall, wide


def _grads(shapes, steps, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(s, generator=g) for s in shapes] for _ in range(steps)]


def torch_muon_takes(adjust_lr_fn: str) -> bool:
    """Whether the installed torch.optim.Muon accepts this `adjust_lr_fn`: torch 2.11's refuses
    "spectral_unclamped" (a ValueError from its constructor), which later versions added."""
    try:
        torch.optim.Muon([torch.zeros(2, 2, requires_grad=True)], adjust_lr_fn=adjust_lr_fn)
    except ValueError:
        return False
    return True


def _torch_muon_case(adjust_lr_fn: str):
    """A parametrize value that skips, with its reason, where torch's Muon (the oracle) lacks the option."""
    return pytest.param(adjust_lr_fn, marks=pytest.mark.skipif(
        not torch_muon_takes(adjust_lr_fn),
        reason=f"torch {torch.__version__}'s torch.optim.Muon has no adjust_lr_fn={adjust_lr_fn!r} (added later)"))


def _run(opt, params, grads):
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.clone()
        opt.step()


@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("adjust_lr_fn", [None, "original", "match_rms_adamw", _torch_muon_case("spectral_unclamped")])
def test_muon_matches_torch_on_2d(adjust_lr_fn, nesterov):
    torch.manual_seed(0)
    ours = [torch.randn(s, requires_grad=True) for s in SHAPES_2D]
    theirs = [p.detach().clone().requires_grad_() for p in ours]
    start = [p.detach().clone() for p in ours]
    kw = dict(lr=0.02, weight_decay=0.1, momentum=0.9, nesterov=nesterov, adjust_lr_fn=adjust_lr_fn)
    grads = _grads(SHAPES_2D, steps=4)
    a, b = Muon(ours, **kw), torch.optim.Muon(theirs, **kw)
    _run(a, ours, grads)
    _run(b, theirs, grads)
    for p, q, p0 in zip(ours, theirs, start):
        assert (p - p0).abs().max() > 1e-3  # it moved
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(a.state[p]["momentum_buffer"], b.state[q]["momentum_buffer"])


@pytest.mark.parametrize("shape", [(8, 4, 3), (6, 3, 3, 3), (4, 8, 5)])
@pytest.mark.parametrize("adjust_lr_fn", [None, "match_rms_adamw"])
def test_muon_nd_equals_torch_on_reshaped_copy(shape, adjust_lr_fn):
    torch.manual_seed(1)
    w = torch.randn(shape, requires_grad=True)
    w2d = w.detach().reshape(shape[0], -1).clone().requires_grad_()
    grads = _grads([shape], steps=3, seed=2)
    kw = dict(lr=0.05, weight_decay=0.01, adjust_lr_fn=adjust_lr_fn)
    _run(Muon([w], **kw), [w], grads)
    _run(torch.optim.Muon([w2d], **kw), [w2d], [[g[0].reshape(shape[0], -1)] for g in grads])
    torch.testing.assert_close(w.detach().reshape(shape[0], -1), w2d.detach(), rtol=1e-6, atol=1e-7)


def test_reshape_is_not_per_channel():
    """The negative control: NS on each output channel's (in, k) slice is a different update."""
    g = torch.randn(8, 4, 3, generator=torch.Generator().manual_seed(3))
    right = zeropower_via_newtonschulz(g.reshape(8, -1), (3.4445, -4.775, 2.0315), 5, 1e-7, torch.float32)
    per_channel = torch.stack([zeropower_via_newtonschulz(c, (3.4445, -4.775, 2.0315), 5, 1e-7, torch.float32)
                               for c in g])
    assert (right.reshape(8, 4, 3) - per_channel).abs().max() > 0.1


def test_never_fp16():
    assert ns_compute_dtype(torch.zeros(2, 2, dtype=torch.float16), "bfloat16") == torch.float32
    assert ns_compute_dtype(torch.zeros(2, 2), "bfloat16") == torch.bfloat16
    assert ns_compute_dtype(torch.zeros(2, 2), "float32") == torch.float32
    with pytest.raises(ValueError, match="float16"):
        Muon([torch.zeros(4, 4, requires_grad=True)], ns_dtype="float16")
    with pytest.raises(ValueError, match="float16"):
        zeropower_via_newtonschulz(torch.randn(4, 4), (3.4445, -4.775, 2.0315), 5, 1e-7, torch.float16)
    # An fp16 weight is stepped with fp32 NS (a bf16 NS would miss this tolerance by ~10x).
    g = torch.randn(8, 12, generator=torch.Generator().manual_seed(4)).half()
    p = torch.zeros(8, 12, dtype=torch.float16, requires_grad=True)
    p.grad = g.clone()
    Muon([p], lr=1.0, weight_decay=0.0, momentum=0.0, nesterov=False).step()
    ref = -adjust_lr(1.0, None, 8, 12) * zeropower_via_newtonschulz(g.float(), (3.4445, -4.775, 2.0315), 5,
                                                                    1e-7, torch.float32)
    assert torch.isfinite(p).all()
    torch.testing.assert_close(p.detach().float(), ref, rtol=2e-3, atol=2e-3)


def test_step_sizes_without_the_torch_oracle():
    """Each `adjust_lr_fn` written out, so all of them stay checked where torch's Muon lacks one (torch 2.11:
    no "spectral_unclamped"; ours never calls torch's Muon, so it works there)."""
    assert adjust_lr(1.0, None, 32, 8) == adjust_lr(1.0, "original", 32, 8) == 2.0
    assert adjust_lr(1.0, "original", 8, 32) == 1.0
    assert adjust_lr(1.0, "match_rms_adamw", 8, 32) == pytest.approx(0.2 * 32 ** 0.5)
    assert adjust_lr(1.0, "spectral_unclamped", 8, 32) == 0.5 and adjust_lr(1.0, "spectral_unclamped", 32, 8) == 2.0
    g = torch.randn(8, 32, generator=torch.Generator().manual_seed(5))
    p = torch.zeros(8, 32, requires_grad=True)
    p.grad = g.clone()
    Muon([p], lr=1.0, weight_decay=0.0, momentum=0.0, nesterov=False, adjust_lr_fn="spectral_unclamped").step()
    ref = -0.5 * zeropower_via_newtonschulz(g, (3.4445, -4.775, 2.0315), 5, 1e-7)
    torch.testing.assert_close(p.detach(), ref.float())

def test_muon_rejects_1d():
    with pytest.raises(ValueError, match="AdamW"):
        Muon([torch.zeros(4, requires_grad=True)])


# ------------------------------------------------------------------------------------------------ split


class OldWeightNormConv(nn.Module):
    """A conv carrying old-style weight-norm parameters `weight_g` / `weight_v`."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.weight_g = nn.Parameter(torch.ones(c, 1, 1))
        self.weight_v = nn.Parameter(torch.randn(c, c, 3) * 0.1)

    def forward(self, x):
        w = self.weight_g * self.weight_v / self.weight_v.norm(dim=(1, 2), keepdim=True)
        return nn.functional.conv1d(x, w, padding=1)


class SplitNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv_pre = weight_norm(nn.Conv1d(4, 16, 7, padding=3))
        self.emb = nn.Embedding(10, 16)
        self.hidden = weight_norm(nn.Conv1d(16, 16, 3, padding=1))
        self.old = OldWeightNormConv(16)
        self.norm = nn.LayerNorm(16)
        self.dw = nn.Conv1d(16, 16, 5, padding=2, groups=16)
        self.lin = nn.Linear(16, 16)
        self.up = weight_norm(nn.ConvTranspose1d(16, 8, 4, stride=2, padding=1))
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)
        self.marked = nn.Sequential(nn.Linear(8, 8))
        self.marked.muon_exclude = True
        self.proj = nn.Linear(8, 8)
        self.tagged = nn.Linear(8, 8, bias=False)
        self.tagged.weight._no_muon = True
        self.conv_post = weight_norm(nn.Conv1d(8, 1, 7, padding=3))

    def forward(self, x, ids):
        h = self.conv_pre(x) + self.emb(ids).transpose(1, 2)
        h = self.old(torch.relu(self.hidden(h)))
        h = self.lin(self.norm(self.dw(h).transpose(1, 2))).transpose(1, 2)
        h = self.up(h).transpose(1, 2)
        h = self.tagged(self.proj(self.marked(self.frozen(h)))).transpose(1, 2)
        return self.conv_post(h)


def test_split_covers_every_trainable_param_once():
    model = SplitNet()
    muon, adamw = split_params(model, exclude=("proj",))
    assert [n for n, _ in muon] == [
        "hidden.parametrizations.weight.original1",
        "old.weight_v",
        "lin.weight",
        "up.parametrizations.weight.original1",
    ]
    adamw_names = {n for n, _ in adamw}
    for name in ["conv_pre.parametrizations.weight.original0", "conv_pre.parametrizations.weight.original1",
                 "conv_pre.bias", "emb.weight", "hidden.parametrizations.weight.original0", "old.weight_g",
                 "norm.weight", "norm.bias", "dw.weight", "lin.bias", "up.parametrizations.weight.original0",
                 "marked.0.weight", "proj.weight", "tagged.weight",
                 "conv_post.parametrizations.weight.original0", "conv_post.parametrizations.weight.original1"]:
        assert name in adamw_names, name
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert sorted(trainable) == sorted([n for n, _ in muon] + list(adamw_names))
    assert len(adamw_names) == len(adamw)
    assert not any(n.startswith("frozen.") for n in adamw_names)

    opt = MuonAdamW(model, lr=1e-3, exclude=("proj",))
    assert [id(p) for p in opt.param_groups[0]["params"]] == [id(p) for _, p in muon]
    assert [id(p) for p in opt.param_groups[1]["params"]] == [id(p) for _, p in adamw]
    assert opt.param_groups[0]["use_muon"] and not opt.param_groups[1]["use_muon"]
    x, ids = torch.randn(2, 4, 12), torch.randint(0, 10, (2, 12))
    model(x, ids).pow(2).mean().backward()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt.step()
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]) == n.startswith("frozen."), n


def test_split_errors():
    model = SplitNet()
    with pytest.raises(ValueError, match="matches no parameter"):
        split_params(model, exclude=("conv_psot",))
    with pytest.raises(TypeError, match="nn.Module"):
        MuonAdamW(list(model.parameters()), lr=1e-3)
    muon, adamw = split_params(model)
    with pytest.raises(RuntimeError, match="In both"):
        check_split(model, muon, adamw + muon[:1])
    with pytest.raises(RuntimeError, match="in neither"):
        check_split(model, muon[1:], adamw)
    with pytest.raises(RuntimeError, match="frozen"):
        check_split(model, muon, adamw + [("frozen.weight", model.frozen.weight)])


# ------------------------------------------------------------------------------------------ MuonAdamW


def test_adamw_half_is_torch_adamw():
    torch.manual_seed(5)
    model = SplitNet()
    ref = copy.deepcopy(model)
    opt = MuonAdamW(model, lr=3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01)
    adamw_names = set(opt.param_groups[1]["param_names"])
    ref_params = dict(ref.named_parameters())
    ref_opt = torch.optim.AdamW([ref_params[n] for n in opt.param_groups[1]["param_names"]],
                                lr=3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01)
    gen = torch.Generator().manual_seed(6)
    for _ in range(4):
        for n, p in model.named_parameters():
            if p.requires_grad:
                p.grad = torch.randn(p.shape, generator=gen)
                ref_params[n].grad = p.grad.clone()
        opt.step()
        ref_opt.step()
    for n, p in model.named_parameters():
        if n in adamw_names:
            assert torch.equal(p, ref_params[n]), n
        elif p.requires_grad:
            assert not torch.equal(p, ref_params[n]), n  # the Muon half did move


class ConvRegressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv_in = nn.Conv1d(1, 16, 5, padding=2)
        self.hidden = nn.Conv1d(16, 16, 5, padding=2)
        self.mlp = nn.Linear(16, 16)
        self.conv_out = nn.Conv1d(16, 1, 5, padding=2)

    def forward(self, x):
        h = torch.tanh(self.hidden(torch.tanh(self.conv_in(x))))
        return self.conv_out(torch.tanh(self.mlp(h.transpose(1, 2))).transpose(1, 2))


def _batch(seed=7):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 1, 32, generator=gen)
    target = torch.tanh(torch.nn.functional.conv1d(x, torch.randn(1, 1, 9, generator=gen), padding=4))
    return x, target


def test_toy_model_trains():
    torch.manual_seed(8)
    model = ConvRegressor()
    opt = MuonAdamW(model, lr=1e-2)
    assert {p.ndim for p in opt.param_groups[0]["params"]} == {3, 2}  # a conv and a linear via Muon
    x, target = _batch()
    losses = []
    for _ in range(150):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), target)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0], (losses[0], losses[-1])


def test_grad_scaler_skips_inf_step():
    torch.manual_seed(9)
    model = ConvRegressor()
    opt = MuonAdamW(model, lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    x, target = _batch()

    def backward():
        opt.zero_grad()
        scaler.scale(nn.functional.mse_loss(model(x), target)).backward()

    backward()
    scaler.step(opt)
    scaler.update()
    muon_p = opt.param_groups[0]["params"][0]
    params = [p.detach().clone() for p in model.parameters()]
    buf = opt.state[muon_p]["momentum_buffer"].clone()
    assert buf.abs().sum() > 0
    backward()
    muon_p.grad[0, 0, 0] = float("inf")
    opt.param_groups[1]["params"][0].grad.view(-1)[0] = float("nan")
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 2.0**9
    for p, q in zip(model.parameters(), params):
        assert torch.equal(p, q)
    assert torch.equal(opt.state[muon_p]["momentum_buffer"], buf)
    backward()  # a finite step afterwards moves the weights again
    scaler.step(opt)
    assert not torch.equal(muon_p, params[2])


def _train(model, opt, sched, steps, x, target):
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), target).backward()
        opt.step()
        sched.step()


def test_state_dict_round_trip_continues_identically():
    torch.manual_seed(10)
    x, target = _batch()
    model = ConvRegressor()
    opt = MuonAdamW(model, lr=1e-2, weight_decay=0.01, muon_lr=2e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    _train(model, opt, sched, 3, x, target)

    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}, buffer)
    buffer.seek(0)
    ckpt = torch.load(buffer, weights_only=True)
    resumed = ConvRegressor()
    resumed.load_state_dict(ckpt["model"])
    opt2 = MuonAdamW(resumed, lr=1.0)  # hyper-parameters come back from the checkpoint
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda s: 1.0 / (1 + s))
    opt2.load_state_dict(ckpt["opt"])
    sched2.load_state_dict(ckpt["sched"])

    _train(model, opt, sched, 3, x, target)
    _train(resumed, opt2, sched2, 3, x, target)
    for p, q in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(p, q)


def test_lambda_lr_scales_both_groups():
    opt = MuonAdamW(ConvRegressor(), lr=1e-3, muon_lr=4e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5**s)
    for _ in range(2):
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-2)
    assert opt.param_groups[1]["lr"] == pytest.approx(2.5e-4)


def test_build_optimizer():
    model = SplitNet()
    for name in ["AdamW", "torch.optim.AdamW"]:
        opt = build_optimizer(name, model, lr=2e-4, beta1=0.8, beta2=0.99, weight_decay=0.0)
        assert type(opt) is torch.optim.AdamW
        assert opt.param_groups[0]["betas"] == (0.8, 0.99)
        assert all(p.requires_grad for p in opt.param_groups[0]["params"])
        assert len(opt.param_groups[0]["params"]) == sum(p.requires_grad for p in model.parameters())
    assert type(build_optimizer("Adam", model, lr=1e-3, betas=[0.5, 0.9])) is torch.optim.Adam
    for name in ["MuonAdamW", "Muon_AdamW", "common.muon.MuonAdamW"]:
        opt = build_optimizer(name, model, lr=2e-4, beta1=0.8, beta2=0.99)
        assert type(opt) is MuonAdamW is Muon_AdamW
        assert opt.param_groups[1]["betas"] == (0.8, 0.99)
    with pytest.raises(ValueError, match="Muon_AdamW"):
        build_optimizer("Adamw", model, lr=1e-3)
    with pytest.raises(ValueError, match="unknown optimizer"):
        build_optimizer("torch.optim.NoSuch", model, lr=1e-3)
    with pytest.raises(ValueError, match="not both"):
        build_optimizer("AdamW", model, lr=1e-3, betas=(0.9, 0.99), beta1=0.8)
    with pytest.raises(TypeError, match="muon_lr"):
        build_optimizer("AdamW", model, lr=1e-3, muon_lr=1e-2)


def test_optimizer_cls_takes_the_documented_spellings_and_imports_nothing(tmp_path, monkeypatch):
    import sys

    from common.config import ConfigError

    model = SplitNet()
    for name, cls in [("AdamW", torch.optim.AdamW), ("torch.optim.AdamW", torch.optim.AdamW), ("Adam", torch.optim.Adam),
                      ("torch.optim.SGD", torch.optim.SGD), ("common.muon.MuonAdamW", MuonAdamW),
                      ("Muon_AdamW", MuonAdamW), ("MuonAdamW", MuonAdamW),
                      ("modules.optimizer.muon.Muon_AdamW", MuonAdamW)]:  # SingingVocoders' spelling
        assert type(build_optimizer(name, model, lr=1e-3)) is cls
    # a module on the path that would run code on import, and even defines an Optimizer subclass
    (tmp_path / "evil_optim.py").write_text(
        "import pathlib, torch\n"
        f"pathlib.Path({str(tmp_path / 'imported')!r}).write_text('ran')\n"
        "class Optim(torch.optim.SGD):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ["evil_optim.Optim", "os.system", "subprocess.Popen", "torch.optim.Optimizer",
                 "torch.optim.lr_scheduler.StepLR", "torch.nn.Linear", "Nope", ""]:
        with pytest.raises(ConfigError) as e:
            build_optimizer(name, model, lr=1e-3)
        msg = str(e.value)
        assert msg.startswith(f"optimizer_cls: unknown optimizer class {name!r}; use an alias (AdamW, ")
        assert "torch.optim.AdamW" in msg and "common.muon.MuonAdamW" in msg and "\n" not in msg
    assert not (tmp_path / "imported").exists() and "evil_optim" not in sys.modules
    with pytest.raises(ConfigError, match="^generator_optimizer_args.optimizer_cls: unknown optimizer class"):
        build_optimizer("os.system", model, key="generator_optimizer_args.optimizer_cls", lr=1e-3)


def test_the_fast_path_keys_reach_the_optimizer_and_are_refused_where_they_do_nothing():
    """`fused` and `batched_ns` (each trainer's keys: common.muon.build_optimizer): fused None = torch's fused
    kernel on CUDA only, True/False = that kernel or not on any device (the CPU has one too); batched_ns is
    Muon's; an optimizer that does not take a key refuses it in one line naming it."""
    from common.config import ConfigError

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    assert not build_optimizer("AdamW", model, lr=1e-3).defaults["fused"]  # on the CPU: the per-tensor path
    assert build_optimizer("AdamW", model, lr=1e-3, fused=True).defaults["fused"] is True
    assert build_optimizer("Adam", model, lr=1e-3, fused=False).defaults["fused"] is False
    assert build_optimizer("MuonAdamW", model, lr=1e-3, fused=True).fused is True
    assert build_optimizer("MuonAdamW", model, lr=1e-3).fused is False
    assert build_optimizer("MuonAdamW", model, lr=1e-3, batched_ns=True).batched_ns is True
    assert build_optimizer("MuonAdamW", model, lr=1e-3).batched_ns is False
    with pytest.raises(ConfigError) as e:
        build_optimizer("torch.optim.SGD", model, lr=1e-3, fused=True, prefix="optim.", key="optim.optimizer")
    assert str(e.value) == ("optim.fused=true: torch.optim.SGD does not take it; the key is for AdamW, Adam, "
                            "MuonAdamW (remove it, or set optim.optimizer to one of them)")
    with pytest.raises(ConfigError, match=r"^optimizer_batched_ns=true: AdamW does not take it; the key is for "
                                          r"MuonAdamW, common.muon.Muon \(remove it"):
        build_optimizer("AdamW", model, lr=1e-3, batched_ns=True, prefix="optimizer_")


def test_a_resumed_optimizer_runs_the_kernel_this_run_asks_for():
    """torch's load_state_dict puts the saved param groups back whole: without `this_runs_kernels` a `fused`
    key changed on resume changed nothing. The state (moments, step counts) carries over; its math is equal."""
    from common.checkpoint import this_runs_kernels

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    plain = build_optimizer("AdamW", model, lr=1e-2, fused=False)
    model(torch.randn(5, 4)).square().mean().backward()
    plain.step()
    fused = build_optimizer("AdamW", model, lr=1e-2, fused=True)
    fused.load_state_dict(this_runs_kernels(fused, plain.state_dict()))
    assert fused.param_groups[0]["fused"] is True
    assert all(st["step"].device == p.device and st["step"].dtype == torch.float32
               for p, st in fused.state.items())  # where the fused kernel keeps its step count
    before = [p.detach().clone() for p in model.parameters()]
    fused.step()  # takes the carried-over moments (the gradients are still there)
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    again = build_optimizer("AdamW", model, lr=1e-2, fused=True)
    again.load_state_dict(plain.state_dict())
    assert again.param_groups[0]["fused"] is False  # what torch alone does
