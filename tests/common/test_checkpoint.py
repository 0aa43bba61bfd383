import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from common.checkpoint import (
    MIN_INIT_SHARE,
    CheckpointError,
    CheckpointManager,
    checkpoint_kind,
    load_checkpoint,
    load_matching,
    make_state,
    refuse_other_kind,
    resolve_resume,
    restore_state,
    save_atomic,
)

REPO = Path(__file__).resolve().parents[2]


def test_atomic_save_survives_crash_mid_write(tmp_path, monkeypatch):
    path = tmp_path / "model.pt"
    save_atomic({"w": torch.ones(3)}, path)

    def exploding_save(obj, f, *a, **k):
        f.write(b"partial garbage")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", exploding_save)
    with pytest.raises(OSError, match="disk full"):
        save_atomic({"w": torch.zeros(3)}, path)
    monkeypatch.undo()
    assert torch.equal(load_checkpoint(path)["w"], torch.ones(3))  # old checkpoint intact
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]  # no temp file left behind


def test_atomic_save_survives_killed_process(tmp_path):
    """A process killed (SIGKILL) while writing leaves the previous file readable."""
    path = tmp_path / "big.pt"
    save_atomic({"step": 1}, path)
    code = (
        "import os, torch, common.checkpoint as c\n"
        "orig = torch.save\n"
        "def slow(obj, f, *a, **k):\n"
        "    f.write(b'x' * 1000); f.flush(); os.kill(os.getpid(), 9)\n"
        "torch.save = slow\n"
        f"c.save_atomic({{'step': 2}}, {str(path)!r})\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO)
    assert proc.returncode != 0
    assert load_checkpoint(path)["step"] == 1


def test_best_pt_is_a_second_name_of_the_checkpoint_not_a_second_write(tmp_path, monkeypatch):
    """A GB-sized checkpoint is written once: best.pt is a hard link to it, whole after rotation deletes
    the numbered name; where the filesystem has no hard links, best.pt is written in full."""
    lines = []
    mgr = CheckpointManager(tmp_path, keep_last=1, log=lines.append)
    assert mgr.best_path is None
    mgr.save({"step": 1}, 1, metric=1.0)
    assert os.stat(tmp_path / "best.pt").st_ino == os.stat(tmp_path / "model_00000001.pt").st_ino
    mgr.save({"step": 2}, 2, metric=5.0)  # not better: model_00000001.pt rotated away, best.pt stays
    assert not (tmp_path / "model_00000001.pt").exists() and load_checkpoint(tmp_path / "best.pt")["step"] == 1
    assert mgr._ours == {"model_00000002.pt"}  # the names of deleted files are not kept
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []

    def no_links(*args):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    mgr.save({"step": 3}, 3, metric=0.5)
    assert load_checkpoint(tmp_path / "best.pt")["step"] == 3
    assert os.stat(tmp_path / "best.pt").st_ino != os.stat(tmp_path / "model_00000003.pt").st_ino
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    # a "new best" line each time best.pt changes, none when it stays
    assert lines == [f"new best at step 1: metric 1 -> {tmp_path / 'best.pt'}",
                     f"new best at step 3: metric 0.5 (was 1) -> {tmp_path / 'best.pt'}"]
    assert mgr.best_path == tmp_path / "best.pt"


def test_rotation_keeps_last_n_and_best_after(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=3, save_best_after=30, mode="min")
    metrics = {10: 0.1, 20: 5.0, 30: 3.0, 40: 4.0, 50: 2.0, 60: 2.5}
    for step, metric in metrics.items():
        mgr.save({"step": step}, step, metric=metric)
    names = sorted(p.name for p in tmp_path.glob("model_*.pt"))
    assert names == ["model_00000040.pt", "model_00000050.pt", "model_00000060.pt"]
    # 0.1 at step 10 is before save_best_after, so the best is step 50's 2.0
    assert load_checkpoint(tmp_path / "best.pt")["step"] == 50
    again = CheckpointManager(tmp_path, keep_last=3, save_best_after=30)
    assert again.best_metric == 2.0 and again.latest().name == "model_00000060.pt"
    assert resolve_resume("auto", tmp_path, again) == tmp_path / "model_00000060.pt"
    assert resolve_resume("auto", tmp_path / "empty") is None
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        resolve_resume(str(tmp_path / "missing.pt"), tmp_path)


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > /tmp/should_not_exist_marker",))


def test_malicious_pickle_is_refused(tmp_path):
    path = tmp_path / "evil.pt"
    with open(path, "wb") as f:
        torch.save({"model": Evil()}, f, pickle_module=pickle)
    with pytest.raises(CheckpointError, match="refused to load"):
        load_checkpoint(path)
    assert not Path("/tmp/should_not_exist_marker").exists()
    (tmp_path / "text.pt").write_text("hello")
    with pytest.raises(CheckpointError, match="not a readable"):
        load_checkpoint(tmp_path / "text.pt")


@pytest.mark.parametrize("value, why", [(float("nan"), "non-finite values"), (3e29, "values up to 3e\\+29")])
def test_diverged_weights_are_refused_by_every_load(tmp_path, value, why):
    """What a diverged run saved before the divergence guard existed (or a NaN model from elsewhere): it
    would crash inference and a resumed run, so every load says what is wrong instead."""
    weights = {"w": torch.ones(4), "steps": torch.tensor(7)}
    save_atomic({"models": {"generator": weights}, "ema": {"generator": {"shadow": dict(weights)}}}, tmp_path / "ok.pt")
    assert load_checkpoint(tmp_path / "ok.pt")["models"]["generator"]["steps"] == 7
    bad = {"w": torch.tensor([1.0, value])}
    save_atomic({"models": {"generator": weights}, "ema": {"generator": {"shadow": bad}}}, tmp_path / "bad.pt")
    with pytest.raises(CheckpointError, match=rf"bad\.pt: its weights are not a trained model \(ema\.generator\.shadow\.w "
                                              rf"(has|holds) {why}\): the run had diverged"):
        load_checkpoint(tmp_path / "bad.pt")
    save_atomic({"generator": bad}, tmp_path / "published.pt")  # another layout: not ours to judge
    assert load_checkpoint(tmp_path / "published.pt")


def test_load_matching_lists_mismatched_and_missing():
    src = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4))
    dst = nn.Sequential(nn.Embedding(12, 4), nn.Linear(4, 4), nn.Linear(4, 2))
    report = load_matching(dst, src.state_dict())
    assert torch.equal(dst[1].weight, src[1].weight)
    assert any(m.startswith("0.weight") for m in report.mismatched)
    assert "2.weight" in report.missing and "2.bias" in report.missing
    assert "0.weight" in str(report) and "re-initialised" in str(report)
    with pytest.raises(CheckpointError, match="strict"):
        load_matching(dst, src.state_dict(), strict_shapes=True)
    ignored = load_matching(dst, src.state_dict(), ignore=("1.",))
    assert "1.weight" in ignored.ignored


def test_init_from_refuses_a_file_of_which_less_than_the_share_fits_and_loads_nothing():
    src = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4))
    wider = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 4), nn.Linear(4, 4))  # 3 of 8 fit
    before = {k: v.clone() for k, v in wider.state_dict().items()}
    ckpt = {"models": {"generator": src.state_dict(), "discriminator": {}}, "extra": {"speakers": {"a": 0}}}
    with pytest.raises(CheckpointError, match=rf"^--init_from x\.pt: only 3 of this model's 8 tensors match it by name "
                       rf"and shape \(38%; at least {MIN_INIT_SHARE:.0%} must.*; the file is a VITS checkpoint "):
        load_matching(wider, src.state_dict(), source="x.pt", ckpt=ckpt)
    assert all(torch.equal(v, before[k]) for k, v in wider.state_dict().items())  # nothing loaded
    assert len(load_matching(wider, src.state_dict()).loaded) == 3  # without `source`: critics, benchmarks
    half = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 8), nn.Linear(8, 4))  # 5 of 8 fit
    assert len(load_matching(half, src.state_dict(), source="x.pt").loaded) == 5
    assert torch.equal(half[0].weight, src[0].weight)
    assert checkpoint_kind({}) is None and checkpoint_kind({"models": {"model": {}}}) == "clone"


def test_a_checkpoint_records_its_trainer_and_readers_go_by_that_field():
    """`make_state(trainer=...)` stores the name it is given; `checkpoint_kind` reads it before any layout
    guess, and a file without it (older checkpoints, exports) is recognised by the trainers' own guesses."""
    net = nn.Linear(2, 2)
    assert "trainer" not in make_state({"model": net})  # common adds nothing of its own
    state = make_state({"model": net}, trainer="vae")  # a `model` network would be guessed as a cloning file
    assert state["trainer"] == "vae" and checkpoint_kind(state) == "vae"
    with pytest.raises(CheckpointError, match=r"^x\.pt is a VAE checkpoint \(vae/train_vae\.py\), not a "
                       r"voice-cloning checkpoint \(tts/train_main\.py\): use it with vae/reconstruct\.py"):
        refuse_other_kind("x.pt", state, "clone")
    refuse_other_kind("x.pt", state, "vae")  # its own reader takes it
    with pytest.raises(CheckpointError, match=r"x\.pt is a checkpoint of the 'wav2x' trainer, not a VITS "):
        refuse_other_kind("x.pt", {"trainer": "wav2x"}, "vits")  # a trainer this checkout does not have
    # files that record no trainer: each trainer's own guess from its layouts
    legacy = {"vocoder": {"models": {"generator": {}}, "extra": {"export": {}}},
              "vocoder_export": {"generator": {}},
              "vits": {"models": {"generator": {}}, "extra": {"symbols": []}},
              "clone": {"models": {"model": {}}},
              "vae": {"models": {"vae": {}}, "extra": {"arch": {}}}}
    assert {kind: checkpoint_kind(ckpt) for kind, ckpt in legacy.items()} == {k: k for k in legacy}
    refuse_other_kind("x.pt", {"state_dict": {}}, "vits")  # nobody's: left to the caller's own checks


def test_resume_into_another_width_is_a_checkpoint_error_naming_what_differs():
    src, wider = nn.Linear(4, 4), nn.Linear(4, 8)
    ckpt = {"models": {"model": src.state_dict()}}
    with pytest.raises(CheckpointError, match=r"^cannot resume from r\.pt: its model weights do not fit this "
                       r"configuration \(2 tensors differ in shape, e\.g\. weight: checkpoint \(4, 4\) vs model "
                       r"\(8, 4\)\); the file is a voice-cloning checkpoint .*--init_from"):
        restore_state(ckpt, {"model": wider}, source="r.pt")
    opt = torch.optim.AdamW(nn.Linear(4, 4).parameters())
    ckpt["optimizers"] = {"optimizer": torch.optim.AdamW(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)).parameters())
                          .state_dict()}
    with pytest.raises(CheckpointError, match=r"its optimizer state for 'optimizer' does not fit this configuration \("):
        restore_state(ckpt, {"model": nn.Linear(4, 4)}, {"optimizer": opt}, source="r.pt")


# ------------------------------------------------------------------ bytes changed on disk (issue 28 item 8)
def _damage(path: Path, n_bytes: int = 20_000, seed: int = 0) -> None:
    """Overwrites `n_bytes` in the middle of `path` with random bytes, keeping its size (a failing disk)."""
    blob = bytearray(path.read_bytes())
    middle = len(blob) // 2 - n_bytes // 2
    blob[middle:middle + n_bytes] = torch.randint(0, 256, (n_bytes,), generator=torch.Generator().manual_seed(seed),
                                                  dtype=torch.uint8).numpy().tobytes()
    path.write_bytes(bytes(blob))


def test_damaged_bytes_are_found_on_every_load_and_resume_takes_the_previous(tmp_path):
    from common.checkpoint import damage, verify_checkpoint

    mgr = CheckpointManager(tmp_path, keep_last=5)
    for step in (1, 2):
        mgr.save({"w": torch.full((100_000,), float(step)), "step": step}, step)
    newest = tmp_path / "model_00000002.pt"
    _damage(newest)
    assert torch.load(newest, weights_only=True)["w"].shape == (100_000,)  # torch alone would use it
    assert damage(newest).startswith("damaged: record ") and "CRC-32" in damage(newest)
    assert verify_checkpoint(newest) == damage(newest)
    with pytest.raises(CheckpointError, match=r"model_00000002\.pt: damaged: record .* fails its CRC-32 check"):
        load_checkpoint(newest)  # --resume PATH, --init_from, export, inference
    lines: list[str] = []
    assert resolve_resume("auto", tmp_path, CheckpointManager(tmp_path), log=lines.append) == tmp_path / "model_00000001.pt"
    assert len(lines) == 1 and lines[0].startswith(f"warning: skipping {newest}: damaged: record ")
    assert lines[0].endswith("renamed it to model_00000002.pt.corrupt and trying the checkpoint before it")
    assert (tmp_path / "model_00000002.pt.corrupt").is_file() and not newest.exists()
    assert load_checkpoint(tmp_path / "model_00000001.pt")["step"] == 1


def test_when_every_checkpoint_is_damaged_resume_auto_refuses_instead_of_starting_over(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=5)
    for step in (1, 2):
        mgr.save({"w": torch.full((100_000,), float(step))}, step)
        _damage(tmp_path / f"model_{step:08d}.pt", seed=step)
    with pytest.raises(CheckpointError, match=r"^--resume auto: no intact checkpoint in .*, found model_00000002\.pt "
                                              r"\(damaged: .*\); model_00000001\.pt \(damaged: .*\) \(each renamed "
                                              r"\*\.corrupt\)\. .*--overwrite"):
        resolve_resume("auto", tmp_path, CheckpointManager(tmp_path), log=lambda *a: None)
    # the next start finds only the renamed files: still no silent start from step 0
    with pytest.raises(CheckpointError, match=r"found only model_00000001\.pt\.corrupt, model_00000002\.pt\.corrupt"):
        resolve_resume("auto", tmp_path, CheckpointManager(tmp_path))


def test_a_rank_above_0_takes_rank_0s_resume_and_a_folder_it_cannot_see_is_refused(tmp_path, monkeypatch):
    """Rank 1 of 2 (simulated): it never searches its own view of the folder (where the newest file is
    damaged: it neither renames nor picks another), it takes rank 0's answer; a path some rank cannot see
    (node-local run folders) stops every rank with the same message instead of a step-0 start on that one."""
    from common import distributed

    mgr = CheckpointManager(tmp_path, keep_last=5)
    for step in (1, 2, 3):
        mgr.save({"w": torch.full((10,), float(step))}, step)
    _damage(tmp_path / "model_00000003.pt")
    rank0_answer = ("", str(tmp_path / "model_00000002.pt"))
    monkeypatch.setattr(distributed, "rank", lambda: 1)
    monkeypatch.setattr(distributed, "broadcast_object", lambda obj: rank0_answer)
    monkeypatch.setattr(distributed, "gather_objects", lambda obj: [False, obj])
    assert resolve_resume("auto", tmp_path, CheckpointManager(tmp_path)) == tmp_path / "model_00000002.pt"
    assert (tmp_path / "model_00000003.pt").is_file()  # rank 0's business, not renamed here
    rank0_answer = ("", str(tmp_path / "elsewhere" / "model_00000009.pt"))
    with pytest.raises(CheckpointError, match=r"which rank\(s\) \[1\] cannot see; .* a disk that all nodes share"):
        resolve_resume("auto", tmp_path, CheckpointManager(tmp_path))
    rank0_answer = ("--resume auto: no intact checkpoint in X", None)  # rank 0's refusal is every rank's
    with pytest.raises(CheckpointError, match="no intact checkpoint in X"):
        resolve_resume("auto", tmp_path, CheckpointManager(tmp_path))


def test_the_new_best_line_names_the_best_pt_it_wrote(tmp_path):
    """With `best_dir` (cloning and the VAE keep their step files in the run folder, best.pt in checkpoints/),
    the line names the file written, not one beside the step checkpoints."""
    lines = []
    mgr = CheckpointManager(tmp_path, keep_last=2, best_dir=tmp_path / "checkpoints", log=lines.append)
    mgr.save({"step": 1}, 1, metric=1.0)
    assert (tmp_path / "checkpoints" / "best.pt").is_file() and not (tmp_path / "best.pt").exists()
    assert lines == [f"new best at step 1: metric 1 -> {tmp_path / 'checkpoints' / 'best.pt'}"]
