"""`make gpu-check` sections 7 and 8: each trainer's step table (base and RTX 5090 configs, each speed
key alone, fraction of the card's peak FLOP/s) and its batch size (the finder, steps at its pick, a
forced out-of-memory through the trainer's own exit path). bench/gpu/check.py runs them."""

from __future__ import annotations

import contextlib
import io
import time
from unittest import mock

import torch

from bench.gpu import trainers
from bench.gpu.base import NA_CPU, Check, OverBudget, Section, fmt
from bench.gpu.peak_flops import peak_tflops
from bench.gpu.row import measure_in_child, measure_steps
from bench.gpu.trainers import RANDOM_BACKBONE_NOTE, TRAINERS, TrainerSpec, build, tile_batch
from bench.timing import seconds_per_step


def _flop_columns(chk: Check, row: dict, flops: dict[str, int] | None) -> None:
    """Achieved TFLOP/s and the fraction of the card's peak: the MODEL's FLOPs (forward and backward, not the
    optimizer step, not checkpointing's recompute) over the step's compute time (step time minus the wait
    on the loader, which no card speeds up). The optimizer's and recompute's FLOPs stay in the row apart."""
    if flops is None:
        return
    row["flops"] = flops
    row["achieved_tflops"] = flops["model"] / row["compute_s"] / 1e12
    if chk.device.type == "cuda":
        peak, row["peak_note"] = peak_tflops(chk.card, row["math"])
        row["fraction_of_peak"] = row["achieved_tflops"] / peak if peak else None
    else:
        row["fraction_of_peak"], row["peak_note"] = None, "n/a on CPU: no card peak to compare with"


def step_rows(spec: TrainerSpec, cuda: bool, dry: bool = False) -> list[tuple[str, str, list[str] | str]]:
    """(label, config, overrides or the reason it is not measured) for one trainer's table (`dry`: the dry
    run's, with `spec.dry_options` where a row needs them)."""
    compile_off = [o.replace("=true", "=false") for o in spec.options["torch.compile"]]
    shipped = [] if cuda else compile_off  # a shipped config that compiles is not compiled on the CPU
    rows: list[tuple[str, str, list[str] | str]] = [
        ("base config (as shipped)", "base", shipped), ("RTX 5090 config (as shipped)", "rtx5090", shipped),
        ("plain: base with every speed key off", "base", spec.plain)]
    for label, change in spec.options.items():
        if isinstance(change, str):
            rows.append((f"plain + {label}", "base", f"n/a: {change}"))
        elif not cuda and label in NA_CPU:
            rows.append((f"plain + {label}", "base", NA_CPU[label]))
        else:
            rows.append((f"plain + {label}", "base", [*spec.plain, *(spec.dry_options.get(label, change) if dry
                                                                      else change)]))
    return rows


def autotunes(label: str) -> bool:
    """Rows where cuDNN autotunes (the configs as shipped turn cudnn_benchmark on); on a GPU each runs in a
    process of its own, from an empty plan cache (why: bench/gpu/row.py)."""
    return not label.startswith("plain") or label == "plain + cudnn benchmark"


def _tier(label: str) -> int:
    """Which pass measures a row: the configs as shipped and plain first (every trainer's headline
    figures), then each speed key alone, compiled rows last (the slowest to start)."""
    return 2 if "compile" in label else 0 if not label.startswith("plain + ") else 1


def run_order(plan: dict[str, list], passes: tuple[int, ...]) -> list[tuple[str, int]]:
    """(trainer, row index) in the order they are measured: pass by pass, and within a pass key by key
    across the trainers (a run cut short still has the same rows for every trainer). Plain is measured
    whenever a later pass is, since × plain needs both in one run."""
    def wanted(label: str) -> bool:
        return _tier(label) in passes or (label.startswith("plain:") and any(t in passes for t in (1, 2)))
    order = [(_tier(label), i, t, name) for t, (name, rows) in enumerate(plan.items())
             for i, (label, _, _) in enumerate(rows) if wanted(label)]
    order.sort(key=lambda o: (0 if o[0] == 0 or plan[o[3]][o[1]][0].startswith("plain:") else o[0], o[1], o[2]))
    return [(name, i) for _, i, _, name in order]


def section_step_tables(chk: Check, sec: Section) -> None:
    steps, warmup = (1, 1) if chk.dry else (12, 3)
    sec.markdown += [f"{steps} timed steps after {warmup} untimed (the first counts FLOPs) per row; synthetic data "
                     f"through each trainer's own DataLoader; × plain = plain step time / row step time. Rows run "
                     f"in three passes (--passes {','.join(map(str, chk.passes))}): shipped configs and plain, each "
                     f"speed key alone, compiled; within a pass key by key across the trainers. "
                     + ("DRY RUN: the tests' tiny sizes on the CPU; the times say nothing about a GPU." if chk.dry
                        else "Real config sizes."), ""]
    plan = {name: step_rows(spec, chk.device.type == "cuda", chk.dry) for name, spec in TRAINERS.items()}
    order = run_order(plan, chk.passes)
    tables: dict[str, dict[str, dict]] = {
        name: {label: {"skipped": "not reached" if (name, i) in order else "not selected (--passes)"}
               for i, (label, _, _) in enumerate(rows)} for name, rows in plan.items()}
    sec.data.update(tables)
    flops: dict[tuple[str, str], dict[str, int]] = {}
    head = len(sec.markdown)
    for name, i in order:
        spec, (label, which, change) = TRAINERS[name], plan[name][i]
        tables[name][label] = _measure_row(chk, sec, spec, label, which, change, steps, warmup, flops)
        print(f"[step_tables] {name} / {label}: {tables[name][label]}", flush=True)
        sec.markdown[head:] = [ln for n, t in tables.items() for ln in _table_markdown(n, t)]
        chk.progress()


def _measure_row(chk: Check, sec: Section, spec: TrainerSpec, label: str, which: str, change: list[str] | str,
                 steps: int, warmup: int, flops: dict[tuple[str, str], dict[str, int]]) -> dict:
    if isinstance(change, str):
        return {"skipped": change}
    compiled = "compile" in label
    try:
        sec.check_time(f"{spec.name} / {label}")
        why = chk.compile_skip(sec, f"{spec.name} / {label}") if compiled and chk.device.type == "cuda" else None
        if why:
            sec.partial(why)
            return {"skipped": why}
        key = (spec.name, which)  # precision and layout do not change the math: one count per config file
        t0 = time.monotonic()
        if chk.device.type == "cuda" and autotunes(label):  # an empty cuDNN plan cache (bench/gpu/row.py)
            job = {"trainer": spec.name, "which": which, "overrides": change, "data": str(chk.data(spec)),
                   "tmp": str(chk.tmp), "device": chk.device.type, "dry": chk.dry, "steps": steps, "warmup": warmup,
                   "count": key not in flops}
            try:
                row, said = measure_in_child(job, max(1.0, sec.left_s()))
            except TimeoutError as e:
                raise OverBudget(f"{spec.name} / {label}: stopped at the section's budget ({e})") from e
            print(said[-20000:], flush=True)
            row["own_process"] = True
        else:
            row = measure_steps(chk, spec, which, change, steps, warmup, count=key not in flops)
        if compiled:
            chk.compiled(time.monotonic() - t0)
        chk.reset_memory()  # the trainer is gone with measure_steps' frame
        if row["flops"]:
            flops[key] = row["flops"]
        _flop_columns(chk, row, row["flops"] or flops.get(key))
        return row
    except OverBudget as e:
        sec.partial(str(e))
        return {"skipped": str(e)}
    except Exception:
        row = {"skipped": "failed: " + chk.error(f"step table {spec.name} / {label}")}
        sec.partial(row["skipped"])
        return row


def _table_markdown(name: str, table: dict[str, dict]) -> list[str]:
    plain = table.get("plain: base with every speed key off", {}).get("step_s")
    lines = [f"### {name}", "", "| row | batch | precision | step s | samples/s | × plain | data wait "
             "| peak GiB | model GFLOP/step | optimizer + recompute GFLOP | model TFLOP/s | % of peak | setup s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    notes = set()
    for label, r in table.items():
        if "skipped" in r:
            lines.append(f"| {label} | {r['skipped']} |||||||||||| ")
            continue
        ratio = f"{plain / r['step_s']:.2f}" if plain else "-"
        frac = r.get("fraction_of_peak")
        f = r.get("flops")
        model = f["model"] / 1e9 if f else None
        apart = f"{f['optimizer'] / 1e9:.2f} + {f['recompute'] / 1e9:.2f}" if f else "-"
        lines.append(
            f"| {label} | {r['batch']} | {r['precision']} | {r['step_s']:.4f} | {r['samples_per_s']:.2f} | {ratio} "
            f"| {100 * r['data_wait']:.1f} % | {fmt(r['peak_gib'], '.2f')} | {fmt(model, '.2f')} | {apart} "
            f"| {fmt(r.get('achieved_tflops'), '.4f')} | {'-' if frac is None else f'{100 * frac:.1f} %'} "
            f"| {sum(r.get('phases', {}).values()):.1f} |")
        notes.add(r.get("peak_note", ""))
    return [*lines, "", "- model GFLOP/step: forward and backward of the networks and losses (grouped convs counted "
            "right); the optimizer step (Muon's Newton-Schulz) and gradient checkpointing's recompute are the next "
            "column, not in TFLOP/s or % of peak, which divide the model's FLOPs by the step time minus the data wait",
            *[f"- peak used: {n}" for n in sorted(notes) if n], ""]


# ---------------------------------------------------------------------------------------- 8 batch size
OOM_ADVICE = "Try, in this order"


def _choose_vae_batch(spec: trainers.Vae, chk: Check) -> int:
    """The VAE's own finder (`--batch_size auto`: vae.memory.choose_batch_size) on its 5090 profile."""
    from vae.memory import choose_batch_size
    from vae.train_vae import new_step

    cfg = spec.config(spec.rtx, spec.tiny() if chk.dry else [])
    cfg.batch_size = "auto"
    choose_batch_size(new_step, cfg, chk.device, spec.perceptual(cfg), main=True)
    return int(cfg.batch_size)


def forced_oom(chk: Check, spec: TrainerSpec) -> dict:
    """The trainer's CLI `main` on its 5090 config with a step that runs out of memory: exit code 4 and
    the advice on stderr, through the trainer's own stop handling and `common.exit_codes.run_main`.

    CUDA: a real OOM inside the trainer's own step: when the step is first called, this process's CUDA
    memory is capped just above what the models and optimizers already hold, so no batch fits (what a
    far-too-large batch does, without synthesising a dataset that large). CPU (dry run):
    torch.cuda.OutOfMemoryError raised from the trainer's train_step instead."""
    main, argv = trainers.cli(spec, "rtx5090", [], chk.data(spec), chk.run_dir(f"{spec.name}_oom"),
                                  chk.device, chk.dry)
    real_step = spec.step_class().train_step
    if chk.device.type == "cuda":
        how = "real CUDA OOM in the trainer's step (memory capped above the weights at its first call)"
        total = torch.cuda.get_device_properties(chk.device).total_memory

        def step(*a, **k):
            cap = torch.cuda.memory_reserved(chk.device) + 64 * 2**20
            torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), chk.device)
            return real_step(*a, **k)
    else:
        how = "simulated: torch.cuda.OutOfMemoryError raised from the trainer's train_step"

        def step(*_a, **_k):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB (gpu_check --dry-run)")

    err = io.StringIO()
    chk.reset_memory()
    out = io.StringIO()
    try:
        with (mock.patch.object(spec.step_class(), "train_step", step), spec.cli_context(),
              contextlib.redirect_stderr(err), contextlib.redirect_stdout(out)):
            rc = main(argv)
    finally:
        if chk.device.type == "cuda":
            torch.cuda.set_per_process_memory_fraction(1.0, chk.device)
        chk.reset_memory()
    text = err.getvalue()
    print(out.getvalue(), text, flush=True)
    if RANDOM_BACKBONE_NOTE in out.getvalue():
        how += f"; {RANDOM_BACKBONE_NOTE}"
    ok = rc == 4 and "out of memory" in text.lower() and OOM_ADVICE in text
    return {"how": how, "exit_code": rc, "advice_printed": OOM_ADVICE in text, "ok": ok,
            "message": next((ln for ln in text.splitlines() if ln.startswith("error:")), text.strip()[:200])}


def finder_and_steps(chk: Check, sec: Section, spec: TrainerSpec, steps: int) -> dict:
    """What the batch-size finder picks for the 5090 config here, then `steps` steps at that batch (one
    real batch of the trainer's loader, repeated to the size: `tile_batch`)."""
    from common.hardware import find_batch_size

    log = io.StringIO()
    if isinstance(spec, trainers.Vae):  # its finder builds a fresh model per trial: nothing else in memory
        with contextlib.redirect_stdout(log):
            picked = _choose_vae_batch(spec, chk)
        chk.reset_memory()
    st = build(spec, "rtx5090", [], chk.data(spec), chk.run_dir(f"{spec.name}_finder"), chk.device, chk.dry)
    one = next(st.batches())

    def try_batch(b: int) -> None:
        sec.check_time(f"{spec.name} batch finder at {b}")
        st.step(tile_batch(one, b))
        chk.sync()

    if not isinstance(spec, trainers.Vae):  # the trainer's models and optimizer states stay in memory
        with contextlib.redirect_stdout(log):
            picked = find_batch_size(try_batch, start=1, limit=4096)
    print(log.getvalue(), flush=True)
    chk.reset_memory()
    batch = tile_batch(one, picked)
    step_s = seconds_per_step(lambda: st.step(batch), steps, chk.device, warmup=1)
    return {"finder": log.getvalue().strip().splitlines()[-1] if log.getvalue().strip() else "", "picked": picked,
            "step_s": step_s, "steps": steps, "peak_gib": chk.peak_gib()}


def section_batch_size(chk: Check, sec: Section) -> None:
    steps = 2 if chk.dry else 10
    sec.markdown += ["| trainer | finder says | picked | steps at it | step s | peak GiB | forced OOM | exit code |",
                     "|---|---|---|---|---|---|---|---|"]
    for name, spec in TRAINERS.items():
        res: dict = {}
        sec.data[name] = res
        try:
            sec.check_time(f"{name} batch size")
            res.update(finder_and_steps(chk, sec, spec, steps))
            chk.reset_memory()
        except OverBudget as e:
            res["skipped"] = str(e)
            sec.partial(str(e))
        except Exception:
            res["skipped"] = "failed: " + chk.error(f"batch size {name}")
            sec.partial(res["skipped"])
        try:
            sec.check_time(f"{name} forced OOM")
            res["oom"] = forced_oom(chk, spec)
            if not res["oom"]["ok"]:
                sec.partial(f"{name}: forced OOM gave exit code {res['oom']['exit_code']}, advice printed: "
                            f"{res['oom']['advice_printed']}")
        except OverBudget as e:
            res["oom"] = {"skipped": str(e)}
            sec.partial(str(e))
        except Exception:
            res["oom"] = {"skipped": "failed: " + chk.error(f"forced OOM {name}")}
            sec.partial(res["oom"]["skipped"])
        chk.progress()
        oom = res["oom"]
        sec.markdown.append(
            f"| {name} | {res.get('finder', res.get('skipped', ''))} | {res.get('picked', '-')} | {res.get('steps', '-')} "
            f"| {fmt(res.get('step_s'), '.4f') if 'step_s' in res else '-'} | {fmt(res.get('peak_gib'), '.2f')} "
            f"| {oom.get('how', oom.get('skipped'))}: {'OK' if oom.get('ok') else 'NOT OK'} | {oom.get('exit_code', '-')} |")
    first_oom = next((r["oom"]["message"] for r in sec.data.values() if r.get("oom", {}).get("message")), None)
    if first_oom:
        sec.markdown += ["", f"First OOM message (the rest in gpu_check.log): `{first_oom}`"]
