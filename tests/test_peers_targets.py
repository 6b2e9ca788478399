"""benchmarks/peers.py's verdicts: which contender the targets are judged on, and the speed and
accuracy checks, over a grid of races, against a plain reference."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import peers  # noqa: E402  (benchmarks/peers.py)

EARLY = "aclpipe-early-exit-int8"
GOALS = {"batch_1": 2.0, "batch_32": 3.0}


def race(optimum: float, ours: dict[str, tuple[float, float]], accuracy: float) -> dict:
    """In-process results: Optimum int8 at ``optimum`` sentences/s and ``accuracy``; each of
    ``ours`` at (sentences/s, accuracy), the same at both batch sizes."""
    row = {"optimum-int8": {"sentences_per_s": optimum, "accuracy": accuracy}}
    row |= {name: {"sentences_per_s": r, "accuracy": a} for name, (r, a) in ours.items()}
    return {batch: row for batch in GOALS}


def reference(ratio: float, ours: float, theirs: float, goal: float) -> tuple[bool, bool]:
    """(within 1 point, met), the slow way: accuracies in whole hundredths of a point."""
    hundredths = round(ours * 10000) - round(theirs * 10000)
    within = hundredths >= -100
    return within, within and ratio >= goal


@pytest.mark.parametrize(
    ("speedup", "below"),
    list(itertools.product((1.0, 1.99, 2.0, 2.5, 3.0, 3.4), (-0.015, -0.01, -0.0099, 0.0, 0.02))),
)
def test_the_targets_are_judged_on_the_early_exit_contender(speedup, below):
    theirs = 0.8268
    ours = round(theirs + below, 4)
    inproc = race(100.0, {EARLY: (100.0 * speedup, ours), "aclpipe-int8": (120.0, 0.85)}, theirs)
    verdicts = peers.targets(inproc, {})
    judged = [t for t in verdicts if t["judged"]]
    assert [t["contender"] for t in judged] == [EARLY, EARLY]
    assert {t["contender"] for t in verdicts if not t["judged"]} == {"aclpipe-int8"}
    for t, (batch, goal) in zip(judged, GOALS.items()):
        within, met = reference(speedup, ours, theirs, goal)
        assert t["target"].endswith(batch) and t["goal"] == goal
        assert (t["accuracy_within_1_point"], t["met"]) == (within, met)
        assert t["value"] == round(speedup, 2)
        assert (t["accuracy"], t["optimum_int8_accuracy"]) == (ours, theirs)


def test_without_an_early_exit_contender_the_single_exit_one_is_judged():
    inproc = race(100.0, {"aclpipe-int8": (250.0, 0.8268)}, 0.8368)  # exactly 1 point below
    verdicts = peers.targets(inproc, {})
    assert [(t["contender"], t["judged"]) for t in verdicts] == [("aclpipe-int8", True)] * 2
    assert [t["accuracy_points"] for t in verdicts] == [-1.0, -1.0]
    assert [t["met"] for t in verdicts] == [True, False]  # 2.5x: batch 1 yes, batch 32 no


def test_other_early_exit_exports_are_raced_beside_not_judged():
    inproc = race(100.0, {EARLY: (150.0, 0.83), f"{peers.EARLY}-mean-int8": (400.0, 0.84),
                          "aclpipe-int8": (120.0, 0.85)}, 0.83)  # fmt: skip
    verdicts = peers.targets(inproc, {})
    assert [(t["contender"], t["judged"]) for t in verdicts[:3]] == [
        (EARLY, True), (f"{peers.EARLY}-mean-int8", False), ("aclpipe-int8", False)]  # fmt: skip
    assert [t["met"] for t in verdicts[:3]] == [False, True, False]


@pytest.mark.parametrize("given", [None, "elsewhere/export"])
@pytest.mark.parametrize("method", [None, "acl-cl"])
@pytest.mark.parametrize("also", [[], ["cls=other/export"], ["cls=a", "ce-mean.2=b"]])
def test_the_raced_exports_are_the_judged_one_then_the_labelled_ones(tmp_path, given, method, also):
    """Against a plain reference: --early-exit FOLDER is judged, else the project's export of
    --early-exit-method, else none; each LABEL=FOLDER follows under its own prefix."""
    folder = None if given is None else tmp_path / given
    got = peers.early_exit_exports(tmp_path / "project", folder, method, also)
    want = {}
    if given is not None:
        want[peers.EARLY] = (tmp_path / given).resolve()
    elif method is not None:
        want[peers.EARLY] = tmp_path / "project" / "models" / "sst2" / method / "export"
    for extra in also:
        label, place = extra.split("=")
        want[f"{peers.EARLY}-{label}"] = Path(place).resolve()
    assert got == want and list(got) == list(want)


@pytest.mark.parametrize(
    ("also", "words"),
    [(["cls"], "give LABEL=FOLDER"), (["=x"], "give LABEL=FOLDER"), (["a b=x"], "give LABEL"),
     (["cls="], "give LABEL=FOLDER"), (["cls=a", "cls=b"], "given twice")],
)  # fmt: skip
def test_a_malformed_also_early_exit_is_one_line(tmp_path, also, words) -> None:
    with pytest.raises(SystemExit) as stop:
        peers.early_exit_exports(tmp_path, None, "acl-cl", also)
    message = str(stop.value.code)
    assert words in message and "\n" not in message and "--also-early-exit" in message
