"""Data for the voice-cloning model: manifests → checked, cached features → bucketed static batches.

Three stages, each for a reason the XTTS-style users felt:
1. `build_features` runs every utterance once through the ONE shared data check
   (`tts.prepare_data.check_item`, the VITS trainer's) and caches log-mel + f0 + voiced + token
   ids per utterance under the cache folder (the input is never touched). Bad items are skipped
   and reported, never fatal. After that, a training step only reads small .npz files: no audio
   decoding, no pitch tracking in the loop, so the GPU is not starved by the DataLoader. A cached file
   that no longer reads back whole (cut short, garbage, NaN/inf, another shape) is made again with one
   line at every start (a resume too); one damaged while the run trains stops it with one line naming it
   (`common.prepared`, exit 2): the same command with --resume auto makes it again and continues.
2. `CloneDataset` returns one utterance plus a reference crop from ANOTHER utterance of the same
   speaker (so the reference encoder must learn the voice, not copy the content), drawn from
   `common.data.sample_rng(key)`: exactly reproducible on resume, with workers.
3. `BucketCollate` pads every batch to its length bucket's fixed (text, frames) size, and the
   reference to one fixed length: a handful of shapes for the whole run, so `torch.compile`,
   cuDNN autotuning and CUDA graphs never see a new shape after the first epoch.
4. `CloneData` puts them together for a run: the bucketed training sampler and the loaders, each
   with an explicit seed so a resume continues mid-epoch exactly.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from common.atomic_write import write_bytes
from common.data import BucketBatchSampler, BucketShapes, make_loader, sample_rng
from common.errors import UserError
from common.prepared import damaged, npz_problem, open_npz, require_finite
from common.workers import process_pool
from speech.audio import AudioError, MelSpectrogram, check_audio, load_audio
from speech.f0 import check_f0_keys, extract_f0, f0_extractor_id
from speech.f0_report import f0_summary, save_f0_report
from tts.clone.config import AudioConfig, CloneConfig, DataConfig
from tts.prepare_data import DataConfig as SharedCheckConfig  # the shared data check's limits
from tts.prepare_data import check_item

LOG_FLOOR = math.log(1e-5)  # the log-mel value of silence (MelSpectrogram's clamp)


class DataError(UserError, ValueError):
    """A data input that cannot be used at all (missing manifest, nothing usable, bad reference clip)."""


# ---------------------------------------------------------------------------------------------
# Manifests
# ---------------------------------------------------------------------------------------------
def resolve_manifests(train: str, val: str) -> tuple[Path, Path]:
    """`--train-data` (train.jsonl or a prepared folder) and `--val-data` → two jsonl paths."""
    if not train:
        raise DataError("no training data: pass --train-data (a train.jsonl from tts/prepare_data.py, "
                        "or the prepared folder that holds it)")
    tr = Path(train)
    if tr.is_dir():
        folder, tr = tr, tr / "train.jsonl"
        if not tr.is_file():
            raise DataError(f"--train-data {train}: the folder has no train.jsonl; run tts/prepare_data.py first")
        va = Path(val) if val else folder / "eval.jsonl"
    else:
        if not tr.is_file():
            raise DataError(f"--train-data {train}: no such file or folder")
        va = Path(val) if val else tr.with_name("eval.jsonl")
    if va.is_dir():
        va = va / "eval.jsonl"
    if not va.is_file():
        raise DataError(f"validation manifest {va} not found: pass --val-data (an eval.jsonl from "
                        "tts/prepare_data.py)")
    return tr, va


def read_manifest(path: Path) -> tuple[list[dict], list[str]]:
    """Rows with absolute wav paths, and one problem line per row that could not be used."""
    rows, problems = [], []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            problems.append(f"{path}:{n}: not valid JSON ({e.msg})")
            continue
        if isinstance(row, dict) and "ids" in row:  # prepare_data.py --text_kind phonemes / phoneme_ids
            raise DataError(f"{path}:{n}: this folder was prepared from phonemes or phoneme ids (tts/prepare_data.py "
                            "--text_kind), which only the VITS trainer reads; the cloning model reads text through "
                            "its own front-end: prepare the corpus again from its text (--text_kind text)")
        missing = [k for k in ("id", "wav", "text") if not isinstance(row, dict) or k not in row]
        if missing:
            problems.append(f"{path}:{n}: missing field(s) {missing} (expected id, wav, text, speaker)")
            continue
        wav = Path(row["wav"])
        row["wav"] = str(wav if wav.is_absolute() else path.parent / wav)
        row["speaker"] = str(row.get("speaker", "speaker"))
        row["source"] = f"{path}:{n}"
        rows.append(row)
    return rows, problems


# ---------------------------------------------------------------------------------------------
# Features (computed once, cached)
# ---------------------------------------------------------------------------------------------
def shared_check_config(data: DataConfig) -> SharedCheckConfig:
    """Our data limits in the VITS trainer's DataConfig, for the one shared `check_item`.
    No blank tokens: this model aligns symbols directly (frames >= symbols is the MAS condition)."""
    return SharedCheckConfig(
        min_audio_len=data.min_seconds, max_audio_len=data.max_seconds, min_text_len=data.min_text_len,
        max_text_len=data.max_text_len, min_chars_per_second=data.min_chars_per_second,
        max_chars_per_second=data.max_chars_per_second, silence_db=data.silence_db,
        max_clip_fraction=data.max_clip_fraction, add_blank=False)


def features_identity(audio: AudioConfig) -> dict:
    """Every setting the features depend on: the audio block, the f0 extractor among them, and for rmvpe its
    weights by content (`speech.f0.f0_extractor_id`), not by path: other weights are another cache."""
    d = asdict(audio)
    del d["f0_weights"]  # the path is not the identity (the digest is); without it older caches keep their tag
    if audio.f0_method == "rmvpe":
        d.update(f0_extractor_id(audio.f0_method, audio.f0_weights))
    return d


def features_tag(audio: AudioConfig) -> str:
    """Cache sub-folder name: a hash of `features_identity`."""
    blob = json.dumps(features_identity(audio), sort_keys=True).encode()
    return "feat_" + hashlib.sha1(blob).hexdigest()[:10]


def check_f0_settings(audio: AudioConfig) -> None:
    """Before any file: audio.f0_method and (rmvpe) audio.f0_weights usable, else one DataError naming the key;
    a missing package raises its ModuleNotFoundError (one line with its pip install at the run's edge)."""
    try:
        check_f0_keys(audio.f0_method, audio.f0_weights, "audio.f0_method", "audio.f0_weights")
    except ValueError as e:
        raise DataError(str(e)) from None


_MEL: tuple[str, MelSpectrogram] | None = None


def _mel_module(audio: AudioConfig) -> MelSpectrogram:
    global _MEL
    tag = json.dumps(audio.mel_kwargs, sort_keys=True)
    if _MEL is None or _MEL[0] != tag:
        _MEL = (tag, MelSpectrogram(**audio.mel_kwargs))
    return _MEL[1]


def compute_features(wav: np.ndarray, audio: AudioConfig) -> dict[str, np.ndarray]:
    """Log-mel [n_mels, T], f0 [T] (Hz, continuous) and voiced [T] of a waveform at audio.sample_rate."""
    with torch.no_grad():
        mel = _mel_module(audio)(torch.from_numpy(wav).float())[0].numpy()
    f0, voiced = extract_f0(wav, audio.sample_rate, audio.hop_length, mel.shape[1], audio.f0_min,
                            audio.f0_max, method=audio.f0_method, weights=audio.f0_weights)
    return {"mel": mel.astype(np.float32), "f0": f0.astype(np.float32), "voiced": voiced.astype(bool)}


def _feature_job(job: tuple[dict, AudioConfig, DataConfig, str]) -> tuple[dict, str | None]:
    """One utterance: check (shared), compute or reuse its cached features. Runs in a worker process."""
    row, audio, data, cache_dir = job
    out = Path(cache_dir) / (row["id"].replace("/", "__") + ".npz")
    item = {"id": row["id"], "speaker": row["speaker"], "path": str(out), "wav": row["wav"]}
    if out.is_file():
        why = cache_problem(out, audio)
        if why is None:
            with np.load(out) as z:
                item.update(frames=int(z["mel"].shape[1]), n_text=int(z["ids"].shape[0]))
            return item, None
        item["remade"] = f"damaged cached features {out} {why}: making it again from {row['wav']}"
    try:
        wav, _ = load_audio(row["wav"], sr=audio.sample_rate)
    except AudioError as e:
        return item, f"audio {e.reason}"
    chk = check_item(row.get("raw_text") or row["text"], wav, audio.sample_rate, shared_check_config(data),
                     audio.hop_length)
    if not chk.ok:
        return item, chk.reason
    feats = compute_features(wav, audio)
    if feats["mel"].shape[1] < len(chk.ids):
        return item, f"audio too short to align ({feats['mel'].shape[1]} frames < {len(chk.ids)} symbols)"
    buf = io.BytesIO()
    np.savez(buf, ids=np.asarray(chk.ids, dtype=np.int64), **feats)
    write_bytes(out, buf.getvalue())  # atomic: never a half-written cache entry; a full disk is one line
    item.update(frames=int(feats["mel"].shape[1]), n_text=len(chk.ids))
    return item, None


def cache_problem(path: Path, audio: AudioConfig) -> str | None:
    """Why a cached feature file cannot be used (unreadable, an array missing or of another shape, NaN/inf),
    or None: ids [S], mel [n_mels, T], f0 [T], voiced [T]."""
    why = npz_problem(path, {"ids": (None,), "mel": (audio.n_mels, None), "f0": (None,), "voiced": (None,)})
    if why is None:
        with np.load(path) as z:
            frames = z["mel"].shape[1]
            if z["f0"].shape[0] != frames or z["voiced"].shape[0] != frames:
                why = f"has f0/voiced of {z['f0'].shape[0]}/{z['voiced'].shape[0]} frames, mel of {frames}"
    return why


def _init_worker() -> None:
    torch.set_num_threads(1)


def build_features(manifest: Path, audio: AudioConfig, data: DataConfig, cache_root: Path,
                   num_workers: int = 1, log=print) -> list[dict]:
    """Check + featurise every row of `manifest` (cached); returns the usable items.

    Each dropped row is reported with its manifest line and reason; none usable → DataError.
    """
    check_f0_settings(audio)
    rows, problems = read_manifest(manifest)
    n_rows = len(rows) + len(problems)
    cache_dir = cache_root / features_tag(audio)
    cache_dir.mkdir(parents=True, exist_ok=True)
    jobs = [(row, audio, data, str(cache_dir)) for row in rows]
    if num_workers > 1 and len(jobs) > 1:
        with process_pool(num_workers, initializer=_init_worker) as pool:
            results = list(pool.map(_feature_job, jobs, chunksize=max(1, len(jobs) // (8 * num_workers))))
    else:
        results = [_feature_job(j) for j in jobs]
    items = []
    for row, (item, reason) in zip(rows, results):
        if "remade" in item:
            log(item.pop("remade"))
        if reason is None:
            items.append(item)
        else:
            problems.append(f"{row['source']} [{row['id']}]: {reason}")
    for p in problems:
        log(f"skipped {p}")
    if not items:
        raise DataError(f"nothing usable in {manifest}: all {n_rows} rows were "
                        "skipped (reasons above)")
    log(f"{manifest}: {len(items)} utterances usable, {len(problems)} skipped; features cached in {cache_dir}")
    for line in f0_report(items, audio, cache_dir, manifest.stem):
        log(line)
    return items


def f0_report(items: list[dict], audio: AudioConfig, cache_dir: Path, name: str) -> list[str]:
    """The f0 the extractor found in the cached features (`speech.f0_report`), as <name>_f0.txt / .json / .png
    in the cache folder: voiced fraction, range, and a warning with suggested audio.f0_min / audio.f0_max when
    they cut a speaker off. The .json records the extractor (and rmvpe's weights digest) the cache holds."""
    def tracks():
        for item in items:
            with np.load(item["path"]) as z:  # named: a cut bound's warning says which speaker and file
                yield z["f0"], z["voiced"], f"speaker {item['speaker']}: {item.get('wav', item['path'])}"

    s = f0_summary(tracks(), audio.f0_min, audio.f0_max, audio.f0_method)
    ident = features_identity(audio)
    return save_f0_report(s, cache_dir, f"{name}_f0", key_prefix="audio.", redo="train again",
                          extra={k: v for k, v in ident.items() if k.startswith("f0_")})


# A cached file damaged after the start checked it: the start of the next run makes it again
REMAKE_CACHE = ("run the same command again with --resume auto: a damaged cached feature file is made again from "
                "its wav at the start, and training continues from the last checkpoint")


def load_item(item: dict) -> dict[str, np.ndarray]:
    """The cached features of an utterance; `PreparedFileError` names the file when it no longer reads back
    whole or holds NaN/inf (damaged after the start checked it)."""
    feats = open_npz(item["path"], ("ids", "mel", "f0", "voiced"))
    if isinstance(feats, str):
        raise damaged(item["path"], feats, REMAKE_CACHE)
    for key in ("mel", "f0"):
        require_finite(feats[key], item["path"], REMAKE_CACHE)
    return feats


def feature_stats(items: list[dict], max_items: int) -> tuple[torch.Tensor, torch.Tensor, float, float]:
    """Per-bin log-mel mean/std and voiced log-f0 mean/std over (up to) `max_items` utterances,
    picked evenly across the list so every speaker contributes."""
    picks = items if len(items) <= max_items else [items[i] for i in np.linspace(0, len(items) - 1, max_items).astype(int)]
    mels, logf0 = [], []
    for it in picks:
        f = load_item(it)
        mels.append(f["mel"])
        if f["voiced"].any():
            logf0.append(np.log(np.maximum(f["f0"][f["voiced"]], 1.0)))
    mel = np.concatenate(mels, axis=1)
    lf = np.concatenate(logf0) if logf0 else np.array([math.log(150.0)])
    return (torch.from_numpy(mel.mean(1)).float(), torch.from_numpy(mel.std(1)).float(),
            float(lf.mean()), float(max(lf.std(), 0.05)))


# ---------------------------------------------------------------------------------------------
# Dataset
# ---------------------------------------------------------------------------------------------
class CloneDataset(Dataset):
    """Utterance + a reference crop of `ref_frames` from another utterance of the same speaker."""

    def __init__(self, items: list[dict], ref_frames: int) -> None:
        self.items = items
        self.ref_frames = ref_frames
        self.by_speaker: dict[str, list[int]] = defaultdict(list)
        for i, it in enumerate(items):
            self.by_speaker[it["speaker"]].append(i)

    def __len__(self) -> int:
        return len(self.items)

    def lengths(self) -> list[int]:
        return [it["frames"] for it in self.items]

    def __getitem__(self, key) -> dict:
        index, rng = sample_rng(key)
        feats = load_item(self.items[index])
        same = self.by_speaker[self.items[index]["speaker"]]
        others = [j for j in same if j != index] or [index]
        ref_index = others[int(rng.integers(len(others)))]
        ref = feats["mel"] if ref_index == index else load_item(self.items[ref_index])["mel"]
        if ref.shape[1] > self.ref_frames:
            start = int(rng.integers(ref.shape[1] - self.ref_frames + 1))
            ref = ref[:, start:start + self.ref_frames]
        feats["ref_mel"] = ref
        feats["id"] = self.items[index]["id"]
        return feats


class BucketCollate(BucketShapes):
    """Pads a batch to its bucket's fixed (text, frames) lengths (`common.data.BucketShapes`); the
    reference to `ref_frames`."""

    def __init__(self, frames: list[int], n_text: list[int], boundaries: list[int], ref_frames: int,
                 frame_multiple: int = 16, text_multiple: int = 8) -> None:
        super().__init__(frames, n_text, boundaries, frame_multiple, text_multiple)
        self.ref_frames = ref_frames

    def __call__(self, samples: list[dict]) -> dict:
        b = len(samples)
        n_mels = samples[0]["mel"].shape[0]
        t_text, t_frames = self.shape_for(max(s["mel"].shape[1] for s in samples),
                                          max(len(s["ids"]) for s in samples))
        batch = {
            "text": torch.zeros(b, t_text, dtype=torch.long),
            "text_mask": torch.zeros(b, t_text, dtype=torch.bool),
            "mel": torch.full((b, n_mels, t_frames), LOG_FLOOR),
            "mel_mask": torch.zeros(b, t_frames, dtype=torch.bool),
            "f0": torch.zeros(b, t_frames),
            "voiced": torch.zeros(b, t_frames, dtype=torch.bool),
            "ref_mel": torch.full((b, n_mels, self.ref_frames), LOG_FLOOR),
            "ref_mask": torch.zeros(b, self.ref_frames, dtype=torch.bool),
        }
        for i, s in enumerate(samples):
            n, t, r = len(s["ids"]), s["mel"].shape[1], s["ref_mel"].shape[1]
            batch["text"][i, :n] = torch.from_numpy(s["ids"])
            batch["text_mask"][i, :n] = True
            batch["mel"][i, :, :t] = torch.from_numpy(s["mel"])
            batch["mel_mask"][i, :t] = True
            batch["f0"][i, :t] = torch.from_numpy(s["f0"])
            batch["voiced"][i, :t] = torch.from_numpy(s["voiced"])
            batch["ref_mel"][i, :, :r] = torch.from_numpy(s["ref_mel"])
            batch["ref_mask"][i, :r] = True
        batch["ids"] = [s["id"] for s in samples]
        return batch


# ---------------------------------------------------------------------------------------------
# Reference clips at inference / validation
# ---------------------------------------------------------------------------------------------
@dataclass
class Reference:
    mel: torch.Tensor   # [1, n_mels, T] log-mel
    mask: torch.Tensor  # [1, T] bool
    wav: np.ndarray
    seconds: float


def load_reference(path: str | os.PathLike, audio: AudioConfig, data: DataConfig,
                   max_seconds: float = 30.0, name: str | None = None) -> Reference:
    """A user's reference voice clip → log-mel, or a DataError that says what is wrong and what to do. `name`:
    how its messages call the clip (default "reference clip PATH"; the server, whose file is a temp, "the
    reference clip").

    Unreadable, too short (< data.min_ref_seconds), silent and clipped clips are refused with
    `speech.audio.check_audio`, the same check the training data passes. Longer clips are cut to
    `max_seconds` (the embedding is a mean over time; more audio adds little).
    """
    name = name or f"reference clip {path}"
    try:
        wav, sr = load_audio(path, sr=audio.sample_rate)
    except AudioError as e:
        raise DataError(f"{name}: {e.reason}; give a wav/flac/ogg/mp3 file with a few seconds "
                        "of the target voice") from None
    reason = check_audio(wav, sr, min_seconds=data.min_ref_seconds, max_seconds=None,
                         silence_db=data.silence_db, max_clip_fraction=data.max_clip_fraction)
    if reason:
        raise DataError(f"{name}: {reason}; give at least {data.min_ref_seconds:g} s of clean, "
                        "audible speech of the target voice")
    wav = wav[: int(max_seconds * sr)]
    with torch.no_grad():
        mel = _mel_module(audio)(torch.from_numpy(wav).float())
    return Reference(mel, torch.ones(1, mel.shape[-1], dtype=torch.bool), wav, len(wav) / sr)


def reference_frames(cfg: CloneConfig) -> int:
    """Frames of the reference crop (data.ref_seconds): training and the teacher-forced mels use the same."""
    return int(math.ceil(cfg.data.ref_seconds * cfg.audio.sample_rate / cfg.audio.hop_length))


def feature_cache_root(cfg: CloneConfig, run_dir: Path) -> Path:
    """Where the features are cached: data.cache_dir, else the run folder's features/ (as training cached them)."""
    return Path(cfg.data.cache_dir) if cfg.data.cache_dir else run_dir / "features"


class CloneData:
    """The bucketed training set and sampler (a static set of padded shapes), the validation loader
    and the loader settings, from the prepared manifests (features cached, input never modified)."""

    def __init__(self, cfg: CloneConfig, device: torch.device, run_dir: Path, log: Callable[[str], None]) -> None:
        t = cfg.train
        train_jsonl, val_jsonl = resolve_manifests(cfg.data.train, cfg.data.val)
        cache_root = feature_cache_root(cfg, run_dir)
        feat_workers = max(1, min(t.num_workers, os.cpu_count() or 1))
        self.train_items = build_features(train_jsonl, cfg.audio, cfg.data, cache_root, feat_workers, log)
        self.val_items = build_features(val_jsonl, cfg.audio, cfg.data, cache_root, feat_workers, log)
        ref_frames = reference_frames(cfg)
        self.train_set = CloneDataset(self.train_items, ref_frames)
        val_set = CloneDataset(self.val_items, ref_frames)
        self.sampler = BucketBatchSampler(self.train_set.lengths(), t.batch_size, cfg.data.num_buckets, shuffle=True,
                                          seed=t.seed, drop_last=True, max_frames=t.max_frames_per_batch,
                                          frame_multiple=cfg.data.frame_multiple)
        self.collate = self._collate(cfg, self.train_set, self.train_items, self.sampler, ref_frames)
        val_sampler = BucketBatchSampler(val_set.lengths(), cfg.val.batch_size, cfg.data.num_buckets, shuffle=False,
                                         seed=0, num_replicas=1, rank=0)
        self.loader_kw = dict(num_workers=t.num_workers, prefetch_factor=cfg.data.prefetch_factor,
                              pin_memory=cfg.data.pin_memory and device.type == "cuda", persistent_workers=False)
        self.train_loader: DataLoader | None = None  # made at the first epoch_loader call
        self.val_loader = make_loader(val_set, batch_sampler=val_sampler, seed=0,
                                      collate_fn=self._collate(cfg, val_set, self.val_items, val_sampler, ref_frames),
                                      **{**self.loader_kw, "num_workers": min(t.num_workers, 2)})

    @staticmethod
    def _collate(cfg: CloneConfig, dataset: CloneDataset, items: list[dict], sampler: BucketBatchSampler,
                 ref_frames: int) -> BucketCollate:
        return BucketCollate(dataset.lengths(), [it["n_text"] for it in items], sampler.boundaries, ref_frames,
                             cfg.data.frame_multiple, cfg.data.text_multiple)

    def epoch_loader(self, epoch: int, batch_in_epoch: int, seed: int) -> DataLoader:
        """The training loader positioned at `epoch`, after `batch_in_epoch` batches (exact resume: every item's
        randomness comes from its sampler key, never from a worker's seed). One loader for the run, its workers
        kept from epoch to epoch: a loader per epoch started them again each time (on a lent H200, a corpus
        of 3 batches an epoch spent 44 % of the step waiting for them; on Windows each start re-imports torch)."""
        self.sampler.set_epoch(epoch)
        self.sampler.skip_batches(batch_in_epoch)
        if self.train_loader is None:
            self.train_loader = make_loader(self.train_set, batch_sampler=self.sampler, collate_fn=self.collate,
                                            seed=seed, **{**self.loader_kw, "persistent_workers": True})
        return self.train_loader
