"""The batched PyTorch MAS (`maximum_path_torch`) against the numba one: the same path, bit for bit,
on random scores, lengths and masks, exact ties, items with fewer frames than tokens and empty items;
and that it never reaches numba or the host (it runs on the 'meta' device, which has no data)."""

from __future__ import annotations

import pytest
import torch

import tts.alignment as alignment
from tts.alignment import implementation_for, maximum_path, maximum_path_numba, maximum_path_torch


def random_batch(g: torch.Generator, max_b: int = 8, max_text: int = 40, max_frames: int = 120,
                 ties: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores [B, T_text, T_frames] and a 0/1 mask with random per-item lengths: some items with fewer
    frames than tokens, some empty. ``ties``: small integers, so equal path sums are common (and exact
    in float32 too)."""
    b = int(torch.randint(1, max_b + 1, (1,), generator=g))
    n_text = int(torch.randint(1, max_text + 1, (1,), generator=g))
    n_frames = int(torch.randint(1, max_frames + 1, (1,), generator=g))
    if ties:
        value = torch.randint(-2, 1, (b, n_text, n_frames), generator=g).float()
    else:
        value = torch.randn(b, n_text, n_frames, generator=g) * 10
    t_text = torch.randint(0, n_text + 1, (b,), generator=g)
    t_frames = torch.randint(0, n_frames + 1, (b,), generator=g)
    mask = (torch.arange(n_text)[None, :, None] < t_text[:, None, None]) & (
        torch.arange(n_frames)[None, None, :] < t_frames[:, None, None])
    return value, mask.float()


@pytest.mark.parametrize("ties", [False, True])
def test_same_path_as_numba(ties):
    g = torch.Generator().manual_seed(3 + ties)
    for k in range(16):
        value, mask = random_batch(g, ties=ties)
        expected = maximum_path_numba(value, mask)
        got = maximum_path_torch(value, mask)
        assert got.dtype == value.dtype and got.shape == value.shape and got.is_contiguous()
        assert torch.equal(got, expected)
        assert torch.equal(maximum_path_torch(value, mask.bool()), expected)  # a bool mask reads the same
        if ties:  # integer sums are exact in float32 as well, ties included
            assert torch.equal(maximum_path_torch(value, mask, dtype=torch.float32), expected)
        elif k % 4 == 0:  # path sums below numba's -1e9 for unreachable cells: still the same (degenerate) path
            assert torch.equal(maximum_path_torch(value * 1e7, mask), maximum_path_numba(value * 1e7, mask))


def test_tie_rule_stays_on_the_token():
    """All scores equal: every path ties, and both stay on a token as long as they can (numba's
    ``value[i, j-1] < value[i-1, j-1]``), so the first tokens get one frame and the last the rest."""
    value = torch.zeros(1, 3, 6)
    path = maximum_path_torch(value, torch.ones_like(value))
    assert torch.equal(path[0].sum(-1), torch.tensor([1.0, 1.0, 4.0]))
    assert torch.equal(path, maximum_path_numba(value, torch.ones_like(value)))


def test_fewer_frames_than_tokens_and_empty_items():
    value = torch.randn(4, 6, 9, generator=torch.Generator().manual_seed(5))
    t_text, t_frames = torch.tensor([6, 0, 4, 6]), torch.tensor([3, 5, 0, 9])
    mask = (torch.arange(6)[None, :, None] < t_text[:, None, None]) & (
        torch.arange(9)[None, None, :] < t_frames[:, None, None])
    path = maximum_path_torch(value, mask)
    assert torch.equal(path, maximum_path_numba(value, mask.float()))
    assert torch.equal(path[0, :3, :3], torch.eye(3)) and path[0, 3:].sum() == 0  # ends at the last frame
    assert path[1].sum() == 0 and path[2].sum() == 0  # no tokens / no frames: an empty path
    assert torch.equal(path[3].sum(0), torch.ones(9))
    for shape in ((0, 3, 4), (2, 0, 4), (2, 3, 0)):
        assert maximum_path_torch(torch.zeros(shape), torch.ones(shape)).shape == shape


def test_broadcast_mask():
    """The mask as VITS builds it can broadcast: x_mask [B, T_text, 1] * y_mask [B, 1, T_frames]."""
    value = torch.randn(3, 7, 20, generator=torch.Generator().manual_seed(6))
    x_mask = (torch.arange(7)[None, :, None] < torch.tensor([7, 4, 5])[:, None, None]).float()
    y_mask = (torch.arange(20)[None, None, :] < torch.tensor([20, 11, 16])[:, None, None]).float()
    assert torch.equal(maximum_path_torch(value, x_mask * y_mask), maximum_path_numba(value, x_mask * y_mask))


def test_torch_version_needs_neither_numba_nor_the_host(monkeypatch):
    """On 'meta' tensors (shapes only, no data) any .item(), .cpu() or Python branch on a value would
    raise: running there shows the loop never waits for the device. And numba is never called."""
    def refuse(*args):
        raise AssertionError("numba called")

    monkeypatch.setattr(alignment, "_maximum_path_batch", refuse)
    value = torch.randn(2, 5, 12, device="meta")
    assert maximum_path_torch(value, torch.ones_like(value)).shape == (2, 5, 12)
    assert maximum_path(value, torch.ones_like(value)).device.type == "meta"  # not CPU: the torch version
    value, mask = random_batch(torch.Generator().manual_seed(7), max_b=2, max_text=6, max_frames=15)
    maximum_path_torch(value, mask)


def test_implementation_by_device():
    assert implementation_for(torch.device("cpu")) is maximum_path_numba  # faster there (bench/bench_mas.py)
    assert implementation_for(torch.device("cuda", 0)) is maximum_path_torch


def test_runs_eagerly_under_torch_compile():
    """Dynamo cannot trace numba (it fails inside numba's dispatcher): `maximum_path` runs eagerly
    between the compiled graphs (backend 'eager': dynamo's tracing only, no code generation)."""
    value, mask = random_batch(torch.Generator().manual_seed(8), max_b=3, max_text=6, max_frames=15)

    def step(value: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return maximum_path(value * 2, mask).sum(-1) + 1

    assert torch.equal(torch.compile(step, backend="eager")(value, mask), step(value, mask))


def test_a_frame_costs_two_ops_and_the_backtrack_a_few_per_doubling():
    """On a GPU every op is a kernel launch and the loop over frames is bound by them (the third lent H200:
    93 ms of a 0.50-s VITS step with six ops a frame): two ops a frame, and a backtrack whose ops grow with
    log2(frames), not with the frames."""
    from bench.bench_mas import op_count

    g = torch.Generator().manual_seed(0)
    short, long = (torch.randn(2, 8, n, generator=g) for n in (64, 1024))
    ops_short, ops_long = (op_count(maximum_path_torch, v, torch.ones_like(v)).ops for v in (short, long))
    assert ops_long - ops_short <= 2 * (1024 - 64) + 2 * 4  # 4 more doublings, a gather and a copy each
    assert ops_short <= 2 * 64 + 60  # the band, the inputs, the directions, the path: a fixed few
