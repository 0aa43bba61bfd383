"""`--init_from` a transformers `VitsModel` folder (MMS-TTS): checked against transformers' own model.

Small VitsModels with random weights are saved with `save_pretrained`, read with `tts.vits.published.mms`,
loaded strictly into our VITS, and must speak the same waveform for the same ids at noise 0; then one
training step runs from them. Each kind of bad folder is one CheckpointError naming the folder.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

from common.checkpoint import CheckpointError
from common.safetensors_io import load_safetensors, save_safetensors
from tts.vits.config import model_args
from tts.vits.discriminator import MultiPeriodDiscriminator
from tts.vits.losses import discriminator_loss, feature_loss, generator_loss, kl_loss
from tts.vits.model import VITS
from tts.vits.published import mms
from tts.vits.published.mms import map_symbols

if TYPE_CHECKING:  # imported where used: transformers costs every test worker ~2 s at collection, run or not
    from transformers import VitsConfig, VitsModel

# MMS-like: row 0 is the blank (here also a letter, as in MMS vocabularies), Cyrillic letters, space, hyphen
VOCAB = ["к", "а", "б", "е", "ш", "щ", "ў", "ю", " ", "-", "ь", "ғ"]


def _small_config(**over) -> VitsConfig:
    base = dict(vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=2, num_attention_heads=2, ffn_dim=24,
                flow_size=8, spectrogram_bins=33, upsample_initial_channel=16, upsample_rates=[4, 2],
                upsample_kernel_sizes=[8, 4], resblock_kernel_sizes=[3, 5], resblock_dilation_sizes=[[1, 3], [1, 3]],
                prior_encoder_num_flows=2, prior_encoder_num_wavenet_layers=2, posterior_encoder_num_wavenet_layers=2,
                duration_predictor_filter_channels=16, sampling_rate=16000)
    from transformers import VitsConfig

    return VitsConfig(**{**base, **over})


def _save(folder: Path, config: VitsConfig, seed: int = 0) -> VitsModel:
    from transformers import VitsModel

    torch.manual_seed(seed)
    model = VitsModel(config).eval()
    with torch.no_grad():  # durations of a few frames per token (random weights give any), a nonzero flow
        for p in model.parameters():
            p.mul_(0.5)
    model.save_pretrained(folder)
    (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(VOCAB)}, ensure_ascii=False))
    (folder / "tokenizer_config.json").write_text(json.dumps({"add_blank": True, "tokenizer_class": "VitsTokenizer"}))
    return model


def _ours(source) -> VITS:
    n_speakers = max(1, len(source.speakers))
    ours = VITS(len(source.symbols), source.audio["n_fft"] // 2 + 1, n_speakers,
                model_args("vits_base", source.model_args), source.audio["hop_length"])
    ours.load_state_dict(source.generator, strict=True)
    return ours.eval()


@pytest.mark.parametrize("sdp, speakers", [(True, 1), (False, 3)])
def test_same_waveform_as_transformers_then_one_training_step(tmp_path, sdp, speakers):
    folder = tmp_path / "mms-tts-uzb-script_cyrillic"
    config = _small_config(use_stochastic_duration_prediction=sdp, num_speakers=speakers,
                           speaker_embedding_size=8 if speakers > 1 else 0)
    theirs = _save(folder, config)
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    source = mms.read(folder)
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before  # the reader writes nothing
    assert source.kind == "mms" and source.phoneme_type == "text" and source.discriminator is None
    assert source.audio == {"sample_rate": 16000, "n_fft": 64, "win_length": 64, "hop_length": 8}
    assert source.licence == "cc-by-nc-4.0"  # the folder declares none; its name says MMS
    assert source.speakers == ({str(i): i for i in range(speakers)} if speakers > 1 else {})
    ours = _ours(source)

    ids = torch.tensor([[0, 1, 0, 2, 0, 4, 0, 8, 0, 6, 0, 3, 0, 11, 0]])
    sid = 2 if speakers > 1 else None
    theirs.noise_scale, theirs.noise_scale_duration = 0.0, 0.0
    with torch.no_grad():
        want = theirs(ids, speaker_id=sid, speaking_rate=1.0).waveform[0]
    got, _, _ = ours.infer(ids, torch.tensor([ids.shape[1]]), None if sid is None else torch.tensor([sid]),
                           noise_scale=0.0, noise_scale_w=0.0, length_scale=1.0)
    got = got[0, 0]
    assert got.shape == want.shape and want.numel() > 8 * ids.shape[1]
    peak = want.abs().max()
    assert peak > 1e-3
    assert (got - want).abs().max() <= 1e-4 * peak

    # one training step of our model from it: generator and critic, every weight finite, the generator moved
    ours.train()
    disc = MultiPeriodDiscriminator([2, 3], 0.125)
    opt_g = torch.optim.AdamW(ours.parameters(), 2e-5)
    opt_d = torch.optim.AdamW(disc.parameters(), 2e-5)
    torch.manual_seed(1)
    x, x_len = ids.repeat(2, 1), torch.tensor([15, 11])
    spec_len = torch.tensor([40, 34])
    spec = torch.rand(2, 33, 40)
    sids = torch.tensor([0, speakers - 1])
    start = {k: v.clone() for k, v in ours.state_dict().items()}
    out = ours(x, x_len, spec, spec_len, sids)
    real = torch.randn_like(out["wav"]) * 0.1
    d_r, d_g, _, _ = disc(real, out["wav"].detach())
    loss_d = discriminator_loss(d_r, d_g)
    opt_d.zero_grad()
    loss_d.backward()
    opt_d.step()
    _, d_g, f_r, f_g = disc(real, out["wav"])
    loss_g = (generator_loss(d_g) + feature_loss(f_r, f_g) + out["l_length"].sum()
              + kl_loss(out["z_p"], out["logs_q"], out["m_p"], out["logs_p"], out["y_mask"]))
    assert torch.isfinite(loss_g) and torch.isfinite(loss_d)
    opt_g.zero_grad()
    loss_g.backward()
    opt_g.step()
    after = ours.state_dict()
    assert all(torch.isfinite(v).all() for v in after.values())
    assert not torch.equal(after["enc_p.emb.weight"], start["enc_p.emb.weight"])
    assert not torch.equal(after["dec.conv_pre.weight"], start["dec.conv_pre.weight"])


def test_cyrillic_rows_map_onto_latin_symbols():
    symbols, notes = map_symbols({t: i for i, t in enumerate(VOCAB)}, len(VOCAB), add_blank=True)
    assert symbols == ["_", "a", "b", "e", "sh", None, "o\u02bb", None, " ", "-", None, "g\u02bb"]
    assert "no single Latin symbol for щ ю ь" in notes[-1] and "row 0 ('к')" in notes[0]
    symbols, _ = map_symbols({"_": 0, "a": 1, "а": 2, "ц": 3}, 4, add_blank=False)
    assert symbols == ["_", None, "a", "s"]  # the Cyrillic letter wins a Latin symbol over a Latin row


def _folder(tmp_path) -> Path:
    folder = tmp_path / "voice"
    _save(folder, _small_config())
    return folder


def _refused(folder: Path, *words: str) -> None:
    with pytest.raises(CheckpointError) as err:
        mms.read(folder)
    msg = str(err.value)
    assert msg.startswith(f"--init_from {folder}:") and "\n" not in msg
    for word in words:
        assert word in msg, msg


def test_bad_folders_are_one_line_errors(tmp_path):
    folder = _folder(tmp_path)
    assert mms.read(folder).licence is None  # no README front matter, not named mms-tts-*
    (folder / "README.md").write_text("---\nlicense: cc-by-nc-4.0\nlanguage: uz\n---\n# voice\n")
    assert mms.read(folder).licence == "cc-by-nc-4.0"

    _refused(tmp_path / "nothing", "not a folder")
    (tmp_path / "empty").mkdir()
    _refused(tmp_path / "empty", "no config.json")

    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "bert"}))
    _refused(folder, "model_type 'bert'", "not a transformers VitsModel")
    (folder / "config.json").write_text(json.dumps({**cfg, "duration_predictor_flow_bins": 8}))
    _refused(folder, "duration_predictor_flow_bins 8 (ours: 10)")
    (folder / "config.json").write_text(json.dumps({**cfg, "num_attention_heads": 3}))
    _refused(folder, "cannot take", "divisible")
    (folder / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 3}))
    _refused(folder, "does not match its config.json", "missing")
    (folder / "config.json").write_text(json.dumps(cfg))

    vocab = json.loads((folder / "vocab.json").read_text())
    (folder / "vocab.json").write_text(json.dumps({**vocab, "z": len(vocab)}))
    _refused(folder, "vocab.json", f"{len(VOCAB)} rows")
    (folder / "vocab.json").write_text(json.dumps(vocab))

    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    _refused(folder, "model.safetensors is damaged", "download it again")
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"pickle")
    _refused(folder, "no model.safetensors", "pytorch_model.bin")
    shutil.rmtree(folder)


def test_hub_files_with_torch_old_weight_norm_names_read_the_same(tmp_path):
    """MMS files on the hub (2023) name weight norm `weight_g`/`weight_v`; save_pretrained today writes
    `parametrizations.weight.original0/1`: both give the same tensors."""
    folder = _folder(tmp_path)
    new = mms.read(folder).generator
    tensors = load_safetensors(folder / "model.safetensors")
    old = {k.replace(".parametrizations.weight.original0", ".weight_g")
            .replace(".parametrizations.weight.original1", ".weight_v"): v for k, v in tensors.items()}
    assert any(k.endswith(".weight_g") for k in old)
    save_safetensors(old, folder / "model.safetensors")
    again = mms.read(folder).generator
    assert again.keys() == new.keys() and all(torch.equal(again[k], new[k]) for k in new)


def test_recipe_and_mms_shape_agree():
    """MMS-TTS (transformers' VitsConfig defaults are facebook/mms-tts-eng's) is vits_base at 16 kHz, and
    finetune_mms_uzb.yaml prepares data with the audio settings the folder fixes."""
    from transformers import VitsConfig

    from common.config import load_config
    from tts.vits.config import TrainConfig
    from tts.vits.published.mms import shape_from_config

    args, audio = shape_from_config(VitsConfig().to_dict())
    assert model_args("vits_base", args) == model_args("vits_base")
    recipe = load_config(Path(__file__).parents[2] / "tts/vits/configs/finetune_mms_uzb.yaml", TrainConfig)
    assert {k: getattr(recipe.audio, k) for k in audio} == audio == {
        "sample_rate": 16000, "n_fft": 1024, "win_length": 1024, "hop_length": 256}
    assert recipe.phoneme_type == "text" and recipe.data.add_blank and recipe.lr == 2e-5


def test_finetune_hf_vits_discriminator_is_read(tmp_path):
    """ylacombe/finetune-hf-vits' training folders (VitsModelForPreTraining, e.g. ylacombe/mms-tts-*-train) add
    `discriminator.discriminators.{i}.convs.{j}` / `.final_conv` (scale critic first, then the periods) and
    `discriminator_*` config keys. That package is not installed, so its names are written here from its
    modeling_vits_training.py; the critic then scores audio exactly as the critic the tensors came from."""
    folder = _folder(tmp_path)
    torch.manual_seed(2)
    critic = MultiPeriodDiscriminator([2, 3], 1.0).eval()
    theirs = {"discriminator." + k.replace("conv_post", "final_conv")
              .replace(".parametrizations.weight.original0", ".weight_g")
              .replace(".parametrizations.weight.original1", ".weight_v"): v for k, v in critic.state_dict().items()}
    tensors = load_safetensors(folder / "model.safetensors")
    save_safetensors({**tensors, **theirs}, folder / "model.safetensors")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "discriminator_periods": [2, 3], "discriminator_stride": 3}))
    source = mms.read(folder)
    assert source.model_args["mpd_periods"] == [2, 3] and source.model_args["disc_channel_scale"] == 1.0
    ours = MultiPeriodDiscriminator(source.model_args["mpd_periods"], 1.0).eval()
    ours.load_state_dict(source.discriminator, strict=True)
    wav = torch.randn(1, 1, 2048) * 0.1
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(ours.score(wav)[0], critic.score(wav)[0]))

    (folder / "config.json").write_text(json.dumps({**cfg, "discriminator_periods": [2, 3, 5]}))
    _refused(folder, "does not match the critic its config.json describes", "missing")
    (folder / "config.json").write_text(json.dumps({**cfg, "discriminator_stride": 4}))
    assert mms.read(folder).discriminator is None


def test_only_cyrillic_letters_are_transliterated():
    symbols, _ = map_symbols({"_": 0, "c": 1, "w": 2, "s": 3, "қ": 4, "ҳ": 5, "ц": 6, "э": 7, "е": 8}, 9, True)
    assert symbols == ["_", None, None, None, "q", "h", "s", None, "e"]  # Latin c, w: not ours; е spells e before э
    symbols, _ = map_symbols({"_": 0, "ц": 1, "с": 2}, 3, add_blank=True)
    assert symbols == ["_", None, "s"]  # с spells s, whichever row comes first
