"""Muon for N-D weights, and MuonAdamW: one optimizer that sends hidden weights to Muon, the rest to AdamW.

Muon (https://kellerjordan.github.io/posts/muon/) keeps SGD-momentum on a weight matrix and replaces the
step by the matrix's nearest semi-orthogonal matrix, found with a few Newton–Schulz (NS) iterations.
`Muon` here has exactly the hyper-parameters and arithmetic of `torch.optim.Muon` (the test oracle on 2-D
weights: momentum as `lerp`, Nesterov, decoupled weight decay `p *= 1 - lr * wd`, `adjust_lr_fn`
None/"original" | "match_rms_adamw" | "spectral_unclamped", `ns_coefficients`, `eps`, `ns_steps`, NS in
bf16). It differs only where torch cannot go:

Why reshape N-D weights to (out, -1).
    `torch.optim.Muon` refuses anything but 2-D. A Conv1d weight (out, in, k) *is* the matrix
    (out, in*k) acting on unfolded input patches, so that is what must be orthogonalised. Running the NS
    matmuls on the 3-D tensor instead (batched `@`) orthogonalises each output channel's (in, k) slice
    separately — a different, wrong update that ignores how output channels relate. The learning-rate
    adjustment is also computed from the 2-D view (torch's reads only `shape[:2]`, i.e. would drop k).
    (out, -1) is right for ConvTranspose weights (in, out, k) too: that view is the matrix of the adjoint
    convolution, and orthogonalisation commutes with transposition.

Why the step size ignores the gradient's magnitude.
    NS first divides by the Frobenius norm, then pushes every singular value towards 1: the update's size
    is set by lr and the weight's shape alone. `clip_grad_norm_` rescales the gradient, which NS undoes,
    so clipping does NOT bound a Muon step; learning-rate warmup, the schedule and weight decay do. A
    spike (or NaN) gradient still moves the weights a full step, so a non-finite step must be skipped
    before it reaches the momentum buffer: step through `GradScaler.step` or
    `common.training.step_optimizer`, both of which skip it.

Why NS never runs in fp16.
    The iteration squares the matrix and applies a polynomial with coefficients near 4.8; fp16's 5-bit
    exponent (max 65504) overflows or underflows on real gradients, while bf16 has fp32's range and the
    iteration is built to tolerate bf16's short mantissa. NS runs in bf16 like torch (or fp32 on request);
    fp16 weights/gradients are orthogonalised in fp32, as are weights on a GPU without bf16.

MuonAdamW is one `torch.optim.Optimizer` (one object to checkpoint, schedule, scale and clip) with
param_groups[0] = Muon (hidden >=2-D weights) and param_groups[1] = AdamW (everything else), the AdamW
half being torch's own functional AdamW, so it works unchanged with LambdaLR, GradScaler, clip_grad_norm_
and state_dict/load_state_dict.
"""

from __future__ import annotations

import functools
import inspect
import math
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.optim.adamw import adamw as functional_adamw

from common.errors import ConfigError

DEFAULT_NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
MUON_EPS = 1e-7
ADJUST_LR_FNS = (None, "original", "match_rms_adamw", "spectral_unclamped")
NS_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


# ----------------------------------------------------------------------------------------------- maths


def zeropower_via_newtonschulz(
    g: Tensor, ns_coefficients: Sequence[float], ns_steps: int, eps: float, dtype: torch.dtype = torch.bfloat16
) -> Tensor:
    """Approximately orthogonalise a 2-D matrix (U S V^T -> U S' V^T, S' ~ 1), same ops as torch's; or
    each matrix of a [n, rows, cols] stack at once (`batched_ns`: one bmm per product instead of n
    small matmuls), each normalised by its own Frobenius norm."""
    if g.ndim not in (2, 3):
        raise ValueError(f"Newton–Schulz needs a 2-D matrix (or a 3-D stack of them), got shape {tuple(g.shape)}")
    if dtype == torch.float16:
        raise ValueError("Newton–Schulz must not run in float16 (overflows); use bfloat16 or float32")
    a, b, c = ns_coefficients
    x = g.to(dtype, copy=True)  # a copy: never normalise the caller's momentum buffer in place
    tall = g.size(-2) > g.size(-1)
    if tall:
        x = x.mT
    if x.ndim == 2:
        x.div_(x.norm().clamp(min=eps))  # spectral norm <= Frobenius norm <= 1
        for _ in range(ns_steps):
            gram = x @ x.T
            poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)
            x = torch.addmm(x, poly, x, beta=a)
    else:
        x.div_(torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True).clamp(min=eps))
        for _ in range(ns_steps):
            gram = torch.bmm(x, x.mT)
            poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
            x = torch.baddbmm(x, poly, x, beta=a)
    return x.mT if tall else x


def adjust_lr(lr: float, adjust_lr_fn: str | None, rows: int, cols: int) -> float:
    """torch.optim.Muon's shape-dependent step size, for the (rows, cols) matrix being orthogonalised."""
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        ratio = math.sqrt(max(1, rows / cols))
    elif adjust_lr_fn == "match_rms_adamw":
        ratio = 0.2 * math.sqrt(max(rows, cols))
    elif adjust_lr_fn == "spectral_unclamped":
        ratio = math.sqrt(rows / cols)
    else:
        raise ValueError(f"adjust_lr_fn must be one of {ADJUST_LR_FNS}, got {adjust_lr_fn!r}")
    return lr * ratio


@functools.cache
def _cuda_has_bf16(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 8


def ns_compute_dtype(t: Tensor, ns_dtype: str) -> torch.dtype:
    """The dtype NS runs in for this gradient: `ns_dtype`, but fp32 for fp16 tensors or a GPU without bf16."""
    if ns_dtype not in NS_DTYPES:
        raise ValueError(f"ns_dtype must be one of {list(NS_DTYPES)} (never float16), got {ns_dtype!r}")
    dtype = NS_DTYPES[ns_dtype]
    if t.dtype == torch.float16:
        return torch.float32
    if dtype == torch.bfloat16 and t.is_cuda and not _cuda_has_bf16(t.device.index or 0):
        return torch.float32
    return dtype


def _muon_group_step(state: dict, group: dict, finite: Tensor | None = None, grad_scale: Tensor | None = None,
                     batched_ns: bool = False) -> None:
    """One Muon step over a param group (torch.optim.Muon's `_single_tensor_muon`, for N-D weights).

    `finite` (a 0-d bool tensor; None: always step) decides on the device whether the step counts: a
    skipped step lerps the momentum towards itself (it stays bitwise as it was, a NaN gradient never
    reaches it), multiplies the weights by 1 and adds a zero update. With `finite` true the arithmetic
    is bitwise that of the unmasked step. `grad_scale`: gradients still multiplied by an fp16 loss scale
    (`GradScaler.step` on an optimizer that unscales by itself). `batched_ns`: Newton–Schulz on a stack
    of the weights of one shape at once (`zeropower_via_newtonschulz`)."""
    lr = float(group["lr"])
    weight_decay, momentum = group["weight_decay"], group["momentum"]
    decay: float | Tensor = 1 - lr * weight_decay
    if finite is not None:
        decay = torch.where(finite, decay, 1.0)  # fp32 weights: bitwise the scalar multiply (test_muon)
    ns = (group["ns_coefficients"], group["ns_steps"], group["eps"])

    def apply(p: Tensor, matrix: Tensor, ortho: Tensor) -> None:
        step_lr = adjust_lr(lr, group["adjust_lr_fn"], matrix.shape[0], matrix.shape[1])
        p.mul_(decay)
        ortho = ortho.reshape(p.shape)
        p.add_(ortho if finite is None else torch.where(finite, ortho, 0.0), alpha=-step_lr)

    work = []  # batched_ns: (weight, its (rows, cols) update, NS dtype)
    for p in group["params"]:
        if p.grad is None:
            continue
        grad = p.grad
        if grad.is_sparse or torch.is_complex(p):
            raise RuntimeError("Muon supports only dense real gradients")
        if grad_scale is not None:
            grad = grad / grad_scale.to(grad.device)
        st = state[p]
        if "momentum_buffer" not in st:
            st["momentum_buffer"] = torch.zeros_like(grad, memory_format=torch.preserve_format)
        buf = st["momentum_buffer"]
        buf.lerp_(grad if finite is None else torch.where(finite, grad, buf), 1 - momentum)
        update = grad.lerp(buf, momentum) if group["nesterov"] else buf
        matrix = update.reshape(update.shape[0], -1)
        dtype = ns_compute_dtype(matrix, group["ns_dtype"])
        if batched_ns:  # orthogonalised below, with the other weights of its shape
            work.append((p, matrix, dtype))
        else:  # one weight at a time: its update tensors live only this long
            apply(p, matrix, zeropower_via_newtonschulz(matrix, *ns, dtype))
    orthos = _batched_newton_schulz([(m, d) for _, m, d in work], ns)
    for (p, matrix, _), ortho in zip(work, orthos):
        apply(p, matrix, ortho)


def _batched_newton_schulz(work: list[tuple[Tensor, torch.dtype]], ns: tuple) -> list[Tensor]:
    """NS of every (matrix, dtype) in `work`, the matrices of one shape, dtype and device stacked and
    orthogonalised as one [n, rows, cols] batch; returned in `work`'s order."""
    out: list[Tensor | None] = [None] * len(work)
    by_kind: dict[tuple, list[int]] = {}
    for i, (m, dtype) in enumerate(work):
        by_kind.setdefault((tuple(m.shape), m.dtype, m.device, dtype), []).append(i)
    for (_, _, _, dtype), index in by_kind.items():
        if len(index) == 1:
            out[index[0]] = zeropower_via_newtonschulz(work[index[0]][0], *ns, dtype)
            continue
        stacked = zeropower_via_newtonschulz(torch.stack([work[i][0] for i in index]), *ns, dtype)
        for j, i in enumerate(index):
            out[i] = stacked[j]
    return out  # type: ignore[return-value]


def _check_muon_args(lr: float, momentum: float, weight_decay: float, ns_coefficients: Sequence[float],
                     ns_steps: int, adjust_lr_fn: str | None, ns_dtype: str) -> None:
    if not 0.0 <= float(lr):
        raise ValueError(f"Muon lr must be >= 0, got {lr}")
    if not 0.0 <= momentum:
        raise ValueError(f"Muon momentum must be >= 0, got {momentum}")
    if not 0.0 <= weight_decay:
        raise ValueError(f"Muon weight_decay must be >= 0, got {weight_decay}")
    if len(ns_coefficients) != 3:
        raise ValueError(f"ns_coefficients must be 3 numbers (a, b, c), got {ns_coefficients}")
    if not 0 <= ns_steps < 100:
        raise ValueError(f"ns_steps must be in [0, 100), got {ns_steps}")
    if adjust_lr_fn not in ADJUST_LR_FNS:
        raise ValueError(f"adjust_lr_fn must be one of {ADJUST_LR_FNS}, got {adjust_lr_fn!r}")
    if ns_dtype not in NS_DTYPES:
        raise ValueError(f"ns_dtype must be one of {list(NS_DTYPES)} (never float16), got {ns_dtype!r}")


class Muon(Optimizer):
    """`torch.optim.Muon` for N-D weights: each weight is orthogonalised as its (out, -1) view.

    Only for hidden >=2-D weights; biases, norms, embeddings, first/last layers belong to AdamW (use
    `MuonAdamW`). `ns_dtype` ("bfloat16" as torch, or "float32") is the extra knob; fp16 is refused.
    `batched_ns`: Newton–Schulz on all weights of one shape as one batch (`_batched_newton_schulz`).
    Skips a non-finite step on the device (`skip_inputs`).
    """

    _step_supports_amp_scaling = True  # GradScaler.step hands over found_inf (and grad_scale): no host sync

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_coefficients: tuple[float, float, float] = DEFAULT_NS_COEFFICIENTS,
        eps: float = MUON_EPS,
        ns_steps: int = 5,
        adjust_lr_fn: str | None = None,
        ns_dtype: str = "bfloat16",
        batched_ns: bool = False,
    ) -> None:
        _check_muon_args(lr, momentum, weight_decay, ns_coefficients, ns_steps, adjust_lr_fn, ns_dtype)
        self.batched_ns = bool(batched_ns)  # an attribute, not a group key: a resume follows this run's config
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        ns_coefficients=tuple(ns_coefficients), eps=eps, ns_steps=ns_steps,
                        adjust_lr_fn=adjust_lr_fn, ns_dtype=ns_dtype)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim < 2:
                    raise ValueError(
                        f"Muon needs >=2-D weights, got a parameter of shape {tuple(p.shape)}; "
                        "send biases and norm gains to AdamW (MuonAdamW does this split for you)"
                    )

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        finite, grad_scale = skip_inputs(self)
        for group in self.param_groups:
            _muon_group_step(self.state, group, finite, grad_scale, self.batched_ns)
        return loss


# ------------------------------------------------------------------------------------------ the split

_EMBEDDINGS = (nn.Embedding, nn.EmbeddingBag)
_NORMS = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm, nn.LocalResponseNorm, nn.RMSNorm)


def _layer_name(param_name: str) -> str:
    """The module a parameter belongs to: `a.conv.parametrizations.weight.original0` -> `a.conv`."""
    parts = param_name.split(".")
    if "parametrizations" in parts:
        cut = len(parts) - 1 - parts[::-1].index("parametrizations")
        return ".".join(parts[:cut])
    return ".".join(parts[:-1])


def _is_weight_norm_magnitude(name: str) -> bool:
    parts = name.split(".")
    old_style = parts[-1] == "weight_g"
    new_style = len(parts) >= 3 and parts[-3] == "parametrizations" and parts[-1] == "original0"
    return old_style or new_style


def _adamw_reason(name: str, p: Tensor, layer: nn.Module | None, excluded_by_module: bool,
                  exclude: Sequence[str], edge_layers: set[str]) -> str | None:
    """Why `name` goes to AdamW, or None when it is a hidden weight for Muon."""
    if p.ndim < 2:
        return "1-D"
    if torch.is_complex(p):
        return "complex"
    if getattr(p, "_no_muon", False):
        return "_no_muon"
    if excluded_by_module:
        return "muon_exclude"
    hit = next((s for s in exclude if s in name), None)
    if hit is not None:
        return f"exclude {hit!r}"
    if _is_weight_norm_magnitude(name):
        return "weight-norm magnitude"
    if _layer_name(name) in edge_layers:
        return "first/last layer"
    if isinstance(layer, _EMBEDDINGS):
        return "embedding"
    if isinstance(layer, _NORMS):
        return "norm"
    if isinstance(layer, nn.modules.conv._ConvNd) and layer.groups > 1:
        return "grouped conv"
    if min(p.shape[0], p.numel() // max(p.shape[0], 1)) == 1:
        return "vector"  # orthogonalising a single row/column only normalises it
    return None


def _named_split(model: nn.Module, exclude: Sequence[str]) -> list[tuple[str, Tensor, str | None]]:
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"MuonAdamW/split_params need the model (an nn.Module) to tell hidden weights from the rest, "
            f"got {type(model).__name__}; for a plain parameter list use Muon or torch.optim.AdamW"
        )
    if isinstance(exclude, str):
        exclude = (exclude,)
    exclude = tuple(exclude)
    if not all(isinstance(s, str) and s for s in exclude):
        raise ValueError(f"exclude must be a list of non-empty name substrings, got {exclude!r}")
    all_named = list(model.named_parameters())
    names = [n for n, _ in all_named]
    for s in exclude:
        if not any(s in n for n in names):
            raise ValueError(
                f"exclude entry {s!r} matches no parameter name (e.g. {names[:3]}); fix or drop it"
            )
    modules = dict(model.named_modules())
    # First and last layer = the first/last module owning parameters, in registration order.
    edge_layers = {_layer_name(all_named[0][0]), _layer_name(all_named[-1][0])} if all_named else set()

    out = []
    for name, p in all_named:
        if not p.requires_grad:
            continue
        layer_name = _layer_name(name)
        parts = layer_name.split(".") if layer_name else []
        ancestors = [modules.get(".".join(parts[:i])) for i in range(len(parts) + 1)]
        by_module = any(getattr(m, "muon_exclude", False) for m in ancestors if m is not None)
        reason = _adamw_reason(name, p, modules.get(layer_name), by_module, exclude, edge_layers)
        out.append((name, p, reason))
    return out


def check_split(model: nn.Module, muon_named: list[tuple[str, Tensor]],
                adamw_named: list[tuple[str, Tensor]]) -> None:
    """Every trainable parameter in exactly one group, nothing else; else a RuntimeError naming them."""
    trainable = {id(p): n for n, p in model.named_parameters() if p.requires_grad}
    seen: dict[int, int] = {}
    for _, p in muon_named + adamw_named:
        seen[id(p)] = seen.get(id(p), 0) + 1
    twice = [trainable.get(i, "?") for i, c in seen.items() if c > 1]
    missing = [n for i, n in trainable.items() if i not in seen]
    foreign = [n for n, p in muon_named + adamw_named if id(p) not in trainable]
    if twice or missing or foreign:
        raise RuntimeError(
            "Muon/AdamW split is broken: every trainable parameter must be in exactly one group. "
            f"In both: {twice}; in neither: {missing}; frozen or not in the model: {foreign}"
        )


def split_params(
    model: nn.Module, exclude: Sequence[str] = ()
) -> tuple[list[tuple[str, Tensor]], list[tuple[str, Tensor]]]:
    """(muon_named, adamw_named) over the trainable parameters of `model`, registration order.

    AdamW gets: 1-D params (biases, norm gains), embeddings, norm layers, weight-norm magnitudes (old
    `weight_g` and new `parametrizations.weight.original0`), every parameter of the first and last
    module that owns parameters in registration order (an NSF-HiFiGAN generator: conv_post, and conv_pre
    only with the mini-NSF source; with the full NSF source the first is m_source.l_linear, so conv_pre
    stays on Muon, as in openvpi's Muon_AdamW, which learned better there: bench/README.md, its section on
    Muon and conv_pre; a KL autoencoder: encoder.conv_in and post_quant_conv), grouped/depthwise convs (their
    (out, -1) view mixes unrelated groups), vectors (a side of 1), and whatever the model marks: `exclude`
    name substrings, `muon_exclude = True` on a module (covers its children), `_no_muon = True` on a
    parameter. Everything else (hidden >=2-D weights, incl. weight-norm direction `original1`) -> Muon.
    """
    split = _named_split(model, exclude)
    muon_named = [(n, p) for n, p, reason in split if reason is None]
    adamw_named = [(n, p) for n, p, reason in split if reason is not None]
    check_split(model, muon_named, adamw_named)
    return muon_named, adamw_named


# -------------------------------------------------------------------------------------------- MuonAdamW


def _scalar_dtype() -> torch.dtype:
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def skip_inputs(optimizer: Optimizer) -> tuple[Tensor | None, Tensor | None]:
    """(finite, grad_scale) for an optimizer with `_step_supports_amp_scaling`: `GradScaler.step` (and
    `common.training.step_optimizer`) set `found_inf` (a float tensor, nonzero: skip this step) and
    `grad_scale` (None when the gradients are already unscaled) as attributes for the step's duration."""
    found_inf = getattr(optimizer, "found_inf", None)
    return (None if found_inf is None else found_inf == 0), getattr(optimizer, "grad_scale", None)


def step_kept_where(finite: Tensor, tensors: list[Tensor], update: Callable[[], None]) -> None:
    """Runs `update` (which changes `tensors` in place) and keeps its result only where the 0-d bool
    `finite` is true: copies before, `torch.where` after, so the skip is decided on the device and a
    finite step is bitwise the plain one (where picks its result unchanged). Costs one copy of the
    tensors and a pass over them. A tensor on another device than `finite` (torch keeps a non-fused
    Adam's step counts on the CPU) gets `finite` copied over, which waits for the device: the fused
    kernels, which skip by themselves, are the sync-free way there."""
    saved = [t.clone() for t in tensors]
    update()
    for t, old in zip(tensors, saved):
        keep = finite if t.device == finite.device else finite.to(t.device)
        t.copy_(torch.where(keep, t, old))


def fused_adamw_default(parameters: Iterable[Tensor]) -> bool:
    """Whether AdamW runs fused by default (`fused=None`): when every parameter is on CUDA. Why: the fused
    kernel takes the skip (`found_inf`) and the fp16 scale itself, with no copy of the state and no host
    sync. On the CPU torch's own default (per-tensor) stays: the trainer digests pin its numerics (CPU
    timings: bench/README.md, "Optimizer step"; a GPU run must confirm fused is the faster there)."""
    params = list(parameters)
    return bool(params) and all(p.is_cuda for p in params)


class MuonAdamW(Optimizer):
    """Muon on hidden >=2-D weights (param_groups[0]) + torch's AdamW on the rest (param_groups[1]).

    `lr`, `betas`, `eps`, `weight_decay` are AdamW's; Muon uses `muon_lr` (default `lr`: with
    adjust_lr_fn="match_rms_adamw" Muon reuses AdamW's lr and weight decay, Moonshot's recipe) and
    `muon_weight_decay` (default `weight_decay`). See `split_params` for who goes where.

    A non-finite step is skipped on the device (`skip_inputs`: `found_inf` from `step_optimizer` or
    `GradScaler.step`), so the step never waits for the host. `fused` (None: on CUDA, `fused_adamw_default`)
    runs the AdamW half in torch's fused kernel, which takes `found_inf` itself; its numerics are the fused
    kernel's, not the per-tensor path's (the CPU default, which the digests pin). `batched_ns`: see `Muon`.
    """

    _step_supports_amp_scaling = True  # GradScaler.step hands over found_inf (and grad_scale): no host sync

    def __init__(
        self,
        model: nn.Module,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        adjust_lr_fn: str | None = "match_rms_adamw",
        muon_lr: float | None = None,
        muon_weight_decay: float | None = None,
        exclude: Sequence[str] = (),
        ns_coefficients: tuple[float, float, float] = DEFAULT_NS_COEFFICIENTS,
        ns_dtype: str = "bfloat16",
        batched_ns: bool = False,
        fused: bool | None = None,
    ) -> None:
        muon_lr = lr if muon_lr is None else muon_lr
        muon_weight_decay = weight_decay if muon_weight_decay is None else muon_weight_decay
        _check_muon_args(muon_lr, momentum, muon_weight_decay, ns_coefficients, ns_steps, adjust_lr_fn,
                         ns_dtype)
        betas = tuple(float(b) for b in betas)
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {betas}")
        if not 0.0 <= lr or not 0.0 <= eps or not 0.0 <= weight_decay:
            raise ValueError(f"lr, eps and weight_decay must be >= 0, got {lr}, {eps}, {weight_decay}")
        muon_named, adamw_named = split_params(model, exclude)
        if not muon_named and not adamw_named:
            raise ValueError("MuonAdamW got a model with no trainable parameters")
        groups = [
            dict(params=[p for _, p in muon_named], param_names=[n for n, _ in muon_named], use_muon=True,
                 lr=muon_lr, weight_decay=muon_weight_decay, momentum=momentum, nesterov=nesterov,
                 ns_coefficients=tuple(ns_coefficients), eps=MUON_EPS, ns_steps=ns_steps,
                 adjust_lr_fn=adjust_lr_fn, ns_dtype=ns_dtype),
            dict(params=[p for _, p in adamw_named], param_names=[n for n, _ in adamw_named],
                 use_muon=False, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay),
        ]
        super().__init__(groups, dict(lr=lr))
        # attributes, not group keys: a resume follows this run's config, not the checkpoint's
        self.batched_ns = bool(batched_ns)
        self.fused = fused_adamw_default(model.parameters()) if fused is None else bool(fused)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        finite, grad_scale = skip_inputs(self)
        for group in self.param_groups:
            if group["use_muon"]:
                _muon_group_step(self.state, group, finite, grad_scale, self.batched_ns)
            else:
                self._adamw_group_step(group, finite, grad_scale)
        return loss

    def _adamw_group_step(self, group: dict, finite: Tensor | None = None, grad_scale: Tensor | None = None) -> None:
        """torch.optim.AdamW's step (same state keys, same functional kernel, same foreach default); a
        skipped step (`finite` false) leaves weights, moments and step counts bitwise as they were."""
        params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError("AdamW does not support sparse gradients")
            st = self.state[p]
            if not st:
                # the fused kernel keeps the step count beside the weight; torch's other paths on the CPU
                st["step"] = (torch.zeros((), dtype=torch.float32, device=p.device) if self.fused
                              else torch.tensor(0.0, dtype=_scalar_dtype()))
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            want = p.device if self.fused else torch.device("cpu")
            if st["step"].device != want:  # a checkpoint of the other kind (once, after a resume)
                st["step"] = st["step"].to(want, torch.float32 if self.fused else _scalar_dtype())
            params.append(p)
            grads.append(p.grad)
            exp_avgs.append(st["exp_avg"])
            exp_avg_sqs.append(st["exp_avg_sq"])
            steps.append(st["step"])
        if not params:
            return
        beta1, beta2 = group["betas"]

        def update(**skip: Any) -> None:
            functional_adamw(
                params, grads, exp_avgs, exp_avg_sqs, [], steps, **skip,
                has_complex=any(torch.is_complex(p) for p in params),
                amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"],
                eps=group["eps"], maximize=False,
            )

        if self.fused:  # the kernel unscales and skips by itself
            update(fused=True, grad_scale=grad_scale, found_inf=None if finite is None else (~finite).float())
            return
        if grad_scale is not None:
            torch._foreach_div_(grads, grad_scale.to(grads[0].device))
        if finite is None:
            update()
        else:
            step_kept_where(finite, [*params, *exp_avgs, *exp_avg_sqs, *steps], update)


Muon_AdamW = MuonAdamW

# ------------------------------------------------------------------------------------------ from config

OPTIMIZER_ALIASES = {
    "AdamW": "torch.optim.AdamW",
    "Adam": "torch.optim.Adam",
    "MuonAdamW": "common.muon.MuonAdamW",
    "Muon_AdamW": "common.muon.MuonAdamW",
    "modules.optimizer.muon.Muon_AdamW": "common.muon.MuonAdamW",  # the seed recipes' own copy: ours replaces it
}
# Where a dotted `optimizer_cls` may point: a config names a class, never code to run, so the name is looked
# up in these two modules (already imported) and nothing is ever imported from a config's string.
OPTIMIZER_NAMESPACES = ("torch.optim", "common.muon")


def _namespace_optimizers(prefix: str) -> dict[str, type]:
    module = torch.optim if prefix == "torch.optim" else sys.modules[__name__]
    return {f"{prefix}.{name}": obj for name, obj in vars(module).items()
            if not name.startswith("_") and inspect.isclass(obj) and issubclass(obj, Optimizer)
            and obj is not Optimizer}


def accepted_optimizers() -> str:
    """The `optimizer_cls` values build_optimizer takes, in words (its refusal lists them)."""
    dotted = [n for prefix in OPTIMIZER_NAMESPACES for n in sorted(_namespace_optimizers(prefix), key=str.lower)]
    return f"an alias ({', '.join(OPTIMIZER_ALIASES)}) or one of {', '.join(dotted)}"


def optimizer_class(cls_name: Any, key: str = "optimizer_cls") -> type[Optimizer]:
    """The optimizer class `cls_name` names: an alias (OPTIMIZER_ALIASES) or `torch.optim.<Name>` /
    `common.muon.<Name>` of a torch.optim.Optimizer subclass. Anything else: ConfigError (exit 2) naming
    `key` and the accepted values; no module is imported for it."""
    name = OPTIMIZER_ALIASES.get(cls_name, cls_name) if isinstance(cls_name, str) else None
    prefix = name.rpartition(".")[0] if name else ""
    if prefix in OPTIMIZER_NAMESPACES:
        cls = _namespace_optimizers(prefix).get(name)
        if cls is not None:
            return cls
    raise ConfigError(f"{key}: unknown optimizer class {cls_name!r}; use {accepted_optimizers()}")


# the fast-path keys every trainer has beside its optimizer, and the optimizers that take each
FAST_PATH_KEYS = {"fused": ("AdamW", "Adam", "MuonAdamW"),  # torch's fused AdamW kernel (MuonAdamW: its AdamW half)
                  "batched_ns": ("MuonAdamW", "common.muon.Muon")}  # Newton-Schulz batched over weights of one shape


def build_optimizer(cls_name: str, model: nn.Module, *, key: str = "optimizer_cls", fused: bool | None = None,
                    batched_ns: bool | None = None, prefix: str = "", **kwargs: Any) -> Optimizer:
    """The optimizer a config names (`optimizer_cls` + its args) over `model`'s trainable parameters.

    `cls_name`: an alias (AdamW, Adam, MuonAdamW, Muon_AdamW) or `torch.optim.<Name>` / `common.muon.<Name>`
    of a torch.optim.Optimizer subclass (`optimizer_class`; anything else: ConfigError naming `key`, exit 2).
    `beta1`/`beta2` (the seed configs' spelling) become `betas`. The fast-path keys (a trainer's `<prefix>fused`,
    `<prefix>batched_ns`): `fused` None = AdamW/Adam (and MuonAdamW's AdamW half) run torch's fused kernel on
    CUDA and the per-tensor path elsewhere (`fused_adamw_default`), True/False = that kernel or not on any
    device; `batched_ns` (Muon's Newton-Schulz over a stack of same-shape weights) None = off. Either set for
    an optimizer that does not take it is a ConfigError naming the key.
    """
    cls = optimizer_class(cls_name, key)
    for name, value in (("fused", fused), ("batched_ns", batched_ns)):
        if value is None:
            continue
        takes = [optimizer_class(n) for n in FAST_PATH_KEYS[name]]
        if cls not in takes:
            raise ConfigError(f"{prefix}{name}={str(bool(value)).lower()}: {cls_name} does not take it; the key is "
                              f"for {', '.join(FAST_PATH_KEYS[name])} (remove it, or set {key} to one of them)")
        kwargs[name] = bool(value)

    if "beta1" in kwargs or "beta2" in kwargs:
        if "betas" in kwargs:
            raise ValueError("give either betas or beta1/beta2 in the optimizer arguments, not both")
        kwargs["betas"] = (float(kwargs.pop("beta1", 0.9)), float(kwargs.pop("beta2", 0.999)))
    if "betas" in kwargs:
        kwargs["betas"] = tuple(kwargs["betas"])

    if issubclass(cls, MuonAdamW):
        target: Any = model
    else:
        target = [p for p in model.parameters() if p.requires_grad]
        if not target:
            raise ValueError(f"{cls_name}: the model has no trainable parameters")
        if cls in (torch.optim.AdamW, torch.optim.Adam) and not {"fused", "foreach"} & set(kwargs) \
                and fused_adamw_default(target):
            kwargs["fused"] = True  # skips a non-finite step on the device (fused_adamw_default)
    try:
        return cls(target, **kwargs)
    except TypeError as exc:
        accepted = [n for n in inspect.signature(cls).parameters if n not in ("self", "params", "model")]
        raise TypeError(f"{cls_name} rejected the arguments {sorted(kwargs)} ({exc}); it accepts {accepted}") from None
