"""The fast lane (`make test-fast`, ``pytest -m "not slow"``) keeps covering every module.

Read from the test files' source, not by collecting them (that would import torch and every
module: seconds): a test is slow when it carries ``@pytest.mark.slow`` or its module sets
``pytestmark = pytest.mark.slow``. A test file whose every test is slow drops out of the fast
lane unnoticed; this fails instead, unless the file is listed below with the reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

# Files with no fast test, and why none can be fast.
ALL_SLOW = {
    "test_atomic_stages.py": "every test kills a stage in a child process mid-write",
    "test_determinism.py": "every test trains and evaluates twice and compares the bits",
    "test_distributed.py": "every test launches torchrun worker processes "
    "(the parts they run are unit-tested fast in test_distributed_parts.py)",
    "test_dvcignore.py": "both tests run `dvc check-ignore` in a subprocess",
    "test_lean_install.py": "every test runs the core install, built into a fresh venv",
    "test_real_glue.py": "it reads the real GLUE files (SST-2's 67k rows) when they exist",
}


def _is_slow_mark(node: ast.expr) -> bool:
    """``pytest.mark.slow`` (or ``mark.slow``), called or not."""
    node = node.func if isinstance(node, ast.Call) else node
    if not (isinstance(node, ast.Attribute) and node.attr == "slow"):
        return False
    owner = node.value
    return (isinstance(owner, ast.Attribute) and owner.attr == "mark") or (
        isinstance(owner, ast.Name) and owner.id == "mark"
    )


def _module_is_slow(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            value = node.value
            marks = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
            return any(_is_slow_mark(m) for m in marks)
    return False


def lanes(path: Path) -> tuple[list[str], list[str]]:
    """The file's test functions (and methods of its Test classes): (fast, slow) names."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    module_slow = _module_is_slow(tree)
    fast, slow = [], []

    def visit(body: list[ast.stmt], class_slow: bool) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                visit(node.body, class_slow or any(_is_slow_mark(d) for d in node.decorator_list))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith(
                "test_"
            ):
                marked = class_slow or any(_is_slow_mark(d) for d in node.decorator_list)
                (slow if marked else fast).append(node.name)

    visit(tree.body, module_slow)
    return fast, slow


def test_the_reader_sees_marks_the_way_pytest_does(tmp_path: Path) -> None:
    source = tmp_path / "test_sample.py"
    source.write_text(
        "import pytest\n"
        "from pytest import mark\n"
        "def test_a(): pass\n"
        "@pytest.mark.slow\n"
        "def test_b(): pass\n"
        "@mark.slow()\n"
        "@pytest.mark.parametrize('x', [1])\n"
        "def test_c(x): pass\n"
        "@pytest.mark.slow\n"
        "class TestGroup:\n"
        "    def test_d(self): pass\n"
        "def helper(): pass\n"
    )
    assert lanes(source) == (["test_a"], ["test_b", "test_c", "test_d"])
    source.write_text("import pytest\npytestmark = [pytest.mark.slow]\ndef test_a(): pass\n")
    assert lanes(source) == ([], ["test_a"])


@pytest.mark.parametrize("path", sorted(TESTS.glob("test_*.py")), ids=lambda p: p.name)
def test_every_test_file_keeps_a_fast_test(path: Path) -> None:
    fast, slow = lanes(path)
    assert fast or slow, f"{path.name} has no test functions"
    if path.name in ALL_SLOW:
        assert not fast, f"{path.name} has a fast test now: remove it from ALL_SLOW"
    else:
        assert fast, (
            f"every test in {path.name} is marked slow, so `make test-fast` no longer covers "
            "it: keep one fast test (a tiny case of the same code), or list the file in "
            "ALL_SLOW with the reason"
        )


def test_every_listed_file_exists() -> None:
    assert [name for name in ALL_SLOW if not (TESTS / name).exists()] == []
