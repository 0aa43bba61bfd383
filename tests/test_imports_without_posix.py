"""Windows has no `resource`, `fcntl`, `termios`, `pwd` or `grp`: every module of the repository must import
without them (a trainer that fails at import cannot train at all there; `common/log.py` once imported
`resource` at module level and every `train_rtx5090.bat` stopped on it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.child_env import child_env

REPO = Path(__file__).resolve().parents[1]
POSIX_ONLY = ("resource", "fcntl", "termios", "pwd", "grp")
PACKAGES = ("common", "speech", "vocoder", "tts", "vae", "bench")

# In a fresh interpreter: block the modules (None in sys.modules makes `import` raise ImportError, as on
# Windows), then import every module of the packages; print the ones that fail with why.
CHILD = f"""
import importlib, sys, traceback
from pathlib import Path
for name in {POSIX_ONLY!r}:
    sys.modules[name] = None
failed = []
repo = Path({str(REPO)!r})
for pkg in {PACKAGES!r}:
    for path in sorted((repo / pkg).rglob("*.py")):
        mod = ".".join(path.relative_to(repo).with_suffix("").parts)
        if mod.endswith("__main__"):
            continue
        try:
            importlib.import_module(mod)
        except ImportError as exc:
            failed.append(f"{{mod}}: {{type(exc).__name__}}: {{exc}}")
print("\\n".join(failed) if failed else "ALL IMPORTED")
"""


def test_every_module_imports_without_posix_only_modules():
    proc = subprocess.run([sys.executable, "-c", CHILD], cwd=REPO, env=child_env(), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "ALL IMPORTED", proc.stdout[-3000:]


def test_peak_memory_reads_without_resource(monkeypatch):
    from common.log import peak_rss_gib

    monkeypatch.setitem(sys.modules, "resource", None)
    assert peak_rss_gib() >= 0.0  # psutil's peak working set where installed, else 0.0: never an ImportError
