"""speech.plots: the pictures render headless, reject wrong shapes, and the side-by-side one is small
enough to commit (common.log.save_figure writes it)."""

import numpy as np
import pytest
import torch
from PIL import Image

from common.log import save_figure
from speech.plots import plot_alignment, plot_spectrogram, plot_spectrograms


def test_plots_reject_wrong_shapes():
    with pytest.raises(ValueError, match=r"\[F, T\]"):
        plot_spectrogram(np.zeros((1, 4, 4)))
    with pytest.raises(ValueError, match="T_text"):
        plot_alignment(np.zeros(5))


def test_side_by_side_picture_is_a_small_png(tmp_path):
    a = np.random.default_rng(0).normal(size=(80, 120))
    path = save_figure(plot_spectrograms([("ground truth", a), ("generated", torch.from_numpy(a * 0.5))],
                                         title="t", hop_seconds=0.01), tmp_path / "sub" / "pair.png")
    with Image.open(path) as im:
        assert im.format == "PNG" and im.width > 2 * im.height  # two panels side by side
    assert path.stat().st_size < 100_000
    with pytest.raises(ValueError, match="panel 'x'"):
        plot_spectrograms([("x", np.zeros(5))])
    with pytest.raises(ValueError, match="at least one"):
        plot_spectrograms([])
