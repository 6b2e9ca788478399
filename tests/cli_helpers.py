"""Helpers shared by the tests that drive the ``aclpipe`` command line."""

from __future__ import annotations

import hashlib
from pathlib import Path

from typer.testing import CliRunner

from aclpipe.cli import app


def invoke(*args: str):
    """Run ``aclpipe ARGS`` in-process (wide columns, so no message is wrapped)."""
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


def ok(*args: str) -> str:
    """Run ``aclpipe ARGS``, assert it succeeded, and return its output."""
    result = invoke(*args)
    assert result.exit_code == 0, f"{args}: {result.output}"
    return result.output


def tree(root: Path) -> dict[str, str | None]:
    """Every path under ``root``: the SHA-256 of a file, None for a folder."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        if p.is_file()
        else None
        for p in sorted(root.rglob("*"))
    }
