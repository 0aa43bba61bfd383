"""Do the new held-out metrics separate good from bad output? (issue 41, "Measure"; docs/DEMO.md keeps the tables)

    python -m bench.metric_separation        # after `make demo` (reads runs/ and data/demo/, trains nothing)

Why: a validation metric is worth its column only when it ranks trained output better than clearly wrong
output. For each demo this reads every new metric at the first and the last validation from the run folder,
then scores clearly wrong outputs against the same held-out recordings with the functions the validations
call (imported, not re-implemented):
- vocoder (`vocoder.validation`: `speech.pitch_metrics.pitch_errors` on the validation's cut of each held-out
  clip): a flat 30-harmonic stack on the clip's own f0 at its level, one clip of each training reader, white
  noise at the clip's level (`bench.demo_references`);
- VITS and cloning (`speech.mcd.mcd_dtw_path` + `aligned_pitch_errors`, `speech.speaker_similarity`,
  each trainer's mel and f0 range): each other speaker's recording of the same held-out sentence (the demo
  corpus has every sentence in all three voices), and white noise at the recording's level.
The VAE's new metric, rFID, is off in the demo (no Inception weights cached), so it has no table.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch

from bench.demo_references import at_level, harmonic_stack
from common.best_by import METRICS
from common.config import load_config
from speech.audio import MelSpectrogram, load_audio
from speech.f0 import extract_f0
from speech.mcd import aligned_pitch_errors, mcd_dtw_path, rms_db
from speech.pitch_metrics import PITCH_METRICS, nanmean, pitch_errors
from speech.speaker_similarity import load_speaker_encoder

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "data" / "demo"
TTS_METRICS = ("mcd", *PITCH_METRICS, "speaker_sim")  # mcd: the figure the demos already judge, for comparison


def cell(v: float) -> str:
    """n/a for NaN (an F0 RMSE with no frame voiced in both), 3 decimals below 10, 1 above (cents)."""
    return "n/a" if not math.isfinite(v) else f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"


def table(title: str, metrics, first: dict, last: dict, wrong: dict[str, dict[str, float]]) -> str:
    """One markdown table: metric | first | last | each wrong output | direction."""
    head = ["metric", f"first validation (step {first['step']})", f"last validation (step {last['step']})",
            *wrong, "direction"]
    lines = [f"**{title}**", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in metrics:
        cells = [first.get(m, math.nan), last.get(m, math.nan), *(w[m] for w in wrong.values())]
        lines.append(f"| {m} | " + " | ".join(cell(v) for v in cells)
                     + f" | {'lower' if METRICS[m] == 'min' else 'higher'} is better |")
    return "\n".join(lines)


def vocoder_table(runs: Path) -> str:
    from vocoder.config import VocoderConfig
    from vocoder.data import VocoderDataset
    from vocoder.demo import CONFIG

    cfg = load_config(CONFIG, VocoderConfig)
    sr, hop = cfg.audio.sample_rate, cfg.audio.hop_length
    history = json.loads((runs / "vocoder_demo" / "summary.json").read_text())["valid"]
    data = DATA / "vocoder_readers_bin"
    manifest = json.loads((data / "manifest.json").read_text())
    valid = VocoderDataset(data, manifest["valid"], cfg, train=False)  # the validation's own cut of each clip
    corpus = json.loads((DATA / "vocoder_readers" / "corpus.json").read_text())
    readers = [next(f for f in corpus["files"] if f.startswith(f"{r}/")) for r in corpus["train_readers"]]
    others = [load_audio(DATA / "vocoder_readers" / f, sr=sr)[0] for f in readers]
    rng = np.random.default_rng(0)
    rows: dict[str, list[dict]] = {"flat harmonic stack": [], "another reader (6)": [], "white noise": []}
    for i in range(len(valid)):
        ref = valid[i]["audio"].numpy().astype(np.float64)
        f0, voiced = extract_f0(ref.astype(np.float32), sr, hop, len(ref) // hop, cfg.f0_min, cfg.f0_max)
        stack = at_level(harmonic_stack(f0, voiced, hop, sr), rms_db(ref))
        noise = at_level(rng.standard_normal(len(ref)), rms_db(ref))
        for name, outs in (("flat harmonic stack", [stack]), ("another reader (6)", others), ("white noise", [noise])):
            rows[name] += [pitch_errors(out, ref, sr, hop, cfg.f0_min, cfg.f0_max) for out in outs]
    wrong = {name: {m: nanmean([r[m] for r in rs]) for m in PITCH_METRICS} for name, rs in rows.items()}
    return table(f"Vocoder: {len(valid)} held-out clips (readers {', '.join(corpus['held_out_readers'])}); wrong "
                 f"outputs: mean over the clips (another reader: over the {len(rows['another reader (6)'])} pairs)", PITCH_METRICS,
                 history[0], history[-1], wrong)


def other_speakers(prepared: Path) -> list[tuple[dict, list[Path]]]:
    """Each held-out row with the other speakers' recordings of its sentence (train or held out)."""
    rows = [json.loads(x) for s in ("train", "eval") for x in (prepared / f"{s}.jsonl").read_text().splitlines()]
    held = [json.loads(x) for x in (prepared / "eval.jsonl").read_text().splitlines()]
    return [(h, [prepared / r["wav"] for r in rows if r["text"] == h["text"] and r["speaker"] != h["speaker"]])
            for h in held]


def tts_wrong(pairs, mel: MelSpectrogram, sr: int, hop: int, f0_range: tuple, encoder, cut) -> dict:
    """The validations' figures, against each held-out recording, of each other speaker's recording of its
    sentence (the other sex's apart from the one same-sex pair of voices, uz_m_low / uz_m_mid: one espeak-ng
    voice re-pitched), and of white noise at the recording's level and length."""
    to_mel = lambda w: mel(torch.from_numpy(w.astype(np.float32))[None])[0].numpy()  # noqa: E731
    sex = lambda speaker: speaker.split("_")[1]  # noqa: E731  (uz_f_mid -> f)
    other, same, noise = "another voice, other sex, same sentence", "another voice, same sex, same sentence", "white noise"
    groups: dict[str, list[dict]] = {other: [], same: [], noise: []}
    rng = np.random.default_rng(0)
    for row, paths in pairs:
        ref = cut(row)
        outs = [(same if sex(p.stem) == sex(row["speaker"]) else other, load_audio(p, sr=sr)[0]) for p in paths]
        outs.append((noise, at_level(rng.standard_normal(len(ref)), rms_db(ref))))
        for group, syn in outs:
            mcd, dtw = mcd_dtw_path(to_mel(ref), to_mel(syn))
            groups[group].append({"mcd": mcd, **aligned_pitch_errors(syn, ref, sr, hop, dtw, *f0_range),
                                  "speaker_sim": encoder.similarity(syn, ref, sr)})
    return {f"{g} ({len(rs)})": {m: nanmean([r[m] for r in rs]) for m in TTS_METRICS}
            for g, rs in groups.items() if rs}


def vits_table(runs: Path, encoder) -> str:
    from tts.vits.demo import CONFIG, PREPARED_DIR
    from tts.vits.train import TrainConfig, build_mel

    cfg = load_config(str(CONFIG), TrainConfig)
    prepared, sr, hop = REPO / PREPARED_DIR, cfg.audio.sample_rate, cfg.audio.hop_length
    history = [json.loads(x) for x in (runs / "tts_demo" / "metrics.jsonl").read_text().splitlines() if x.strip()]

    def cut(row):  # the evaluation's reference: the recording cut to its spectrogram's frames
        frames = np.load(prepared / row["spec"], mmap_mode="r").shape[-1]
        return load_audio(prepared / row["wav"], sr=sr)[0][: frames * hop]

    wrong = tts_wrong(other_speakers(prepared), build_mel(cfg), sr, hop, (), encoder, cut)
    return table("VITS: 6 held-out sentences, each in its speaker's voice", TTS_METRICS, history[0], history[-1], wrong)


def clone_table(runs: Path, encoder) -> str:
    from tts.clone.config import CloneConfig
    from tts.clone.demo import CONFIG, PREPARED_DIR

    cfg = load_config(CONFIG, CloneConfig)
    a, prepared = cfg.audio, REPO / PREPARED_DIR
    history = json.loads((runs / "tts_clone_demo" / "summary.json").read_text())["history"]
    wrong = tts_wrong(other_speakers(prepared), MelSpectrogram(**a.mel_kwargs), a.sample_rate, a.hop_length,
                      (a.f0_min, a.f0_max), encoder, lambda row: load_audio(prepared / row["wav"], sr=a.sample_rate)[0])
    return table("Cloning: 6 held-out sentences (through the vocoder demo's export)", TTS_METRICS, history[0],
                 history[-1], wrong)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=Path, default=REPO / "runs", help="the folder of make demo's run folders")
    runs = p.parse_args(argv).runs
    torch.set_num_threads(1)
    encoder = load_speaker_encoder("resemblyzer")
    print(vocoder_table(runs), vits_table(runs, encoder), clone_table(runs, encoder), sep="\n\n")
    print("\nVAE: rfid is off in the demo (no Inception weights cached), so nothing to compare.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
