"""A training step decides and counts a non-finite skip on the device: no host sync in `step_optimizer`
(checked on the CPU at the dispatcher: `.item()`, `bool()`, `float()` all reach `aten._local_scalar_dense`),
a skipped step leaves weights, Muon momentum, Adam moments and step counts bitwise as they were, the
guard's device counters count it, and a streak is judged (NonFiniteError, saving blocked) when read.
tests/cuda/test_no_sync.py checks the same on a GPU with CUDA's sync debug mode."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from common.guards import NonFiniteError, NonFiniteGuard, saving_blocked
from common.muon import DEFAULT_NS_COEFFICIENTS, MuonAdamW, zeropower_via_newtonschulz
from common.training import step_optimizer


class NoHostReads(TorchDispatchMode):
    """Raises on any read of a tensor's value by the host (`aten._local_scalar_dense`: `.item()`, `bool()`,
    `float()`, `int()`), except of the tensors in `allowed` (torch's non-fused Adam keeps its step counts on
    the host on CUDA too, so reading those is no device sync)."""

    def __init__(self, allowed: list[torch.Tensor] = ()) -> None:
        super().__init__()
        self.allowed = {t.data_ptr() for t in allowed}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default and args[0].data_ptr() not in self.allowed:
            raise AssertionError(f"host read of a tensor's value inside the step: {func}")
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def no_host_reads(allowed: list[torch.Tensor] = ()):
    """NoHostReads, plus `.tolist()` / `.numpy()`, which read memory without the dispatcher."""
    def refuse(*_a, **_k):
        raise AssertionError("host read (.tolist/.numpy) inside the step")

    with pytest.MonkeyPatch.context() as m, NoHostReads(allowed):
        m.setattr(torch.Tensor, "tolist", refuse)
        m.setattr(torch.Tensor, "numpy", refuse)
        yield


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.hidden, self.out = nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 2)

    def forward(self, x):
        return self.out(torch.tanh(self.hidden(torch.tanh(self.inp(x)))))


OPTIMIZERS = {
    "MuonAdamW": lambda m: MuonAdamW(m, lr=1e-2, weight_decay=0.1),
    "MuonAdamW fused": lambda m: MuonAdamW(m, lr=1e-2, weight_decay=0.1, fused=True),
    "AdamW": lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2),
    "AdamW foreach": lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, foreach=True),
    "AdamW fused": lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, fused=True),
}


def _loss(model: nn.Module, poison: bool = False) -> torch.Tensor:
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
    loss = model(x).square().mean()
    return loss * float("nan") if poison else loss


def _state(model: nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    out = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        out += [v.clone() for v in opt.state[p].values() if isinstance(v, torch.Tensor)]
    return out


def _host_steps(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [st["step"] for st in opt.state.values() if "step" in st and st["step"].device.type == "cpu"
            and not getattr(opt, "fused", False) and not opt.param_groups[-1].get("fused")]


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_skipped_step_touches_nothing_counts_on_the_device_and_makes_no_host_read(name):
    torch.manual_seed(0)
    model, twin = Net(), Net()
    twin.load_state_dict(model.state_dict())
    opt, twin_opt = OPTIMIZERS[name](model), OPTIMIZERS[name](twin)
    guard = NonFiniteGuard(max_consecutive=3)
    step_optimizer(_loss(model), opt, model.parameters(), clip_grad_norm=1.0, guard=guard)  # creates the state
    step_optimizer(_loss(twin), twin_opt, twin.parameters(), clip_grad_norm=1.0)
    before = _state(model, opt)
    with no_host_reads(_host_steps(opt)):
        _, stepped = step_optimizer(_loss(model, poison=True), opt, model.parameters(), clip_grad_norm=1.0, guard=guard)
        assert isinstance(stepped, torch.Tensor)
    assert not stepped
    after = _state(model, opt)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True)), "a skipped step changed the state"
    assert all(p.grad is None for p in model.parameters())
    assert guard.skipped_total == 1 and guard.consecutive == 1 and guard.in_streak
    # the next finite step is bitwise the one an optimizer that never saw the NaN step takes
    with no_host_reads(_host_steps(opt)):
        step_optimizer(_loss(model), opt, model.parameters(), clip_grad_norm=1.0, guard=guard)
    step_optimizer(_loss(twin), twin_opt, twin.parameters(), clip_grad_norm=1.0)
    assert all(torch.equal(a, b) for a, b in zip(_state(model, opt), _state(twin, twin_opt), strict=True))
    assert guard.skipped_total == 1 and guard.consecutive == 0 and guard.settle()


def test_a_streak_is_judged_when_read_and_blocks_saving():
    guard, nan = NonFiniteGuard(max_consecutive=3), torch.tensor(False)
    guard.record(torch.tensor(True))
    guard.record(nan)
    guard.record(nan)
    assert saving_blocked(guard)  # 2 < 3 in a row: no checkpoint, no stop yet
    guard.record(nan)  # the 3rd in a row: nothing raises until someone reads the counters
    guard.record(torch.tensor(True))  # the streak ended before the read: it is still judged
    assert guard.consecutive == 0  # a plain read never raises
    with pytest.raises(NonFiniteError, match="3 consecutive steps had non-finite"):
        saving_blocked(guard)
    with pytest.raises(NonFiniteError):
        guard.settle()  # the run is over: reading again says so again
    restored = NonFiniteGuard(3)
    restored.load_state_dict({"consecutive": 2, "skipped_total": 5})
    restored.record(nan)
    assert restored.state_dict() == {"consecutive": 3, "skipped_total": 6}
    with pytest.raises(NonFiniteError):
        restored.settle()


def test_muon_masked_step_is_bitwise_the_plain_step():
    """found_inf = 0 (finite) must give exactly what a step without the mask gives (the digests' promise)."""
    torch.manual_seed(0)
    model, twin = Net(), Net()
    twin.load_state_dict(model.state_dict())
    opts = [MuonAdamW(m, lr=1e-2, weight_decay=0.1, nesterov=True) for m in (model, twin)]
    for _ in range(3):
        for m in (model, twin):
            _loss(m).backward()
        opts[0].step()
        opts[0].zero_grad()
        opts[1].found_inf, opts[1].grad_scale = torch.zeros(()), None
        opts[1].step()
        opts[1].zero_grad()
    assert all(torch.equal(a, b) for a, b in zip(_state(model, opts[0]), _state(twin, opts[1]), strict=True))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_batched_newton_schulz_matches_one_at_a_time(dtype):
    """bf16 (the default NS dtype) came out bitwise equal here; fp32 bmm may differ from mm in the last
    bits, so `batched_ns` stays a key (off by default) and is compared within fp32 rounding."""
    gen = torch.Generator().manual_seed(0)
    for shape in ((16, 48), (48, 16)):
        ms = [torch.randn(*shape, generator=gen) for _ in range(3)]
        one = torch.stack([zeropower_via_newtonschulz(m, DEFAULT_NS_COEFFICIENTS, 5, 1e-7, dtype) for m in ms])
        batched = zeropower_via_newtonschulz(torch.stack(ms), DEFAULT_NS_COEFFICIENTS, 5, 1e-7, dtype)
        torch.testing.assert_close(batched, one, rtol=0, atol=1e-5 if dtype == torch.float32 else 0)


def test_batched_muon_step_matches_the_unbatched_step():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 2))
    twin = nn.Sequential(*[nn.Linear(m.in_features, m.out_features) for m in model])
    twin.load_state_dict(model.state_dict())
    opts = [MuonAdamW(model, lr=1e-2), MuonAdamW(twin, lr=1e-2, batched_ns=True)]
    for _ in range(2):
        for m, opt in zip((model, twin), opts):
            m(torch.ones(2, 4)).square().mean().backward()
            opt.step()
            opt.zero_grad()
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_the_host_read_check_catches_a_sync():
    """The check above would have caught the old step: `bool(torch.isfinite(norm))`."""
    with pytest.raises(AssertionError, match="host read"), no_host_reads():
        bool(torch.isfinite(torch.ones(())))
    with pytest.raises(AssertionError, match="host read"), no_host_reads():
        torch.ones(2).tolist()
