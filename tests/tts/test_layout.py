"""The tts/ layout: two trainers, tts/vits/ and tts/clone/, over shared modules (tts/text/,
tts/alignment.py, tts/prepare_data.py). The entry scripts the READMEs name are thin and run both as
`python tts/X.py` and `python -m tts.X`."""

from __future__ import annotations

import ast
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TTS = ROOT / "tts"
# entry script users type → the package module that holds its code
SCRIPTS = {
    "train": "tts.vits.train", "train_uzbek_tts": "tts.vits.train", "synthesize": "tts.vits.synthesize",
    "export_onnx": "tts.vits.export_onnx", "demo": "tts.vits.demo",
    "train_main": "tts.clone.train", "infer_clone": "tts.clone.infer", "export_clone_onnx": "tts.clone.export_onnx",
    "clone_demo": "tts.clone.demo",
}


def _imports(path: Path) -> set[str]:
    """Every module name a file imports (absolute imports only: the repo uses no relative ones)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_entry_script_is_thin_and_runs_both_ways(script, monkeypatch, capsys):
    path = TTS / f"{script}.py"
    imports = _imports(path) - {"__future__", "__future__.annotations", "sys"}
    assert imports == {SCRIPTS[script], f"{SCRIPTS[script]}.main"}, imports  # main and nothing else
    for run in (lambda: runpy.run_path(str(path), run_name="__main__"),
                lambda: runpy.run_module(f"tts.{script}", run_name="__main__", alter_sys=True)):
        monkeypatch.setattr(sys, "argv", [str(path), "--help"])
        with pytest.raises(SystemExit) as stop:
            run()
        assert stop.value.code == 0
        assert "usage:" in capsys.readouterr().out


def test_script_path_runs_from_the_repository_root():
    """`python tts/train.py` puts tts/ (not the root) first on sys.path; the package still imports."""
    proc = subprocess.run([sys.executable, "tts/train.py", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0 and "--data_dir" in proc.stdout, proc.stderr[-2000:]


def test_each_trainer_imports_only_itself_and_the_shared_modules():
    """tts/vits/ never imports tts.clone; tts/clone/ imports tts.vits only in its demo (which reuses
    the VITS demo's corpus and MCD bar); the shared modules import no cloning code."""
    shared = [TTS / "alignment.py", TTS / "prepare_data.py", *sorted((TTS / "text").glob("*.py"))]
    for path in [*sorted((TTS / "vits").glob("*.py")), *shared]:
        assert not any(m.startswith("tts.clone") for m in _imports(path)), path
    for path in sorted((TTS / "clone").glob("*.py")):
        if path.name != "demo.py":
            assert not any(m.startswith("tts.vits") for m in _imports(path)), path
