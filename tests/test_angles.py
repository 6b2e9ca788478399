"""`aclpipe angles`: per-step gradient angles recorded during training, histogram and JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from paths import at
from typer.testing import CliRunner

from aclpipe.cli import app
from aclpipe.layout import ANGLES_JSON, ANGLES_PNG
from aclpipe.run_log import write_run_log
from aclpipe.study.angles import read_angles, summarise


def test_read_angles_skips_steps_without_two_gradients(tmp_path: Path) -> None:
    rows = [{"cosine": 1.0, "altered": False}, {"loss": 0.3}, {"cosine": -1.0, "altered": True},
            {"cosine": 0.0, "altered": False}, {"cosine": float("nan")}]  # fmt: skip
    base = {"main": 0.5, "loss": 0.5, "stage": 1, "epoch": 1, "lr": 1e-5}
    steps = [{**base, **row, "step": i + 1} for i, row in enumerate(rows)]
    write_run_log(
        tmp_path, {"task": "rte", "method": "acl", "exits": [3], "processes": 1}, [], steps
    )
    angles, altered = read_angles(tmp_path)
    assert angles == pytest.approx([0.0, 180.0, 90.0])
    assert altered == [False, True, False]
    summary = summarise(angles, altered)
    assert summary["steps"] == 3 and summary["mean_angle"] == pytest.approx(90.0)
    assert summary["share_over_90"] == pytest.approx(1 / 3)
    assert summary["altered_rate"] == pytest.approx(1 / 3)


@pytest.mark.slow
def test_angles_command_end_to_end(tmp_path: Path, make_project, monkeypatch) -> None:
    project = make_project(tmp_path / "p", train={"epochs": 1, "batch_size": 8})
    monkeypatch.chdir(project)
    result = CliRunner().invoke(app, ["angles", "--task", "sst2", "-m", "scl", "--method", "acl"])
    assert result.exit_code == 0, result.output
    report = json.loads((at(project).angles("sst2") / ANGLES_JSON).read_text())
    assert set(report["methods"]) == {"scl", "acl"}
    for summary in report["methods"].values():
        assert summary["steps"] > 0 and len(summary["angles"]) == summary["steps"]
        assert all(0.0 <= a <= 180.0 for a in summary["angles"])
        assert math.isfinite(summary["mean_angle"])
    assert report["methods"]["scl"]["altered_rate"] == 0.0  # a plain sum never drops
    png = (at(project).angles("sst2") / ANGLES_PNG).read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert not at(project).models().exists() or not any(at(project).models().rglob("*.safetensors"))


def test_angles_refuses_a_method_without_an_auxiliary_term(
    tmp_path: Path, make_project, monkeypatch
) -> None:
    project = make_project(tmp_path / "p", train={"epochs": 1, "batch_size": 8})
    monkeypatch.chdir(project)
    result = CliRunner().invoke(app, ["angles", "--task", "sst2", "--method", "ce"])
    assert result.exit_code == 2
    assert "no auxiliary objective" in result.output
