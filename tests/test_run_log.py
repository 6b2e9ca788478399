"""The training log round trip: records -> DVCLive files -> the same records."""

from __future__ import annotations

import json
import math

import pytest

from aclpipe.errors import UserError
from aclpipe.layout import DVC_YAML, LEGACY_HISTORY, LEGACY_STEPS
from aclpipe.run_log import LIVE_DIR, read_run_log, write_run_log

RUN = {"task": "sst2", "method": "acl-cl", "exits": [2, 4, 6], "processes": 1}


def _steps() -> list[dict]:
    rows = []
    for step in range(1, 8):
        row = {"main": 0.7 / step, "loss": 3.1 / step + 1e-9, "aux": 2.4 + step / 3}
        row.update(cosine=math.cos(step) if step != 3 else float("nan"))
        row.update(altered=math.cos(step) < 0, grad_norm_ratio=1.0 / 7 * step)
        row.update(step=step, stage=1 + (step > 4), epoch=1, lr=5e-5 * (8 - step) / 7)
        rows.append(row)
    return rows


HISTORY = [
    {"stage": 1, "epoch": 1, "step": 4, "dev_scores": [0.5011467889908257, 0.75, 0.8123]},
    {"stage": 2, "epoch": 1, "step": 7, "dev_scores": [0.6, 0.7, 0.8]},
]


def _same(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    both_nan = lambda k: isinstance(a[k], float) and math.isnan(a[k]) and math.isnan(b[k])  # noqa: E731
    return all(a[k] == b[k] or both_nan(k) for k in a)


def test_round_trip_is_exact(tmp_path):
    steps = _steps()
    write_run_log(tmp_path, RUN, HISTORY, steps)
    log = read_run_log(tmp_path)
    assert log.run == RUN
    assert log.history == HISTORY
    assert len(log.steps) == len(steps)
    assert all(_same(a, b) for a, b in zip(log.steps, steps))
    assert all(type(r["altered"]) is bool and type(r["stage"]) is int for r in log.steps)


def test_dvclive_layout_and_summary(tmp_path):
    write_run_log(tmp_path, RUN, HISTORY, _steps())
    live = tmp_path / LIVE_DIR
    assert (live / "plots/metrics/train/loss.tsv").read_text().splitlines()[0] == "step\tloss"
    summary = json.loads((live / "metrics.json").read_text())  # DVCLive's summary: what `dvc exp show` lists
    assert summary["dev"]["score_L6"] == 0.8 and summary["step"] == 7
    assert not (live / DVC_YAML).exists() and not (tmp_path / DVC_YAML).exists()


def test_single_objective_run_has_no_rule_records(tmp_path):
    steps = [{"main": 0.5, "loss": 0.5, "step": 1, "stage": 1, "epoch": 1, "lr": 1e-5}]
    write_run_log(tmp_path, {**RUN, "exits": [6]}, [], steps)
    assert read_run_log(tmp_path).steps == steps
    assert not (tmp_path / LIVE_DIR / "plots/metrics/train/cosine.tsv").exists()


def test_legacy_campaign_run_is_read(tmp_path):
    steps = _steps()[:2]
    (tmp_path / LEGACY_STEPS).write_text("".join(json.dumps(r) + "\n" for r in steps))
    (tmp_path / LEGACY_HISTORY).write_text(json.dumps({**RUN, "epochs": HISTORY}))
    log = read_run_log(tmp_path)
    assert log.run == RUN and log.history == HISTORY and log.steps[0]["main"] == steps[0]["main"]


def test_missing_log_is_one_line(tmp_path):
    with pytest.raises(UserError, match="no training log"):
        read_run_log(tmp_path)
