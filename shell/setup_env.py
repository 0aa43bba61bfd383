#!/usr/bin/env python3
"""Makes the project's virtualenv with a PyTorch build that uses this machine's NVIDIA card.

    py -3.11 shell\\setup_env.py [--cuda auto]        Windows (setup_windows.bat runs this)
    python3 shell/setup_env.py --cuda cu130           Linux (shell/setup.sh runs this)
    python3 shell/setup_env.py --dry-run --platform windows --cuda auto \\
        --gpu "NVIDIA GeForce RTX 5090" --driver 566.36 --compute-cap 12.0

Steps, in the repository root, each printed before it runs:
  1. `python -m venv .venv` (skipped when the venv's python exists);
  2. pip and setuptools upgraded in it (setuptools: `-e .` is installed without build isolation, and
     Python >= 3.12 venvs come without it);
  3. torch and torchvision at requirements.txt's pins, from PyTorch's own index for the chosen build
     (`--index-url https://download.pytorch.org/whl/<build>`), pinned with the build's local label
     (`torch==2.14.1+cu128`) so that a torch of another build already in the venv is replaced;
  4. the rest of requirements.txt, without its torch lines (the CUDA torch already satisfies every
     `torch` requirement there, so pip keeps it instead of taking PyPI's, which is CPU-only on Windows);
  5. requirements-nodeps.txt's pins with `--no-deps` (where that file exists), then the repository itself
     (`-e .`, no deps, no build isolation), as the Makefile does;
  6. Linux only: shell/install_sysdeps.sh (Debian's espeak-ng and sox, as `make setup`); on Windows one
     line says what espeak-ng is for and where to get it;
  7. `<venv python> shell/setup_env.py --verify <build>`: the installed torch is that build and, where a
     GPU was found, runs a kernel on it.

Linux: `make setup` is unchanged and stays the default there: it installs PyPI's torch, which for
torch 2.14.1 on Linux is the CUDA 13.0 build (its wheel requires cuda-toolkit==13.0.3). This script is
the explicit-build path on Linux and the setup path on Windows; it always takes torch from PyTorch's
index, for cu130 too (the same CUDA 13.0 build PyPI serves on Linux), so one rule holds on both systems
and `torch.__version__` names the build (2.14.1+cu130).

--cuda auto reads `nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader` and
takes the newest build that (a) the driver supports, by NVIDIA's minimum driver per CUDA version
(CUDA_BUILDS below), and (b) has kernels for every GPU's compute capability (an RTX 50xx, compute
capability 12.0, needs cu128 or newer; Maxwell to Volta, below 7.5, only cu126). When the card needs a
newer build than the driver allows, it stops with one line saying which driver to install. No
nvidia-smi, or no GPU in it: cpu, said in one line.

--dry-run prints the commands, one per line, exactly as they would run from the repository root on
--platform (auto: this machine), and runs nothing; notes go to stderr. Test hooks, only with
--dry-run: --gpu NAME --driver VERSION [--compute-cap X.Y] replace the nvidia-smi read (--gpu none: no
GPU). For another --platform the interpreter that would make the venv is shown as `python`.
SETUP_ENV_DRY_RUN_ONLY=1 in the environment refuses every real run (the tests set it).

Exit status: 0 done; 1 a step failed (pip's own messages are above the line that says which);
2 refused before doing anything (bad arguments, a driver too old for the card, Python < 3.11).
"""

from __future__ import annotations

import argparse
import ntpath
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT_REL = ("shell", "setup_env.py")
TORCH_INDEX = "https://download.pytorch.org/whl/"
DRY_RUN_ONLY_ENV = "SETUP_ENV_DRY_RUN_ONLY"
MIN_PYTHON = (3, 11)  # pyproject.toml: requires-python = ">=3.11"
DRIVER_DOWNLOAD = "https://www.nvidia.com/drivers"

# Minimum NVIDIA driver per CUDA build, per system: NVIDIA's CUDA Toolkit release notes, Table 3 "CUDA
# Toolkit and Corresponding Driver Versions" (docs.nvidia.com/cuda/cuda-toolkit-release-notes), the
# "Toolkit Driver Version" of each GA release:
#   CUDA 12.6 GA  Linux x86_64 >= 560.28.03   Windows x86_64 >= 560.76
#   CUDA 12.8 GA  Linux x86_64 >= 570.26      Windows x86_64 >= 570.65
#   CUDA 13.0 GA  Linux x86_64 >= 580.65.06   Windows x86_64 "N/A" (for every 13.x: the Windows toolkit
#                 stopped bundling the display driver). Table 2 of the same notes (minor version compatibility) puts every
#                 CUDA 13.x at driver branch >= 580, and PyTorch's 2.12 release notes give >= 580.88 on
#                 Windows for its CUDA 13.0 wheels: that is the number used.
# These are the drivers that report the CUDA version as supported (nvidia-smi's "CUDA Version"); minor
# version compatibility lets some CUDA 12.x programs run on drivers >= 525, with limits, which is not
# relied on here.
# Compute capabilities with kernels in each build: PyTorch's CUDA support matrix (RELEASE.md, and the
# release RFCs pytorch/pytorch#172352, #190355): 12.6 Maxwell(5.0) .. Hopper(9.0); 12.8 and 13.0 Turing(7.5)
# .. Blackwell(10.0, 12.0). PyTorch announced no more 12.8 wheels from 2.12 (pytorch/pytorch#178665): if
# the pinned torch has none, pip says "no matching distribution" and the line after it says what to try.


@dataclass(frozen=True)
class Build:
    name: str
    cuda: str
    linux_driver: str  # the minimum driver, as NVIDIA writes it
    windows_driver: str
    caps: tuple  # (lowest, highest) compute capability with kernels, as (major, minor) pairs

    def min_driver(self, platform: str) -> str:
        return self.windows_driver if platform == "windows" else self.linux_driver


def _v(text: str) -> tuple:
    return tuple(int(p) for p in text.split("."))


CUDA_BUILDS = (  # oldest first
    Build("cu126", "12.6", "560.28.03", "560.76", ((5, 0), (9, 0))),
    Build("cu128", "12.8", "570.26", "570.65", ((7, 5), (12, 0))),
    Build("cu130", "13.0", "580.65.06", "580.88", ((7, 5), (12, 0))),
)
BUILD_NAMES = tuple(b.name for b in CUDA_BUILDS) + ("cpu",)


class Refusal(Exception):
    """One line for the user; exit status 2, nothing done."""


@dataclass(frozen=True)
class Gpu:
    name: str
    driver: str
    cap: tuple[int, int] | None  # None: this nvidia-smi has no compute_cap field


def cap_str(cap: tuple[int, int] | None) -> str:
    return "unknown" if cap is None else f"{cap[0]}.{cap[1]}"


def parse_cap(text: str) -> tuple[int, int] | None:
    m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def guess_cap(name: str) -> tuple[int, int] | None:
    """An old nvidia-smi cannot report compute_cap; the cards this project is for, by name."""
    if re.search(r"RTX\s*(PRO\s*)?50\d0|RTX PRO \d000 Blackwell", name, re.I):
        return (12, 0)
    if re.search(r"RTX\s*40\d0", name, re.I):
        return (8, 9)
    return None


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """Lines of `NAME, DRIVER[, CAP]` → GPUs (a GPU's name never has a comma; lines without one are skipped)."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2 or not re.fullmatch(r"\d+(\.\d+)+", parts[1]):
            continue
        cap = parse_cap(parts[2]) if len(parts) > 2 else None
        gpus.append(Gpu(parts[0], parts[1], cap or guess_cap(parts[0])))
    return gpus


def read_nvidia_smi() -> tuple[list[Gpu], str]:
    """The GPUs nvidia-smi lists, and why the list is empty when it is."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return [], "nvidia-smi not found"
    for fields in ("name,driver_version,compute_cap", "name,driver_version"):  # older drivers lack compute_cap
        try:
            p = subprocess.run([exe, f"--query-gpu={fields}", "--format=csv,noheader"], capture_output=True,
                               text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            return [], f"nvidia-smi failed: {e}"
        if p.returncode == 0:
            gpus = parse_nvidia_smi(p.stdout)
            return gpus, "" if gpus else "nvidia-smi lists no GPU"
    last = (p.stderr or p.stdout).strip().splitlines()
    return [], f"nvidia-smi failed (exit {p.returncode}): {last[-1] if last else 'no message'}"


def build_by_name(name: str) -> Build:
    return next(b for b in CUDA_BUILDS if b.name == name)


def builds_for_cap(cap: tuple[int, int] | None) -> list[Build]:
    """The builds with kernels for `cap` (unknown: all; newer than every build knows: the newest, which
    carries PTX on Linux)."""
    if cap is None:
        return list(CUDA_BUILDS)
    if cap > max(b.caps[1] for b in CUDA_BUILDS):
        return [CUDA_BUILDS[-1]]
    return [b for b in CUDA_BUILDS if b.caps[0] <= cap <= b.caps[1]]


def choose_build(gpus: list[Gpu], why_none: str, platform: str) -> tuple[str, str]:
    """(build, one line saying why) for --cuda auto; raises Refusal when the driver is too old for the card."""
    if not gpus:
        return "cpu", f"cuda auto: no NVIDIA GPU found ({why_none}) -> cpu: torch will run on the CPU only"
    driver = _v(gpus[0].driver)  # one driver serves every GPU of a machine
    by_driver = [b for b in CUDA_BUILDS if driver >= _v(b.min_driver(platform))]
    fit = [b for b in CUDA_BUILDS if all(b in builds_for_cap(g.cap) for g in gpus)]
    if not fit:
        caps = ", ".join(f"{g.name} {cap_str(g.cap)}" for g in gpus)
        raise Refusal(f"no CUDA build of torch has kernels for all of these GPUs ({caps}): pass --cuda cpu or "
                      f"the build of one of them ({', '.join(b.name for b in CUDA_BUILDS)})")
    gpu = max(gpus, key=lambda g: g.cap or (0, 0))  # the card that narrows the choice most
    what = f"{gpu.name} (compute capability {cap_str(gpu.cap)})"
    usable = [b for b in fit if b in by_driver]
    if not usable:
        need = fit[0]
        can = (f"supports builds up to {by_driver[-1].name} (CUDA {by_driver[-1].cuda})" if by_driver else
               f"is older than any build here needs (cu126: >= {CUDA_BUILDS[0].min_driver(platform)})")
        raise Refusal(f"{what} needs the {need.name} build or newer, but driver {gpu.driver} {can}: update the "
                      f"NVIDIA driver to >= {need.min_driver(platform)} ({DRIVER_DOWNLOAD}) and run again, "
                      f"or pass --cuda cpu")
    best = usable[-1]
    return best.name, (f"cuda auto: {what}, driver {gpu.driver} -> {best.name} (CUDA {best.cuda}, the newest build "
                       f"this driver supports on {platform.capitalize()}: >= {best.min_driver(platform)})")


def warnings_for_explicit(build: str, gpus: list[Gpu], platform: str) -> list[str]:
    """An explicit --cuda that will not use the card found: said, not refused (you chose it)."""
    if build == "cpu" or not gpus:
        return []
    b, out = build_by_name(build), []
    if _v(gpus[0].driver) < _v(b.min_driver(platform)):
        out.append(f"warning: {build} needs driver >= {b.min_driver(platform)} on {platform.capitalize()}, this one "
                   f"is {gpus[0].driver}: torch will not see the GPU until the driver is updated")
    for g in gpus:
        if b not in builds_for_cap(g.cap):
            out.append(f"warning: {build} has no kernels for {g.name} (compute capability {cap_str(g.cap)}); "
                       f"--cuda auto picks a build that has")
    return out


def read_requirements(path: str) -> tuple[str, str, list[str]]:
    """(torch version, torchvision version, every other requirement line) from requirements.txt."""
    pins, rest = {}, []
    with open(path, encoding="utf-8") as f:
        for raw in f:
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            if line.startswith("-"):
                raise Refusal(f"{path}: '{line}': this script reads plain requirement lines only")
            m = re.fullmatch(r"(torch|torchvision)\s*==\s*([\w.]+)", line, re.I)
            if m:
                pins[m.group(1).lower()] = m.group(2)
            elif re.match(r"(torch|torchvision)\b(?![-_.\w])", line, re.I):
                raise Refusal(f"{path}: '{line}': torch and torchvision must be pinned with == (the build is chosen here)")
            else:
                rest.append(line)
    missing = [n for n in ("torch", "torchvision") if n not in pins]
    if missing:
        raise Refusal(f"{path} pins no {' and no '.join(missing)} (torch==X and torchvision==Y expected)")
    return pins["torch"], pins["torchvision"], rest


def read_plain_requirements(path: str) -> list[str]:
    """The requirement lines of a file of plain pins (requirements-nodeps.txt); [] when it does not exist."""
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        lines = [raw.split("#", 1)[0].strip() for raw in f]
    for line in lines:
        if line.startswith("-"):
            raise Refusal(f"{path}: '{line}': this script reads plain requirement lines only")
    return [line for line in lines if line]


def host_platform() -> str:
    if sys.platform.startswith("win"):
        return "windows"
    if sys.platform.startswith("linux"):
        return "linux"
    raise Refusal(f"this script knows Linux and Windows, not {sys.platform}: use `make setup`")


def render(argv: list[str], platform: str) -> str:
    """A command line exactly as it runs: Windows' CreateProcess quoting, or a POSIX shell's."""
    return subprocess.list2cmdline(argv) if platform == "windows" else shlex.join(argv)


@dataclass
class Plan:
    platform: str
    build: str
    steps: list[list[str]]
    notes: list[str]
    torch_step: int
    python: str  # the venv's python  # index in steps of the torch install, for its failure line


def venv_python(venv: str, platform: str) -> str:
    return ntpath.join(venv, "Scripts", "python.exe") if platform == "windows" else posixpath.join(venv, "bin", "python")


def make_plan(build: str, platform: str, venv: str, gpu_found: bool, requirements: str,
              sysdeps: bool = True) -> Plan:
    torch_v, vision_v, rest = read_requirements(requirements)
    py = venv_python(venv, platform)
    join = ntpath.join if platform == "windows" else posixpath.join
    steps: list[list[str]] = []
    if not os.path.exists(os.path.join(REPO, py)):
        maker = sys.executable if platform == host_platform_or_none() else "python"
        steps.append([maker, "-m", "venv", venv])
    steps.append([py, "-m", "pip", "install", "--upgrade", "pip", "setuptools"])
    torch_step = len(steps)
    steps.append([py, "-m", "pip", "install", "--no-compile", f"torch=={torch_v}+{build}",
                  f"torchvision=={vision_v}+{build}", "--index-url", TORCH_INDEX + build])
    if rest:
        steps.append([py, "-m", "pip", "install", "--no-compile", *rest])
    nodeps = read_plain_requirements(os.path.join(os.path.dirname(requirements), "requirements-nodeps.txt"))
    if nodeps:
        steps.append([py, "-m", "pip", "install", "--no-compile", "--no-deps", *nodeps])
    steps.append([py, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-e", "."])
    notes = []
    if platform == "linux":
        if sysdeps:
            steps.append(["bash", join("shell", "install_sysdeps.sh")])
    else:
        notes.append(WINDOWS_SYSDEPS_NOTE)
    verify = [py, join(*SCRIPT_REL), "--verify", build]
    steps.append(verify + (["--gpu-expected"] if gpu_found and build != "cpu" else []))
    return Plan(platform, build, steps, notes, torch_step, py)


def host_platform_or_none() -> str | None:
    try:
        return host_platform()
    except Refusal:
        return None


WINDOWS_SYSDEPS_NOTE = (
    "espeak-ng and sox are not installed on Windows: the VITS, voice-cloning and vocoder demos make their Uzbek "
    "speech with espeak-ng (and `phoneme_type: espeak` configs phonemize with it; tests that need it skip): install "
    "the .msi from https://github.com/espeak-ng/espeak-ng/releases and have `espeak-ng` on PATH; sox is called by "
    "no code here (Linux's make setup installs it): https://sourceforge.net/projects/sox/ if you want it")


def run_steps(plan: Plan) -> int:
    """The real path: runs every step from the repository root, stopping at the first failure."""
    if os.environ.get(DRY_RUN_ONLY_ENV):
        raise Refusal(f"{DRY_RUN_ONLY_ENV} is set: refusing to run anything (use --dry-run)")
    os.chdir(REPO)
    for i, argv in enumerate(plan.steps):
        print(f"+ {render(argv, plan.platform)}", flush=True)
        rc = subprocess.run(argv).returncode
        if rc != 0:
            if i == plan.torch_step:
                url = argv[-1]
                print(f"error: pip could not install {argv[5]} from {url} (exit {rc}; pip's messages are above). If "
                      f"it found no matching distribution, PyTorch publishes no such wheel for Python "
                      f"{sys.version_info[0]}.{sys.version_info[1]} or this build: see {url}/torch/ and try another "
                      f"--cuda ({', '.join(BUILD_NAMES)})", file=sys.stderr)
            else:
                print(f"error: this step failed (exit {rc}): {render(argv, plan.platform)}", file=sys.stderr)
            return 1
    for note in plan.notes:
        if "espeak-ng" in note and shutil.which("espeak-ng"):
            continue
        print(f"note: {note}")
    print(f"setup done: {plan.python} has torch {plan.build}")
    return 0


def verify(build: str, gpu_expected: bool) -> int:
    """Run by the venv's python after the install: torch is the chosen build and, for a CUDA build where a
    GPU was found, runs a kernel on it. One line either way."""
    try:
        import torch
    except ImportError as e:
        print(f"error: torch does not import: {e}", file=sys.stderr)
        return 1
    try:
        torch_v = read_requirements(os.path.join(REPO, "requirements.txt"))[0]
    except (OSError, Refusal) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    want = f"{torch_v}+{build}"
    if torch.__version__ != want:
        print(f"error: torch {torch.__version__} is installed, not {want}: something replaced it (pip install "
              f"without --index-url?); run the setup again", file=sys.stderr)
        return 1
    if build == "cpu":
        print(f"ok: torch {torch.__version__} (CPU)")
        return 0
    if not torch.cuda.is_available():
        line = f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device"
        if gpu_expected:
            print(f"error: {line}, though nvidia-smi lists one: check the driver (nvidia-smi) and "
                  f"CUDA_VISIBLE_DEVICES", file=sys.stderr)
            return 1
        print(f"warning: {line} (none was found at setup)")
        return 0
    name, cap = torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0)
    try:
        (torch.ones(8, device="cuda") * 2).sum().item()
    except RuntimeError as e:
        print(f"error: torch {torch.__version__} cannot run on {name} (compute capability {cap[0]}.{cap[1]}; "
              f"kernels for {' '.join(torch.cuda.get_arch_list())}): {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    print(f"ok: torch {torch.__version__} (CUDA {torch.version.cuda}) runs on {name} "
          f"(compute capability {cap[0]}.{cap[1]})")
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="See the top of shell/setup_env.py.")
    p.add_argument("--cuda", choices=("auto",) + BUILD_NAMES, default="auto",
                   help="the PyTorch build: auto (from nvidia-smi), a CUDA build, or cpu (default auto)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, one per line, and run nothing")
    p.add_argument("--platform", choices=("auto", "linux", "windows"), default="auto",
                   help="whose commands (auto: this machine's; another only with --dry-run)")
    p.add_argument("--venv", default=".venv", help="the virtualenv, relative to the repository root (default .venv)")
    p.add_argument("--no-sysdeps", action="store_true", help="Linux: skip shell/install_sysdeps.sh (espeak-ng, sox)")
    hooks = p.add_argument_group("test hooks (only with --dry-run): replace the nvidia-smi read")
    hooks.add_argument("--gpu", help='the GPU name, e.g. "NVIDIA GeForce RTX 5090"; "none": no GPU')
    hooks.add_argument("--driver", help="the driver version, e.g. 566.36")
    hooks.add_argument("--compute-cap", help="the compute capability, e.g. 12.0 (default: from the name)")
    p.add_argument("--verify", choices=BUILD_NAMES, help=argparse.SUPPRESS)  # step 7, run by the venv's python
    p.add_argument("--gpu-expected", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def gpus_from_hooks(args: argparse.Namespace) -> tuple[list[Gpu], str] | None:
    if args.gpu is None and args.driver is None and args.compute_cap is None:
        return None
    if not args.dry_run:
        raise Refusal("--gpu/--driver/--compute-cap are test hooks: only with --dry-run")
    if args.gpu is not None and args.gpu.lower() == "none":
        return [], "--gpu none"
    if not args.gpu or not args.driver:
        raise Refusal("the test hooks need --gpu NAME and --driver VERSION together (or --gpu none)")
    if not re.fullmatch(r"\d+(\.\d+)+", args.driver):
        raise Refusal(f"--driver {args.driver!r}: write the version nvidia-smi shows, e.g. 566.36")
    cap = parse_cap(args.compute_cap) if args.compute_cap else guess_cap(args.gpu)
    if args.compute_cap and cap is None:
        raise Refusal(f"--compute-cap {args.compute_cap!r}: write it as X.Y, e.g. 12.0")
    return [Gpu(args.gpu, args.driver, cap)], ""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.verify:
        return verify(args.verify, args.gpu_expected)
    try:
        platform = host_platform() if args.platform == "auto" else args.platform
        if not args.dry_run and platform != host_platform():
            raise Refusal(f"--platform {platform} on {host_platform()}: only with --dry-run")
        if platform == host_platform_or_none() and sys.version_info < MIN_PYTHON:
            raise Refusal(f"Python {MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer is needed, this is "
                          f"{sys.version.split()[0]} ({sys.executable}): run it with py -3.11 or python3.11")
        hooked = gpus_from_hooks(args)
        gpus, why_none = hooked if hooked is not None else read_nvidia_smi()
        if args.cuda == "auto":
            build, line = choose_build(gpus, why_none, platform)
            print(line, file=sys.stderr)
        else:
            build = args.cuda
            for w in warnings_for_explicit(build, gpus, platform):
                print(w, file=sys.stderr)
        plan = make_plan(build, platform, args.venv, bool(gpus), os.path.join(REPO, "requirements.txt"),
                         sysdeps=not args.no_sysdeps)
        if args.dry_run:
            for argv_ in plan.steps:
                print(render(argv_, platform))
            for note in plan.notes:
                print(f"note: {note}", file=sys.stderr)
            return 0
        return run_steps(plan)
    except Refusal as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
