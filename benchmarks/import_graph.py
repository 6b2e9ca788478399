"""The floor plan, measured: import floors, package arrows back up, import circles (type-only
imports counted), cli.py's length, the longest function under src/, and the three floors
(library, pipeline, studies): modules and lines on each, modules over 400 lines, functions
over 80 lines, and the source files that list every method by name.

    python benchmarks/import_graph.py

Reads the source with ``ast`` only (nothing is imported), so it runs in well under a second.
A module's imports are every ``import``/``from`` anywhere in its file, inside functions and
``if TYPE_CHECKING:`` blocks too. Packages are aclpipe's subpackages (``aclpipe.training``) and
its top-level modules (``aclpipe.config``). ``TIERS`` is the intended order, bottom first: an
arrow from a package to one in a higher tier points back up.
"""

from __future__ import annotations

import ast
import graphlib
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "aclpipe"

# The intended layering, bottom first: a package may import its own tier and those below it.
TIERS = (
    ("errors", "layout", "atomic", "run_log", "method_names", "checks"),  # the floor
    ("modeling",),  # the model: shared by training and inference
    ("data", "early_exit"),  # prepared data; serving (policies, runtimes, predict)
    ("evaluation",),  # metrics and scores
    ("exits", "training"),  # offline export and sweeps; the training loop and methods
    ("config", "cli_options"),  # params.yaml assembled from the sections; the CLI's shared parts
    ("stages",),  # the pipeline's stage functions, the trade-off stage among them
    ("study",),  # the campaign, reports and experiments built on the stages
    ("cli", "cli_serve", "__main__"),  # the face
)
TIER = {name: i for i, names in enumerate(TIERS) for name in names}


def module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST):
    """Every node that runs: the bodies of ``if TYPE_CHECKING:`` (annotations only) left out."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(child for child in ast.iter_child_nodes(node) if not _type_checking(child))


def import_graph(names: dict[str, Path], type_only: bool = True) -> dict[str, set[str]]:
    """Module -> the aclpipe modules it imports anywhere in its file, inside functions too;
    with ``type_only`` also the ``if TYPE_CHECKING:`` imports, else only those that run.
    (tests/test_layering.py checks the architecture on this same graph.)"""
    graph = {}
    for name, path in names.items():
        imported = set()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree) if type_only else _runtime_nodes(tree):
            if isinstance(node, ast.Import):
                imported |= {a.name for a in node.names if a.name in names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module in names:
                    imported.add(node.module)
                imported |= {f"{node.module}.{a.name}" for a in node.names} & names.keys()
        graph[name] = imported - {name}
    return graph


def package(module: str) -> str:
    return module.split(".")[1] if module.count(".") else module


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), each sorted."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        if module == "aclpipe":
            continue
        edges = packages.setdefault(package(module), set())
        edges |= {package(t) for t in targets if t != "aclpipe"} - {package(module)}
    return packages


def floors(packages: dict[str, set[str]]) -> list[list[str]]:
    """Packages by height: floor 0 imports no other package; floor n imports one on n-1."""
    groups = {p: p for p in packages}
    for group in circles(packages):  # a circle counts as one block
        joined = "+".join(group)
        groups.update({p: joined for p in group})
    merged: dict[str, set[str]] = {}
    for p, targets in packages.items():
        merged.setdefault(groups[p], set()).update(groups[t] for t in targets)
    height: dict[str, int] = {}
    for block in graphlib.TopologicalSorter(
        {b: ts - {b} for b, ts in merged.items()}
    ).static_order():
        height[block] = 1 + max((height[t] for t in merged[block] - {block}), default=-1)
    out: list[list[str]] = [[] for _ in range(max(height.values()) + 1)]
    for block, h in height.items():
        out[h].append(block)
    return [sorted(f) for f in out]


# The three floors a reader sees from the tree: the library (every package the stages call),
# the pipeline (the params, the stages, the command line) and the studies.
PIPELINE = ("config", "cli_options", "cli_serve", "stages", "cli", "__main__", "__init__")


def building_floor(path: Path) -> str:
    top = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
    return "studies" if top == "study" else "pipeline" if top in PIPELINE else "library"


def functions() -> list[tuple[int, str]]:
    """(lines, "path:name") of every function under src/aclpipe, longest first."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found.append(
                    (node.end_lineno - node.lineno + 1, f"{path.relative_to(SRC)}:{node.name}")
                )
    return sorted(found, reverse=True)


def _lists_methods(path: Path) -> bool:
    """Whether a dict, tuple or list literal in the file names most methods (a method list)."""
    names = {"ce", "scl", "acl", "joint", "deebert", "deebert-sd", "romebert", "acl-cl"}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Dict | ast.Tuple | ast.List):
            items = node.keys if isinstance(node, ast.Dict) else node.elts
            found = {i.value for i in items if isinstance(i, ast.Constant)}
            if len(found & names) >= 6:
                return True
    return False


def building() -> None:
    lines = {p: len(p.read_text(encoding="utf-8").splitlines()) for p in PACKAGE.rglob("*.py")}
    total = sum(lines.values())
    for name in ("library", "pipeline", "studies"):
        mine = sorted(p for p in lines if building_floor(p) == name)
        count = sum(lines[p] for p in mine)
        big = [str(p.relative_to(PACKAGE)) for p in mine if lines[p] > 400]
        print(f"{name}: {len(mine)} modules, {count} lines ({100 * count / total:.0f}%), "
              f"{sum(lines[p] > 300 for p in mine)} over 300, over 400: {big}")  # fmt: skip
    print(f"functions over 80 lines: {[f'{f} ({n})' for n, f in functions() if n > 80]}")
    lists = [str(p.relative_to(SRC)) for p in sorted(PACKAGE.rglob("*.py")) if _lists_methods(p)]
    print(f"method lists in the source (a new method's entries): {len(lists)} {lists}")


def longest_function() -> tuple[str, int]:
    best = ("", 0)
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > best[1]:
                    best = (f"{path.relative_to(SRC)}:{node.name}", lines)
    return best


def main() -> None:
    names = module_names()
    graph = import_graph(names)
    packages = package_graph(graph)
    back = sorted(
        (p, t) for p, ts in packages.items() for t in ts if TIER.get(t, 0) > TIER.get(p, 0)
    )
    loops = circles(graph)
    cli = PACKAGE / "cli.py"
    for i, floor in enumerate(floors(packages)):
        print(f"floor {i}: {', '.join(floor)}")
    print(f"package arrows back up: {len(back)} {['->'.join(a) for a in back]}")
    print(f"import circles (type-only counted): {len(loops)} {loops}")
    print(f"cli.py lines: {len(cli.read_text(encoding='utf-8').splitlines())}")
    name, lines = longest_function()
    print(f"longest function: {name} ({lines} lines)")
    building()


if __name__ == "__main__":
    main()
