"""Monotonic alignment search against a brute-force search over every monotonic path."""

from __future__ import annotations

import itertools

import torch

from tts.alignment import alignment_posterior, maximum_path


def brute_force(value: torch.Tensor) -> torch.Tensor:
    """Best path by enumerating every split of the frames into len(text) non-empty runs."""
    t_text, t_frames = value.shape
    best, best_bounds = None, None
    for cuts in itertools.combinations(range(1, t_frames), t_text - 1):
        bounds = (0, *cuts, t_frames)
        score = sum(value[i, bounds[i] : bounds[i + 1]].sum().item() for i in range(t_text))
        if best is None or score > best:
            best, best_bounds = score, bounds
    path = torch.zeros(t_text, t_frames)
    for i in range(t_text):
        path[i, best_bounds[i] : best_bounds[i + 1]] = 1
    return path


def test_maximum_path_matches_brute_force():
    g = torch.Generator().manual_seed(0)
    for _ in range(60):
        b, max_t, max_f = 3, 5, 9
        value = torch.randn(b, max_t, max_f, generator=g)
        t_len = torch.randint(1, max_t + 1, (b,), generator=g)
        f_len = torch.maximum(torch.randint(1, max_f + 1, (b,), generator=g), t_len)
        mask = (torch.arange(max_t)[None, :, None] < t_len[:, None, None]) & (
            torch.arange(max_f)[None, None, :] < f_len[:, None, None])
        path = maximum_path(value, mask.float())
        assert path.shape == value.shape and path.dtype == value.dtype
        for i in range(b):
            t, f = int(t_len[i]), int(f_len[i])
            assert torch.equal(path[i, :t, :f], brute_force(value[i, :t, :f]))
            assert path[i].sum() == f  # padding untouched, every frame used once
            assert (path[i, :t].sum(-1) >= 1).all()  # frames per token


def test_maximum_path_follows_a_planted_alignment():
    durations = torch.tensor([3, 1, 4, 2, 5])
    target = torch.repeat_interleave(torch.arange(5), durations)
    value = torch.full((1, 5, int(durations.sum())), -5.0)
    value[0, target, torch.arange(len(target))] = 0.0
    path = maximum_path(value, torch.ones_like(value))
    assert torch.equal(path[0].sum(-1), durations.float())


def test_fewer_frames_than_tokens_does_not_crash():
    value = torch.randn(1, 6, 3)
    path = maximum_path(value, torch.ones_like(value))
    assert path.sum() == 3 and torch.equal(path.sum(1), torch.ones(1, 3))


def test_alignment_posterior_matches_enumeration():
    g = torch.Generator().manual_seed(1)
    for t_text, t_frames in ((1, 4), (3, 3), (3, 6), (4, 7)):
        value = torch.randn(t_text, t_frames, generator=g, dtype=torch.float64) * 2
        occ, total = torch.zeros(t_text, t_frames, dtype=torch.float64), 0.0
        for cuts in itertools.combinations(range(1, t_frames), t_text - 1):
            bounds = (0, *cuts, t_frames)
            path = torch.zeros(t_text, t_frames, dtype=torch.float64)
            for i in range(t_text):
                path[i, bounds[i] : bounds[i + 1]] = 1
            w = torch.exp((value * path).sum())
            occ += w * path
            total += w
        post = alignment_posterior(value)
        assert torch.allclose(post, occ / total, atol=1e-9)
        assert torch.allclose(post.sum(0), torch.ones(t_frames, dtype=torch.float64))
