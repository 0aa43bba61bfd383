"""Measure a model's *effective* initialisation (the weight a forward uses, after weight norm) against
an intended rule per tensor. Shared by the vocoder and VITS init tests.

Rules: ``"default"`` = PyTorch's default for conv/linear (weight and bias U(+-1/sqrt(fan_in)), fan_in
from the weight); ``("uniform", bound)``; ``("normal", std)``; ``"zeros"``. A tensor's std is checked against the rule within
six standard errors of a sample std, so a wrong rule (e.g. N(0, 0.01) instead of the default, 2-10x
apart) fails while the right one passes for any seed.
"""

from __future__ import annotations

import math

import torch
from torch import nn

Rule = str | tuple[str, float]


def _std_tolerance(n: int, kurtosis: float) -> float:
    """Six standard errors of a sample std, relative: se(s)/sigma ~ sqrt((kurtosis - 1) / n) / 2."""
    return 6 * 0.5 * math.sqrt((kurtosis - 1) / n)


def default_bound(weight: torch.Tensor) -> float:
    """The bound of PyTorch's default U(-b, b) init for this weight (and its layer's bias)."""
    fan_in, _ = nn.init._calculate_fan_in_and_fan_out(weight)
    return 1.0 / math.sqrt(fan_in)


def check_tensor(name: str, t: torch.Tensor, rule: Rule, bound: float) -> list[str]:
    """Problems of tensor ``t`` against ``rule`` (empty when it follows it)."""
    t = t.detach().double().flatten()
    n = t.numel()
    if rule == "zeros":
        return [] if bool((t == 0).all()) else [f"{name}: expected zeros, max |x| {t.abs().max():.3g}"]
    if rule == "default" or rule[0] == "uniform":
        bound = bound if rule == "default" else rule[1]
        std, kurt = bound / math.sqrt(3), 1.8
        if t.abs().max() > bound * (1 + 1e-4):
            return [f"{name}: max |x| {t.abs().max():.4g} exceeds the {rule} bound {bound:.4g}"]
    else:
        std, kurt = rule[1], 3.0
    if n < 16:
        return []  # too few values for a std; the bound check above still ran for "default"
    got = float(((t - t.mean()) ** 2).mean().sqrt()) if n > 1 else 0.0
    if abs(got / std - 1) > _std_tolerance(n, kurt):
        return [f"{name}: std {got:.4g}, rule {rule} wants {std:.4g} (n={n})"]
    return []


def check_model(model: nn.Module, rule_for) -> tuple[list[str], int]:
    """Check every conv / linear / embedding weight and bias of ``model``; ``rule_for(module_name,
    'weight'|'bias')`` gives the rule (None = not checked). Returns (problems, tensors checked)."""
    problems, checked = [], 0
    for mname, m in model.named_modules():
        if not isinstance(m, (nn.Conv1d, nn.Conv2d, nn.ConvTranspose1d, nn.Linear, nn.Embedding)):
            continue
        weight = m.weight  # effective (weight-norm parametrisation applied)
        bound = default_bound(weight) if weight.dim() > 1 else 0.0
        for pname, t in (("weight", weight), ("bias", getattr(m, "bias", None))):
            rule = rule_for(mname, pname) if t is not None else None
            if rule is None:
                continue
            problems += check_tensor(f"{mname}.{pname}", t, rule, bound)
            checked += 1
    return problems, checked
