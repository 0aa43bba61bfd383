"""Monotonic alignment search (MAS, Glow-TTS / VITS) with numba: no C extension to build.

Given the log-likelihood of every frame under every text token's prior, MAS finds the
monotonic, surjective path (each frame → exactly one token, tokens in order, every token at
least one frame) that maximises the total log-likelihood. Dynamic programming over frames,
then a backtrack; O(T_text · T_frames) per item, run on the CPU on detached values (the path
is a constant for the gradient, as in the paper).
"""

from __future__ import annotations

import numba
import numpy as np
import torch

_NEG = -1e9


@numba.njit(cache=True, nogil=True)
def _maximum_path_one(path: np.ndarray, value: np.ndarray, t_text: int, t_frames: int) -> None:
    """Fill ``path[:t_text, :t_frames]`` with the best monotonic path through ``value``."""
    # value[i, j] becomes the best score of a path ending at token i on frame j.
    for j in range(t_frames):
        lo = max(0, t_text - (t_frames - j))  # leave enough frames for the remaining tokens
        hi = min(t_text, j + 1)  # token i needs at least i earlier frames
        for i in range(lo, hi):
            if j == 0:
                prev = 0.0 if i == 0 else _NEG
            else:
                stay = value[i, j - 1] if i < j else _NEG  # token i was already reachable
                move = value[i - 1, j - 1] if i > 0 else _NEG
                prev = max(stay, move)
            value[i, j] += prev
        for i in range(0, lo):
            value[i, j] = _NEG
        for i in range(hi, t_text):
            value[i, j] = _NEG
    i = t_text - 1
    for j in range(t_frames - 1, -1, -1):
        path[i, j] = 1.0
        if i > 0 and (i == j or value[i, j - 1] < value[i - 1, j - 1]):
            i -= 1


@numba.njit(cache=True, nogil=True)
def _maximum_path_batch(path: np.ndarray, value: np.ndarray, t_texts: np.ndarray,
                        t_frames: np.ndarray) -> None:
    for b in range(path.shape[0]):
        if t_texts[b] > 0 and t_frames[b] > 0:
            _maximum_path_one(path[b], value[b], t_texts[b], t_frames[b])


def maximum_path(neg_cent: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Best monotonic 0/1 path.

    neg_cent: [B, T_text, T_frames] log-likelihood of frame t under token i.
    mask: same shape (or broadcastable), 1 inside each item's valid (text, frames) rectangle.
    Returns a 0/1 tensor like ``neg_cent`` (same device/dtype). Where an item has fewer frames
    than tokens no surjective path exists: the path then ends at the last frame and later
    tokens stay empty (prepare_data filters such items out).
    """
    if neg_cent.dim() != 3:
        raise ValueError(f"neg_cent must be [B, T_text, T_frames], got shape {tuple(neg_cent.shape)}")
    mask = mask.expand_as(neg_cent)
    value = neg_cent.detach().float().masked_fill(mask == 0, 0.0).cpu().numpy().astype(np.float64)
    m = mask.detach().cpu()
    t_texts = m[:, :, 0].sum(1).long().numpy().astype(np.int64)
    t_frames = m[:, 0, :].sum(1).long().numpy().astype(np.int64)
    t_texts = np.minimum(t_texts, np.maximum(t_frames, 0))  # no surjective path otherwise
    path = np.zeros(value.shape, dtype=np.float32)
    _maximum_path_batch(path, value, t_texts, t_frames)
    return torch.from_numpy(path).to(device=neg_cent.device, dtype=neg_cent.dtype)


@numba.njit(cache=True, nogil=True)
def _logaddexp(a: float, b: float) -> float:
    if a < b:
        a, b = b, a
    if b <= _NEG:
        return a
    return a + np.log1p(np.exp(b - a))


@numba.njit(cache=True, nogil=True)
def _posterior_one(value: np.ndarray) -> np.ndarray:
    t_text, t_frames = value.shape
    alpha = np.full((t_text, t_frames), _NEG)
    beta = np.full((t_text, t_frames), _NEG)
    alpha[0, 0] = value[0, 0]
    for j in range(1, t_frames):
        for i in range(max(0, t_text - (t_frames - j)), min(t_text, j + 1)):
            prev = alpha[i, j - 1]
            if i > 0:
                prev = _logaddexp(prev, alpha[i - 1, j - 1])
            alpha[i, j] = prev + value[i, j]
    beta[t_text - 1, t_frames - 1] = 0.0
    for j in range(t_frames - 2, -1, -1):
        for i in range(max(0, t_text - (t_frames - j)), min(t_text, j + 1)):
            nxt = beta[i, j + 1] + value[i, j + 1]
            if i + 1 < t_text:
                nxt = _logaddexp(nxt, beta[i + 1, j + 1] + value[i + 1, j + 1])
            beta[i, j] = nxt
    log_z = alpha[t_text - 1, t_frames - 1]
    post = np.zeros((t_text, t_frames))
    for j in range(t_frames):
        for i in range(t_text):
            if alpha[i, j] > _NEG / 2 and beta[i, j] > _NEG / 2:
                post[i, j] = np.exp(alpha[i, j] + beta[i, j] - log_z)
    return post


def alignment_posterior(log_lik: torch.Tensor) -> torch.Tensor:
    """Soft monotonic alignment of one item: P(frame t belongs to token i) under the uniform
    prior over all monotonic surjective paths weighted by exp(log-likelihood) (forward-backward,
    the soft counterpart of MAS). log_lik [T_text, T_frames] (unpadded, T_frames >= T_text);
    returns [T_text, T_frames], each column summing to 1."""
    value = log_lik.detach().double().cpu().numpy()
    if value.shape[0] > value.shape[1]:
        raise ValueError(f"alignment_posterior: {value.shape[0]} tokens but only {value.shape[1]} frames")
    return torch.from_numpy(_posterior_one(np.ascontiguousarray(value))).to(log_lik.device)

