"""Reading a prepared task back: the tokenized splits and their meta record.

What ``aclpipe prepare`` writes (``data/<task>/<split>.jsonl`` and ``meta.json``) is read here,
by training, evaluation and export alike, without loading the prepare stage (tokenizers,
GLUE readers, the hub).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TypeVar

from aclpipe.errors import UserError
from aclpipe.layout import META, split_file

Row = TypeVar("Row")


def subsample(examples: list[Row], limit: int | None, seed: int) -> list[Row]:
    """A deterministic subsample of ``limit`` examples, in their original order."""
    if limit is None or limit >= len(examples):
        return examples
    keep = sorted(random.Random(seed).sample(range(len(examples)), limit))
    return [examples[i] for i in keep]


def load_split(data_dir: Path, split: str) -> list[dict]:
    path = split_file(data_dir, split)
    if not path.exists():
        raise UserError(f"{path} not found: run `aclpipe prepare --task {data_dir.name}` first")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def load_meta(data_dir: Path) -> dict:
    path = data_dir / META
    if not path.exists():
        raise UserError(f"{path} not found: run `aclpipe prepare --task {data_dir.name}` first")
    return json.loads(path.read_text(encoding="utf-8"))
