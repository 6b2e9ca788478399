"""Same params and seed, same bits: two runs on the CPU give identical weights and metrics.

acl-cl exercises most of what could draw randomness or depend on order: every exit, dropout
(the tiny BERT keeps its 0.1), the contrastive pool, and ACL-Grad's decisions.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cli_helpers import tree
from paths import RELATIVE, at
from safetensors.torch import load_file
from typer.testing import CliRunner

from aclpipe.cli import app
from aclpipe.layout import CURVES_CSV, CURVES_JSON, METRICS, MODEL_CONFIG, TRAINING_LOG, WEIGHTS

METHOD = "acl-cl"
TRAIN = {"epochs": 2}  # 48 rows in batches of 16: 6 steps
FILES = (MODEL_CONFIG,)
REPORTS = (METRICS, CURVES_JSON, CURVES_CSV)


def run(make_project, folder: Path, *overrides: str) -> Path:
    """prepare (by ``make_project``), finetune and evaluate in ``folder``; the project."""
    work = make_project(folder, train=TRAIN)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        for stage in ("finetune", "evaluate"):
            args = [stage, "--task", "sst2", "--method", METHOD, *overrides]
            result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
            assert result.exit_code == 0, result.output
    return work


def weights(work: Path) -> dict[str, torch.Tensor]:
    return load_file(at(work).model("sst2", METHOD) / WEIGHTS)


def assert_identical(first: Path, second: Path) -> None:
    a, b = weights(first), weights(second)
    assert a.keys() == b.keys()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    for name in FILES:
        path = RELATIVE.model("sst2", METHOD) / name
        assert (first / path).read_bytes() == (second / path).read_bytes(), name
    log = RELATIVE.model("sst2", METHOD) / TRAINING_LOG  # every step's losses and cosines
    assert tree(first / log) == tree(second / log) and tree(first / log)
    for name in REPORTS:
        path = RELATIVE.report("sst2", METHOD) / name
        assert (first / path).read_bytes() == (second / path).read_bytes(), name


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory, make_project) -> Path:
    return run(make_project, tmp_path_factory.mktemp("first"))


@pytest.mark.slow
def test_same_seed_same_bits(first: Path, make_project, tmp_path: Path) -> None:
    assert_identical(first, run(make_project, tmp_path / "second"))


@pytest.mark.slow
def test_checkpoints_and_logging_change_no_bits(first: Path, make_project, tmp_path: Path) -> None:
    """A checkpoint after every step and other progress lines touch no RNG and no weight."""
    second = run(
        make_project,
        tmp_path / "second",
        "--set",
        "train.save_every=1",
        "--set",
        "train.log_every=4",
    )
    assert_identical(first, second)


@pytest.mark.slow
def test_another_seed_other_bits(first: Path, make_project, tmp_path: Path) -> None:
    """The comparison can fail: a different seed gives different weights."""
    other = weights(run(make_project, tmp_path / "other", "--set", "train.seed=1"))
    assert any(not torch.equal(other[k], v) for k, v in weights(first).items())
