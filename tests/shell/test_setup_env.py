"""shell/setup_env.py (setup_windows.bat, shell/setup.sh): the commands its dry run prints per platform and
build, --cuda auto's choice from the GPU and driver, the one-line refusal, and that tests never take the
real path (it would make a venv and download torch)."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "shell" / "setup_env.py"
BUILDS = ("cu126", "cu128", "cu130", "cpu")
WIN_PY = r".venv\Scripts\python.exe"

_spec = importlib.util.spec_from_file_location("setup_env", SCRIPT)
setup_env = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("setup_env", setup_env)  # dataclasses look their module up there
_spec.loader.exec_module(setup_env)


def pins() -> tuple[str, str, list[str]]:
    """torch's and torchvision's versions and the other pins, read here as a person would."""
    lines = [ln.split("#")[0].strip() for ln in (REPO / "requirements.txt").read_text().splitlines()]
    lines = [ln for ln in lines if ln]
    torch = next(ln.split("==")[1] for ln in lines if ln.startswith("torch=="))
    vision = next(ln.split("==")[1] for ln in lines if ln.startswith("torchvision=="))
    return torch, vision, [ln for ln in lines if not re.match(r"torch(vision)?==", ln)]


def nodeps() -> list[str]:
    """requirements-nodeps.txt's pins (installed with --no-deps), read the same way."""
    lines = [ln.split("#")[0].strip() for ln in (REPO / "requirements-nodeps.txt").read_text().splitlines()]
    return [ln for ln in lines if ln]


@pytest.fixture(autouse=True)
def never_the_real_path(monkeypatch):
    """Every test here: the real path (venv, pip) raises instead of running, in this process and in any
    child process (SETUP_ENV_DRY_RUN_ONLY)."""

    def tripwire(plan):
        raise AssertionError(f"a test reached the real install path: {plan.steps[0]}")

    monkeypatch.setattr(setup_env, "run_steps", tripwire)
    monkeypatch.setenv(setup_env.DRY_RUN_ONLY_ENV, "1")


def dry(capsys, *args: str) -> tuple[int, list[str], list[str]]:
    rc = setup_env.main(["--dry-run", *args])
    out, err = capsys.readouterr()
    return rc, out.splitlines(), err.splitlines()


@pytest.mark.parametrize("build", BUILDS)
def test_windows_dry_run_installs_torch_from_pytorchs_index_for_the_build(capsys, build):
    torch, vision, rest = pins()
    rc, out, _ = dry(capsys, "--platform", "windows", "--cuda", build)
    assert rc == 0
    assert out[0] == "python -m venv .venv"  # no .venv\Scripts\python.exe on this machine
    assert out[1] == f"{WIN_PY} -m pip install --upgrade pip setuptools"
    assert out[2] == (f"{WIN_PY} -m pip install --no-compile torch=={torch}+{build} torchvision=={vision}+{build} "
                      f"--index-url https://download.pytorch.org/whl/{build}")
    assert out[3] == f"{WIN_PY} -m pip install --no-compile " + " ".join(rest)  # the rest, without the torch lines
    assert out[4] == f"{WIN_PY} -m pip install --no-compile --no-deps " + " ".join(nodeps())
    assert out[5] == f"{WIN_PY} -m pip install --no-deps --no-build-isolation -e ."
    assert out[6] == rf"{WIN_PY} shell\setup_env.py --verify {build}"
    assert len(out) == 7  # no apt packages on Windows
    assert not any("/" in line.split(" ")[0] for line in out)


@pytest.mark.parametrize("build", BUILDS)
def test_linux_dry_run_installs_torch_from_pytorchs_index_and_the_debian_packages(capsys, tmp_path, build):
    torch, vision, rest = pins()
    venv = str(tmp_path / "venv")
    rc, out, _ = dry(capsys, "--platform", "linux", "--cuda", build, "--venv", venv)
    assert rc == 0
    py = f"{venv}/bin/python"
    assert out == [
        f"{sys.executable} -m venv {venv}",
        f"{py} -m pip install --upgrade pip setuptools",
        f"{py} -m pip install --no-compile torch=={torch}+{build} torchvision=={vision}+{build} "
        f"--index-url https://download.pytorch.org/whl/{build}",
        f"{py} -m pip install --no-compile " + " ".join(rest),
        f"{py} -m pip install --no-compile --no-deps " + " ".join(nodeps()),
        f"{py} -m pip install --no-deps --no-build-isolation -e .",
        "bash shell/install_sysdeps.sh",
        f"{py} shell/setup_env.py --verify {build}",
    ]


def test_the_torch_versions_come_from_requirements_txt(tmp_path, monkeypatch):
    req = tmp_path / "requirements.txt"
    req.write_text("# comment\ntorch==9.8.7  # pinned\ntorchvision==6.5.4\nnumpy==1.0\n")
    plan = setup_env.make_plan("cu130", "windows", ".venv", False, str(req))
    assert "torch==9.8.7+cu130" in plan.steps[plan.torch_step] and "torchvision==6.5.4+cu130" in plan.steps[plan.torch_step]
    assert plan.steps[plan.torch_step + 1][-1] == "numpy==1.0"
    req.write_text("torch>=2\ntorchvision==6.5.4\n")
    with pytest.raises(setup_env.Refusal, match="pinned with =="):
        setup_env.make_plan("cu130", "windows", ".venv", False, str(req))


@pytest.mark.parametrize(("platform", "driver", "build"), [
    ("windows", "581.57", "cu130"),  # a new driver: the newest build
    ("linux", "580.65.06", "cu130"),
    ("windows", "572.16", "cu128"),  # CUDA 12.8's driver, not yet 13.0's
    ("windows", "566.36", "cu126"),
    ("linux", "560.35.03", "cu126"),
])
def test_auto_picks_the_newest_build_the_driver_supports_for_an_rtx_4090(capsys, platform, driver, build):
    rc, out, err = dry(capsys, "--platform", platform, "--gpu", "NVIDIA GeForce RTX 4090", "--driver", driver,
                       "--compute-cap", "8.9")
    assert rc == 0
    (torch_line,) = [line for line in out if "--index-url" in line]
    assert f"torch=={pins()[0]}+{build} " in torch_line and torch_line.endswith(f"/whl/{build}")
    assert f"-> {build}" in err[0] and driver in err[0]


@pytest.mark.parametrize(("platform", "driver", "need"), [("windows", "566.36", "570.65"), ("linux", "565.57.01", "570.26")])
def test_an_rtx_5090_on_a_cuda_12_6_driver_is_refused_in_one_line(capsys, platform, driver, need):
    rc, out, err = dry(capsys, "--platform", platform, "--gpu", "NVIDIA GeForce RTX 5090", "--driver", driver,
                       "--compute-cap", "12.0")
    assert rc == 2 and out == [] and len(err) == 1
    line = err[0]
    assert line.startswith("error: ") and "RTX 5090" in line and driver in line
    assert "cu128" in line and f"update the NVIDIA driver to >= {need}" in line


def test_the_5090s_compute_capability_is_known_from_its_name(capsys):
    rc, _, err = dry(capsys, "--platform", "windows", "--gpu", "NVIDIA GeForce RTX 5090", "--driver", "566.36")
    assert rc == 2 and "compute capability 12.0" in err[0]
    rc, out, err = dry(capsys, "--platform", "windows", "--gpu", "NVIDIA GeForce RTX 5090", "--driver", "572.16")
    assert rc == 0 and "-> cu128" in err[0]


def test_no_gpu_is_cpu_said_in_one_line(capsys, tmp_path, monkeypatch):
    rc, out, err = dry(capsys, "--platform", "windows", "--gpu", "none")
    assert rc == 0 and any("+cpu " in line and line.endswith("/whl/cpu") for line in out)
    assert err[0].startswith("cuda auto: no NVIDIA GPU found") and "-> cpu" in err[0]
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi at all: the real read
    rc, out, err = dry(capsys, "--platform", "linux")
    assert rc == 0 and "(nvidia-smi not found) -> cpu" in err[0] and any("+cpu " in line for line in out)


def fake_nvidia_smi(tmp_path: Path, body: str) -> None:
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(0o755)


@pytest.mark.skipif(os.name == "nt", reason="the fake nvidia-smi is a shell script")
def test_auto_reads_nvidia_smi(capsys, tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path, 'echo "NVIDIA GeForce RTX 5090, 575.57.08, 12.0"; echo "NVIDIA GeForce RTX 4090, 575.57.08, 8.9"')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    gpus, why = setup_env.read_nvidia_smi()
    assert [g.cap for g in gpus] == [(12, 0), (8, 9)] and why == ""
    rc, out, err = dry(capsys, "--platform", "linux")
    assert rc == 0 and "RTX 5090 (compute capability 12.0), driver 575.57.08 -> cu128" in err[0]
    assert out[-1].endswith("--verify cu128 --gpu-expected")  # a GPU was found: the check must see it


@pytest.mark.skipif(os.name == "nt", reason="the fake nvidia-smi is a shell script")
def test_an_nvidia_smi_without_compute_cap_falls_back_to_the_name(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path, 'case "$1" in *compute_cap*) echo \'Field "compute_cap" is not a valid field to query.\' >&2; '
                              'exit 2;; esac; echo "NVIDIA GeForce RTX 5080, 566.36"')
    monkeypatch.setenv("PATH", str(tmp_path))
    gpus, _ = setup_env.read_nvidia_smi()
    assert gpus == [setup_env.Gpu("NVIDIA GeForce RTX 5080", "566.36", (12, 0))]


@pytest.mark.skipif(os.name == "nt", reason="the fake nvidia-smi is a shell script")
def test_an_nvidia_smi_that_lists_no_gpu_is_cpu(capsys, tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path, 'echo "No devices were found" >&2; exit 6')
    monkeypatch.setenv("PATH", str(tmp_path))
    rc, _, err = dry(capsys, "--platform", "linux")
    assert rc == 0 and "nvidia-smi failed (exit 6): No devices were found" in err[0] and "-> cpu" in err[0]


def test_pre_turing_gpus_get_cu126_and_an_explicit_build_that_misses_the_card_is_warned_about(capsys):
    rc, _, err = dry(capsys, "--platform", "linux", "--gpu", "Tesla V100-SXM2-16GB", "--driver", "580.65.06",
                     "--compute-cap", "7.0")
    assert rc == 0 and "-> cu126" in err[0]
    rc, out, err = dry(capsys, "--platform", "windows", "--cuda", "cu126", "--gpu", "NVIDIA GeForce RTX 5090",
                       "--driver", "581.57")
    assert rc == 0 and any("+cu126 " in line for line in out)  # you chose it: said, not refused
    assert any(line.startswith("warning: cu126 has no kernels for NVIDIA GeForce RTX 5090") for line in err)


def test_the_real_path_is_never_run_by_tests(capsys, tmp_path):
    """Without --dry-run main() goes to run_steps, which the fixture replaced: nothing is made."""
    venv = tmp_path / "venv"
    with pytest.raises(AssertionError, match="reached the real install path"):
        setup_env.main(["--cuda", "cpu", "--venv", str(venv)])
    assert not venv.exists()


def test_a_child_process_refuses_the_real_path_when_told_to(tmp_path):
    """The script run as a command (how the launchers run it) under SETUP_ENV_DRY_RUN_ONLY: exit 2, nothing made."""
    venv = tmp_path / "venv"
    p = subprocess.run([sys.executable, str(SCRIPT), "--cuda", "cpu", "--venv", str(venv)], capture_output=True,
                       text=True, timeout=120, env={**os.environ, setup_env.DRY_RUN_ONLY_ENV: "1"})
    assert p.returncode == 2 and p.stdout == "" and "refusing to run anything" in p.stderr
    assert not venv.exists()


@pytest.mark.parametrize("args", [["--gpu", "NVIDIA GeForce RTX 4090", "--driver", "581.57"], ["--platform", "windows"]])
def test_test_hooks_and_another_platform_need_the_dry_run(capsys, args):
    if args[0] == "--platform" and os.name == "nt":
        args = ["--platform", "linux"]
    assert setup_env.main(["--cuda", "cpu", *args]) == 2
    assert "only with --dry-run" in capsys.readouterr().err


def test_windows_names_what_espeak_ng_is_for_and_where_to_get_it(capsys):
    rc, _, err = dry(capsys, "--platform", "windows", "--cuda", "cpu")
    (note,) = [line for line in err if line.startswith("note:")]
    assert "github.com/espeak-ng/espeak-ng/releases" in note and "sourceforge.net/projects/sox" in note


@pytest.mark.skipif(os.name == "nt", reason="bash launcher")
def test_the_linux_launcher_runs_the_script(tmp_path):
    p = subprocess.run(["bash", str(REPO / "shell" / "setup.sh"), "--dry-run", "--cuda", "cu128", "--platform", "windows"],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHON": sys.executable})
    assert p.returncode == 0, p.stderr
    assert "--index-url https://download.pytorch.org/whl/cu128" in p.stdout.splitlines()[2]


def test_setup_windows_bat_runs_the_script_with_every_argument():
    bat = (REPO / "setup_windows.bat").read_bytes()
    assert b"\r\n" in bat and bat.count(b"\n") == bat.count(b"\r\n")  # cmd.exe reads CRLF batch files reliably
    text = bat.decode()
    assert r'"%~dp0shell\setup_env.py" %*' in text and "exit /b %ERRORLEVEL%" in text
    assert "py -3.11" in text


class TestVerify:
    """Step 7, run by the venv's python: here with this checkout's torch."""

    def test_another_build_than_the_installed_one_fails(self, capsys):
        import torch

        other = "cpu" if not torch.__version__.endswith("+cpu") else "cu130"
        assert setup_env.main(["--verify", other]) == 1
        assert f"is installed, not {pins()[0]}+{other}" in capsys.readouterr().err

    def test_the_installed_build_passes_and_a_missing_gpu_fails_only_when_one_was_found(self, capsys):
        import torch

        build = torch.__version__.partition("+")[2]
        if build not in BUILDS or torch.__version__.partition("+")[0] != pins()[0]:
            pytest.skip(f"this torch ({torch.__version__}) is not one the setup installs")
        if torch.cuda.is_available() or build == "cpu":
            assert setup_env.main(["--verify", build]) == 0
            return
        assert setup_env.main(["--verify", build]) == 0
        assert "warning:" in capsys.readouterr().out
        assert setup_env.main(["--verify", build, "--gpu-expected"]) == 1
        assert "sees no CUDA device, though nvidia-smi lists one" in capsys.readouterr().err
