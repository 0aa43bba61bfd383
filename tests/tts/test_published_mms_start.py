"""`tts/vits/train.py --init_from` an MMS-style transformers VitsModel folder, end to end through the shared
start-up (tts/vits/published/start.py): the model takes the folder's shape, the Cyrillic rows go to our Latin
symbols, and Latin text then speaks exactly what MMS speaks for the same text in Cyrillic (noise 0); one
training step runs; a damaged folder exits 2 before the run folder exists."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from common.config import load_config
from common.distributed import setup_distributed
from tests.tts.test_vits_train import SR, _corpus
from tts.text.symbols import intersperse, text_to_ids
from tts.vits import train as train_mod
from tts.vits.config import TrainConfig

VOCAB = ["к", "а", "б", "е", "ш", "л", "о", "м", "с", " ", "д", "у", "н", "т", "и", "р", "г", "."]
FAST = ["model=tiny", "batch_size=2", "num_workers=0", "persistent_workers=false", "pin_memory=false",
        "precision=32-true", "run_eval=false", "eval_at_start=false", "test_sentences=[]", "print_step=1",
        "save_step=100", "val_check_interval=0", "data.num_buckets=2", "max_minutes=null", "progress_bar=false",
        "model_args.segment_frames=8", "max_steps=1"]

if TYPE_CHECKING:  # imported where used: transformers costs every test worker ~2 s at collection, run or not
    from transformers import VitsModel


def _mms_folder(folder: Path) -> VitsModel:
    """A small MMS-like VitsModel at the test corpus' audio settings (22.05 kHz, n_fft 1024, hop 256)."""
    from transformers import VitsConfig, VitsModel

    config = VitsConfig(vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=2, ffn_dim=24, flow_size=8,
                        spectrogram_bins=513, upsample_initial_channel=16, upsample_rates=[8, 8, 4],
                        upsample_kernel_sizes=[16, 16, 8], resblock_kernel_sizes=[3], resblock_dilation_sizes=[[1, 3]],
                        prior_encoder_num_flows=2, prior_encoder_num_wavenet_layers=2,
                        posterior_encoder_num_wavenet_layers=2, sampling_rate=SR)
    torch.manual_seed(0)
    model = VitsModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)  # a few frames per token
    model.save_pretrained(folder)
    (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(VOCAB)}, ensure_ascii=False))
    return model


def test_mms_folder_starts_a_run_and_speaks_latin_as_mms_speaks_cyrillic(tmp_path, capsys):
    data = _corpus(tmp_path / "corpus", ["anna"])
    folder = tmp_path / "mms-tts-uzb-script_cyrillic"
    mms = _mms_folder(folder)
    args = train_mod.parse_args(["--data_dir", str(data), "--run_dir", str(tmp_path / "run"), "--init_from",
                                 str(folder), *sum((["--set", s] for s in FAST), [])])
    cfg = load_config(None, TrainConfig, args.overrides, extra={"data_dir": args.data_dir, "run_dir": args.run_dir})
    trainer = train_mod.VitsTrainer(cfg, setup_distributed("cpu"), source=train_mod.plan_source_start(cfg, args))
    out = capsys.readouterr().out
    assert "model_args.hidden_channels: 32 -> 16 (from the source voice)" in out
    assert "text embedding: 18 of this run's 39 symbols take the source's row of the same symbol" in out
    assert "licence: cc-by-nc-4.0" in out
    ours = torch.tensor([intersperse(text_to_ids("salom bolam"))])
    theirs = torch.tensor([intersperse([VOCAB.index(c) for c in "салом болам"], 0)])
    mms.noise_scale = mms.noise_scale_duration = 0.0
    with torch.no_grad():
        want = mms(theirs).waveform[0]
    got = trainer.generator.eval().infer(ours, torch.tensor([ours.shape[1]]), noise_scale=0.0, noise_scale_w=0.0)[0]
    assert got[0, 0].shape == want.shape and float(want.abs().max()) > 1e-3
    assert float((got[0, 0] - want).abs().max()) <= 1e-4 * float(want.abs().max())
    trainer.generator.train()
    before = trainer.generator.enc_p.emb.weight.detach().clone()
    losses = trainer.train_step(next(iter(trainer.loader)))
    assert all(torch.isfinite(v) for k, v in losses.items() if k != "samples") and "loss_disc" in losses
    assert not torch.equal(before, trainer.generator.enc_p.emb.weight)


def test_damaged_mms_folder_exits_2_before_the_run_folder(tmp_path, capsys):
    data = _corpus(tmp_path / "corpus", ["anna"])
    folder = tmp_path / "voice"
    _mms_folder(folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    run = tmp_path / "run"
    argv = ["--data_dir", str(data), "--run_dir", str(run), "--init_from", str(folder), "--device", "cpu",
            *sum((["--set", s] for s in FAST), [])]
    assert train_mod.main(argv) == 2
    err = capsys.readouterr().err
    assert f"--init_from {folder}: model.safetensors is damaged" in err and "download it again" in err
    assert not run.exists()
