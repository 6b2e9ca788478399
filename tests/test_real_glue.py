"""The GLUE readers on the real SST-2, MRPC and RTE files (skipped where they are absent)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aclpipe.data.glue_sources import local_available, read_local
from aclpipe.data.tasks import TASKS

# The shared data sits next to the checkout (../shared/glue); GLUE_DIR points elsewhere.
GLUE_DIR = Path(
    os.environ.get("GLUE_DIR") or Path(__file__).resolve().parents[1].parent / "shared" / "glue"
)


@pytest.mark.parametrize(
    ("name", "train_rows", "dev_rows"),
    [("sst2", 67_349, 872), ("mrpc", 3_668, 408), ("rte", 2_490, 277)],
)
@pytest.mark.slow
def test_real_files(name: str, train_rows: int, dev_rows: int) -> None:
    task = TASKS[name]
    if not local_available(task, GLUE_DIR):
        pytest.skip(f"no real {task.folder} files in {GLUE_DIR}")
    train = read_local(task, GLUE_DIR, "train")
    dev = read_local(task, GLUE_DIR, "dev")
    assert (len(train), len(dev)) == (train_rows, dev_rows)
    for examples in (train, dev):
        # Both classes occur, and every label is a class index.
        assert {e.label for e in examples} == {0, 1}
        assert all(isinstance(e.label, int) for e in examples)
        assert all(e.text_a for e in examples)
        assert all((e.text_b is not None) == task.is_pair for e in examples)
    # The MRPC byte-order mark must not leak into a column name or a text.
    assert not any(e.text_a.startswith("\ufeff") for e in train + dev)
