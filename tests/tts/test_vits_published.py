"""`--init_from` a Piper training checkpoint, checked against piper-tts's own code: small voices built with
`piper.train.vits` (random weights) and saved by Lightning as piper's training saves them, with a voice
config. Loaded here, they speak the same waveform for the same symbols (noise scales 0), also with the
ids permuted, and with one speaker of a multi-speaker voice; one training step runs from them. Each bad
input exits 2 with one line naming the file, before the run folder exists."""

from __future__ import annotations

import functools
import json
import pathlib
import random
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

from common.checkpoint import load_checkpoint
from common.config import load_config
from common.distributed import setup_distributed
from tests.tts.test_vits_train import TEXTS, _corpus
from tts.text.normalizer import normalize
from tts.text.phonemes import ESPEAK_SYMBOLS
from tts.vits import export_onnx
from tts.vits import train as train_mod
from tts.vits.config import TrainConfig
from tts.vits.published.source import SourceError, SourceVoice
from tts.vits.published.start import load_start

# The voice's symbols: piper's four specials, IPA we share, and two we lack (a click and a tone letter)
PHONES = ["_", "^", "$", " ", "a", "b", "d", "e", "i", "k", "l", "m", "n", "o", "s", "t", "u", "ʃ", "ɑ", "ˈ", "ː",
          ".", ",", "ʘ", "˥"]
# Lightning's loader lists every critic tensor a checkpoint without critics lacks, in one very long warning.
pytestmark = pytest.mark.filterwarnings("ignore:Found keys that are in the model state dict:UserWarning")
RECIPE = Path(__file__).resolve().parents[2] / "tts/vits/configs/finetune_piper.yaml"
OUR = {s: i for i, s in enumerate(ESPEAK_SYMBOLS)}
# Our recipe for these tests: tiny and fast; the model's shape comes from the source voice
FAST = ["model=tiny", "batch_size=2", "num_workers=0", "persistent_workers=false", "pin_memory=false",
        "precision=32-true", "run_eval=false", "eval_at_start=false", "test_sentences=[]", "print_step=1",
        "save_step=100", "val_check_interval=0", "data.num_buckets=2", "max_minutes=null", "progress_bar=false",
        "model_args.segment_frames=8", "max_steps=1"]
SAYS = ["s", "a", "l", "o", "m", " ", "d", "u", "n", "ˈ", "ɑ", "ː", "."]  # what both models are given
CACHED = ["salom", "dunˈɑː", "bugun", "kitob", "ʃoi", "men", "bu", "ʘ"]  # phonemes of TEXTS (no espeak-ng needed)

if TYPE_CHECKING:  # imported where used: piper's Lightning module costs every test worker ~2 s at collection
    from piper.train.vits.lightning import VitsModel


def piper_voice(folder: Path, speakers: dict[str, int] | None = None, seed: int = 0, critics: bool = True) -> Path:
    """A tiny piper VitsModel with random weights, saved by Lightning, and its config.json beside it.
    Without `critics`, the file is re-saved without piper's full-size discriminator (model_d.*: 47 M
    weights that piper's code does not let a small voice shrink), to keep the tests quick."""
    import lightning
    from piper.train.vits.lightning import VitsModel

    torch.manual_seed(seed)
    n = len(speakers or {}) or 1
    model = VitsModel(num_symbols=len(PHONES), num_speakers=n, sample_rate=22050, hidden_channels=16,
                      inter_channels=16, filter_channels=32, n_layers=1, upsample_initial_channel=32,
                      gin_channels=16 if n > 1 else 0, mos_metric=None,
                      dataset=[pathlib.Path("/data/dataset.jsonl")])  # piper_train keeps paths in hparams
    with torch.no_grad():  # flows and duration splines start as the identity: make every part matter
        for p in model.model_g.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    folder.mkdir(parents=True, exist_ok=True)
    trainer = lightning.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False)
    trainer.strategy.connect(model)
    path = folder / "epoch=9-step=100.ckpt"
    trainer.save_checkpoint(path)
    if not critics:
        lightning_ckpt = torch.load(path, weights_only=False)
        lightning_ckpt["state_dict"] = {k: v for k, v in lightning_ckpt["state_dict"].items()
                                        if not k.startswith("model_d.")}
        torch.save(lightning_ckpt, path)
    write_config(folder / "config.json", {s: [i] for i, s in enumerate(PHONES)}, speakers)
    return path


def write_config(path: Path, id_map: dict, speakers: dict[str, int] | None = None, rate: int = 22050) -> Path:
    path.write_text(json.dumps({"audio": {"sample_rate": rate, "quality": "medium"}, "espeak": {"voice": "en-us"},
                                "phoneme_type": "espeak", "num_symbols": len(PHONES),
                                "num_speakers": len(speakers or {}) or 1, "speaker_id_map": speakers or {},
                                "phoneme_id_map": id_map}, ensure_ascii=False), encoding="utf-8")
    return path


def variant(ckpt: Path, folder: Path, permute: list[int] | None = None, **config) -> Path:
    """The voice of `ckpt` as a Lightning checkpoint without the critics (small, quick to write), its ids
    renumbered by `permute` (new id of PHONES[i] = permute[i]: map and embedding rows alike), with
    `config` added to its voice config (an .onnx.json beside it)."""
    lightning_ckpt = torch.load(ckpt, weights_only=False)
    state = {k: v for k, v in lightning_ckpt["state_dict"].items() if not k.startswith("model_d.")}
    order = permute or list(range(len(PHONES)))
    emb = state["model_g.enc_p.emb.weight"]
    state["model_g.enc_p.emb.weight"] = torch.empty_like(emb).index_copy_(0, torch.tensor(order), emb)
    folder.mkdir(parents=True)
    torch.save({**lightning_ckpt, "state_dict": state}, folder / "voice.ckpt")
    path = write_config(folder / "voice.onnx.json", {s: [order[i]] for i, s in enumerate(PHONES)})
    path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return folder / "voice.ckpt"


@functools.cache
def piper_model(ckpt: Path) -> VitsModel:
    from piper.train.vits.lightning import VitsModel

    return VitsModel.load_from_checkpoint(ckpt, map_location="cpu", weights_only=False, strict=False).eval()


def piper_wave(ckpt: Path, sid: int | None = None) -> torch.Tensor:
    """piper's own inference of SAYS (blanks between, as piper's runtime) at noise scales 0."""
    model = piper_model(ckpt)
    index = {s: i for i, s in enumerate(PHONES)}
    x = torch.tensor([with_blanks([index[s] for s in SAYS], index["_"])])
    with torch.no_grad():
        wav, *_ = model.model_g.infer(x, torch.tensor([x.size(1)]), None if sid is None else torch.tensor([sid]),
                                      noise_scale=0.0, length_scale=1.0, noise_scale_w=0.0)
    return wav


def with_blanks(ids: list[int], blank: int) -> list[int]:
    out = [blank] * (2 * len(ids) + 1)
    out[1::2] = ids
    return out


def our_wave(generator, sid: int | None = None) -> torch.Tensor:
    x = torch.tensor([with_blanks([OUR[s] for s in SAYS], OUR["_"])])
    generator.eval()
    wav, _, _ = generator.infer(x, torch.tensor([x.size(1)]), None if sid is None else torch.tensor([sid]),
                                noise_scale=0.0, length_scale=1.0, noise_scale_w=0.0)
    return wav


def assert_same_wave(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert ours.shape == theirs.shape
    assert float((ours - theirs).abs().max()) <= 1e-4 * float(theirs.abs().max())
    assert float(theirs.abs().max()) > 1e-3  # a waveform, not silence


def espeak_data(root: Path, speakers: list[str]) -> Path:
    """The tiny corpus of test_vits_train with its espeak phonemes cached (symbols of PHONES)."""
    data = _corpus(root, speakers)
    table = {normalize(t): ph for t, ph in zip(TEXTS, CACHED)}
    (data / "phonemes_uz.json").write_text(json.dumps(table, ensure_ascii=False), encoding="utf-8")
    return data


@pytest.fixture(scope="module")
def one_speaker(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("piper_one")
    return piper_voice(root / "voice"), espeak_data(root / "corpus", ["anna"])


@pytest.fixture(scope="module")
def three_speakers(tmp_path_factory) -> Path:
    return piper_voice(tmp_path_factory.mktemp("piper_multi") / "voice", {"anna": 0, "bobur": 1, "vali": 2}, seed=1,
                       critics=False)


def start(ckpt: Path, data: Path, run: Path, *flags: str, sets: tuple[str, ...] = (), config: Path | None = None):
    """What train.run does before the run folder: (config, the planned start)."""
    args = train_mod.parse_args(["--data_dir", str(data), "--run_dir", str(run), "--init_from", str(ckpt), *flags,
                                 *sum((["--set", s] for s in [*FAST, *sets]), [])])
    cfg = load_config(config, TrainConfig, args.overrides, extra={"data_dir": args.data_dir, "run_dir": args.run_dir})
    return cfg, train_mod.plan_source_start(cfg, args)


def loaded_generator(ckpt: Path, data: Path, run: Path, *flags: str):
    cfg, source = start(ckpt, data, run, *flags)
    generator, discriminator = train_mod.build_models(cfg, len(json.loads((data / "speakers.json").read_text())))
    load_start(source, generator, discriminator)
    return generator, source


def test_piper_voice_speaks_the_same_and_trains_one_step(one_speaker, tmp_path, capsys):
    ckpt, data = one_speaker
    cfg, source = start(ckpt, data, tmp_path / "run")
    assert cfg.args().hidden_channels == 16 and cfg.args().n_layers_q == 16 and cfg.phoneme_type == "espeak"
    trainer = train_mod.VitsTrainer(cfg, setup_distributed("cpu"), source=source)
    out = capsys.readouterr().out
    assert "model_args.hidden_channels: 32 -> 16 (from the source voice)" in out
    assert f"{len(ESPEAK_SYMBOLS) - 21} start fresh" in out and "'ʒ'" in out  # ours, not in the voice
    assert "2 source symbol(s) have no counterpart here: '^' '$'" not in out
    assert "4 source symbol(s) have no counterpart here: '^' '$' 'ʘ' '˥'" in out
    assert "no speaker" not in out and "licence: the source declares none" in out
    assert_same_wave(our_wave(trainer.generator), piper_wave(ckpt))
    piper_d = piper_model(ckpt).model_d.state_dict()
    assert torch.equal(trainer.discriminator.state_dict()["discriminators.1.conv_post.bias"],
                       piper_d["discriminators.1.conv_post.bias"])
    before = trainer.generator.enc_p.emb.weight.detach().clone()
    losses = trainer.train_step(next(iter(trainer.loader)))  # one training step from the voice, critics included
    assert all(torch.isfinite(v) for k, v in losses.items() if k != "samples") and "loss_disc" in losses
    assert not torch.equal(before, trainer.generator.enc_p.emb.weight)


def test_ids_are_mapped_by_symbol(one_speaker, tmp_path):
    """The same voice with its ids permuted (map and embedding rows alike) loads to the same model."""
    ckpt, data = one_speaker
    order = list(range(len(PHONES)))
    random.Random(0).shuffle(order)
    generator, _ = loaded_generator(variant(ckpt, tmp_path / "permuted", order), data, tmp_path / "run")
    assert_same_wave(our_wave(generator), piper_wave(ckpt))


def test_one_speaker_of_a_multi_speaker_voice(three_speakers, one_speaker, tmp_path):
    _, data = one_speaker
    generator, source = loaded_generator(three_speakers, data, tmp_path / "run", "--init_speaker", "vali")
    assert generator.n_speakers == 1 and "speaker 'vali' (row 2" in "\n".join(source.lines)
    assert_same_wave(our_wave(generator), piper_wave(three_speakers, sid=2))
    cfg, source = start(three_speakers, data, tmp_path / "run", config=RECIPE)  # the shipped recipe
    assert "the mean of the source's 3 speaker embeddings" in "\n".join(source.lines)
    assert (cfg.lr_gen, cfg.lr_disc, cfg.args().hidden_channels, cfg.args().gin_channels) == (2e-4, 1e-4, 16, 16)


def test_equal_speaker_tables_carry_over_and_others_go_by_name(three_speakers, tmp_path):
    same = espeak_data(tmp_path / "same", ["anna", "bobur", "vali"])
    generator, source = loaded_generator(three_speakers, same, tmp_path / "run")
    assert "speakers: the source's 3 speakers carry over (same names and ids)" in source.lines
    assert_same_wave(our_wave(generator, sid=2), piper_wave(three_speakers, sid=2))
    two = espeak_data(tmp_path / "two", ["anna", "bobur"])
    generator, source = loaded_generator(three_speakers, two, tmp_path / "run")
    assert "2 of the data's 2 speakers take the source's embedding of the same name" in "\n".join(source.lines)
    assert_same_wave(our_wave(generator, sid=1), piper_wave(three_speakers, sid=1))


def _fails(tmp_path, capsys, ckpt: Path, data: Path, *flags: str, sets: tuple[str, ...] = ()) -> str:
    """Exit 2, one error line, and the run folder never made."""
    run = tmp_path / "never"
    argv = ["--data_dir", str(data), "--run_dir", str(run), "--init_from", str(ckpt), "--device", "cpu", *flags,
            *sum((["--set", s] for s in [*FAST, *sets]), [])]
    assert train_mod.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1 and not run.exists()
    return err


class RunsCode:
    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(__file__).with_name("pwned"),))


def test_bad_sources_exit_2_before_the_run_folder(one_speaker, tmp_path, capsys):
    ckpt, data = one_speaker
    bad = tmp_path / "bad"
    bad.mkdir()
    # a pickle that would run code
    torch.save({"state_dict": {"model_g.enc_p.emb.weight": torch.zeros(3, 2)}, "x": RunsCode()}, bad / "evil.ckpt")
    assert "refused to load" in _fails(tmp_path, capsys, bad / "evil.ckpt", data)
    assert not Path(__file__).with_name("pwned").exists()
    # a truncated file
    (bad / "cut.ckpt").write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 2])
    err = _fails(tmp_path, capsys, bad / "cut.ckpt", data)
    assert "cut.ckpt" in err and "fetch it again" in err
    # a checkpoint of another model
    torch.save({"state_dict": {"model.encoder.weight": torch.zeros(2)}}, bad / "other.ckpt")
    assert "not a Piper voice checkpoint" in _fails(tmp_path, capsys, bad / "other.ckpt", data)
    torch.save({"models": {"generator": {}}, "config": {"task_cls": "x"}}, bad / "vocoder.pt")  # another trainer's
    assert "is a vocoder training checkpoint" in _fails(tmp_path, capsys, bad / "vocoder.pt", data)
    # no voice config beside it, a config without a phoneme map, an inconsistent one
    (bad / "voice.ckpt").symlink_to(ckpt)
    assert "--init_config" in _fails(tmp_path, capsys, bad / "voice.ckpt", data)
    no_map = write_config(bad / "no_map.json", {})
    assert "no phoneme_id_map" in _fails(tmp_path, capsys, ckpt, data, "--init_config", str(no_map))
    too_far = write_config(bad / "too_far.json", {"a": [len(PHONES) + 5]})
    assert "inconsistent phoneme_id_map" in _fails(tmp_path, capsys, ckpt, data, "--init_config", str(too_far))
    other_rate = write_config(bad / "rate.json", {s: [i] for i, s in enumerate(PHONES)}, rate=16000)
    assert "16000 Hz" in _fails(tmp_path, capsys, ckpt, data, "--init_config", str(other_rate))
    # data prepared at another sample rate than the voice's
    data16 = tmp_path / "data16"
    shutil.copytree(data, data16)
    state = json.loads((data16 / "prepare_state.json").read_text())
    state["audio"]["sample_rate"] = 16000
    (data16 / "prepare_state.json").write_text(json.dumps(state))
    err = _fails(tmp_path, capsys, ckpt, data16)
    assert "audio.sample_rate=16000" in err and "audio.sample_rate=22050" in err and "epoch=9-step=100.ckpt" in err
    # a speaker to keep, from a voice of one speaker
    assert "--init_speaker" in _fails(tmp_path, capsys, ckpt, data, "--init_speaker", "vali")
    # a value typed on the command line that contradicts the voice
    err = _fails(tmp_path, capsys, ckpt, data, sets=("model_args.hidden_channels=64",))
    assert "--set model_args.hidden_channels=64" in err and "16" in err and "epoch=9-step=100.ckpt" in err


def test_licence_reaches_the_checkpoint_and_the_onnx_json(one_speaker, tmp_path, capsys):
    """The command line end to end (one step), from a voice without critics: they keep the recipe's size."""
    ckpt, data = one_speaker
    licensed = variant(ckpt, tmp_path / "licensed", license="CC-BY-NC-4.0")
    run = tmp_path / "run"
    argv = ["--data_dir", str(data), "--run_dir", str(run), "--init_from", str(licensed),
            "--device", "cpu", *sum((["--set", s] for s in FAST), [])]
    assert train_mod.main(argv) == 0
    out = capsys.readouterr().out
    assert "licence: CC-BY-NC-4.0" in out and "no discriminator in the source: the critics start fresh" in out
    saved = next((run / "checkpoints").glob("vits_*.pt"))
    saved_ckpt = load_checkpoint(saved)
    assert saved_ckpt["extra"]["licence"] == "CC-BY-NC-4.0"
    assert saved_ckpt["config"]["model_args"]["n_layers_q"] == 16  # the voice's shape, in the run's config
    assert saved_ckpt["config"]["model_args"].get("disc_channel_scale") is None  # the tiny recipe's critics
    assert export_onnx.main(["--checkpoint", str(saved), "--out", str(tmp_path / "v.onnx"), "--no_check"]) == 0
    assert json.loads((tmp_path / "v.onnx.json").read_text())["licence"] == "CC-BY-NC-4.0"


def test_a_source_that_does_not_map_names_every_kind_of_misfit():
    """Missing (unless the run draws it fresh), left over, another shape (the text embedding's rows are
    mapped by symbol, so its shape may differ): each named in the one SourceError."""
    from tts.vits.published.start import _check_fit

    own = {"a": torch.zeros(2, 3), "b": torch.zeros(4), "fresh": torch.zeros(1), "enc_p.emb.weight": torch.zeros(5, 2)}
    voice = SourceVoice(Path("voice.onnx"), "piper", {}, {}, [], {})
    _check_fit(voice, "generator", {"a": torch.ones(2, 3), "b": torch.ones(4), "enc_p.emb.weight": torch.ones(9, 2)},
               own, fresh=["fresh"])  # fits
    with pytest.raises(SourceError) as err:
        _check_fit(voice, "generator", {"a": torch.ones(3, 3), "extra": torch.ones(1), "enc_p.emb.weight": torch.ones(9, 2)},
                   own, fresh=["fresh"])
    text = str(err.value)
    assert "voice.onnx" in text and "1 not in the source: b" in text and "1 left over in the source: extra" in text
    assert "1 of another shape: a: checkpoint (3, 3) vs model (2, 3)" in text and "enc_p.emb" not in text
