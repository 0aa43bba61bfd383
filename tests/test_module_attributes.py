"""A name moved out of a module must not leave a caller behind: every `alias.name` where `alias` is one of
the repository's own modules (`from tts.vits import train as train_mod`, `import vae.memory as memory`)
must exist on that module. (After the training loop moved, `tts/vits/demo.py` still called
`train_mod.load_config` and the VITS demo failed after 6 minutes of training.)"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "speech", "vocoder", "tts", "vae", "bench")


def module_aliases(tree: ast.Module) -> dict[str, set[str]]:
    """alias -> module paths, for the repo's own modules imported under a name (one alias may name another
    module in another function: `demo` is vae.demo in one and tts.vits.demo in the next)."""
    out: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and a.name.split(".")[0] in PACKAGES:
                    out.setdefault(a.asname, set()).add(a.name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if importlib.util.find_spec(node.module) and (REPO / full.replace(".", "/")).with_suffix(".py").is_file():
                    out.setdefault(a.asname or a.name, set()).add(full)
    return out


def test_every_attribute_of_an_imported_repo_module_exists():
    missing = []
    files = [p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")] + list((REPO / "tests").rglob("*.py"))
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases = module_aliases(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                mods = aliases[node.value.id]
                if isinstance(node.ctx, ast.Load) and not any(hasattr(importlib.import_module(m), node.attr)
                                                              for m in mods):
                    missing.append(f"{path.relative_to(REPO)}:{node.lineno}: {' or '.join(sorted(mods))}.{node.attr}")
    assert not missing, "\n".join(missing)
