"""Dataset over a folder made by tts/prepare_data.py, and its collate function.

An item is (token ids with blanks, cached linear spectrogram, 16-bit waveform cropped to
whole frames, speaker id). The random training window is cut inside the model (VITS slices
its latent), with the global torch RNG that checkpoints restore, so the dataset itself is
deterministic and resumes exactly with any number of loader workers.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
from torch.utils.data import Dataset

from common.audio import to_float32
from common.data import BucketShapes, sample_rng
from tts.text import intersperse
from tts.text.phonemes import Frontend, PhonemeCache
from tts.vits.config import AudioConfig


class DataError(RuntimeError):
    """The prepared folder is missing, incomplete, or was prepared with other audio settings."""


def read_manifest(data_dir: str | Path, split: str) -> list[dict]:
    path = Path(data_dir) / f"{split}.jsonl"
    if not path.is_file():
        raise DataError(f"{path} not found: --data_dir must be a folder made by "
                        "`python tts/prepare_data.py --metadata ... --audio_dir ... --output_dir DIR`")
    items = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                items.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{n}: not valid JSON ({e}); re-run prepare_data.py") from None
    return items


def read_speakers(data_dir: str | Path) -> dict[str, int]:
    path = Path(data_dir) / "speakers.json"
    if not path.is_file():
        raise DataError(f"{path} not found: --data_dir must be a folder made by "
                        "`python tts/prepare_data.py --metadata ... --audio_dir ... --output_dir DIR`")
    return json.loads(path.read_text(encoding="utf-8"))


def check_prepared_audio(data_dir: str | Path, audio: AudioConfig, source: str | Path | None = None) -> None:
    """The data must have been prepared with the sample rate / STFT the model trains with; `source`: the
    published voice (`--init_from`) those settings come from, named in the message."""
    state = Path(data_dir) / "prepare_state.json"
    if not state.is_file():
        return
    prepared = json.loads(state.read_text()).get("audio", {})
    for key in ("sample_rate", "n_fft", "win_length", "hop_length"):
        if key in prepared and prepared[key] != getattr(audio, key):
            if source is not None:
                raise DataError(f"{data_dir} was prepared with audio.{key}={prepared[key]}, but --init_from {source} "
                                f"is a voice of audio.{key}={getattr(audio, key)}: prepare the data again with the "
                                f"voice's settings (prepare_data.py --set audio.{key}={getattr(audio, key)}), or start "
                                "from a voice made for the data's")
            raise DataError(f"{data_dir} was prepared with audio.{key}={prepared[key]} but the config says "
                            f"{getattr(audio, key)}; re-run prepare_data.py with this --config (or fix the config)")


class VitsDataset(Dataset):
    def __init__(self, data_dir: str | Path, split: str, audio: AudioConfig, add_blank: bool = True,
                 frontend: Frontend | None = None):
        self.dir = Path(data_dir)
        self.items = read_manifest(data_dir, split)
        self.hop = audio.hop_length
        self.spec_channels = audio.n_fft // 2 + 1
        self.add_blank = add_blank
        self.frontend = frontend or Frontend()
        self.phonemes: dict[str, str] = {}
        if self.frontend.phoneme_type == "espeak":  # prepare_data.py cached them; data prepared for text: now
            cache = PhonemeCache(data_dir, self.frontend.voice)
            new = cache.fill([it["text"] for it in self.items])
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
        return [len(self.tokens(item["text"])) for item in self.items]

    def tokens(self, text: str) -> torch.Tensor:
        ids = self.frontend.ids(text, on_unknown="error", phonemes=self.phonemes.get(text))
        return torch.tensor(intersperse(ids) if self.add_blank else ids, dtype=torch.long)

    def __getitem__(self, key) -> dict:
        index, _ = sample_rng(key)
        item = self.items[index]
        spec = torch.from_numpy(np.load(self.dir / item["spec"]).astype(np.float32))
        if spec.size(0) != self.spec_channels:
            raise DataError(f"{self.dir / item['spec']}: {spec.size(0)} frequency bins, expected "
                            f"{self.spec_channels} (audio.n_fft // 2 + 1); re-run prepare_data.py")
        pcm, _ = sf.read(self.dir / item["wav"], dtype="int16")
        frames = min(spec.size(1), len(pcm) // self.hop)
        wav = torch.from_numpy(to_float32(pcm[: frames * self.hop]))
        return {"id": item["id"], "ids": self.tokens(item["text"]), "spec": spec[:, :frames], "wav": wav,
                "sid": int(item.get("speaker_id", 0))}


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
