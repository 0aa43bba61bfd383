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
# the trainer protocol (common.loop.Trainer): what `common.loop.fit` and `RunCheckpoints` call
PUBLIC_METHODS = {"fit", "batches", "train_step", "validate", "log", "state", "load_state"}
# the same things under the same names: the parts the loop and the checkpointer read, the writer, the printer
SHARED_ATTRIBUTES = {"cfg", "info", "device", "precision", "printer", "writer", "checkpoints", "step", "epoch",
                     "batch_in_epoch", "models", "optimizers", "schedulers", "guards", "divergence", "trackers"}


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
    assert not assigned & {"logger", "say", "ckpt", "counters", "step_count", "g_train", "d_train", "net", "manager",
                           "last_good", "guard", "g_guard", "d_guard", "log"}


@pytest.mark.parametrize("cls", TRAINERS, ids=lambda c: c.__name__)
def test_every_attribute_is_first_set_in_init(cls):
    methods = assigned_attributes(cls)
    # load_state runs inside __init__ too, through `self.checkpoints.resume`
    in_init = set().union(*(methods.get(m, set()) for m in {"__init__", "load_state"} | called_from_init(cls)))
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
def calls_in(func) -> set[str]:
    """The dotted names a function calls (`loop.fit`, `stop.check`, `check_run_ended_good`, ...)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    return {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}


@pytest.mark.parametrize("cls", TRAINERS, ids=lambda c: c.__name__)
def test_the_trainer_runs_through_the_one_loop_and_checkpointer(cls):
    names = set().union(*(calls_in(f) for f in vars(cls).values() if inspect.isfunction(f)))
    assert "loop.fit" in names, f"{cls.__name__}.fit does not run common.loop.fit"
    # the loop's and the checkpointer's own work is not done again by hand
    assert not names & {"stop.check", "check_run_ended_good", "loop.run", "make_state", "restore_state",
                        "RunStop", "Progress"}, sorted(names)
    call = next(n for n in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(cls.fit))))
                if isinstance(n, ast.Call) and ast.unparse(n.func) == "loop.fit")
    assert [ast.unparse(a) for a in call.args][0] == "self" and ast.unparse(call.args[3]) == "self.checkpoints"


# ----------------------------------------------------------------------------------- behaviour
@pytest.mark.parametrize("trainer", ["vocoder", "vits", "clone", "vae"])
def test_each_trainer_stops_on_max_minutes_with_the_shared_shapes(trainer, tmp_path, monkeypatch):
    """Through its command line, with `max_minutes` so small that the first step's check ends the run: the run
    stops on its time limit (validated, saved, exit 0), `fit` returns a `RunResult`, `validate` a dict,
    `state` a dict, and every optimizer object has a guard of its own."""
    from common import loop
    from tests import test_trainer_digest as runs

    seen = {}
    real_fit = loop.fit

    def spy(t, *args, **kwargs):
        seen["trainer"], seen["result"] = t, real_fit(t, *args, **kwargs)
        return seen["result"]

    monkeypatch.setattr(loop, "fit", spy)
    monkeypatch.chdir(tmp_path)
    runs.RUNS[trainer](tmp_path, "max_minutes=1e-9")
    t, result = seen["trainer"], seen["result"]
    assert isinstance(result, loop.RunResult) and result.stopped == "time limit" and result.step == 1
    assert isinstance(t.validate(), dict) and isinstance(t.state(), dict)
    assert set(t.guards) == set(t.optimizers) and len({id(g) for g in t.guards.values()}) == len(t.optimizers)
    assert len({id(o) for o in t.optimizers.values()}) == len(t.optimizers)
