"""docs/windows.md (the README's "Windows" section in full) says what the Makefile and the .bat files do: the demo's jobs are make demo's,
the test commands are make test's, and the launcher's configs are the ones the .bat files run."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def windows_section() -> str:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert re.search(r"^## Windows\n.*\(docs/windows\.md\)", readme, re.S | re.M), "README's Windows section links docs/windows.md"
    return (REPO / "docs" / "windows.md").read_text(encoding="utf-8")


def demo_jobs_from_makefile() -> list[str]:
    """make demo's --job arguments, each make target replaced by the python command its recipe runs."""
    makefile = (REPO / "Makefile").read_text()
    includes = re.search(r"^-include (.+)$", makefile, re.M).group(1).split()
    jobs = []
    for mk in includes:
        text = (REPO / mk).read_text()
        for name, target in re.findall(r"^DEMO_JOBS \+= --job '([^=]+)=\$\(MAKE\) --no-print-directory (\S+)'", text, re.M):
            recipe = re.search(rf"^{re.escape(target)}: setup\n\t(.+)$", text, re.M).group(1)
            words = [w for w in recipe.split() if not w.startswith("$(")]  # $(DEMO_ENV) $(PY) $(DEMO_ARGS)
            assert "$(PY)" in recipe and words[0].endswith(".py"), recipe
            jobs.append(f"{name}=.venv\\Scripts\\python " + " ".join([words[0].replace("/", "\\"), *words[1:]]))
    return jobs


def test_the_demo_command_runs_make_demos_jobs():
    section = windows_section()
    makefile = (REPO / "Makefile").read_text()
    slots = re.search(r"^DEMO_SLOTS \?= (\d+)", makefile, re.M).group(1)
    assert "$(PY) -m common.demo --slots $(DEMO_SLOTS) --log_dir runs/demo_logs $(DEMO_JOBS)" in makefile
    block = re.search(r"```bat\n(\.venv\\Scripts\\python -m common\.demo .*?)```", section, re.S).group(1)
    assert block.startswith(rf".venv\Scripts\python -m common.demo --slots {slots} --log_dir runs\demo_logs ^")
    assert re.findall(r'--job "([^"]+)"', block) == demo_jobs_from_makefile()


def test_the_test_commands_are_make_tests():
    makefile = (REPO / "Makefile").read_text()
    assert "$(PY) -m pip install -q --no-compile -r requirements-test.txt" in makefile
    assert re.search(r"^test: setup \$\(TESTDEPS\)\n\t\$\(PY\) -m pytest tests -n auto$", makefile, re.M)
    section = windows_section()
    assert ".venv\\Scripts\\python -m pip install -r requirements-test.txt\n.venv\\Scripts\\python -m pytest tests" in section


def test_the_launcher_paragraph_names_the_configs_the_bat_files_run():
    section = windows_section()
    for trainer, script in (("vocoder", "vocoder\\train.py"), ("tts", "tts\\train.py"), ("vae", "vae\\train_vae.py")):
        bat = (REPO / trainer / "train_rtx5090.bat").read_text()
        config = re.search(r'set "CONFIG=%HERE%\\([^"]+)"', bat).group(1)
        assert script in bat and script in section
        assert config in section, (trainer, config)
        assert ("PYTORCH_CUDA_ALLOC_CONF" in bat) == (trainer in ("vocoder", "vae"))
    assert "shell\\train_rtx5090.bat {vocoder|tts|vae}" in section
    assert "setup_windows.bat" in section and (REPO / "setup_windows.bat").is_file()
