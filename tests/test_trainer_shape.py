"""The four trainers have one shape: the same public methods, the same names for the same
things, every attribute set in `__init__`, and no import cycle in the packages."""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import pytest

from tts.clone.train import CloneTrainer
from tts.vits.train import VitsTrainer
from vae.train_vae import VAETrainer
from vocoder.train import VocoderTrainer

REPO = Path(__file__).resolve().parents[1]
TRAINERS = [VocoderTrainer, VitsTrainer, CloneTrainer, VAETrainer]
PUBLIC_METHODS = {"fit", "train_step", "validate", "save", "restore"}
# the same things under the same names: TensorBoard writer, print function, counters, checkpoint manager
SHARED_ATTRIBUTES = {"cfg", "info", "device", "precision", "log", "writer", "manager", "last_good", "step", "epoch",
                     "batch_in_epoch"}


def public_methods(cls: type) -> set[str]:
    return {name for name, value in vars(cls).items() if not name.startswith("_") and inspect.isfunction(value)}


def assigned_attributes(cls: type) -> dict[str, set[str]]:
    """method name -> the `self.<name>` attributes it assigns (plain, tuple and chained assignments)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    out: dict[str, set[str]] = {}
    for node in tree.body[0].body:
        if not isinstance(node, ast.FunctionDef):
            continue
        names = out.setdefault(node.name, set())
        for sub in ast.walk(node):
            targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target] if isinstance(
                sub, (ast.AnnAssign, ast.AugAssign)) else []
            for t in targets:
                for elt in t.elts if isinstance(t, ast.Tuple) else [t]:
                    if isinstance(elt, ast.Attribute) and isinstance(elt.value, ast.Name) and elt.value.id == "self":
                        names.add(elt.attr)
    return out


def called_from_init(cls: type) -> set[str]:
    """The methods `__init__` calls on self (their attributes count as set in `__init__`)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    init = next(n for n in tree.body[0].body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    return {n.func.attr for n in ast.walk(init) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and isinstance(n.func.value, ast.Name) and n.func.value.id == "self"}


def test_the_four_trainers_expose_the_same_public_methods():
    for cls in TRAINERS:
        assert public_methods(cls) == PUBLIC_METHODS, cls.__name__


@pytest.mark.parametrize("cls", TRAINERS, ids=lambda c: c.__name__)
def test_the_same_things_have_the_same_names(cls):
    assigned = set().union(*assigned_attributes(cls).values())
    assert SHARED_ATTRIBUTES <= assigned, sorted(SHARED_ATTRIBUTES - assigned)
    # the old names of these things are gone
    assert not assigned & {"logger", "say", "ckpt", "counters", "step_count", "g_train", "d_train", "net"}


@pytest.mark.parametrize("cls", TRAINERS, ids=lambda c: c.__name__)
def test_every_attribute_is_first_set_in_init(cls):
    methods = assigned_attributes(cls)
    in_init = set().union(*(methods.get(m, set()) for m in {"__init__"} | called_from_init(cls)))
    late = {f"{m}: {a}" for m, attrs in methods.items() for a in attrs - in_init}
    assert not late, f"set outside __init__: {sorted(late)}"


# ----------------------------------------------------------------------------------- import graph
PACKAGES = ("common", "speech", "vocoder", "tts", "vae")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports anywhere in its file (top level, in functions, under
    TYPE_CHECKING alike: each is a dependency a reader has to follow)."""
    files = {module_name(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                deps |= {f"{node.module}.{a.name}" for a in node.names} | {node.module}
        graph[name] = {d for d in deps if d in files and d != name and d not in PACKAGES
                       and not (REPO / d.replace(".", "/")).is_dir()}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle_in_the_packages():
    graph = import_graph()
    assert graph["vae.train_vae"] and "common.stopping" in graph["vocoder.train"]  # the walk sees the imports
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


# ----------------------------------------------------------------------------------- the one loop
LOOPED = TRAINERS  # every trainer runs through common.loop


def calls_in(func) -> set[str]:
    """The dotted names a function calls (`loop.run`, `stop.check`, `check_run_ended_good`, ...)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    return {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}


@pytest.mark.parametrize("cls", LOOPED, ids=lambda c: c.__name__)
def test_the_trainer_runs_through_the_one_loop(cls):
    names = set().union(*(calls_in(f) for f in vars(cls).values() if inspect.isfunction(f)))
    assert "loop.run" in names, f"{cls.__name__}.fit does not run common.loop"
    # the loop's own work is not done again by hand
    assert not names & {"stop.check", "check_run_ended_good", "self._run_epoch"}, sorted(names)
    # every optimizer's guard reaches the loop, which refuses a missing one (next test)
    call = next(n for n in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(cls.fit))))
                if isinstance(n, ast.Call) and ast.unparse(n.func) == "loop.run")
    passed = {k.arg: ast.unparse(k.value) for k in call.keywords}
    assert passed["optimizers"] == "self.optimizers" and passed["guards"] == "self.guards", passed


def test_the_loop_refuses_a_trainer_that_skips_a_guard():
    from common import loop
    from common.log import Progress
    from common.stopping import RunStop
    from common.training import DivergenceGuard, NonFiniteGuard

    class Skipper:  # two optimizers, one guard: its critic's NaN streak would go unnoticed
        step = epoch = batch_in_epoch = 0
        optimizers = {"generator": object(), "discriminator": object()}
        guards = {"generator": NonFiniteGuard(3)}

        def train_step(self, batch):
            raise AssertionError("the loop must refuse before the first step")

    t = Skipper()
    common_args = dict(epoch_batches=lambda: [1, 2], optimizers=t.optimizers, log=lambda logs, bar: {})
    with pytest.raises(ValueError, match="discriminator"):
        loop.run(t, loop.Cadence(total_steps=2, log_every=1), RunStop(), Progress(2, enabled=False),
                 guards=t.guards, divergence=DivergenceGuard([], 3), **common_args)
    with pytest.raises(ValueError, match="divergence"):
        loop.run(t, loop.Cadence(total_steps=2, log_every=1), RunStop(), Progress(2, enabled=False),
                 guards={**t.guards, "discriminator": NonFiniteGuard(3)}, divergence=None, **common_args)
