"""The demo harness every trainer's demo uses, in two parts.

Plausibility figures: a demo names figures (`Figure`: a measured value, its threshold and which side
passes), prints them as one table with `report`, and exits non-zero when any fails (is the output
plausible, not merely better than step 0?). The speech figures (level, MCD-DTW) are `speech.mcd`'s.
A demo's settings: `--set` / `--seed` (`add_demo_overrides`), the record of what a run was trained
with (`trained_with_other_settings`), and its torch threads (`demo_threads`).

Jobs: run several commands side by side on a few CPU cores, each after the jobs it needs, with each
line of output prefixed by its job's name (``make demo`` runs the four trainer demos this way).

Why not one after another: the demos train small models whose CPU ops scale poorly past one
thread (measured: a GAN demo's step is only ~1.35x faster on 2 threads than on 1), so two
single-threaded demos at once finish far sooner than two 2-thread demos in turn. Why not
``make -j``: a job here waits for named jobs whether they passed or failed, its output stays
readable while two jobs print, and the end repeats each job's verdict in one place.

    python -m common.demo --slots 2 --log_dir runs/demo_logs \\
        --job 'a=make a-demo' --job 'c@a,b=make c-demo' ...

A job is ``NAME[@NEEDS,...]=COMMAND`` (run by the shell). Each child gets
``OMP_NUM_THREADS = cores // slots`` (unless set already); a progress bar redrawn with a carriage
return becomes one prefixed line per redraw (common.log's bar redraws every 30 s off a terminal).
The full output of each job is kept in ``<log_dir>/<name>.log``. Exit status 1 when any job
failed; the summary names them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from common.atomic_write import write_text
from common.cli import FlagParser
from common.errors import ConfigError

JOB_RE = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+)(@(?P<needs>[A-Za-z0-9_.,-]+))?=(?P<cmd>.+)$", re.S)
SUMMARY_LINES = 24  # a demo ends with its figures, its verdict and its pictures: about this many lines
PROGRESS_RE = re.compile(r"\d+/\d+ \[\d")  # a tqdm redraw ("1250/2500 [01:45<..."): not part of a verdict


# ----------------------------------------------------------------------------- plausibility figures


@dataclass
class Figure:
    """One measured figure against its threshold. `better`: "lower" passes when value <= limit,
    "higher" when value >= limit, "within" when |value| <= limit."""

    name: str
    value: float
    limit: float
    better: str = "lower"
    unit: str = ""
    # why this figure is shown but not judged (a fault the demo is known to have at its length, stated in
    # docs/DEMO.md); empty: judged. A figure not judged passes and says so in its line.
    not_judged: str = ""

    def __post_init__(self) -> None:
        if self.better not in ("lower", "higher", "within"):
            raise ValueError(f"Figure '{self.name}': better must be lower, higher or within, not {self.better!r}")

    @property
    def ok(self) -> bool:
        if self.not_judged:
            return True
        if not math.isfinite(self.value):
            return False
        if self.better == "lower":
            return self.value <= self.limit
        if self.better == "higher":
            return self.value >= self.limit
        return abs(self.value) <= self.limit

    def line(self) -> str:
        rule = {"lower": "<=", "higher": ">=", "within": "within ±"}[self.better]
        verdict = f"not judged: {self.not_judged}" if self.not_judged else "ok" if self.ok else "FAIL"
        return f"{self.name:<36} {self.value:7.2f} {self.unit:<3} {rule} {self.limit:g} {self.unit:<3} {verdict}"


def steps_figure(trained: int, planned: int, stopped: str | None) -> Figure:
    """The steps a demo trained against the steps it planned, as a figure that fails when it stopped short.

    Why a failure and not a quiet pass: every threshold of a demo was measured at its planned steps, so a run
    cut short (under load, by `max_minutes`) is judged against a threshold it was never measured for; its
    figures are still printed, and this line says why the verdict cannot stand: where it stopped and why."""
    why = {"time limit": "max_minutes"}.get(stopped or "", stopped or "an earlier run")
    name = "steps trained, of those planned"
    if trained < planned:
        name = f"steps trained: stopped by {why}, thresholds are for {planned}"
    return Figure(name, float(trained), float(planned), "higher")


def report(figures: list[Figure], title: str, log=print) -> bool:
    """Print the figures as one table under `title`; True when every figure passes."""
    log(f"{title}:")
    for f in figures:
        log("  " + f.line())
    ok = all(f.ok for f in figures)
    if not ok:
        log(f"  NOT plausible: {sum(not f.ok for f in figures)} of {len(figures)} figures outside their threshold")
    return ok


# ----------------------------------------------------------------------------- jobs


@dataclass
class Job:
    name: str
    command: str
    needs: list[str] = field(default_factory=list)
    rc: int | None = None
    seconds: float = 0.0
    lines: list[str] = field(default_factory=list)


def parse_job(text: str) -> Job:
    m = JOB_RE.match(text.strip())
    if not m:
        raise ConfigError(f"--job {text!r}: write NAME=COMMAND or NAME@NEED1,NEED2=COMMAND")
    needs = [n for n in (m.group("needs") or "").split(",") if n]
    return Job(m.group("name"), m.group("cmd"), needs)


def check_jobs(jobs: list[Job]) -> None:
    names = [j.name for j in jobs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"job names must be unique: {', '.join(dupes)}")
    for j in jobs:
        unknown = [n for n in j.needs if n not in names]
        if unknown:
            raise ConfigError(f"job '{j.name}' needs unknown job(s) {', '.join(unknown)}; known: {', '.join(names)}")
    # A cycle would wait forever: every job must become ready once the jobs before it are done.
    done: set[str] = set()
    while len(done) < len(jobs):
        ready = [j.name for j in jobs if j.name not in done and set(j.needs) <= done]
        if not ready:
            raise ConfigError(f"the jobs' needs form a cycle among: {', '.join(sorted(set(names) - done))}")
        done.update(ready)


def add_demo_overrides(p: argparse.ArgumentParser, config: str, seed_key: str) -> None:
    """A demo's `--set KEY=VALUE` (repeatable) and `--seed N` (make demo's DEMO_SEED), read back by
    `demo_overrides`: one spelling for every demo."""
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help=f"override {config} keys (repeatable)")
    p.add_argument("--seed", type=int, default=None, help=f"training seed (default: the config's {seed_key})")
    p.set_defaults(seed_key=seed_key)


def demo_overrides(args: argparse.Namespace) -> list[str]:
    """The `--set` overrides, with `--seed` as the demo config's seed key when given."""
    return [*args.overrides, *([] if args.seed is None else [f"{args.seed_key}={args.seed}"])]


DEMO_SETTINGS = "demo_settings.json"  # in a demo's run folder: the --set / --seed it was trained with


def prepared_with(folder: Path, state: str = "prepare_state.json") -> list[str]:
    """The prepared data a demo trains on, as one more entry of its settings (`trained_with_other_settings`):
    the folder and a digest of the settings its prepare recorded, so a run trained on data prepared otherwise
    (before silence trimming, say) is trained again instead of reported as if made from this data."""
    path = folder / state
    if not path.is_file():
        return []
    return [f"data={folder.as_posix()}#{hashlib.sha256(path.read_bytes()).hexdigest()[:12]}"]


def trained_with_other_settings(run: Path, settings: list[str], log=print) -> bool:
    """Whether the demo run in `run` must be trained again for `settings` (this call's `--set` / `--seed`,
    e.g. make demo's DEMO_SEED), saying why in one line: a finished run trained with other settings would
    otherwise be reported as if it had these. A run from before this record counts as trained with none."""
    if not run.is_dir() or not any(run.iterdir()):
        return False
    record = run / DEMO_SETTINGS
    had = json.loads(record.read_text(encoding="utf-8")) if record.is_file() else []
    if sorted(had) == sorted(settings):
        return False
    log(f"{run} was trained with {' '.join(had) or 'the config as it is'}, this call asks for "
        f"{' '.join(settings) or 'the config as it is'}: training it again")
    return True


def record_demo_settings(run: Path, settings: list[str]) -> None:
    run.mkdir(parents=True, exist_ok=True)
    write_text(run / DEMO_SETTINGS, json.dumps(sorted(settings)) + "\n")


def demo_threads() -> int:
    """Torch threads for a demo: OMP_NUM_THREADS when set (``make demo`` sets it; a measurement pins
    it), else two on an idle machine and one when the cores are already busy, because OpenMP threads
    that wait for each other on an oversubscribed CPU ran many times slower than one thread here."""
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    try:
        busy = os.getloadavg()[0] > (os.cpu_count() or 1) - 0.5
    except OSError:
        busy = False
    return 1 if busy else max(1, min(2, os.cpu_count() or 1))


def child_env(slots: int) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(1, slots))))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _pump(job: Job, proc: subprocess.Popen, log_path: Path, out_lock: threading.Lock) -> None:
    """Copies the child's output to its log file and, prefixed, to our stdout. A carriage return
    (a progress bar redrawing itself) ends a line too, so each redraw becomes one prefixed line."""
    with open(log_path, "w", encoding="utf-8") as log:
        buf = ""
        for chunk in iter(lambda: proc.stdout.read1(4096), b""):  # type: ignore[union-attr]
            buf += chunk.decode("utf-8", errors="replace")
            *complete, buf = re.split(r"\r\n|\r|\n", buf)
            for line in complete:
                if not line.strip():
                    continue
                job.lines.append(line)
                log.write(line + "\n")
                with out_lock:
                    print(f"[{job.name}] {line}", flush=True)
        if buf.strip():
            job.lines.append(buf)
            log.write(buf + "\n")
            with out_lock:
                print(f"[{job.name}] {buf}", flush=True)


def run_jobs(jobs: list[Job], slots: int = 2, log_dir: str | Path = "runs/job_logs") -> list[Job]:
    """Runs every job once, at most `slots` at a time, each only after all the jobs it needs have
    ended (passed or failed: a demo that missed its check still leaves the outputs the next uses)."""
    check_jobs(jobs)
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    env, out_lock = child_env(slots), threading.Lock()
    pending, running, ended = list(jobs), {}, set()
    print(f"running {len(jobs)} jobs, {slots} at a time, {env['OMP_NUM_THREADS']} thread(s) each; "
          f"full logs in {log_dir}/", flush=True)
    while pending or running:
        for job in [j for j in pending if set(j.needs) <= ended][: max(0, slots - len(running))]:
            pending.remove(job)
            with out_lock:
                print(f"[{job.name}] start: {job.command}", flush=True)
            proc = subprocess.Popen(job.command, shell=True, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            pump = threading.Thread(target=_pump, args=(job, proc, log_dir / f"{job.name}.log", out_lock), daemon=True)
            pump.start()
            running[job.name] = (job, proc, pump, time.time())
        time.sleep(0.2)
        for name, (job, proc, pump, t0) in list(running.items()):
            if proc.poll() is None:
                continue
            pump.join()
            job.rc, job.seconds = proc.returncode, time.time() - t0
            with out_lock:
                print(f"[{name}] ended with exit status {job.rc} after {job.seconds / 60:.1f} min", flush=True)
            del running[name]
            ended.add(name)
    return jobs


def verdict(job: Job) -> list[str]:
    """The last lines of a job's output without progress-bar redraws: where a demo prints its figures."""
    return [line for line in job.lines if not PROGRESS_RE.search(line)][-SUMMARY_LINES:]


def summarize(jobs: list[Job], wall_s: float) -> int:
    print("\n" + "=" * 100)
    for job in jobs:
        state = "ok" if job.rc == 0 else f"FAILED (exit status {job.rc})"
        print(f"\n## {job.name}: {state}, {job.seconds / 60:.1f} min")
        for line in verdict(job):
            print(f"   {line}")
    failed = [j.name for j in jobs if j.rc != 0]
    print(f"\nall jobs ended in {wall_s / 60:.1f} min; " + (f"NOT ok: {', '.join(failed)}" if failed else "every job ok"))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = FlagParser(description="Run several commands side by side on a few CPU cores, each after the "
                                "jobs it needs, with each line of output prefixed by its job's name.")
    p.add_argument("--job", action="append", default=[], metavar="NAME[@NEEDS]=COMMAND", help="a job (repeat)")
    p.add_argument("--slots", type=int, default=2, help="jobs at once (default 2)")
    p.add_argument("--log_dir", default="runs/job_logs", help="one full log per job")
    args = p.parse_args(argv)
    if args.slots < 1:
        p.error(f"--slots must be at least 1, not {args.slots}")

    def body() -> int:
        jobs = [parse_job(j) for j in args.job]
        if not jobs:
            p.error("no --job given")
        check_jobs(jobs)
        t0 = time.time()
        run_jobs(jobs, args.slots, args.log_dir)
        return summarize(jobs, time.time() - t0)

    from common import exit_codes  # here: exit_codes imports torch, which the job runner itself never needs

    return exit_codes.run_main(body)


if __name__ == "__main__":
    sys.exit(main())
