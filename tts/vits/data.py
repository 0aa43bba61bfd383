"""Dataset over a folder made by tts/prepare_data.py, and its collate function.

An item is (token ids with blanks, cached linear spectrogram, 16-bit waveform cropped to
whole frames, speaker id). The random training window is cut inside the model (VITS slices
its latent), with the global torch RNG that checkpoints restore, so the dataset itself is
deterministic and resumes exactly with any number of loader workers.

A damaged prepared file (a spec or wav missing, cut short, not what prepare_data.py wrote, of another
length than its manifest line, NaN/inf in a spec; a damaged speakers.json or prepare_state.json) stops the
run with one line naming it and the prepare command that makes it again (``common.prepared``, exit 2),
also from a loader worker; a NaN in a spec is never a divergence.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
from torch.utils.data import Dataset

from common.data import BucketShapes, sample_rng
from common.errors import UserError
from common.prepared import damaged, load_npy, read_json, require_finite
from speech.audio import to_float32
from tts.text import intersperse
from tts.text.phonemes import Frontend, PhonemeCache
from tts.vits.config import AudioConfig


class DataError(UserError, RuntimeError):
    """The prepared folder is missing, incomplete, or was prepared with other audio settings."""


def read_manifest(data_dir: str | Path, split: str) -> list[dict]:
    path = Path(data_dir) / f"{split}.jsonl"
    if not path.is_file():
        raise DataError(f"{path} not found: --data_dir must be a folder made by "
                        "`python tts/prepare_data.py --metadata ... --audio_dir ... --output_dir DIR`")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise damaged(path, f"is damaged (not UTF-8: {e.reason} at byte {e.start})", prepare_again(data_dir)) from None
    items = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                items.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{n}: not valid JSON ({e}); re-run prepare_data.py") from None
            if not isinstance(items[-1], dict):
                raise damaged(f"{path}:{n}", "is damaged (not a JSON object)", prepare_again(data_dir))
    return items


def prepare_again(data_dir: str | Path) -> str:
    """What to do about a damaged prepared file of `data_dir`: the prepare command that makes it again."""
    return (f"run `python tts/prepare_data.py --metadata <metadata> --audio_dir <audio folder> --output_dir {data_dir} "
            "--config <this run's config>` again (it makes damaged files again and keeps the others), then train "
            "again (--resume auto continues from the last checkpoint)")


def read_speakers(data_dir: str | Path) -> dict[str, int]:
    path = Path(data_dir) / "speakers.json"
    if not path.is_file():
        raise DataError(f"{path} not found: --data_dir must be a folder made by "
                        "`python tts/prepare_data.py --metadata ... --audio_dir ... --output_dir DIR`")
    speakers = read_json(path, prepare_again(data_dir))
    if not speakers or not all(isinstance(k, str) and type(v) is int for k, v in speakers.items()):
        raise damaged(path, "is damaged (not the {name: id} table prepare_data.py writes)", prepare_again(data_dir))
    return speakers


def check_prepared_audio(data_dir: str | Path, audio: AudioConfig, source: str | Path | None = None) -> None:
    """The data must have been prepared with the sample rate / STFT the model trains with; `source`: the
    published voice (`--init_from`) those settings come from, named in the message."""
    state = Path(data_dir) / "prepare_state.json"
    if not state.is_file():
        return
    prepared = read_json(state, prepare_again(data_dir)).get("audio", {})
    if not isinstance(prepared, dict):
        raise damaged(state, "is damaged (its audio settings are not a table)", prepare_again(data_dir))
    for key in ("sample_rate", "n_fft", "win_length", "hop_length"):
        if key in prepared and prepared[key] != getattr(audio, key):
            if source is not None:
                raise DataError(f"{data_dir} was prepared with audio.{key}={prepared[key]}, but --init_from {source} "
                                f"is a voice of audio.{key}={getattr(audio, key)}: prepare the data again with the "
                                f"voice's settings (prepare_data.py --set audio.{key}={getattr(audio, key)}), or start "
                                "from a voice made for the data's")
            raise DataError(f"{data_dir} was prepared with audio.{key}={prepared[key]} but the config says "
                            f"{getattr(audio, key)}; re-run prepare_data.py with this --config (or fix the config)")


def check_given_ids(data_dir: str | Path, frontend: Frontend) -> None:
    """Phoneme ids given to prepare_data.py index the symbol list it wrote to symbols.json: a model of another
    list would read other sounds, so it is refused."""
    path = Path(data_dir) / "symbols.json"
    if not path.is_file():
        raise damaged(path, "is missing (the folder holds phoneme ids)", prepare_again(data_dir))
    table = read_json(path, prepare_again(data_dir))
    if not isinstance(table, dict) or table.get("symbols") != list(frontend.symbols):
        kind = table.get("phoneme_type") if isinstance(table, dict) else None
        raise DataError(f"{data_dir} was prepared from phoneme ids of phoneme_type: {kind} "
                        f"(its symbols.json), but this config's front-end is phoneme_type: {frontend.phoneme_type}: "
                        "train with the phoneme_type it was prepared with, or prepare the ids again for this one")


class VitsDataset(Dataset):
    def __init__(self, data_dir: str | Path, split: str, audio: AudioConfig, add_blank: bool = True,
                 frontend: Frontend | None = None):
        self.dir = Path(data_dir)
        self.items = read_manifest(data_dir, split)
        self.hop = audio.hop_length
        self.spec_channels = audio.n_fft // 2 + 1
        self.add_blank = add_blank
        self.again = prepare_again(data_dir)  # the advice of a damaged file's one line
        self.frontend = frontend or Frontend()
        self.phonemes: dict[str, str] = {}
        if any("ids" in it for it in self.items):  # prepared from phoneme ids: of this front-end's symbols only
            check_given_ids(data_dir, self.frontend)
        if self.frontend.phoneme_type == "espeak":  # prepare_data.py cached them; data prepared for text: now
            cache = PhonemeCache(data_dir, self.frontend.voice)
            new = cache.fill([it["text"] for it in self.items if "ids" not in it])
            if new:
                print(f"note: phonemized {new} {split} utterance(s) with espeak-ng into {cache.path}")
            self.phonemes = cache.table
        check_prepared_audio(data_dir, audio)

    def __len__(self) -> int:
        return len(self.items)

    def frames(self, i: int) -> int:
        return int(self.items[i]["num_samples"]) // self.hop

    @property
    def lengths(self) -> list[int]:
        return [self.frames(i) for i in range(len(self.items))]

    def token_lengths(self) -> list[int]:
        """Tokens per item (blanks included), for the bucket shapes of ``collate``."""
        return [len(self.item_tokens(item)) for item in self.items]

    def tokens(self, text: str) -> torch.Tensor:
        ids = self.frontend.ids(text, on_unknown="error", phonemes=self.phonemes.get(text))
        return torch.tensor(intersperse(ids) if self.add_blank else ids, dtype=torch.long)

    def item_tokens(self, item: dict) -> torch.Tensor:
        """An item's ids with blanks: the phoneme ids its metadata gave (prepare_data.py --text_kind), else its text's."""
        if "ids" not in item:
            return self.tokens(item["text"])
        return torch.tensor(intersperse(item["ids"]) if self.add_blank else item["ids"], dtype=torch.long)

    def __getitem__(self, key) -> dict:
        index, _ = sample_rng(key)
        item = self.items[index]
        spec_path, wav_path = self.dir / item["spec"], self.dir / item["wav"]
        spec = load_npy(spec_path, self.again, shape=(self.spec_channels, None))  # bins: audio.n_fft // 2 + 1
        spec = torch.from_numpy(require_finite(spec, spec_path, self.again).astype(np.float32))
        pcm = self._pcm(wav_path, int(item["num_samples"]))
        if abs(spec.size(1) - len(pcm) // self.hop) > 1:  # T samples make T // hop frames
            raise damaged(spec_path, f"has {spec.size(1)} frames, expected {len(pcm) // self.hop} for its "
                          f"{len(pcm)}-sample wav", self.again)
        frames = min(spec.size(1), len(pcm) // self.hop)
        wav = torch.from_numpy(to_float32(pcm[: frames * self.hop]))
        return {"id": item["id"], "ids": self.item_tokens(item), "spec": spec[:, :frames], "wav": wav,
                "sid": int(item.get("speaker_id", 0))}


    def _pcm(self, path: Path, samples: int) -> np.ndarray:
        """The prepared 16-bit wav, refused (named) when it is missing, unreadable or of another length
        than its manifest line's `num_samples` (cut short)."""
        if not path.is_file():
            raise damaged(path, "is missing", self.again)
        try:
            pcm, _ = sf.read(path, dtype="int16")
        except (RuntimeError, OSError, ValueError, EOFError) as e:  # soundfile.LibsndfileError is a RuntimeError
            raise damaged(path, f"is damaged (not a readable wav: {getattr(e, 'error_string', None) or e})", self.again) from None
        if pcm.ndim != 1 or len(pcm) != samples:
            raise damaged(path, f"has {len(pcm)} samples{'' if pcm.ndim == 1 else ' in several channels'}, its "
                          f"manifest line says {samples} (cut short?)", self.again)
        return pcm


def collate(batch: list[dict], shapes: BucketShapes | None = None) -> dict:
    """Zero-pad to the longest item, or with ``shapes`` to the batch's length bucket's fixed
    (text, frames) size (cudnn_benchmark / compile: a few shapes per run); lengths say what is real."""
    b = len(batch)
    x_len = torch.tensor([len(it["ids"]) for it in batch])
    y_len = torch.tensor([it["spec"].size(1) for it in batch])
    t_text, t_frames = int(x_len.max()), int(y_len.max())
    if shapes is not None:
        t_text, t_frames = shapes.shape_for(t_frames, t_text)
    c = batch[0]["spec"].size(0)
    hop = batch[0]["wav"].numel() // max(1, batch[0]["spec"].size(1))
    x = torch.zeros(b, t_text, dtype=torch.long)
    spec = torch.zeros(b, c, t_frames)
    wav = torch.zeros(b, t_frames * hop)
    for i, it in enumerate(batch):
        x[i, : x_len[i]] = it["ids"]
        spec[i, :, : y_len[i]] = it["spec"]
        wav[i, : it["wav"].numel()] = it["wav"]
    return {"ids": x, "ids_len": x_len, "spec": spec, "spec_len": y_len, "wav": wav,
            "sid": torch.tensor([it["sid"] for it in batch]), "id": [it["id"] for it in batch]}
