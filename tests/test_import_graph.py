"""The package's import graph has no circle, counting imports inside functions too."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "aclpipe"


def module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def import_graph() -> dict[str, set[str]]:
    """Module -> the aclpipe modules it imports anywhere in its file."""
    names = module_names()
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported |= {a.name for a in node.names if a.name in names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module in names:
                    imported.add(node.module)
                imported |= {f"{node.module}.{a.name}" for a in node.names} & names.keys()
        graph[name] = imported - {name}
    return graph


def test_no_import_circle() -> None:
    graph = import_graph()
    assert "aclpipe.config" in graph["aclpipe.study.campaign"]  # the walk sees imports
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as err:
        raise AssertionError(f"import circle: {' -> '.join(err.args[1])}") from None


def test_methods_do_not_import_the_config() -> None:
    """Knobs live with their method; config.py asks the catalogue, never the other way."""
    assert "aclpipe.config" not in import_graph()["aclpipe.training.methods"]
    assert "aclpipe.training.methods" in import_graph()["aclpipe.config"]
