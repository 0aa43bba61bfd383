"""best.pt from the phase the run ends in (`common.checkpoint.ranking_start`): a recipe whose critics start at
step N never ranks a checkpoint from before them against one trained with them, and the config says so."""

from __future__ import annotations

import json

from common.checkpoint import CheckpointManager, ranking_start, ranking_start_note
from common.config import load_config
from vocoder.config import VocoderConfig
from vocoder.demo import CONFIG as VOCODER_DEMO
from vocoder.demo import demo_checkpoint


def test_the_ranking_starts_after_the_critics_start_whatever_save_best_after_asks():
    assert ranking_start(0, 2000) == 2001  # the checkpoint at 2000 has had no step with the critics yet
    assert ranking_start(5000, 2000) == 5000  # a later save_best_after stands
    assert ranking_start(0, 0) == 0 and ranking_start(300, 0) == 300  # critics from the first step


def test_a_late_critic_run_cannot_pick_a_pre_critic_best(tmp_path):
    """The vocoder demo's case: MR-STFT 1.719 at step 1800 (generator only), 1.780 at 2250 with the critics."""
    store = CheckpointManager(tmp_path, save_best_after=ranking_start(0, 2000), log=lambda _: None)
    for step, mrstft in ((1800, 1.719), (2000, 1.722), (2250, 1.780)):
        store.save({"step": step}, step, mrstft)
    assert json.loads((tmp_path / "best.json").read_text())["step"] == 2250


def test_a_resumed_run_forgets_a_best_from_before_its_ranking_start(tmp_path):
    CheckpointManager(tmp_path, log=lambda _: None).save({"step": 1800}, 1800, 1.719)  # ranked from 0, as before
    said: list[str] = []
    store = CheckpointManager(tmp_path, save_best_after=2001, log=said.append)
    assert store.best_metric is None and "from step 1800" in said[0]
    store.save({"step": 2250}, 2250, 1.780)
    assert json.loads((tmp_path / "best.json").read_text())["step"] == 2250


def test_the_config_check_says_so_in_one_line():
    cfg = load_config(VOCODER_DEMO, VocoderConfig, [])  # save_best_after 0, critics from step 2000
    note = ranking_start_note(cfg.save_best_after, cfg.discriminator_train_start_steps, "discriminator_train_start_steps")
    assert note is not None and "\n" not in note
    assert "save_best_after 0" in note and "discriminator_train_start_steps 2000" in note and "step 2001" in note
    assert ranking_start_note(5000, 2000, "discriminator_train_start_steps") is None


def test_the_vocoder_demo_takes_best_pt_only_from_the_critic_phase(tmp_path):
    final = tmp_path / "model_00002250.pt"
    (tmp_path / "best.pt").write_bytes(b"")
    (tmp_path / "best.json").write_text(json.dumps({"metric": 1.719, "step": 1800, "mode": "min"}))
    assert demo_checkpoint(tmp_path, 2001, final) == final  # an older run's pre-critic best.pt
    (tmp_path / "best.json").write_text(json.dumps({"metric": 1.78, "step": 2250, "mode": "min"}))
    assert demo_checkpoint(tmp_path, 2001, final) == tmp_path / "best.pt"


def test_a_vits_demo_cut_short_before_its_critics_synthesises_its_newest_checkpoint(tmp_path):
    from tts.vits.demo import demo_checkpoint as vits_checkpoint

    for step in (500, 959):
        (tmp_path / f"vits_{step:08d}.pt").write_bytes(b"")
    assert vits_checkpoint(tmp_path) == tmp_path / "vits_00000959.pt"  # no best.pt: nothing ranked before step 1451
    (tmp_path / "best.pt").write_bytes(b"")
    assert vits_checkpoint(tmp_path) == tmp_path / "best.pt"
