"""The architecture, checked: no import circle inside aclpipe (imports inside functions
counted too), knobs apart from the training code, and the serving path (``aclpipe predict``)
loading neither the training stack nor the scoring libraries."""

from __future__ import annotations

import ast
import graphlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "aclpipe"


def module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST):
    """Every node that runs: the bodies of ``if TYPE_CHECKING:`` (annotations only) are left out."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(child for child in ast.iter_child_nodes(node) if not _type_checking(child))


def import_graph() -> dict[str, set[str]]:
    """Module -> the aclpipe modules it imports anywhere in its file (at run time)."""
    names = module_names()
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        imported = set()
        for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
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
    assert "aclpipe.modeling.model" not in graph["aclpipe.modeling.layerwise"]  # typing only
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as err:
        raise AssertionError(f"import circle: {' -> '.join(err.args[1])}") from None


def test_methods_do_not_import_the_config() -> None:
    """Knobs live with their method; config.py asks the catalogue, never the other way."""
    graph = import_graph()
    assert "aclpipe.config" not in graph["aclpipe.training.methods"]
    assert "aclpipe.config" not in graph["aclpipe.training.knobs"]
    assert "aclpipe.training.knobs" in graph["aclpipe.config"]


@pytest.mark.slow
def test_the_method_table_is_torch_free() -> None:
    """The CLI's help and checks, and the config, read the table without the training code."""
    script = "import sys, aclpipe.training.knobs\nprint('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


# The training code: everything under aclpipe.training but the torch-free method table.
TRAINING_CODE = tuple(
    f"aclpipe.training.{p.stem}" for p in (PACKAGE / "training").iterdir()
    if p.stem not in ("__init__", "knobs", "__pycache__")
)  # fmt: skip


def test_inference_never_imports_training_or_the_prepare_stage() -> None:
    graph = import_graph()
    serving = [m for m in graph if m.startswith("aclpipe.early_exit.")]
    for module in serving:
        for target in graph[module]:
            assert not target.startswith(TRAINING_CODE), (module, target)
            assert target != "aclpipe.data.prepare", (module, target)


# scipy is not here: transformers' PreTrainedModel imports it itself (transformers/loss/
# loss_utils.py) when the torch engine loads the model; aclpipe's own modules must not.
FORBIDDEN = ("sklearn", "datasets", *TRAINING_CODE, "aclpipe.data.prepare",
             "aclpipe.evaluation", "aclpipe.study", "aclpipe.early_exit.export")  # fmt: skip


@pytest.mark.slow
def test_serving_modules_import_no_scipy() -> None:
    script = (
        "import sys\nimport aclpipe.cli, aclpipe.early_exit.predict\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('scipy', 'sklearn')))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.slow
def test_predict_loads_no_training_stack(tmp_path: Path, tiny_model_dir: Path) -> None:
    """`aclpipe predict` end to end in a fresh interpreter, then a look at sys.modules."""
    from test_predict import save_folder

    folder = save_folder(tmp_path / "model", tiny_model_dir, "sst2", 2)
    script = (
        "import sys, json\n"
        "from aclpipe.cli import app\n"
        f"args = ['predict', '--model', {str(folder)!r}, '--input', {str(tmp_path / 'in.txt')!r},"
        f" '--output', {str(tmp_path / 'out.jsonl')!r}]\n"
        "try:\n    app(args)\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    (tmp_path / "in.txt").write_text("a good film\nbad plot\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 2
    bad = [m for m in loaded if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)]
    assert bad == []
