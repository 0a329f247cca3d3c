"""The package's import graph, read from the source with `ast` (nothing is imported): no two modules import
each other (lazy imports inside functions count too), and the sweep planner does not import the IGLUE-HF
pipeline (docs/architecture.md: it knows `volta_ml/iglue_hf/` only through the `volta-ml iglue-hf` command
line)."""
from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "volta_ml"


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's __init__)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere in its source (`from X import name` counts as an
    import of `X.name` when that is a module, else of `X`)."""
    modules = _modules()
    graph = {}
    for name, (path, is_package) in modules.items():
        here = name.split(".") if is_package else name.split(".")[:-1]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names if alias.name.split(".")[0] == "volta_ml"}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else []))
                if base.split(".")[0] != "volta_ml":
                    continue
                targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
        graph[name] = targets - {name}
    return graph


def test_the_graph_sees_relative_lazy_and_absolute_imports():
    graph = import_graph()
    assert "volta_ml.engine.failures" in graph["volta_ml.engine.distributed"]        # lazy, absolute
    assert "volta_ml.protocols.grid" in graph["volta_ml.protocols.runners"]          # relative
    assert "volta_ml.features.records" in graph["volta_ml.features"]                 # a package's __init__


def test_no_two_modules_import_each_other():
    graph = import_graph()
    circles = sorted((a, b) for a, targets in graph.items() for b in targets if a < b and a in graph.get(b, ()))
    assert circles == []


def test_the_planner_does_not_import_the_iglue_hf_pipeline():
    graph = import_graph()
    upward = sorted((a, b) for a, targets in graph.items() if a.startswith("volta_ml.protocols")
                    for b in targets if b.startswith("volta_ml.iglue_hf"))
    assert upward == []


def test_the_pipelines_do_not_import_the_command_line_above_them():
    """`volta_ml/cli` sits on top (docs/architecture.md): the pipelines' own command lines take what they share
    with it (`backend_options`, `int_at_least`, `VoltaArgumentParser`) from below (`hf/base.py`, `options.py`)."""
    graph = import_graph()
    rooms = ("volta_ml.cvqa", "volta_ml.iglue_hf", "volta_ml.suite", "volta_ml.pretrain")
    upward = sorted((a, b) for a, targets in graph.items() if a.startswith(rooms)
                    for b in targets if b.startswith("volta_ml.cli"))
    assert upward == []
