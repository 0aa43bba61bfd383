"""bench/vits_finetune.py's data split and table (the training itself is the VITS trainer's, tested elsewhere)."""

import json

from bench.vits_finetune import table, voice_subset
from tts.vits.data import read_manifest, read_speakers


def test_voice_subset_keeps_only_the_voices_and_renumbers_them(tmp_path):
    prepared = tmp_path / "prepared"
    (prepared / "wavs").mkdir(parents=True)
    (prepared / "spec").mkdir()
    for name in ("prepare_state.json", "report.json"):
        (prepared / name).write_text("{}")
    rows = [{"id": f"{v}_{i}", "speaker": v, "speaker_id": n} for n, v in enumerate(("a", "b", "c")) for i in range(3)]
    for split in ("train", "eval"):
        (prepared / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    out = voice_subset(prepared, tmp_path / "sub", ["c", "a"])

    assert read_speakers(out) == {"c": 0, "a": 1}
    got = read_manifest(out, "train")
    assert [(r["speaker"], r["speaker_id"]) for r in got] == [("a", 1)] * 3 + [("c", 0)] * 3
    assert (out / "wavs").resolve() == (prepared / "wavs").resolve()  # audio linked, not copied
    voice_subset(prepared, tmp_path / "sub", ["c", "a"])  # a second call (a rerun) is fine


def test_table_pairs_the_runs_step_by_step():
    lines = table([{"step": 0, "mcd": 5.0}, {"step": 10, "mcd": 3.0}],
                  [{"step": 0, "mcd": 7.0}, {"step": 10, "mcd": 4.5}, {"step": 20, "mcd": 4.0}])
    assert lines[0].count("step") == 2
    assert lines[2].endswith("| 5.00 | 3.00 |") and lines[3].endswith("| 7.00 | 4.50 |")
