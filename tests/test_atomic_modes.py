"""One atomic writer (``atomic.atomic_path``) for every single-file output: under umask 022
each comes out 0644 (``mkstemp`` alone makes 0600), an error leaves neither a temporary file
nor a changed target."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from aclpipe import atomic
from aclpipe.early_exit.predict import write_jsonl
from aclpipe.stages.tradeoff_plots import draw_exit_scores, draw_score_vs_time
from aclpipe.study.angles import draw_histograms


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def only(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_write_text_and_atomic_path_are_0644(tmp_path: Path, umask_022) -> None:
    atomic.write_text(tmp_path / "a.md", "text\n")
    with atomic.atomic_path(tmp_path / "b.bin") as tmp:
        assert tmp.parent == tmp_path and mode(tmp) == 0o600  # mkstemp's mode until done
        tmp.write_bytes(b"\x00\x01")
    assert (tmp_path / "a.md").read_text() == "text\n"
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert mode(tmp_path / "a.md") == mode(tmp_path / "b.bin") == 0o644
    assert only(tmp_path) == ["a.md", "b.bin"]


def test_the_umask_decides_not_mkstemp(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        atomic.write_text(tmp_path / "private.md", "x")
    finally:
        os.umask(old)
    assert mode(tmp_path / "private.md") == 0o600


def test_an_error_leaves_the_target_and_no_temporary(tmp_path: Path, umask_022) -> None:
    target = tmp_path / "out.jsonl"
    target.write_text("old\n")

    def rows():
        yield {"label": 1}
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        write_jsonl(rows(), target)
    assert target.read_text() == "old\n" and only(tmp_path) == ["out.jsonl"]


def test_predict_output_is_0644(tmp_path: Path, umask_022) -> None:
    out = tmp_path / "sub" / "predictions.jsonl"
    assert write_jsonl([{"label": 1}, {"label": 0}], out) == 2
    assert out.read_text().splitlines() == ['{"label": 1}', '{"label": 0}']
    assert mode(out) == 0o644 and only(out.parent) == ["predictions.jsonl"]


def test_figures_are_0644(tmp_path: Path, umask_022) -> None:
    points = {"ce": [{"policy": "full", "expected_time_ratio": 1.0, "score": 0.8},
                     {"policy": "entropy", "expected_time_ratio": 0.5, "score": 0.7}]}  # fmt: skip
    draw_score_vs_time("sst2", points, 0.8, tmp_path / "tradeoff.png", majority=0.5)
    draw_exit_scores("sst2", {"ce": {1: 0.6, 2: 0.8}}, 2, 0.8, tmp_path / "exits.png")
    angles = {"task": "rte", "methods": {"acl-cl": {"angles": [10.0, 95.0], "share_over_90": 0.5}}}
    draw_histograms(angles, tmp_path / "angles.png")
    for name in ("angles.png", "exits.png", "tradeoff.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert mode(tmp_path / name) == 0o644, name
    assert only(tmp_path) == ["angles.png", "exits.png", "tradeoff.png"]
