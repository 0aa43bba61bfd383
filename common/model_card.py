"""Where a model's data came from, under which licence, and the README.md (model card) every export writes.

Why: an exported model travels without its run folder. Whoever receives it needs what trained it, with which
settings and for how long, how it scored on held-out data, what data it learned from under which licence, and
the code's licence. The facts are recorded where they arise and carried with the weights:

- each prepare script records `data_source(...)` in its manifest / report: the inputs it was given, the
  `--data_licence` text (`add_data_licence_flag`) and the LICENSE / COPYING files found at the top of each
  input folder (their first line);
- each trainer reads it back from the prepared folder (`read_data_source`) and keeps it in its checkpoints'
  `extra` under `DATA_SOURCE`, the way a published voice's `licence` travels (`extra["licence"]`);
- each export writes `write_model_card(...)`: `README.md` inside a folder export (a generator folder, a
  diffusers folder), `<file>.README.md` beside a file export (`model.onnx.README.md`, as `model.onnx.json`).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path

import yaml

from common.atomic_write import write_text

CODE_LICENCE = "MIT"
DATA_SOURCE = "data_source"  # the key in a prepared folder's manifest / report and in a checkpoint's `extra`
LICENCE_FILES = ("LICENSE", "LICENSE.txt", "LICENSE.md", "LICENCE", "LICENCE.txt", "COPYING", "COPYING.txt")
RECORDS = ("manifest.json", "report.json")  # where the prepares write `data_source`, in the order read


def add_data_licence_flag(parser: argparse.ArgumentParser) -> None:
    """`--data_licence TEXT`, the same for every prepare script."""
    parser.add_argument("--data_licence", default=None, metavar="TEXT",
                        help="the licence of the input data (e.g. 'CC-BY 4.0, LJ Speech'); recorded in the prepared "
                             "folder, carried into the checkpoints and written into every export's README.md")


def first_line(path: Path) -> str:
    """The first non-empty line of a text file (a licence's name, as LICENSE files begin), at most 200 characters."""
    try:
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.strip():
                return line.strip()[:200]
    except OSError:
        pass
    return ""


def data_source(inputs: Iterable[str | Path | None], data_licence: str | None = None) -> dict:
    """What a prepare records about its inputs: each one named (absolute), `data_licence` as given, and the
    licence files at the top of each input folder (or beside an input file) with their first line."""
    named = [Path(p).resolve() for p in inputs if p is not None]
    files = {}
    for path in named:
        folder = path if path.is_dir() else path.parent
        for name in LICENCE_FILES:
            if (folder / name).is_file():
                files[str(folder / name)] = first_line(folder / name)
    return {"inputs": [str(p) for p in named], "data_licence": data_licence, "licence_files": files}


def read_data_source(prepared: str | Path | None) -> dict | None:
    """The `data_source` a prepare recorded in the folder `prepared` (a file in it: its folder); None when the
    folder records none (prepared before this was recorded, or never prepared: a trainer may read plain folders)."""
    if not prepared:
        return None
    folder = Path(prepared) if Path(prepared).is_dir() else Path(prepared).parent
    for name in RECORDS:
        try:
            record = json.loads((folder / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and isinstance(record.get(DATA_SOURCE), dict):
            return record[DATA_SOURCE]
    return None


def card_path(out: str | Path) -> Path:
    """Where an export's card goes: `README.md` inside a folder export, `<file>.README.md` beside a file export."""
    out = Path(out)
    return out / "README.md" if out.is_dir() else out.with_name(out.name + ".README.md")


def held_out_figures(ckpt: dict, ckpt_path: str | Path | None = None) -> list[str]:
    """The held-out figures a checkpoint records, one line each: the last validation in its `extra` (the last
    entry of a `history` list, or a `valid` dict), a recorded `best_psnr`, and best.json beside the file (the
    best value of the metric best.pt is chosen by, and its step)."""
    extra = ckpt.get("extra", {})
    lines = []
    history = extra.get("history", ckpt.get("counters", {}).get("history"))
    if isinstance(history, str):  # written before the one checkpoint layout: a JSON string under `counters`
        history = json.loads(history)
    if isinstance(history, dict):
        history = history.get("valid")
    last = history[-1] if isinstance(history, list) and history else extra.get("valid")
    if isinstance(last, dict) and last:
        lines.append(f"last validation (step {last.get('step', '?')}): " + ", ".join(
            f"{k} {v:.4g}" for k, v in last.items() if k != "step" and isinstance(v, int | float)))
    if extra.get("best_psnr") is not None:
        lines.append(f"best held-out PSNR {extra['best_psnr']:.4g} dB")
    best = Path(ckpt_path).parent / "best.json" if ckpt_path else None
    if best is not None and best.is_file():
        try:
            record = json.loads(best.read_text(encoding="utf-8"))
            lines.append(f"best.pt: {record.get('by', 'metric')} {record['metric']:.4g} at step {record['step']}")
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return lines


def checkpoint_facts(ckpt: dict, ckpt_path: str | Path) -> dict:
    """The keyword arguments of `write_model_card` a training checkpoint of this repository gives."""
    extra = ckpt.get("extra", {})
    return {"trainer": ckpt.get("trainer", "unknown"), "step": ckpt.get("counters", {}).get("step"),
            "config": ckpt.get("config", {}), "held_out": held_out_figures(ckpt, ckpt_path),
            "data": extra.get(DATA_SOURCE), "weights_licence": extra.get("licence"), "source": str(ckpt_path)}


def lookup(config: dict, dotted: str):
    """`config["a"]["b"]` for "a.b"; None when absent."""
    value = config
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def data_lines(data: dict | None) -> list[str]:
    if not data:
        return ["- not recorded: the data was prepared before prepare_data.py recorded its inputs (or not "
                "prepared at all); check the data's own terms before sharing this model"]
    lines = [f"- input: `{p}`" for p in data.get("inputs", [])]
    lines.append(f"- data licence: {data.get('data_licence') or 'not given (--data_licence)'}")
    lines += [f"- licence file `{f}`: {text}" for f, text in data.get("licence_files", {}).items()]
    return lines


def write_model_card(out: str | Path, *, trainer: str, step: int | None, config: dict, held_out: list[str],
                     data: dict | None, weights_licence: str | None = None, source: str | None = None,
                     export: str = "", key_config: Iterable[str] = ()) -> Path:
    """Writes the card of the export `out` (`card_path`) and returns its path. `key_config`: the dotted config
    keys worth reading first (the full resolved config follows, collapsed)."""
    path = card_path(out)
    keys = [(k, lookup(config, k)) for k in key_config]
    lines = [f"# {Path(out).name}", "",
             f"A `{trainer}` model of the trainers repository, exported by `{export}`." if export else
             f"A `{trainer}` model of the trainers repository.", "",
             "## Training", "",
             f"- trainer: `{trainer}`",
             f"- steps trained: {step if step is not None else 'not recorded'}",
             *([f"- from checkpoint: `{source}`"] if source else []),
             *(f"- `{k}`: {json.dumps(v, ensure_ascii=False)}" for k, v in keys if v is not None), "",
             "## Held-out figures", "",
             *([f"- {line}" for line in held_out] or ["- none recorded (saved before any validation)"]), "",
             "## Data", "", *data_lines(data), "",
             "## Licences", "",
             f"- code: {CODE_LICENCE} (the repository's LICENSE); its runtime dependencies include GPL-3 "
             "praat-parselmouth",
             f"- data: {(data or {}).get('data_licence') or 'see Data above'}; the weights learned from it, so "
             "its terms may bind how they are shared",
             *([f"- weights this run started from: {weights_licence}"] if weights_licence else []), "",
             "## Full resolved config", "", "<details><summary>config</summary>", "", "```yaml",
             yaml.safe_dump(config, sort_keys=False, allow_unicode=True).rstrip(), "```", "", "</details>", ""]
    write_text(path, "\n".join(lines))
    return path
