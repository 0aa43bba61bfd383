"""Speech pictures: a spectrogram, an alignment, and spectrograms side by side on one colour scale.

Moved out of `common/log.py`, which keeps what any trainer logs (images, figures, the LR plan, a
figure saved as a PNG). Built on `common.log.new_figure` (the Agg canvas directly, never pyplot): no display, no
global figure list; `common.log.RunLogger.figure` logs them and `common.log.save_figure` writes them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from common.log import new_figure
from speech.audio import _to_numpy

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ArrayLike = torch.Tensor | np.ndarray


def _heatmap(x: np.ndarray, figsize: tuple[float, float], xlabel: str, ylabel: str, title: str) -> Figure:
    fig = new_figure(figsize=figsize, dpi=100)
    ax = fig.add_subplot()
    im = ax.imshow(x, aspect="auto", origin="lower", interpolation="none")
    fig.colorbar(im, ax=ax)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig


def plot_spectrogram(spec: ArrayLike, title: str = "") -> Figure:
    """A [F, T] (log-)spectrogram, low frequencies at the bottom."""
    x = _to_numpy(spec)
    if x.ndim != 2:
        raise ValueError(f"plot_spectrogram expects a [F, T] array, got shape {x.shape}")
    return _heatmap(x, (10, 3), "frame", "bin", title)


def plot_alignment(attn: ArrayLike, title: str = "") -> Figure:
    """A [T_text, T_frames] alignment: text tokens on the y axis, decoder frames on the x axis."""
    x = _to_numpy(attn)
    if x.ndim != 2:
        raise ValueError(f"plot_alignment expects a [T_text, T_frames] array, got shape {x.shape}")
    return _heatmap(x, (6, 4), "decoder frame", "text token", title)


def plot_spectrograms(panels: list[tuple[str, ArrayLike]], vmin: float | None = None, vmax: float | None = None,
                      title: str = "", hop_seconds: float | None = None) -> Figure:
    """[F, T] (log-)spectrograms side by side on ONE colour scale (ground truth beside generated),
    so a flat or quiet output shows as a visibly different picture. `panels` = [(title, spec)];
    `vmin`/`vmax` default to the range of the first panel (the reference); `hop_seconds` labels
    the x axis in seconds instead of frames."""
    if not panels:
        raise ValueError("plot_spectrograms needs at least one (title, spectrogram) panel")
    arrays = [_to_numpy(x) for _, x in panels]
    for (name, _), x in zip(panels, arrays):
        if x.ndim != 2:
            raise ValueError(f"plot_spectrograms: panel '{name}' must be [F, T], got shape {x.shape}")
    lo = float(arrays[0].min()) if vmin is None else vmin
    hi = float(arrays[0].max()) if vmax is None else vmax
    fig = new_figure(figsize=(3.2 * len(panels) + 0.6, 2.6), dpi=80, layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (name, _), x in zip(axes, panels, arrays):
        t_max = x.shape[1] * hop_seconds if hop_seconds else x.shape[1]
        im = ax.imshow(x, aspect="auto", origin="lower", interpolation="none", vmin=lo, vmax=hi,
                       extent=(0, t_max, 0, x.shape[0]))
        ax.set_title(name, fontsize=8)
        ax.set_xlabel("seconds" if hop_seconds else "frame", fontsize=7)
        ax.tick_params(labelsize=6)
    axes[0].set_ylabel("mel bin", fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    cbar = fig.colorbar(im, ax=list(axes), fraction=0.03, pad=0.01)
    cbar.ax.tick_params(labelsize=6)
    cbar.set_label("log mel", fontsize=7)
    return fig
