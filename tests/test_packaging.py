"""`pip install .`: pyproject.toml's dependencies agree with the exact locks `make setup` and `make test` install,
every console command names a `main(argv=None)`, and the wheel carries the metadata, commands, data files and
licence a user installs (README "Install").

Why the pins are checked against the specifiers: requirements*.txt are the locks the tests ran with and
pyproject.toml the ranges `pip install .` accepts; a lock outside its range means either the tested
environment cannot be installed from the package, or the range was never tested. Either way one of them
drifted."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
LOCKS = ("requirements.txt", "requirements-test.txt", "requirements-nodeps.txt")
# installed with --no-deps after requirements.txt (requirements-nodeps.txt says why): never a dependency
NO_DEPS = {"resemblyzer"}
PACKAGES = ("common", "speech", "vocoder", "tts", "vae", "bench", "serve")


def pins() -> dict[str, tuple[str, str]]:
    """{canonical name: (pinned version, lock file)} of every `name==version` line of the locks."""
    found = {}
    for lock in LOCKS:
        for line in (REPO / lock).read_text(encoding="utf-8").splitlines():
            line = line.split("#", 1)[0].strip()
            if not line or line.startswith("-"):
                continue
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f"{lock}: {line!r} is not an exact pin"
            found[canonicalize_name(req.name)] = (spec.version, lock)
    return found


def declared() -> dict[str, list[Requirement]]:
    """{canonical name: its requirements} over pyproject's dependencies and every extra (not self-references)."""
    project = PYPROJECT["project"]
    found: dict[str, list[Requirement]] = {}
    for line in [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]:
        req = Requirement(line)
        if canonicalize_name(req.name) != canonicalize_name(project["name"]):
            found.setdefault(canonicalize_name(req.name), []).append(req)
    return found


def test_every_pin_satisfies_pyprojects_specifier():
    ranges = declared()
    for name, (version, lock) in pins().items():
        if name in NO_DEPS:
            assert name not in ranges, f"{name} is installed --no-deps: it must not be a dependency of the package"
            continue
        assert name in ranges, f"{lock} pins {name}=={version}, which pyproject.toml declares nowhere"
        for req in ranges[name]:
            assert req.specifier.contains(version, prereleases=True), (
                f"{lock} pins {name}=={version} outside pyproject.toml's {req}")
    unpinned = set(ranges) - set(pins())
    assert not unpinned, f"declared in pyproject.toml but pinned in no lock file: {sorted(unpinned)}"


def test_runtime_leaves_out_dev_tools_and_the_server():
    """pytest and ruff are development tools; the page's server is the `serve` extra (requirements.txt still
    installs it for `make setup`), so `pip install .` alone and `pip install ".[serve]"` differ."""
    project = PYPROJECT["project"]
    base = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    serve = {canonicalize_name(Requirement(r).name) for r in project["optional-dependencies"]["serve"]}
    assert serve == {"starlette", "uvicorn", "python-multipart"}
    assert not base & (serve | {"pytest", "ruff", "pytest-xdist"})


def test_every_console_command_calls_a_main_that_takes_argv():
    """Each command's target defines (or imports) `main(argv=None)`; read from the source, nothing imported."""
    for command, target in PYPROJECT["project"]["scripts"].items():
        module, func = target.split(":")
        source = REPO / (module.replace(".", "/") + ".py")
        tree = ast.parse(source.read_text(encoding="utf-8"))
        defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == func]
        assert len(defs) == 1, f"{command}: {source} defines no {func}()"
        args = defs[0].args
        assert [a.arg for a in args.args] == ["argv"] and len(args.defaults) == 1, f"{command}: {func}(argv=None)"


def test_installed_copies_list_the_same_trainers():
    """common/trainers.py reads [tool.trainers] in a checkout and the entry points in an installed copy."""
    group = PYPROJECT["project"]["entry-points"]["trainers.packages"]
    assert [group[name] for name in sorted(group)] == PYPROJECT["tool"]["trainers"]["packages"]


def test_the_wheel_installs_commands_metadata_and_licence(tmp_path):
    """Builds the wheel from a copy of the sources (setuptools writes build/ into the tree it builds), reads
    its metadata, installs it alone and finds every command's module in the installed copy. ~4-7 s here."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, src / name)
    for package in PACKAGES:
        shutil.copytree(REPO / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", str(src), "-w", str(tmp_path / "dist")],
                   check=True, cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("trainers-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        info = next(n for n in names if n.endswith(".dist-info/METADATA")).rsplit("/", 1)[0]
        metadata = z.read(f"{info}/METADATA").decode()
        entry_points = z.read(f"{info}/entry_points.txt").decode()
    assert "License-Expression: MIT" in metadata and f"{info}/licenses/LICENSE" in names
    requires = re.findall(r"^Requires-Dist: (.+)$", metadata, re.M)
    assert "torch>=2.11" in requires and not any(r.startswith("resemblyzer") for r in requires)
    assert set(re.findall(r"^Provides-Extra: (\S+)$", metadata, re.M)) == {"serve", "trackers", "f0", "datasets",
                                                                            "test"}
    for command, target in PYPROJECT["project"]["scripts"].items():
        assert f"{command} = {target}" in entry_points
    assert {"vocoder/configs/demo.yaml", "vae/configs/tiny.yaml", "serve/static/index.html"} <= set(names)

    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--no-compile", "--target", str(site), str(wheel)], check=True)
    # Every command's module is found in the installed copy (found, not run: each imports torch, 3-10 s here;
    # `vocoder-export --help` and `vae-check --help` from this copy were run by hand and print their usage).
    probe = ("import importlib.util, sys; from importlib.metadata import entry_points; "
             "from common.trainers import trainer_packages; "
             "print(sorted(ep.name for ep in entry_points(group='console_scripts') if ep.dist.name == 'trainers' "
             "and importlib.util.find_spec(ep.module).origin.startswith(sys.argv[1]))); print(trainer_packages())")
    env = dict(os.environ)  # the installed copy first (not this checkout), then whatever the environment had
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    out = subprocess.run([sys.executable, "-c", probe, str(site)], env=env, cwd=tmp_path, capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == [str(sorted(PYPROJECT["project"]["scripts"])), str(PYPROJECT["tool"]["trainers"]["packages"])]
