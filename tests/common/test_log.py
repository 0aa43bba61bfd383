"""RunLogger writes what TensorBoard reads back; plots render headless; Progress arithmetic."""

import io

import numpy as np
import pytest
import soundfile as sf
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from common.log import Progress, RunLogger
from speech.plots import plot_alignment, plot_spectrogram


def test_run_logger_round_trip(tmp_path, capsys):
    log = RunLogger(tmp_path / "tb")
    log.scalar("loss/total", torch.tensor(1.5), 3)
    log.scalars({"mel": torch.tensor(0.25), "fm": 2.0, "lr": np.float32(1e-4)}, step=3, prefix="train")
    log.audio("val/wav", torch.linspace(-3, 3, 800), sr=8000, step=3)  # out of range: clipped
    log.image("val/img_chw", torch.rand(3, 16, 24), 3)
    log.image("val/img_hwc", np.full((10, 12, 3), 200, np.uint8), 3)
    log.figure("val/mel", plot_spectrogram(torch.randn(20, 50), title="mel"), 3)
    log.figure("val/align", plot_alignment(np.random.rand(7, 40)), 3)
    log.text("config", "batch_size: 2", 0)
    log.close()

    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0, "images": 0, "audio": 0})
    acc.Reload()
    tags = acc.Tags()
    assert set(tags["scalars"]) == {"loss/total", "train/mel", "train/fm", "train/lr"}
    assert acc.Scalars("loss/total")[0].value == 1.5 and acc.Scalars("loss/total")[0].step == 3
    assert acc.Scalars("train/mel")[0].value == 0.25
    assert acc.Scalars("train/lr")[0].value == pytest.approx(1e-4)
    assert set(tags["images"]) == {"val/img_chw", "val/img_hwc", "val/mel", "val/align"}
    img = acc.Images("val/img_chw")[0]
    assert (img.width, img.height) == (24, 16)
    assert (acc.Images("val/img_hwc")[0].width, acc.Images("val/img_hwc")[0].height) == (12, 10)
    assert acc.Images("val/mel")[0].width == 1000  # 10 in at 100 dpi
    audio = acc.Audio("val/wav")[0]
    assert audio.sample_rate == 8000 and audio.length_frames == 800
    wav, _ = sf.read(io.BytesIO(audio.encoded_audio_string))
    assert wav.min() == pytest.approx(-1, abs=1e-3) and wav.max() == pytest.approx(1, abs=1e-3)
    assert np.mean(np.abs(wav) > 0.999) > 0.5  # two thirds of the ramp clipped
    assert "out of range" not in capsys.readouterr().out  # we clipped, not TensorBoard


def test_disabled_logger_is_a_no_op(tmp_path):
    log = RunLogger(tmp_path / "off", enabled=False)
    log.scalar("a", 1.0, 0)
    log.scalars({"b": torch.tensor(2.0)}, 0)
    log.audio("c", np.zeros(10), 100, 0)
    log.image("d", torch.zeros(3, 4, 4), 0)
    log.figure("e", plot_spectrogram(np.zeros((4, 4))), 0)
    log.flush()
    log.close()
    assert not (tmp_path / "off").exists()


def test_progress_data_wait_fraction():
    p = Progress(total_steps=100, enabled=False)
    assert p.data_wait_fraction == 0.0
    p.update(1, data_s=1.0, step_s=3.0)
    p.update(2, data_s=0.0, step_s=4.0)
    assert p.data_wait_fraction == pytest.approx(1 / 8)
    w = Progress(total_steps=100, enabled=False, window=2)  # sliding window drops the oldest
    for i, (d, s) in enumerate([(9.0, 1.0), (1.0, 1.0), (1.0, 3.0)]):
        w.update(i + 1, d, s)
    assert w.data_wait_fraction == pytest.approx(2 / 6)


def test_progress_counts_the_samples_each_step_held_when_batches_vary():
    """A frame budget makes a long utterance's batch smaller: samples/s is the window's samples over its
    busy seconds, not the step rate times a fixed batch size; without counts, the fixed size as before."""
    varying = Progress(total_steps=10, enabled=False, samples_per_step=64)
    for step, (n, s) in enumerate([(64, 1.0), (8, 1.0), (24, 2.0)]):
        varying.update(step + 1, 0.0, s, samples=n)
    assert varying.samples_per_second() == pytest.approx(96 / 4)
    fixed = Progress(total_steps=10, enabled=False, samples_per_step=8)
    fixed.update(1, 0.0, 0.5), fixed.update(2, 0.0, 0.5)
    assert fixed.samples_per_second() == pytest.approx(8 / 0.5)


def test_progress_bar_shows_rates_and_metrics(capsys):
    p = Progress(total_steps=10, initial=2, samples_per_step=8, desc="train")
    p.bar.mininterval = 0  # draw on every update
    for step in range(3, 6):
        p.update(step, data_s=0.01, step_s=0.03, loss=torch.tensor(0.123456), lr=2e-4, epoch=1)
    assert p.bar.n == 5
    text = str(p.bar)
    assert "loss=0.123" in text and "lr=0.0002" in text and "epoch=1" in text
    assert "samples/s" in text and "mem=" in text and "data_wait=25%" in text
    p.close()
    assert "train" in capsys.readouterr().err


def test_a_resumed_run_purges_what_an_earlier_attempt_logged_after_its_checkpoint(tmp_path):
    """Resumed at step 5 while the first attempt had logged up to step 9: one curve, not two overlapping."""
    first = RunLogger(tmp_path)
    for step in range(10):
        first.scalar("train/loss", 1.0, step)
    first.close()
    resumed = RunLogger(tmp_path, purge_step=5)
    for step in range(5, 8):
        resumed.scalar("train/loss", 2.0, step)
    resumed.close()
    events = EventAccumulator(str(tmp_path)).Reload().Scalars("train/loss")
    assert [(e.step, e.value) for e in events] == [(s, 1.0) for s in range(5)] + [(s, 2.0) for s in range(5, 8)]
