"""The error kinds a user can fix, which every entry point turns into exit 2 (`common.exit_codes`).

`UserError` is their one base: every error class of the repo that describes something the user gave (a config
key, a file, a flag, a dataset, a checkpoint) derives from it, and `common.exit_codes.run_main` turns exactly
these into one `error:` line and exit 2; any other exception is a bug and keeps its traceback. Each class also
keeps the built-in base it had (ValueError, RuntimeError), so `except ValueError` elsewhere still catches it.

A leaf module: the low-level writers (`common.atomic_write`, `common.run_lock`) raise them without
importing the config machinery, which itself writes through `common.atomic_write`.
Also the one message for a missing third-party module (`missing_dependency_message`)."""

from __future__ import annotations

import re
import stat
from pathlib import Path


class UserError(Exception):
    """Something the user can fix, said in one line that names it and what to do: exit 2, no traceback.

    The message is the whole text the user sees (the CLI prints `error: <message>`, serve answers it as
    the 4xx body), so it is worded once, where the problem is found, and never rewritten by a caller."""


_FILE_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
               (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"))


def file_kind(mode: int) -> str:
    """What a path whose `st_mode` is `mode` is, in a refusal's words ("a folder", "a FIFO (named pipe)", ...), for
    a path that had to be a regular file (a run's lock, a model file)."""
    return next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")


class ConfigError(UserError, ValueError):
    """A config problem a user can fix: the message names the key, the source and a suggestion."""


class InputNotFoundError(UserError, FileNotFoundError):
    """A file or folder the user named that is not there, or holds nothing this script reads (exit 2). A
    FileNotFoundError too, so code that catches that still does."""


class OutputPathError(ConfigError):
    """An output location that cannot be used, with the reason and what to do (exit 2)."""


# A missing (or broken) third-party package is not a bad input file: the run stops with one line naming
# it. The pip name where it differs from the module name; any other module installs under its own name.
PIP_NAMES = {"parselmouth": "praat-parselmouth", "PIL": "pillow", "yaml": "PyYAML", "skimage": "scikit-image",
             "sklearn": "scikit-learn", "cv2": "opencv-python",
             "pkg_resources": "'setuptools<81'"}  # pyworld 0.3.5 (f0 harvest) imports pkg_resources
# This repository's own top-level packages (each folder beside common/ with an __init__.py): an import of
# these failing is a bug, not a missing install.
OWN_PACKAGES = tuple(sorted(p.parent.name for p in Path(__file__).resolve().parents[1].glob("*/__init__.py")))


REQUIREMENT_FILES = ("requirements.txt", "requirements-test.txt", "requirements-nodeps.txt")


def pinned_requirement(pip_name: str) -> tuple[str, str] | None:
    """(the pinned requirement, e.g. 'torchfcpe==0.0.4', and the file that holds it) for a pip name the repo's
    requirement files list, first match in `REQUIREMENT_FILES` order; None when none lists it. Why: an install hint
    must name the file that really holds the package (fcpe's torchfcpe is in requirements-test.txt only)."""
    root = Path(__file__).resolve().parents[1]
    wanted = pip_name.strip("'").split("<")[0].split("=")[0].lower().replace("_", "-")
    for name in REQUIREMENT_FILES:
        try:
            lines = (root / name).read_text(encoding="utf-8").splitlines()
        except OSError:
            continue
        for line in lines:
            spec = line.split("#")[0].strip()
            project = re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0].lower().replace("_", "-")
            if spec and project == wanted:
                return spec, name
    return None


def missing_module_name(exc: ImportError) -> str | None:
    """The module an ImportError could not import: its `name`, or the one named in "No module named 'x'"
    (an ImportError raised by hand, or re-raised from a worker process, may carry only the message)."""
    if exc.name:
        return exc.name
    match = re.search(r"No module named '([^']+)'", str(exc))
    return match.group(1) if match else None


def missing_dependency_message(exc: ImportError) -> str | None:
    """One line for an ImportError of a third-party module: which module, and what to install. None when
    the failed import is one of the repo's own modules (a bug, whose traceback should be seen)."""
    name = missing_module_name(exc)
    top = name.split(".")[0] if name else None
    if top in OWN_PACKAGES:
        return None
    everything = "pip install -r requirements.txt"
    if isinstance(exc, ModuleNotFoundError) and top:
        pip_name = PIP_NAMES.get(top, top)
        pinned = pinned_requirement(pip_name)
        if pinned is None:  # in no requirements file: the package alone
            where = ""
        elif pinned[1] == "requirements.txt":
            pip_name, where = pinned[0], f" (or everything the repo needs: `{everything}`)"
        else:  # an optional package, pinned only in another file: that file, never requirements.txt
            pip_name, where = pinned[0], f" (pinned in {pinned[1]}: `pip install -r {pinned[1]}` installs it)"
        return f"the Python module '{top}' is not installed ({exc}); install it with `pip install {pip_name}`{where}"
    what = f"the Python module '{top}'" if top else "a required Python module"
    return f"{what} does not import ({exc}); reinstall the pinned versions: `{everything}`"
