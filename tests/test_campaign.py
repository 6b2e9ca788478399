"""The seeds campaign: run spec, one run end to end, and the committed reports against the
committed runs (the report's statistics: test_paired.py, test_campaign_report.py)."""

from __future__ import annotations

import io
import json
import os
import statistics
from pathlib import Path

import pytest
import torch
import yaml
from paths import REPO, at, campaign_at
from rich.console import Console
from typer.testing import CliRunner

from aclpipe.cli import app, parse_list
from aclpipe.errors import UserError
from aclpipe.host import cpu_name
from aclpipe.layout import (
    CAMPAIGN,
    CAMPAIGN_PARAMS,
    CURVES_CSV,
    CURVES_JSON,
    DVC_YAML,
    METRICS,
    PREDICTIONS,
    REPORTS_README,
    RESULTS_JSON,
    RESULTS_MD,
    RUN_RECORD,
    TRAINING_LOG,
    Layout,
)
from aclpipe.study.campaign.markdown import campaign_reports
from aclpipe.study.campaign.plan import load_campaign
from aclpipe.study.campaign.report import write_reports
from aclpipe.study.campaign.runner import _run_logged, pending, run_pending


def write_campaign(folder: Path, base: dict, **spec) -> Path:
    """``folder/campaign/params.yaml``: the tiny model's params plus a campaign section."""
    campaign = {"tasks": ["sst2"], "seeds": [1, 2], "runs": ["ce", "joint"], **spec}
    path = folder / CAMPAIGN_PARAMS
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({**base, "campaign": campaign}), encoding="utf-8")
    return path


# --- the spec and its errors ------------------------------------------------------------------


def test_run_params_apply_task_settings_variant_and_seed(tmp_path: Path, params_dict) -> None:
    path = write_campaign(
        tmp_path,
        params_dict(None),
        runs=["ce", "acl-nograd"],
        variants={"acl-nograd": {"method": "acl", "set": {"acl_grad": False}}},
        task_settings={"sst2": {"data": {"max_length": 16}, "train": {"epochs": 2}}},
    )
    campaign = load_campaign(path)
    params = campaign.params("sst2", "acl-nograd", 2)
    assert params.method("acl").acl_grad is False and params.train.seed == 2
    assert params.data.max_length == 16 and params.train.epochs == 2
    assert campaign.params("sst2", "ce", 1).method("acl").acl_grad is True  # only the variant
    assert campaign.run_dir("sst2", "acl-nograd", 2) == Layout(path.parent).runs("sst2") / "acl-nograd-s2"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"runs": ["ce", "nope"]}, "neither a method"),
        ({"variants": {"x": {"method": "bogus"}}, "runs": ["x"]}, "needs method"),
        ({"seeds": []}, "non-empty list"),
        ({"tasks": ["sst2"], "task_settings": {"rte": {"data": {}}}}, "not a task"),
        ({"task_settings": {"sst2": {"pipeline": {}}}}, "only data, train"),
        ({"extra": 1}, "unknown key campaign.extra"),
    ],
)
def test_bad_campaign_files_fail_in_one_line(tmp_path, params_dict, spec, message) -> None:
    path = write_campaign(tmp_path, params_dict(None), **spec)
    with pytest.raises(UserError, match=message):
        load_campaign(path)
    result = CliRunner().invoke(app, ["campaign", "report", "--campaign", str(path)])
    assert result.exit_code == 2 and message.split()[0] in result.output
    assert "Traceback" not in result.output


# --- one campaign end to end on the tiny model ------------------------------------------------


@pytest.mark.slow
def test_campaign_end_to_end(tmp_path: Path, params_dict, glue_dir: Path, monkeypatch) -> None:
    base = params_dict(glue_dir)
    write_campaign(
        tmp_path,
        base,
        runs=["ce", "acl-nograd", "joint"],
        variants={"acl-nograd": {"method": "acl", "set": {"acl_grad": False}}},
        task_settings={"sst2": {"train": {"record_angles": True}}},
    )
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    flag = ["--campaign", CAMPAIGN_PARAMS]
    result = runner.invoke(app, ["campaign", "prepare", "--task", "sst2,qnli", *flag])
    assert result.exit_code == 2 and "task 'qnli' is not in campaign.tasks" in result.output
    result = runner.invoke(app, ["campaign", "prepare", *flag])  # default: campaign.tasks
    assert result.exit_code == 0 and "prepared sst2 from local" in result.output, result.output
    for run in ("ce", "acl-nograd", "joint"):  # seed 1 one stage at a time, as DVC runs them
        args = ["campaign", "run", "--task", "sst2", "--run", run, "--seed", "1", *flag]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
    seed_1 = {p: p.stat().st_mtime_ns for p in campaign_at(tmp_path).runs().rglob("*-s1/*")}
    result = runner.invoke(app, ["campaign", "run-pending", "--workers", "2", *flag])
    assert result.exit_code == 0, result.output  # seed 2 in two worker processes
    assert "3 runs to do, 2 at a time" in result.output and "3 runs written" in result.output
    commit = "dvc commit -f " + " ".join(
        f"{CAMPAIGN}/{DVC_YAML}:run@2-sst2-{run}" for run in ("acl-nograd", "ce", "joint")
    )
    assert commit in " ".join(result.output.split())  # the stages to record, whatever the wrap
    assert {p: p.stat().st_mtime_ns for p in seed_1} == seed_1  # finished runs are not redone
    assert campaign_at(tmp_path).run_log("sst2", "joint", 2).read_text().strip()
    result = runner.invoke(app, ["campaign", "run-pending", *flag])
    assert result.exit_code == 0 and "0 runs to do" in result.output
    for args, message in [
        (["--seed", "7"], "seed 7 is not in campaign.seeds"),
        (["--seed", "1,x"], "is not a comma-separated list of whole numbers"),
        (["--task", "sst2,"], "has an empty item"),
        (["--task", "sst2", "-t", "qnli"], "task 'qnli' is not in campaign.tasks"),
        (["--workers", "0"], "--workers 0: give at least 1"),
    ]:
        result = runner.invoke(app, ["campaign", "run-pending", *args, *flag])
        assert result.exit_code == 2 and message in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1
    args = ["campaign", "run", "--task", "sst2", "--run", "ce", "--seed", "7", *flag]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "seed 7 is not in campaign.seeds" in result.output
    run_dir = campaign_at(tmp_path).run("sst2", "acl-nograd", 2)
    record = json.loads((run_dir / RUN_RECORD).read_text())
    assert record["method"] == "acl" and record["params"]["train"]["seed"] == 2
    assert record["params"]["methods"]["acl"]["acl_grad"] is False
    assert record["environment"]["device"] == "cpu"  # the tiny params set train.device cpu
    assert record["environment"]["torch"] == torch.__version__
    assert record["environment"]["cpu"] == cpu_name() != ""  # which host: timings differ by CPU
    assert {p.name for p in run_dir.iterdir()} == {
        METRICS, CURVES_JSON, CURVES_CSV, TRAINING_LOG, RUN_RECORD, PREDICTIONS
    }  # fmt: skip
    assert not campaign_at(tmp_path).scratch("sst2", "acl-nograd", 2).exists()  # weights dropped
    result = runner.invoke(app, ["campaign", "report", *flag])
    assert result.exit_code == 0, result.output
    summary = json.loads((campaign_reports(at(tmp_path).reports(), "sst2") / RESULTS_JSON).read_text())
    finals = [
        json.loads((campaign_at(tmp_path).run("sst2", "joint", s) / METRICS).read_text())
        for s in (1, 2)
    ]
    expected = statistics.fmean(m["final_score"] for m in finals)
    assert summary["runs"]["joint"]["final"]["mean"] == pytest.approx(expected)
    assert summary["runs"]["acl-nograd"]["angles"]["steps"] > 0  # plain sum, angles recorded
    assert summary["data"]["splits"]["train"]["examples"] > 0


# --- the committed results --------------------------------------------------------------------


def committed_tasks() -> list[str]:
    runs = campaign_at(REPO).runs()
    return sorted(p.name for p in runs.iterdir()) if runs.exists() else []


@pytest.mark.skipif(not committed_tasks(), reason="no campaign runs committed yet")
@pytest.mark.slow
def test_committed_reports_match_committed_runs(tmp_path: Path) -> None:
    """reports/campaign/<task>/results.{json,md} and reports/README.md are what the committed run
    folders give (the check behind `dvc repro -s campaign/dvc.yaml:report`)."""
    cwd = os.getcwd()
    os.chdir(REPO)  # the campaign's paths are relative to the repository root
    try:
        write_reports(load_campaign(Path(CAMPAIGN_PARAMS)), tmp_path)
    finally:
        os.chdir(cwd)
    for task in committed_tasks():
        for name in (RESULTS_JSON, RESULTS_MD):
            rebuilt = (campaign_reports(tmp_path, task) / name).read_text(encoding="utf-8")
            committed = campaign_reports(at(REPO).reports(), task) / name
            assert rebuilt == committed.read_text(encoding="utf-8"), (
                f"{committed.relative_to(REPO)} is stale: run `aclpipe campaign report`"
            )
    overview = (tmp_path / REPORTS_README).read_text(encoding="utf-8")
    assert overview == (at(REPO).reports() / REPORTS_README).read_text(encoding="utf-8")


def test_run_pending_helpers(tmp_path: Path, params_dict) -> None:
    path = write_campaign(tmp_path, params_dict(None), runs=["ce", "joint"], seeds=[1, 2])
    campaign = load_campaign(path)
    assert parse_list([" sst2 ,sst2"], "--task") == ["sst2"]  # stripped, repeats dropped
    assert parse_list(["2,1", "2", "3"], "--seed", int) == [2, 1, 3]  # repeated and commas
    assert parse_list(None, "--seed", int) is None and parse_list([], "--seed") is None
    with pytest.raises(UserError, match="--task 'sst2,' has an empty item"):
        parse_list(["sst2,"], "--task")
    finished = campaign.run_dir("sst2", "ce", 1)  # a run counts as done once its folder exists
    finished.mkdir(parents=True)
    assert pending(campaign) == [("sst2", "joint", 1), ("sst2", "ce", 2), ("sst2", "joint", 2)]
    assert pending(campaign, seeds=[2]) == [("sst2", "ce", 2), ("sst2", "joint", 2)]
    with pytest.raises(UserError, match="is not prepared: run `aclpipe campaign prepare"):
        run_pending(campaign, 2, Console(file=io.StringIO()))
    # a failing run leaves its traceback in its log (here: no prepared data); the log of an
    # earlier, killed attempt is replaced by a new file, so its birth is this attempt's start
    log = Layout(path.parent).run_log("sst2", "joint", 2)
    log.parent.mkdir(parents=True)
    log.write_text("killed attempt\n")
    stale = log.with_name("stale.log")
    stale.hardlink_to(log)  # keeps the old file; it would follow a truncation in place
    with pytest.raises(UserError):
        _run_logged(str(path), "run", "sst2", "joint", 2, 1)
    text = log.read_text()
    assert "Traceback" in text and "UserError" in text and "killed attempt" not in text
    assert stale.read_text() == "killed attempt\n"  # a new file, not the old one truncated
