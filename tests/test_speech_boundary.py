"""speech/ sits between common/ and the speech trainers (docs/DESIGN "Layout"): common/ imports no `speech`
(it stays the layer every trainer, the image VAE included, can take alone), no vae/ file imports `speech`
(an image trainer needs none of audio, f0 or mel), and speech/ imports `common` and third-party packages
only, never a trainer, serve or bench.

Read with `ast`, nothing is imported: every `import x` / `from x import y`, at module level or inside a
function (a deferred import still makes the dependency), and `importlib.import_module("x")` with a literal
name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRAINERS_AND_TOOLS = ("vocoder", "tts", "vae", "serve", "bench", "shell", "tests")


def imported_names(source: str) -> list[tuple[int, str]]:
    """(line, dotted module name) of every import in `source`, relative imports left out (they stay inside
    their own package)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.append((node.lineno, node.args[0].value))
    return found


def imports_of_package(folder: str, packages: tuple[str, ...]) -> list[str]:
    """'file:line: module' for every import of one of `packages` in a .py file under `folder`."""
    hits = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for line, name in imported_names(path.read_text(encoding="utf-8")):
            if name.split(".")[0] in packages:
                hits.append(f"{path.relative_to(ROOT)}:{line}: {name}")
    return hits


@pytest.mark.parametrize("folder", ["common", "vae"])
def test_common_and_vae_import_no_speech(folder):
    hits = imports_of_package(folder, ("speech",))
    assert not hits, (f"{folder}/ imports speech (common/ is the layer below speech/, and the image VAE needs "
                      f"nothing of audio; move what both need into common/): {hits}")


def test_speech_imports_common_only():
    hits = imports_of_package("speech", TRAINERS_AND_TOOLS)
    assert not hits, f"speech/ imports a trainer or tool (it may import common and third-party only): {hits}"


def test_the_check_sees_deferred_and_dynamic_imports():
    source = ("import os\n"
              "from speech.audio import load_audio\n"
              "def f():\n"
              "    import speech.f0 as f0\n"
              "    return importlib.import_module('speech.trim')\n"
              "from . import sibling\n")
    assert sorted(name for _, name in imported_names(source)) == ["os", "speech.audio", "speech.f0", "speech.trim"]
