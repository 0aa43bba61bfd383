"""Monotonic alignment search (MAS, Glow-TTS / VITS): numba on the CPU, batched PyTorch elsewhere.

Given the log-likelihood of every frame under every text token's prior, MAS finds the
monotonic, surjective path (each frame → exactly one token, tokens in order, every token at
least one frame) that maximises the total log-likelihood. Dynamic programming over frames,
then a backtrack; O(T_text · T_frames) per item, on detached values (the path is a constant
for the gradient, as in the paper).

Two implementations give the same path (same values in float64, same tie rule):
- `maximum_path_numba`: item by item on the CPU (no C extension to build; numba ships with librosa);
- `maximum_path_torch`: the whole batch at once, one loop step per frame of two vectorised ops over
  [B, T_text] and a backtrack of ~log2(frames) ops, on the tensors' own device: on a GPU no copy to the
  host and no host sync, so the training step does not stall on MAS.
`maximum_path` picks one by device (`implementation_for`).
"""

from __future__ import annotations

from collections.abc import Callable

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


def _lengths(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, frames) per item [B] from a 0/1 mask whose valid part is the top-left rectangle,
    tokens capped at frames (no surjective path otherwise)."""
    valid = mask != 0
    t_frames = valid[:, 0, :].sum(1)
    return torch.minimum(valid[:, :, 0].sum(1), t_frames), t_frames


def maximum_path_numba(neg_cent: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`maximum_path` item by item with numba on the CPU, in float64 (the reference implementation;
    a GPU tensor is copied to the host and back, which waits for the GPU)."""
    mask = mask.expand_as(neg_cent)
    value = neg_cent.detach().float().masked_fill(mask == 0, 0.0).cpu().numpy().astype(np.float64)
    t_texts, t_frames = (n.cpu().numpy().astype(np.int64) for n in _lengths(mask.detach()))
    path = np.zeros(value.shape, dtype=np.float32)
    _maximum_path_batch(path, value, t_texts, t_frames)
    return torch.from_numpy(path).to(device=neg_cent.device, dtype=neg_cent.dtype)


def maximum_path_torch(neg_cent: torch.Tensor, mask: torch.Tensor,
                       dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """`maximum_path` for the whole batch in PyTorch, on ``neg_cent``'s device: no host copy, no sync.

    The same recursion as `_maximum_path_one`, a loop over frames whose every step is two ops over all
    items and tokens at once ([B, T_text]): the better of "stay" and "move", plus the frame's scores.
    Items of different lengths run side by side, each inside its own band of reachable cells (token i on
    frame j needs i <= j, and enough frames left for the tokens after it); cells outside it score -inf
    (numba's -1e9: both lose every comparison to a reachable cell, and every reachable cell has a
    reachable predecessor). Every frame's scores are kept, so the directions (did the path come from the
    previous token?) are one op after the loop, and the backtrack is ~log2(T_frames) rounds of composing
    the frames' token maps (pointer doubling) instead of a second loop over frames. On a GPU such a loop
    is bound by kernel launches, not arithmetic: the third lent H200 timed the earlier six-ops-a-frame
    version at 93 ms of a 0.50-s VITS step (batch 64 x 208 tokens x 704 frames).

    ``dtype`` float64 (default) gives the numba path exactly: both add the same float32 inputs in
    float64 in the same order, and ties break the same way (the path stays on its token unless the
    previous token scored strictly more: numba's ``value[i, j-1] < value[i-1, j-1]``). In float32 the
    sums round differently, so a near-tie can flip. Memory at batch 64 x 300 tokens x 1034 frames: the
    kept scores and a copy of the inputs (160 MB each in float64), then the token maps of the backtrack
    (160 MB of int64, twice while composing) and a few one-byte tensors of that size.
    """
    if neg_cent.dim() != 3:
        raise ValueError(f"neg_cent must be [B, T_text, T_frames], got shape {tuple(neg_cent.shape)}")
    b, n_text, n_frames = neg_cent.shape
    device = neg_cent.device
    if b == 0 or n_text == 0 or n_frames == 0:
        return torch.zeros_like(neg_cent)
    mask = mask.detach().expand_as(neg_cent)
    t_texts, t_frames = _lengths(mask)
    tok = torch.arange(n_text, device=device)
    frame = torch.arange(n_frames, device=device)[:, None, None]
    # [T_frames, B, T_text]: the cells a path of this item can pass through (empty for an empty item)
    band = (tok <= frame) & (tok >= (t_texts - t_frames)[:, None] + frame) & (tok < t_texts[:, None])
    # float32 as numba reads them (0 outside the mask), then in ``dtype`` (an add of two dtypes would cast
    # every frame: one more op each), -inf outside the band; frames first, so each frame is one block
    x = neg_cent.detach().float().masked_fill(mask == 0, 0.0).to(dtype).permute(2, 0, 1).contiguous()
    x.masked_fill_(~band, float("-inf"))

    # score[j, :, 1 + i]: best score of a path on token i after frame j - 1 (row 0: before frame 0, where the
    # path stands on token 0); column 0 is a token before the first one, never reachable, so "come from
    # token i-1" is the same rows shifted by one column.
    score = torch.full((n_frames + 1, b, n_text + 1), float("-inf"), dtype=dtype, device=device)
    score[0, :, 1] = 0.0
    stay, move, new = score[:-1, :, 1:].unbind(0), score[:-1, :, :-1].unbind(0), score[1:, :, 1:].unbind(0)
    best = torch.empty((b, n_text), dtype=dtype, device=device)
    for j, x_j in enumerate(x.unbind(0)):
        torch.maximum(stay[j], move[j], out=best)
        torch.add(best, x_j, out=new[j])
    from_prev = score[:-1, :, 1:] < score[:-1, :, :-1]  # the previous token strictly better: the tie rule
    del score

    # numba's backtrack steps down a token at (i, j) iff i > 0 and (i == j or from_prev); outside the band
    # (frames past an item's end) it never steps, so each item starts at its own end. back[j][i]: the token
    # on frame j given token i on frame j + 1 (the last frame maps to itself); composing these maps in
    # doubling strides makes back[j] the map from the last frame to frame j.
    step_down = (from_prev | (tok == frame)) & (tok > 0) & band
    back = torch.cat([tok - step_down[1:].long(), tok.expand(1, b, n_text)])
    spare = torch.empty_like(back)
    stride = 1
    while stride < n_frames:  # frames within `stride` of the last already map from it
        torch.gather(back[:-stride], 2, back[stride:], out=spare[:-stride])
        spare[-stride:] = back[-stride:]
        back, spare = spare, back
        stride *= 2
    del spare
    last = (t_texts - 1).clamp(min=0)
    token = back.gather(2, last[None, :, None].expand(n_frames, b, 1))  # [T_frames, B, 1]
    path = (tok == token) & band
    return path.permute(1, 2, 0).to(neg_cent.dtype).contiguous()


# On the CPU numba is faster at every size measured (bench/bench_mas.py); elsewhere the batched torch
# version runs on the device, where numba would copy to the host and wait for the GPU.
def implementation_for(device: torch.device) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The MAS implementation `maximum_path` uses for tensors on ``device``."""
    return maximum_path_numba if device.type == "cpu" else maximum_path_torch


def maximum_path(neg_cent: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Best monotonic 0/1 path.

    neg_cent: [B, T_text, T_frames] log-likelihood of frame t under token i.
    mask: same shape (or broadcastable), 0/1 or bool, 1 inside each item's valid (text, frames)
    rectangle (top left). Returns a 0/1 tensor like ``neg_cent`` (same device/dtype). Where an item
    has fewer frames than tokens no surjective path exists: the path then ends at the last frame and
    later tokens stay empty (prepare_data filters such items out); an empty item gets an empty path.

    Under torch.compile it runs eagerly between the compiled graphs: dynamo cannot trace numba, and
    would unroll the torch version's loop over frames. The wrapper is made here, only then, because
    importing torch._dynamo (which `torch.compiler.disable` does) costs every start-up ~1.7 s.
    """
    if neg_cent.dim() != 3:
        raise ValueError(f"neg_cent must be [B, T_text, T_frames], got shape {tuple(neg_cent.shape)}")
    fn = implementation_for(neg_cent.device)
    if torch.compiler.is_compiling():
        fn = torch.compiler.disable(fn)
    return fn(neg_cent, mask)


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

