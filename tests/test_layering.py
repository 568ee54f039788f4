"""The folders of ``mempo`` are its layers: each imports only folders below it (the README's layout block), and
inside a folder the modules import each other without a circle.

Every ``import`` of a mempo module counts, function-local ones included (those used to hide imports that ran back
up the layers, and circles inside a folder). A module belongs to the folder it sits in; a module at the package root
(beside ``__init__.py``) has no floor and fails. A new edge between folders must be added to ALLOWED on purpose, with
the reason in review; an edge to a folder above is refused even then (``test_allowed_edges_point_down``).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The floors, bottom to top: mempo/<folder>/.
LAYERS: tuple[str, ...] = (
    "core",  # plain types and helpers every layer uses: Task, the turn format, padding, atomic writes, console
    "losses",  # pure tensor math (torch only; tests/losses/test_purity.py)
    "lm",  # model loading, token log-probs, answer scoring: model utilities, no training
    "rollout",  # samplers, the agent loop, prompts, masks, the search environment, rewards
    "data",  # the synthetic world and its oracle teacher, QA files, the composer, the DataModule
    "capacity",  # whether a run fits a GPU's memory: the planner behind experiments/plan.py
    "eval",  # agent evaluation: grids, statistics, reports, figures
    "models",  # the LightningModules (MemPOModule, SFT) and their callbacks
    "stages",  # the config and builders, and what experiments/run.py runs
)
# Folder -> the folders it may import (besides itself): the edges that exist, each pointing down.
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "losses": set(),
    "lm": {"core", "losses"},
    "rollout": {"core", "lm"},
    "data": {"core"},
    "capacity": {"core", "lm", "rollout", "data"},
    "eval": {"core", "losses", "lm", "rollout", "data"},  # losses: the KL estimators of eval.kl_reference
    "models": {"core", "losses", "lm", "rollout", "eval"},
    "stages": {"core", "losses", "lm", "rollout", "data", "capacity", "eval", "models"},
}


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def is_module(module: str) -> bool:
    """Whether ``mempo.x.y`` is a module file or a package folder of this repository."""
    path = ROOT.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def folder_of(module: str) -> str:
    """``mempo.<folder>.x`` -> ``<folder>``; the package itself (``mempo``) is the empty root, below every floor."""
    parts = module.split(".")
    if parts == ["mempo"]:
        return "core"
    if (ROOT / "mempo" / parts[1]).is_dir() and parts[1] in LAYERS:
        return parts[1]
    raise AssertionError(f"{module} is in no layer folder of mempo/ ({', '.join(LAYERS)}): move it into one")


def mempo_imports(path: Path) -> set[str]:
    """Every mempo module ``path`` imports, at any depth of the file (``from mempo.x import y`` -> mempo.x)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "mempo"}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "mempo":
                # ``from mempo import core`` names the folder in the alias, not in the module; likewise
                # ``from mempo.stages import demo`` imports the module mempo.stages.demo
                subs = {f"{node.module}.{a.name}" for a in node.names if is_module(f"{node.module}.{a.name}")}
                found |= subs if node.module == "mempo" or subs else {node.module}
        elif isinstance(node, ast.ImportFrom) and node.level > 0:  # relative: resolve against the package
            package = module_name(path).split(".")
            package = package if path.name == "__init__.py" else package[:-1]
            base = package[: len(package) - node.level + 1]
            found.add(".".join([*base, node.module] if node.module else base))
    return found


MODULES = sorted((ROOT / "mempo").rglob("*.py"))


def test_every_folder_is_a_layer_and_every_module_in_a_folder():
    folders = {p.name for p in (ROOT / "mempo").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(LAYERS) == set(ALLOWED)
    assert [folder_of(module_name(p)) for p in MODULES]


@pytest.mark.parametrize("path", MODULES, ids=module_name)
def test_imports_run_downward_only(path):
    src = folder_of(module_name(path))
    bad = sorted(
        f"{module_name(path)} ({src}/) imports {m} ({folder_of(m)}/)"
        for m in mempo_imports(path)
        if folder_of(m) != src and folder_of(m) not in ALLOWED[src]
    )
    assert not bad, "imports that are not allowed edges of tests/test_layering.py:\n" + "\n".join(bad)


def test_allowed_edges_point_down():
    """No two folders may import each other, and no folder imports one listed above it."""
    for layer, below in ALLOWED.items():
        assert all(LAYERS.index(b) < LAYERS.index(layer) for b in below), layer


def test_the_check_sees_function_local_imports(tmp_path):
    """The bug this guards against: an upward import hidden inside a function body (rollout -> models)."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from mempo.models.module import MemPOModule\n    return MemPOModule\n")
    assert mempo_imports(probe) == {"mempo.models.module"}
    assert folder_of("mempo.models.module") == "models" and "models" not in ALLOWED["rollout"]


def test_the_check_sees_folder_imports(tmp_path):
    """``from mempo import models`` imports the models folder, though the module it names is ``mempo``."""
    probe = tmp_path / "probe.py"
    probe.write_text("from mempo import models\n")
    assert mempo_imports(probe) == {"mempo.models"}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle of ``graph`` (module -> modules it imports), each once, as the modules along it: the
    strongly connected components of more than one module, and modules that import themselves."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm; the graphs here are a few dozen modules deep at most
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def folder_graph(paths: list[Path]) -> dict[str, dict[str, set[str]]]:
    """Per folder, its modules -> the modules of the same folder they import (function-local imports included)."""
    graphs: dict[str, dict[str, set[str]]] = {}
    for path in paths:
        name = module_name(path)
        folder = folder_of(name)
        inside = {m for m in mempo_imports(path) if m != name and m.startswith("mempo.") and folder_of(m) == folder}
        graphs.setdefault(folder, {})[name] = inside - {f"mempo.{folder}"} if name != f"mempo.{folder}" else inside
    return graphs


@pytest.mark.parametrize("folder", LAYERS)
def test_no_import_circle_inside_a_folder(folder):
    """Two modules of one folder that import each other (at any depth of either file) are one module split in two,
    or a helper in the wrong file: move what both need into a module of its own. A module importing its own
    folder's ``__init__`` is left out: the package registers its modules by importing them (mempo.stages)."""
    found = circles(folder_graph(MODULES).get(folder, {}))
    assert not found, f"import circles inside mempo/{folder}/: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_circle_check_sees_a_function_local_circle(tmp_path, monkeypatch):
    """The bug this guards against: ``a`` imports ``b`` at the top and ``b`` imports ``a`` inside a function (the
    form the eval/report <-> eval/seeds circle had), which imports cleanly and so is seen only by reading."""
    pkg = tmp_path / "mempo" / "eval"
    pkg.mkdir(parents=True)
    (tmp_path / "mempo" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from mempo.eval.b import g\n\n\ndef f():\n    return g()\n")
    (pkg / "b.py").write_text("def g():\n    from mempo.eval.a import f\n\n    return f\n")
    (pkg / "c.py").write_text("from mempo.eval import a\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    graph = folder_graph(sorted(pkg.glob("*.py")))["eval"]
    assert graph["mempo.eval.c"] == {"mempo.eval.a"}  # ``from package import module`` is an edge to the module
    assert circles(graph) == [["mempo.eval.a", "mempo.eval.b"]]
    assert circles({"x": {"y"}, "y": {"z"}, "z": set()}) == []
