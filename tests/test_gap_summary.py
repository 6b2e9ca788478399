"""fewshot/gap/summarize.py, the summary of the SetFit-gap ablations that docs/studies.md quotes:
its paired differences against a plain loop over draws, and its one-line refusal."""

from __future__ import annotations

import importlib.util
import random
import subprocess
import sys
from pathlib import Path

import pytest
from paths import REPO

SCRIPT = REPO / "fewshot" / "gap" / "summarize.py"
HEADER = "config\tN\tdraw\thead\tdev_accuracy\tseconds\n"


def _module():
    spec = importlib.util.spec_from_file_location("gap_summarize", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tsv(tmp_path: Path, rows: list[tuple[str, int, int, str, float]]) -> Path:
    path = tmp_path / "ablations.tsv"
    path.write_text(HEADER + "".join(f"{c}\t{n}\t{d}\t{h}\t{a:.2f}\t1\n" for c, n, d, h, a in rows))
    return path


@pytest.mark.parametrize(
    "draws_a,draws_b", [(range(1, 11), range(1, 11)), (range(1, 8), range(3, 11)), ([4], [4])]
)
def test_paired_difference_is_the_plain_mean_over_shared_draws(tmp_path, draws_a, draws_b) -> None:
    gap = _module()
    rng = random.Random(len(list(draws_a)))
    rows = [("a", 100, d, "head", rng.uniform(60, 80)) for d in draws_a]
    rows += [("b", 100, d, "head", rng.uniform(60, 80)) for d in draws_b]
    rows += [("a", 20, 1, "head", 99.0)]  # another N: never read
    table = gap.read(_tsv(tmp_path, rows), 100)
    a, b = table["a|head"], table["b|head"]
    shared = sorted(set(draws_a) & set(draws_b))
    plain = [round(a[d], 2) - round(b[d], 2) for d in shared]
    d = gap.paired(a, b, resamples=2000)
    assert d["draws"] == shared
    assert d["mean"] == pytest.approx(sum(plain) / len(plain))
    assert d["positive"] == sum(x > 0 for x in plain)
    assert (d["min"], d["max"]) == (pytest.approx(min(plain)), pytest.approx(max(plain)))
    assert d["low"] <= d["mean"] <= d["high"]
    assert min(plain) - 1e-9 <= d["low"] and d["high"] <= max(plain) + 1e-9


def test_a_repeated_row_keeps_its_last_value(tmp_path) -> None:
    path = _tsv(tmp_path, [("a", 100, 1, "head", 70.0), ("a", 100, 1, "head", 72.5)])
    assert _module().read(path, 100) == {"a|head": {1: 72.5}}


@pytest.mark.slow  # a subprocess
def test_a_pair_without_rows_is_one_line_naming_the_fix(tmp_path) -> None:
    path = _tsv(tmp_path, [("a", 100, 1, "head", 70.0)])
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--tsv", str(path), "--pair", "a|head", "b|head"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.strip().splitlines() == [
        f"no rows for 'b|head' at N = 100 in {path}: run ablate.py first"
    ]


def test_the_committed_summary_is_what_the_committed_ablations_give() -> None:
    gap = _module()
    tsv = REPO / "fewshot" / "gap" / "ablations.tsv"
    committed = (REPO / "fewshot" / "gap" / "summary.md").read_text(encoding="utf-8")
    assert committed == gap.summary(tsv, 100, gap.DEFAULT_PAIRS)
