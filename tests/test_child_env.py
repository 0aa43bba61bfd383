"""tests/child_env.py: a child process a test starts sees this checkout first and still the PYTHONPATH
entries the environment added (a GPU machine's `pip install --target /tmp/site` wheels)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from tests.child_env import REPO, child_env, pythonpath_with_repo


def test_a_child_sees_the_repo_and_the_paths_the_environment_added(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    (site / "wheel_only_here.py").write_text("WHERE = 'site'\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    show = ("import json, sys, common, wheel_only_here; "
            "print(json.dumps([sys.path, wheel_only_here.WHERE]))")
    out = subprocess.run([sys.executable, "-c", show], cwd=tmp_path, env=child_env(EXTRA="1"),
                         capture_output=True, text=True, check=True).stdout
    path, where = json.loads(out)
    assert where == "site"
    assert path.index(str(REPO)) < path.index(str(site))  # this checkout first, then the environment's


def test_no_empty_entry_when_nothing_was_there():
    assert pythonpath_with_repo(None) == pythonpath_with_repo("") == str(REPO)
    assert pythonpath_with_repo(f"/a{os.pathsep}/b") == f"{REPO}{os.pathsep}/a{os.pathsep}/b"


def test_no_test_replaces_pythonpath_with_the_repo_alone():
    """Every child a test starts gets its environment from `child_env` (a literal `"PYTHONPATH": ...` in an
    env dict drops what the environment had put there)."""
    offenders = []
    for folder in ("tests", "bench", "common", "speech", "vocoder", "tts", "vae"):
        for f in sorted((REPO / folder).rglob("*.py")):
            if f.name not in ("child_env.py", "test_child_env.py") and re.search(r"""["']PYTHONPATH["']\s*:""", f.read_text()):
                offenders.append(str(f.relative_to(REPO)))
    assert not offenders, f"set PYTHONPATH through tests.child_env.child_env(): {offenders}"
