"""Helpers shared by the tests that drive the ``aclpipe`` command line."""

from __future__ import annotations

import hashlib
from pathlib import Path

import yaml
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


def write_study(folder: Path, base: dict, grid: dict, **spec) -> Path:
    """A few-shot study's params file under ``folder/fewshot``: the params ``base`` (the tiny
    model's), its ``campaign:`` section ``grid`` updated by ``spec``, batches of 4 and a quarter
    of the training rows held out as the validation split."""
    path = folder / "fewshot" / "params.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = {**base, "campaign": {**grid, **spec}}
    raw["train"].update(batch_size=4, score_each_epoch=False)
    raw["data"].update(validation_fraction=0.25)
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path
