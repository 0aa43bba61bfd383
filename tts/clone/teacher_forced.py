"""The cloning model's teacher-forced ("GTA") mels of a prepared dataset, for fine-tuning the vocoder
on the mels this model really makes (`vocoder/prepare_data.py --mel_dir`, `speech.mel_files`).

Teacher forcing is the training forward in eval mode: the durations come from MAS on the ground-truth
mel, so every output frame is the model's mel for the same instant of the recording, frame for frame
(a waveform of T samples: T // hop frames, the vocoder's grid). The reference is what training gives
the utterance: a crop of another utterance of the same speaker (`CloneDataset`, a fixed draw per
utterance, so running twice writes the same files).

    python tts/infer_clone.py --teacher_forced --checkpoint runs/tts_clone/checkpoints/best.pt \
        --data data/tts_prepared/train.jsonl --output data/gta_mels
"""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from common.atomic_write import write_bytes
from speech.mel_files import MEL_SETTINGS_FILE, write_mel_settings
from tts.clone.config import CloneConfig
from tts.clone.data import CloneDataset, DataError, build_features, reference_frames
from tts.clone.model import VoiceCloneTTS


def manifests(data: str | Path) -> list[Path]:
    """`--data`: a jsonl manifest, or a prepared folder (its train.jsonl and eval.jsonl)."""
    path = Path(data)
    found = [path] if path.is_file() else [p for p in (path / "train.jsonl", path / "eval.jsonl") if p.is_file()]
    if not found:
        raise DataError(f"--data {data}: not a .jsonl manifest nor a folder with train.jsonl / eval.jsonl "
                        "(made by tts/prepare_data.py)")
    return found


@torch.no_grad()
def teacher_forced_mel(model: VoiceCloneTTS, ids: np.ndarray, mel: np.ndarray, ref_mel: np.ndarray) -> np.ndarray:
    """One utterance's teacher-forced log-mel `[n_mels, frames]` (the vocoder's units), as many frames as `mel`."""
    device = next(model.parameters()).device

    def batch(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(x)[None].to(device)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(1, n, dtype=torch.bool, device=device)

    out = model(batch(ids), ones(len(ids)), batch(mel), ones(mel.shape[1]), batch(ref_mel), ones(ref_mel.shape[1]))
    return model.denorm_mel(out["post_mel"].float())[0].cpu().numpy()


def write_teacher_forced_mels(model: VoiceCloneTTS, cfg: CloneConfig, data: str | Path, output: str | Path,
                              cache_root: Path, overwrite: bool = False, log=print) -> list[Path]:
    """`<wav stem>.npy` per usable utterance of `data` + mel_settings.json in `output`; returns the mel files.
    Features (ground-truth mel, f0, ids) come from the training cache under `cache_root`."""
    output = Path(output)
    if (output / MEL_SETTINGS_FILE).is_file() and not overwrite:
        raise DataError(f"--output {output} already holds mels; pass --overwrite to write them again")
    items = [it for m in manifests(data) for it in build_features(m, cfg.audio, cfg.data, cache_root, 1, log)]
    names = [Path(it["wav"]).stem for it in items]
    twice = sorted(n for n, count in Counter(names).items() if count > 1)  # one pass, not n² for 100k files
    if twice:
        raise DataError(f"--data {data}: several utterances' audio files are named {', '.join(twice[:3])}; the mels are "
                        "named after the audio file, so the names must be unique")
    model.eval()
    dataset = CloneDataset(items, reference_frames(cfg))
    written = []
    for i, name in enumerate(names):
        feats = dataset[i]  # an int key: the same reference crop every run
        mel = teacher_forced_mel(model, feats["ids"], feats["mel"], feats["ref_mel"])
        buf = io.BytesIO()
        np.save(buf, mel.astype(np.float32))
        written.append(write_bytes(output / f"{name}.npy", buf.getvalue()))
    write_mel_settings(output, cfg.audio)  # last: a folder with settings is a complete folder
    log(f"wrote {len(written)} teacher-forced mels + {MEL_SETTINGS_FILE} to {output}")
    return written
