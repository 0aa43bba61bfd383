"""common.demo: `make demo`'s runner (needs respected, slots respected, output prefixed, failures reported),
a demo's settings, and the plausibility `Figure`."""

from __future__ import annotations

import pytest

from common import demo
from common.demo import Figure


def _stamp(path, name: str, seconds: float = 0.3) -> str:
    """A shell command that records its start and end (monotonic order through the file) and prints."""
    return f"echo start {name} >> {path}; echo 'hello from {name}'; sleep {seconds}; echo end {name} >> {path}"


def test_a_job_starts_only_after_the_jobs_it_needs_end(tmp_path, capsys):
    order = tmp_path / "order.txt"
    specs = [f"a={_stamp(order, 'a')}", f"b={_stamp(order, 'b')}", f"c@a,b={_stamp(order, 'c', 0.0)}"]
    rc = demo.main([*(x for s in specs for x in ("--job", s)), "--slots", "3", "--log_dir", str(tmp_path / "logs")])
    assert rc == 0
    events = order.read_text().split("\n")
    assert events.index("start c") > max(events.index("end a"), events.index("end b"))
    out = capsys.readouterr().out
    assert "[a] hello from a" in out and "[c] hello from c" in out
    assert (tmp_path / "logs" / "b.log").read_text().strip() == "hello from b"


def test_slots_bound_how_many_run_at_once(tmp_path):
    order = tmp_path / "order.txt"
    done = demo.run_jobs([demo.parse_job(f"{n}={_stamp(order, n, 0.2)}") for n in "xyz"], slots=1,
                         log_dir=tmp_path / "logs")
    # One at a time, in the listed order: each ends before the next starts.
    assert order.read_text().split("\n")[:-1] == ["start x", "end x", "start y", "end y", "start z", "end z"]
    assert all(j.rc == 0 for j in done)


def test_a_failed_job_still_lets_its_dependents_run_and_fails_the_whole(tmp_path, capsys):
    specs = ["bad=echo 'figure: plausibility FAIL'; exit 3", "after@bad=echo still ran"]
    rc = demo.main([*(x for s in specs for x in ("--job", s)), "--log_dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "[after] still ran" in out
    assert "## bad: FAILED (exit status 3)" in out and "NOT ok: bad" in out
    assert "figure: plausibility FAIL" in out.split("=" * 100)[-1]  # the verdict is repeated at the end


def test_the_summary_repeats_the_figures_without_progress_bars(tmp_path, capsys):
    cmd = ("printf 'train:  50%%|#  | 5/10 [00:01<00:01]\\rtrain: 100%%|##| 10/10 [00:02<00:00]\\n'; "
           "echo 'mean MCD-DTW 2.88 dB  <= 3 dB  ok'; echo 'pictures: a.png'; exit 1")
    rc = demo.main(["--job", f"demo={cmd}", "--log_dir", str(tmp_path)])
    summary = capsys.readouterr().out.split("=" * 100)[-1]
    assert rc == 1
    assert "mean MCD-DTW 2.88 dB" in summary and "pictures: a.png" in summary
    assert "10/10 [" not in summary and "5/10 [" not in summary


def test_carriage_returns_become_separate_prefixed_lines(tmp_path, capsys):
    rc = demo.main(["--job", "bar=printf 'step 1\\rstep 2\\rdone\\n'", "--log_dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "[bar] step 1\n" in out and "[bar] step 2\n" in out and "[bar] done\n" in out


@pytest.mark.parametrize("specs, words", [
    (["a@b=true", "b@a=true"], "cycle"),
    (["a@nope=true"], "unknown job(s) nope"),
    (["a=true", "a=false"], "unique"),
    (["no equals sign"], "NAME=COMMAND"),
])
def test_bad_job_lists_get_one_clear_message(tmp_path, capsys, specs, words):
    rc = demo.main([*(x for s in specs for x in ("--job", s)), "--log_dir", str(tmp_path)])
    assert rc == 2
    assert words in capsys.readouterr().err


def test_children_get_one_share_of_the_cores(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(demo.os, "cpu_count", lambda: 8)
    assert demo.child_env(2)["OMP_NUM_THREADS"] == "4"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert demo.child_env(2)["OMP_NUM_THREADS"] == "3"  # the user's choice wins


def test_demo_threads_pinned_by_omp_else_by_load(monkeypatch):
    monkeypatch.setattr(demo.os, "cpu_count", lambda: 2)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setattr(demo.os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    assert demo.demo_threads() == 2  # pinned: a measurement's thread count never depends on the load
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert demo.demo_threads() == 1  # busy cores: one thread
    monkeypatch.setattr(demo.os, "getloadavg", lambda: (0.1, 0.1, 0.1))
    assert demo.demo_threads() == 2


def test_make_demo_passes_seed_and_threads():
    """`make demo DEMO_SEED=7 DEMO_THREADS=2` reaches every demo as --seed 7 and OMP_NUM_THREADS=2."""
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run(["make", "-n", "--no-print-directory", "demo", "DEMO_SEED=7", "DEMO_THREADS=2",
                          "STAMP=", "SYSDEPS="], cwd=repo, capture_output=True, text=True).stdout
    line = next(x for x in out.splitlines() if "common.demo" in x)
    assert line.startswith("OMP_NUM_THREADS=2 ")
    for target in ("vocoder-demo", "tts-demo", "tts-clone-demo", "vae-demo"):
        assert target in line
    recipes = subprocess.run(["make", "-n", "--no-print-directory", "vocoder-demo", "tts-demo", "tts-clone-demo",
                              "vae-demo", "DEMO_SEED=7", "STAMP=", "SYSDEPS="], cwd=repo, capture_output=True,
                             text=True).stdout
    demos = [x for x in recipes.splitlines() if "demo.py" in x and "--data_only" not in x]
    assert len(demos) == 4 and all(x.endswith("--seed 7") for x in demos), demos
    # one demo on its own (and the GTA demo) takes both too
    recipes = subprocess.run(["make", "-n", "--no-print-directory", "vocoder-demo", "gta-demo", "DEMO_SEED=7",
                              "DEMO_THREADS=2", "STAMP=", "SYSDEPS="], cwd=repo, capture_output=True, text=True).stdout
    demos = [x for x in recipes.splitlines() if "demo.py" in x]
    assert len(demos) == 2 and all(x.startswith("OMP_NUM_THREADS=2 ") and "--seed 7" in x for x in demos), demos


def test_a_demo_run_trained_with_other_settings_is_trained_again(tmp_path):
    """`make demo DEMO_SEED=7` after `make demo` (or the reverse) must not report the earlier run's figures
    as seed 7's: a run folder records its settings, and other settings mean training again."""
    run = tmp_path / "run"
    said: list[str] = []
    assert not demo.trained_with_other_settings(run, ["seed=7"], said.append)  # nothing there yet
    run.mkdir()
    (run / "model.pt").write_text("x")  # a run from before the record: trained with the config as it is
    assert not demo.trained_with_other_settings(run, [], said.append) and said == []
    assert demo.trained_with_other_settings(run, ["seed=7"], said.append)
    assert said == [f"{run} was trained with the config as it is, this call asks for seed=7: training it again"]
    demo.record_demo_settings(run, ["seed=7", "a=1"])
    assert not demo.trained_with_other_settings(run, ["a=1", "seed=7"], said.append)  # the same settings, any order
    assert demo.trained_with_other_settings(run, [], said.append)
    assert "trained with a=1 seed=7, this call asks for the config as it is" in said[-1] and len(said) == 2


def test_a_demo_run_on_data_prepared_otherwise_is_trained_again(tmp_path):
    """A TTS demo run trained before its corpus was prepared again with other settings (silence trimming came
    in) is trained again, not reported as if made from the new data; the same data keeps the run."""
    data, run = tmp_path / "prepared", tmp_path / "run"
    assert demo.prepared_with(data) == []  # not prepared yet: nothing to compare
    data.mkdir()
    (data / "prepare_state.json").write_text('{"trim": false}')
    untrimmed = demo.prepared_with(data)
    demo.record_demo_settings(run, ["seed=7", *untrimmed])
    assert not demo.trained_with_other_settings(run, ["seed=7", *demo.prepared_with(data)], print)
    (data / "prepare_state.json").write_text('{"trim": true}')
    said: list[str] = []
    assert demo.trained_with_other_settings(run, ["seed=7", *demo.prepared_with(data)], said.append)
    assert untrimmed[0].startswith(f"data={data.as_posix()}#") and untrimmed[0] in said[0]
    assert demo.trained_with_other_settings(tmp_path / "old", [], print) is False  # no run yet
    (tmp_path / "old").mkdir(), (tmp_path / "old" / "best.pt").write_text("x")  # a run from before the record
    assert demo.trained_with_other_settings(tmp_path / "old", demo.prepared_with(data), print)


def test_demo_seed_becomes_the_configs_seed_key():
    import argparse

    p = argparse.ArgumentParser()
    demo.add_demo_overrides(p, "clone_demo.yaml", "train.seed")
    assert demo.demo_overrides(p.parse_args(["--set", "a=1"])) == ["a=1"]
    assert demo.demo_overrides(p.parse_args(["--set", "a=1", "--seed", "7"])) == ["a=1", "train.seed=7"]


def test_figure_sides_and_non_finite_values():
    assert Figure("a", 2.0, 3.0, "lower").ok and not Figure("a", 4.0, 3.0, "lower").ok
    assert Figure("b", 21.0, 20.8, "higher").ok and not Figure("b", 20.0, 20.8, "higher").ok
    assert Figure("c", -5.9, 6.0, "within").ok and not Figure("c", -6.1, 6.0, "within").ok
    assert not Figure("d", float("nan"), 3.0, "lower").ok
    with pytest.raises(ValueError, match="better"):
        Figure("e", 1.0, 1.0, "bigger")


def test_a_figure_shown_but_not_judged_passes_and_says_why():
    fig = Figure("mean hop comb", 17.0, 10.0, "lower", "dB", not_judged="a buzz expected at this length")
    said: list[str] = []
    assert fig.ok and demo.report([fig], "demo", said.append)
    assert said[1].endswith("not judged: a buzz expected at this length")


def test_the_steps_figure_passes_a_full_run_and_fails_a_short_one_with_its_reason():
    assert demo.steps_figure(1700, 1700, None).ok
    short = demo.steps_figure(959, 1700, "time limit")
    assert not short.ok and "stopped by max_minutes, thresholds are for 1700" in short.line()
