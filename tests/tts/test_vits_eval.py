"""Batched VITS evaluation (eval_batch_size, num_eval_loader_workers) equals item-by-item evaluation:
padded batches with masks (the decoder's too), per-item noise, metrics on each item's unpadded part."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
import torch

from common.data import BucketShapes
from tts.prepare_data import prepare
from tts.vits.config import TrainConfig
from tts.vits.data import VitsDataset, collate
from tts.vits.evaluation import evaluate
from tts.vits.train import build_mel, build_models

SR = 22050
TEXTS = ["salom", "bugun havo juda yaxshi", "kitob oʻqiymiz", "men uyga boraman endi", "choy",
         "bu yaxshi kun ekan", "ertaga yomgʻir", "non"]


@pytest.fixture(scope="module")
def eval_set(tmp_path_factory) -> tuple[VitsDataset, TrainConfig]:
    """Two speakers, eight utterances of different lengths, all in the eval split."""
    root = tmp_path_factory.mktemp("evalcorpus")
    rng = np.random.default_rng(0)
    lines = []
    for i, text in enumerate(TEXTS):
        spk = ("anna", "bobur")[i % 2]
        t = np.arange(int((0.6 + 0.12 * len(text) / 3) * SR)) / SR
        wav = (0.3 * np.sin(2 * np.pi * (120 + 9 * i) * t) + 0.01 * rng.standard_normal(len(t))).astype(np.float32)
        (root / "audio" / spk).mkdir(parents=True, exist_ok=True)
        sf.write(root / "audio" / spk / f"{i:02d}.wav", wav, SR, subtype="PCM_16")
        lines.append(f"{spk}/{i:02d}|{text}")
    (root / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    cfg = TrainConfig(model="tiny", model_args={"use_sdp": True, "upsample_initial_channel": 32})
    cfg.data.eval_split_size = 6
    cfg.data.min_chars_per_second = 0.5
    cfg.data.trim_silence = False  # tones: no speech for the Silero VAD to keep
    prepare(root / "metadata.csv", root / "audio", root / "prepared", cfg, quiet=True, speaker_from_path=True)
    ds = VitsDataset(root / "prepared", "eval", cfg.audio)
    assert len(ds) == 6 and len(set(ds.lengths)) > 3  # padding really happens in a batch
    return ds, cfg


def _model(cfg: TrainConfig):
    torch.manual_seed(0)
    gen, _ = build_models(cfg, n_speakers=2)
    return gen.eval()


def test_masked_batch_decodes_each_item_as_alone(eval_set):
    ds, cfg = eval_set
    gen = _model(cfg)
    items = [ds[i] for i in range(4)]
    b = collate(items)
    cap = 4 * b["spec_len"]
    noise = torch.randn(4, gen.args.inter_channels, int(cap.max()))
    wav, _, y_mask = gen.infer(b["ids"], b["ids_len"], b["sid"], noise_scale=0.667, noise_scale_w=0.0,
                               max_frames=cap, noise=noise, mask_decoder=True)
    lens = y_mask.sum((1, 2)).long()
    assert len(set(lens.tolist())) > 1
    for j, it in enumerate(items):
        one, _, _ = gen.infer(it["ids"][None], torch.tensor([len(it["ids"])]), torch.tensor([it["sid"]]),
                              noise_scale=0.667, noise_scale_w=0.0, max_frames=int(cap[j]), noise=noise[j : j + 1])
        assert one.size(-1) == int(lens[j]) * gen.hop_length
        torch.testing.assert_close(wav[j, :, : one.size(-1)], one[0], atol=2e-5, rtol=1e-4)
    # without the decoder mask the padded tail leaks into the shorter items' last samples
    unmasked, _, _ = gen.infer(b["ids"], b["ids_len"], b["sid"], noise_scale=0.667, noise_scale_w=0.0,
                               max_frames=cap, noise=noise)
    short = int(lens.argmin())
    n = int(lens[short]) * gen.hop_length
    assert not torch.allclose(unmasked[short, :, :n], wav[short, :, :n], atol=1e-4)


@pytest.mark.parametrize("batch_size,workers", [(3, 0), (4, 1)])
def test_batched_evaluation_equals_one_by_one(eval_set, batch_size, workers):
    ds, cfg = eval_set
    gen = _model(cfg)
    mel = build_mel(cfg)
    state = torch.get_rng_state()
    one = evaluate(gen, ds, mel, torch.device("cpu"), max_items=5, batch_size=1)
    batched = evaluate(gen, ds, mel, torch.device("cpu"), max_items=5, batch_size=batch_size, num_workers=workers)
    assert torch.equal(state, torch.get_rng_state())  # training's RNG untouched (exact resume)
    assert one["items"] == batched["items"] == 5
    assert one.keys() == batched.keys()
    for k in one:
        assert batched[k] == pytest.approx(one[k], rel=1e-4, abs=1e-4), k
    with pytest.raises(ValueError, match="eval_batch_size"):
        evaluate(gen, ds, mel, torch.device("cpu"), batch_size=0)


def test_bucket_shaped_padding_changes_no_valid_value(eval_set):
    """cudnn_benchmark / compile pad training batches to the bucket's fixed shape: the teacher-forced
    prior likelihoods and MAS paths on the valid region equal those of a batch padded to its longest item."""
    ds, cfg = eval_set
    gen = _model(cfg)
    items = [ds[i] for i in range(3)]
    frames, tokens = ds.lengths, ds.token_lengths()
    shapes = BucketShapes(frames, tokens, [max(frames) + 20], frame_multiple=16, text_multiple=8)
    tight, padded = collate(items), collate(items, shapes=shapes)
    assert padded["spec"].size(2) > tight["spec"].size(2) and padded["ids"].size(1) > tight["ids"].size(1)
    a = gen.align(tight["ids"], tight["ids_len"], tight["spec"], tight["spec_len"], tight["sid"])
    b = gen.align(padded["ids"], padded["ids_len"], padded["spec"], padded["spec_len"], padded["sid"])
    for j in range(3):
        n, t = int(tight["ids_len"][j]), int(tight["spec_len"][j])
        torch.testing.assert_close(b[0][j, :n, :t], a[0][j, :n, :t], atol=1e-3, rtol=1e-4)
        assert torch.equal(b[1][j, :n, :t], a[1][j, :n, :t])


def test_pitch_and_speaker_figures_beside_mcd(eval_set):
    """F0 RMSE / V/UV / periodicity along the MCD's DTW path; speaker_sim only with an encoder."""
    from speech.speaker_similarity import load_speaker_encoder, resemblyzer_weights

    if resemblyzer_weights() is None:
        pytest.skip("no speaker encoder (pip install --no-deps resemblyzer==0.1.4)")
    ds, cfg = eval_set
    m = evaluate(_model(cfg), ds, build_mel(cfg), torch.device("cpu"), max_items=2,
                 speaker_encoder=load_speaker_encoder(say=pytest.fail))
    assert 0.0 <= m["vuv_error"] <= 1.0 and 0.0 <= m["periodicity"] <= 1.0 and -1.0 <= m["speaker_sim"] <= 1.0
    assert "f0_rmse" in m  # NaN when an untrained model voices no frame the recording voices
