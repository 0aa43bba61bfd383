"""Voice-cloning model: sizes, MAS-trained forward/backward, inference shapes, bucketed static shapes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.data import BucketBatchSampler
from tts.clone.config import SIZES, LossConfig, ModelConfig
from tts.clone.data import BucketCollate
from tts.clone.decoder import durations_to_path
from tts.clone.model import VoiceCloneTTS, count_parameters, parameter_counts
from tts.text import SYMBOLS

N_MELS = 80


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny shapes gain nothing from a second thread, and one thread cannot be slowed down by
    OpenMP threads waiting on each other when the CPU is shared (measured 5x slower at load 4)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_batch(b: int = 3, t_text: int = 12, t_frames: int = 60, t_ref: int = 40, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    text_len = torch.tensor([t_text, t_text - 3, t_text - 5][:b])
    mel_len = torch.tensor([t_frames, t_frames - 10, t_frames - 25][:b])
    text = torch.randint(1, len(SYMBOLS), (b, t_text), generator=g)
    text_mask = torch.arange(t_text)[None] < text_len[:, None]
    mel_mask = torch.arange(t_frames)[None] < mel_len[:, None]
    return {
        "text": text * text_mask, "text_mask": text_mask,
        "mel": torch.randn(b, N_MELS, t_frames, generator=g) - 5.0, "mel_mask": mel_mask,
        "ref_mel": torch.randn(b, N_MELS, t_ref, generator=g) - 5.0, "ref_mask": torch.ones(b, t_ref, dtype=torch.bool),
        "f0": 100.0 + 100.0 * torch.rand(b, t_frames, generator=g),
        "voiced": torch.rand(b, t_frames, generator=g) > 0.3,
    }


def run(model: VoiceCloneTTS, batch: dict) -> dict:
    return model(batch["text"], batch["text_mask"], batch["mel"], batch["mel_mask"], batch["ref_mel"],
                 batch["ref_mask"])


def test_size_table_matches_the_documented_normal_size():
    assert SIZES["normal"] == {"text": (512, 6, 8), "audio": (512, 6, 8), "decoder": (768, 8, 12)}


def test_normal_parameter_counts_without_a_forward():
    counts = parameter_counts("normal", n_vocab=len(SYMBOLS), n_mels=128)  # meta device: no memory
    print({k: f"{v / 1e6:.1f}M" for k, v in counts.items()})
    # 12·d² per transformer layer (+ AdaLN conditioning in the decoder): ~19 M, ~19 M, ~71 M
    assert 17e6 < counts["text_encoder"] < 21e6
    assert 17e6 < counts["ref_encoder"] < 22e6
    assert 60e6 < counts["decoder"] < 80e6
    assert 100e6 < counts["total"] < 130e6
    assert counts["total"] > parameter_counts("small")["total"] > parameter_counts("tiny")["total"]


@pytest.mark.parametrize("size", ["tiny", "small"])
def test_forward_shapes_per_size(size):
    torch.manual_seed(0)
    model = VoiceCloneTTS(ModelConfig(size=size), len(SYMBOLS), N_MELS)
    batch = make_batch(b=2, t_text=10, t_frames=40, t_ref=24)
    out = run(model, batch)
    b, t = 2, 40
    assert out["dec_mel"].shape == out["post_mel"].shape == (b, N_MELS, t)
    assert out["logf0"].shape == out["vuv"].shape == (b, t)
    assert out["path"].shape == (b, 10, t)
    assert out["spk"].shape == (b, SIZES[size]["audio"][0])
    assert count_parameters(model) == parameter_counts(size, len(SYMBOLS), N_MELS)["total"]


def test_tiny_forward_backward_with_mas_durations():
    torch.manual_seed(0)
    model = VoiceCloneTTS(ModelConfig(size="tiny"), len(SYMBOLS), N_MELS)
    batch = make_batch()
    out = run(model, batch)
    path, dur = out["path"], out["durations"]
    # MAS: every frame of an item belongs to exactly one of its symbols, in order, each symbol >= 1 frame
    assert torch.equal(path.sum(1), batch["mel_mask"].float())
    assert torch.equal(dur.sum(1), batch["mel_mask"].sum(1).float())
    assert bool((dur[batch["text_mask"]] >= 1).all()) and bool((dur[~batch["text_mask"]] == 0).all())
    owner = path.argmax(1)  # symbol index of each frame
    for i in range(path.shape[0]):
        n = int(batch["mel_mask"][i].sum())
        assert bool((owner[i, 1:n] - owner[i, : n - 1] >= 0).all())
    losses = model.losses(out, batch, LossConfig())
    assert set(losses) == {"loss", "mel", "postnet", "prior", "duration", "f0", "voiced"}
    losses["loss"].backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    missing = [n for n, g in grads.items() if g is None]
    assert not missing, f"parameters without gradient: {missing}"
    assert all(torch.isfinite(g).all() for g in grads.values())
    # the duration predictor learns from MAS with a stopped gradient: it cannot move the text encoder
    model.zero_grad()
    out = run(model, batch)
    model.losses(out, batch, LossConfig(mel=0, prior=0, f0=0, voiced=0))["loss"].backward()
    assert model.duration_predictor.conv1.weight.grad.abs().sum() > 0
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in model.text_encoder.parameters())


def test_a_few_steps_on_one_batch_lower_every_main_loss():
    torch.manual_seed(0)
    model = VoiceCloneTTS(ModelConfig(size="tiny", dropout=0.0), len(SYMBOLS), N_MELS)
    batch = make_batch()
    opt = torch.optim.AdamW(model.parameters(), 2e-3)
    first = None
    for _ in range(25):
        losses = model.losses(run(model, batch), batch, LossConfig())
        first = first or {k: float(v.detach()) for k, v in losses.items()}
        opt.zero_grad()
        losses["loss"].backward()
        opt.step()
    last = {k: float(v.detach()) for k, v in losses.items()}
    for k in ("loss", "mel", "postnet", "prior"):
        assert last[k] < 0.8 * first[k], (k, first[k], last[k])


def test_infer_uses_predicted_durations_and_reference():
    torch.manual_seed(0)
    model = VoiceCloneTTS(ModelConfig(size="tiny"), len(SYMBOLS), N_MELS).eval()
    with torch.no_grad():
        model.duration_predictor.out.bias.fill_(2.0)  # ~6 frames per symbol, as after some training
    batch = make_batch()
    out = model.infer(batch["text"], batch["text_mask"], batch["ref_mel"], batch["ref_mask"])
    frames = out["durations"].sum(1)
    assert out["mel"].shape[0] == 3 and out["mel"].shape[1] == N_MELS and out["mel"].shape[2] == int(frames.max())
    assert torch.equal(out["mel_mask"].sum(1), frames)
    assert bool((out["durations"][batch["text_mask"]] >= 1).all())
    assert bool((out["f0"][out["mel_mask"]] > 0).all())
    slow = model.infer(batch["text"], batch["text_mask"], batch["ref_mel"], batch["ref_mask"], length_scale=2.0)
    assert bool((slow["durations"].sum(1) > frames).all())
    other = model.infer(batch["text"], batch["text_mask"], batch["ref_mel"].flip(0), batch["ref_mask"])
    assert not torch.allclose(other["spk"], out["spk"])


def test_durations_to_path_is_a_hard_monotonic_path():
    d = torch.tensor([[2, 0, 3, 1], [1, 1, 0, 0]])
    p = durations_to_path(d, 7)
    assert p.shape == (2, 4, 7)
    assert torch.equal(p.sum(-1), d.float())
    assert torch.equal(p[0].argmax(0)[:6], torch.tensor([0, 0, 2, 2, 2, 3]))
    assert p[0, :, 6].sum() == 0 and p[1, :, 2:].sum() == 0  # frames past the total stay unassigned


def test_bucketed_batches_have_a_few_static_shapes():
    rng = np.random.default_rng(0)
    frames = rng.integers(80, 700, size=200).tolist()
    n_text = [max(5, f // 7 + int(rng.integers(-5, 5))) for f in frames]
    sampler = BucketBatchSampler(frames, 8, num_buckets=5, shuffle=True, seed=1, drop_last=True)
    collate = BucketCollate(frames, n_text, sampler.boundaries, ref_frames=64, frame_multiple=16, text_multiple=8)
    allowed = set(collate.shapes())
    assert len(allowed) <= 5
    seen = set()
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for keys in sampler:
            idx = [k[0] for k in keys]
            samples = [{"ids": np.ones(n_text[i], np.int64), "mel": np.zeros((N_MELS, frames[i]), np.float32),
                        "f0": np.zeros(frames[i], np.float32), "voiced": np.zeros(frames[i], bool),
                        "ref_mel": np.zeros((N_MELS, min(frames[i], 64)), np.float32), "id": str(i)} for i in idx]
            batch = collate(samples)
            shape = (batch["text"].shape[1], batch["mel"].shape[2])
            assert shape in allowed, shape
            assert batch["ref_mel"].shape == (8, N_MELS, 64) and batch["text"].shape[0] == 8
            assert shape[0] % 8 == 0 and shape[1] % 16 == 0
            assert torch.equal(batch["mel_mask"].sum(1), torch.tensor([frames[i] for i in idx]))
            seen.add(shape)
    assert len(seen) == len(allowed)  # the whole run compiles len(allowed) shapes, then never again
