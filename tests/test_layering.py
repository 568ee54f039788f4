"""The package's layers import downward only, like the purity of ``mempo.losses`` (tests/losses/test_purity.py).

Every ``import`` of a mempo module counts, function-local ones included (those used to hide imports that ran back
up the layers). A new module must be placed in a layer here; a new edge between layers must be added to ALLOWED
on purpose, with the reason in review.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Layer -> its modules (a trailing ".*" takes a package's every module). Listed bottom to top.
LAYERS: dict[str, tuple[str, ...]] = {
    "base": ("mempo", "mempo.base", "mempo.console", "mempo.padding", "mempo.data.tasks", "mempo.rollout.format"),
    "math": ("mempo.losses", "mempo.losses.*"),  # pure tensor math (torch only)
    "data": ("mempo.data", "mempo.data.*"),  # tasks, the synthetic world, the oracle teacher, the DataModule
    "model_utils": ("mempo.models", "mempo.models.loading", "mempo.models.logprobs", "mempo.models.scoring"),
    "rollout": ("mempo.rollout", "mempo.rollout.*"),  # samplers, environment, agent loop, rewards
    "eval": ("mempo.eval", "mempo.eval.*"),  # evaluation library: grids, statistics, reports, figures
    "training": ("mempo.models.module", "mempo.models.callbacks", "mempo.models.sft"),  # LightningModules, callbacks
    "config": ("mempo.config", "mempo.builders"),  # the config groups' schema, and objects built from a config
    "stages": ("mempo.stages", "mempo.stages.*"),  # what experiments/run.py runs
}
# Layer -> the layers it may import (besides itself).
ALLOWED: dict[str, set[str]] = {
    "base": set(),
    "math": set(),
    "data": {"base"},
    "model_utils": {"base", "math"},
    "rollout": {"base", "data", "model_utils"},
    "eval": {"base", "data", "model_utils", "rollout"},
    "training": {"base", "math", "data", "model_utils", "rollout", "eval"},
    "config": {"base", "math", "data", "model_utils", "rollout", "eval", "training"},
    "stages": {"base", "math", "data", "model_utils", "rollout", "eval", "training", "config"},
}


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def layer_of(module: str) -> str:
    """The layer that names ``module`` exactly, else the one whose longest ``pkg.*`` entry covers it."""
    best: tuple[int, str] | None = None
    for layer, entries in LAYERS.items():
        for entry in entries:
            if entry == module:
                return layer
            if entry.endswith(".*") and module.startswith(entry[:-1]) and (best is None or len(entry) > best[0]):
                best = (len(entry), layer)
    if best is None:
        raise AssertionError(f"{module} is in no layer of tests/test_layering.py: place it")
    return best[1]


def mempo_imports(path: Path) -> set[str]:
    """Every mempo module ``path`` imports, at any depth of the file (``from mempo.x import y`` -> mempo.x)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "mempo"}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "mempo":
                found.add(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level > 0:  # relative: resolve against the package
            package = module_name(path).split(".")
            package = package if path.name == "__init__.py" else package[:-1]
            base = package[: len(package) - node.level + 1]
            found.add(".".join([*base, node.module] if node.module else base))
    return found


MODULES = sorted((ROOT / "mempo").rglob("*.py"))


def test_every_module_has_a_layer():
    assert [layer_of(module_name(p)) for p in MODULES]


@pytest.mark.parametrize("path", MODULES, ids=module_name)
def test_imports_run_downward_only(path):
    src = layer_of(module_name(path))
    bad = sorted(
        f"{module_name(path)} ({src}) imports {m} ({layer_of(m)})"
        for m in mempo_imports(path)
        if layer_of(m) != src and layer_of(m) not in ALLOWED[src]
    )
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_allowed_edges_form_a_strict_order():
    """No two layers may import each other, and no layer imports one listed above it."""
    order = list(LAYERS)
    for layer, below in ALLOWED.items():
        assert all(order.index(b) < order.index(layer) for b in below), layer


def test_the_check_sees_function_local_imports(tmp_path):
    """The bug this guards against: an upward import hidden inside a function body (rollout -> training)."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from mempo.models.module import MemPOModule\n    return MemPOModule\n")
    assert mempo_imports(probe) == {"mempo.models.module"}
    assert layer_of("mempo.models.module") == "training" and "training" not in ALLOWED[layer_of("mempo.rollout.x")]
