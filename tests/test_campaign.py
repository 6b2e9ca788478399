"""The seeds campaign: run spec, one run end to end, aggregation against plain references,
and the committed reports against the committed runs."""

from __future__ import annotations

import io
import json
import os
import statistics
from pathlib import Path

import pytest
import torch
import yaml
from rich.console import Console
from typer.testing import CliRunner

from aclpipe.cli import app, parse_list
from aclpipe.errors import UserError
from aclpipe.study.campaign import load_campaign
from aclpipe.study.campaign_report import mean_sd, summarise_task, verdict, write_reports
from aclpipe.study.campaign_runner import _run_logged, pending, run_pending

REPO = Path(__file__).resolve().parents[1]


def write_campaign(folder: Path, base: dict, **spec) -> Path:
    """``folder/campaign/params.yaml``: the tiny model's params plus a campaign section."""
    campaign = {"tasks": ["sst2"], "seeds": [1, 2], "runs": ["ce", "joint"], **spec}
    path = folder / "campaign" / "params.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({**base, "campaign": campaign}), encoding="utf-8")
    return path


# --- statistics on hand-checkable numbers -----------------------------------------------------


def test_mean_and_sample_sd() -> None:
    figure = mean_sd([0.80, 0.90, 0.85])
    assert figure["n"] == 3 and figure["mean"] == pytest.approx(0.85)
    assert figure["sd"] == pytest.approx(0.05)  # sqrt((0.0025 + 0.0025 + 0) / 2)
    assert mean_sd([0.7]) == {"mean": 0.7, "sd": None, "n": 1}
    assert mean_sd([]) == {"mean": None, "sd": None, "n": 0}


def test_verdict_calls_a_gap_within_one_sd_a_tie() -> None:
    a, b = mean_sd([0.80, 0.90]), mean_sd([0.78, 0.80])  # sd 0.0707 and 0.0141
    assert verdict(a, b) == "tie"  # gap 0.06 <= 0.0707
    c = mean_sd([0.90, 0.91])
    assert verdict(c, b) == "better" and verdict(b, c) == "worse"  # gap 0.115 > 0.0141
    assert verdict(mean_sd([0.9]), b) == "too few seeds"


# --- aggregation from hand-built run folders --------------------------------------------------


def fake_run(root: Path, task: str, run: str, method: str, seed: int, per_exit: list[float],
             points: list[tuple[float, float]], cosines: list[float] | None = None) -> None:  # fmt: skip
    """A run folder as ``campaign run`` writes it, with chosen scores: ``per_exit`` scores at
    layers 1..E and sweep ``points`` as (score, layer speed-up)."""
    folder = root / "runs" / task / f"{run}-s{seed}"
    folder.mkdir(parents=True)
    exits = list(range(7 - len(per_exit), 7))
    metrics = {
        "exits": exits,
        "final_score": per_exit[-1],
        "average_over_exits": sum(per_exit) / len(per_exit),
        "splits": {
            "dev": {"per_exit": [{"layer": k, "score": s} for k, s in zip(exits, per_exit)]}
        },
    }
    curves = {
        "full_model": {"score": per_exit[-1], "expected_time_ratio": 1.0},
        "points": [{"policy": "entropy", "threshold": 0.1 * i, "score": s, "layer_speedup": x,
                    "mean_exit_layer": 6 / x, "expected_time_ratio": 1 / x}
                   for i, (s, x) in enumerate(points)],
    }  # fmt: skip
    record = {"task": task, "run": run, "method": method, "seed": seed,
              "overrides": ["data.max_length=16", f"train.seed={seed}"], "data": {"splits": {}}}  # fmt: skip
    (folder / "metrics.json").write_text(json.dumps(metrics))
    (folder / "curves.json").write_text(json.dumps(curves))
    (folder / "run.json").write_text(json.dumps(record))
    rows = [{"step": i + 1, "cosine": c, "altered": c < 0} for i, c in enumerate(cosines or [])]
    (folder / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def hand_built(tmp_path: Path, params_dict) -> Path:
    path = write_campaign(tmp_path, params_dict(None), runs=["ce", "acl", "joint", "acl-cl"])
    root = path.parent
    for seed, ce in ((1, 0.80), (2, 0.84)):
        fake_run(root, "sst2", "ce", "ce", seed, [ce], [])
    fake_run(root, "sst2", "acl", "acl", 1, [0.86], [], cosines=[1.0, 0.0, -1.0, 0.5])
    fake_run(root, "sst2", "acl", "acl", 2, [0.88], [], cosines=[-0.5, 0.5])
    # joint: exits 1..6; sweep points (score, layer speed-up)
    fake_run(root, "sst2", "joint", "joint", 1, [0.60, 0.70, 0.75, 0.80, 0.82, 0.82],
             [(0.82, 1.2), (0.81, 1.5), (0.79, 2.0), (0.70, 3.0)])  # fmt: skip
    fake_run(root, "sst2", "joint", "joint", 2, [0.62, 0.72, 0.77, 0.80, 0.81, 0.84],
             [(0.83, 1.1), (0.80, 1.8), (0.77, 2.5)])  # fmt: skip
    return path


def test_summary_against_plain_references(hand_built: Path) -> None:
    summary = summarise_task(load_campaign(hand_built), "sst2")
    runs = summary["runs"]
    assert runs["ce"]["final"]["mean"] == pytest.approx(0.82)
    assert runs["ce"]["final"]["sd"] == pytest.approx(statistics.stdev([0.80, 0.84]))
    joint = runs["joint"]
    seeds = [[0.60, 0.70, 0.75, 0.80, 0.82, 0.82], [0.62, 0.72, 0.77, 0.80, 0.81, 0.84]]
    for i, figure in enumerate(joint["per_exit"]):
        assert figure["mean"] == pytest.approx((seeds[0][i] + seeds[1][i]) / 2)
    shallow = [sum(s[:3]) / 3 for s in seeds]  # layers 1..3, per seed, then over seeds
    assert joint["shallow_exits"] == [1, 2, 3]
    assert joint["shallow"]["mean"] == pytest.approx(sum(shallow) / 2)
    assert joint["shallow"]["sd"] == pytest.approx(statistics.stdev(shallow))
    # Budgets from ce's mean 0.82. 0 points: seed 1 reaches 1.2x (0.82), seed 2 1.1x (0.83).
    # 2 points (>= 0.80): 1.5x and 1.8x. 5 points (>= 0.77): 2.0x and 2.5x.
    budgets = joint["budgets"]
    assert budgets["0"]["mean"] == pytest.approx(1.15) and budgets["0"]["seeds_reaching"] == 2
    assert budgets["2"]["mean"] == pytest.approx(1.65)
    assert budgets["5"]["mean"] == pytest.approx(2.25)
    assert "budgets" not in runs["ce"]  # single exit: nothing to trade
    # Angles: cosines 1, 0, -1, 0.5 -> 0, 90, 180, 60 degrees; -0.5, 0.5 -> 120, 60.
    angles = runs["acl"]["angles"]
    assert angles["steps"] == 6
    assert angles["mean_angle"] == pytest.approx((0 + 90 + 180 + 60 + 120 + 60) / 6)
    assert angles["share_over_90"]["mean"] == pytest.approx((1 / 4 + 1 / 2) / 2)  # 90 is not over
    assert sum(angles["histogram"]) == 6 and angles["histogram"][-1] == 1  # 180 in the last bin
    answers = {q["question"]: q for q in summary["questions"]}
    acl_ce = answers["Does ACL beat CE on the final exit?"]
    assert acl_ce["verdict"] == "better"  # 0.87 against 0.82: gap 0.05 > the larger sd 0.0283
    assert acl_ce["a_figure"]["mean"] == pytest.approx(0.87)
    assert answers["Does ACL-CL beat RomeBERT on the shallow exits?"]["verdict"] == "not run yet"
    assert summary["expected_runs"]["acl-cl"] == [1, 2]


def test_every_mean_is_over_the_seeds_every_run_finished(tmp_path: Path, params_dict) -> None:
    path = write_campaign(tmp_path, params_dict(None), runs=["ce", "acl"], seeds=[1, 2, 3])
    for seed, score in ((1, 0.80), (2, 0.84), (3, 0.60)):  # ce has seed 3, acl does not yet
        fake_run(path.parent, "sst2", "ce", "ce", seed, [score], [])
    for seed, score in ((1, 0.86), (2, 0.88)):
        fake_run(path.parent, "sst2", "acl", "acl", seed, [score], [])
    summary = summarise_task(load_campaign(path), "sst2")
    assert summary["seeds"] == [1, 2] and summary["left_out"] == {"ce": [3]}
    assert summary["runs"]["ce"]["final"]["mean"] == pytest.approx(0.82)  # seeds 1 and 2 only
    assert summary["runs"]["ce"]["seeds"] == [1, 2]
    assert summary["expected_runs"] == {"ce": [], "acl": [3]}
    reports = tmp_path / "reports"
    write_reports(load_campaign(path), reports)
    text = (reports / "sst2" / "results.md").read_text()
    assert "(5 of 6 runs done)" in text and "Not run yet: acl (seeds 3)" in text
    assert "Finished but left out until every run has that seed: ce (seeds 3)" in text


def test_reports_are_written_whole(hand_built: Path, tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    write_reports(load_campaign(hand_built), reports)
    text = (reports / "sst2" / "results.md").read_text()
    assert "| ce | ce |" in text and "Not run yet: acl-cl (seeds 1, 2)" in text
    assert "No seed is finished by every run yet" in text  # acl-cl has none
    assert "82.0 ± 2.8" in text  # ce: mean 0.82, sd 0.0283, x100
    for name in ("results.json", "results_exits.png", "results_angles.png"):
        assert (reports / "sst2" / name).stat().st_size > 0
    overview = (reports / "README.md").read_text()
    assert "6 of 8 runs done" in overview and "[sst2](sst2/results.md)" in overview


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
    assert campaign.run_dir("sst2", "acl-nograd", 2) == path.parent / "runs/sst2/acl-nograd-s2"


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
    flag = ["--campaign", "campaign/params.yaml"]
    result = runner.invoke(app, ["campaign", "prepare", "--task", "sst2", *flag])
    assert result.exit_code == 0, result.output
    for run in ("ce", "acl-nograd", "joint"):  # seed 1 one stage at a time, as DVC runs them
        args = ["campaign", "run", "--task", "sst2", "--run", run, "--seed", "1", *flag]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
    seed_1 = {p: p.stat().st_mtime_ns for p in (tmp_path / "campaign/runs").rglob("*-s1/*")}
    result = runner.invoke(app, ["campaign", "run-pending", "--workers", "2", *flag])
    assert result.exit_code == 0, result.output  # seed 2 in two worker processes
    assert "3 runs to do, 2 at a time" in result.output and "3 runs written" in result.output
    commit = "dvc commit -f " + " ".join(
        f"campaign/dvc.yaml:run@2-sst2-{run}" for run in ("acl-nograd", "ce", "joint")
    )
    assert commit in " ".join(result.output.split())  # the stages to record, whatever the wrap
    assert {p: p.stat().st_mtime_ns for p in seed_1} == seed_1  # finished runs are not redone
    assert (tmp_path / "campaign/models/sst2/joint-s2.log").read_text().strip()
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
    run_dir = tmp_path / "campaign/runs/sst2/acl-nograd-s2"
    record = json.loads((run_dir / "run.json").read_text())
    assert record["method"] == "acl" and record["params"]["train"]["seed"] == 2
    assert record["params"]["methods"]["acl"]["acl_grad"] is False
    assert record["environment"]["device"] == "cpu"  # the tiny params set train.device cpu
    assert record["environment"]["torch"] == torch.__version__
    assert {p.name for p in run_dir.iterdir()} == {
        "metrics.json", "curves.json", "curves.csv", "dvclive", "run.json", "predictions.npz"
    }  # fmt: skip
    assert not (tmp_path / "campaign/models/sst2/acl-nograd-s2").exists()  # weights dropped
    result = runner.invoke(app, ["campaign", "report", *flag])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "reports/sst2/results.json").read_text())
    finals = [
        json.loads((tmp_path / f"campaign/runs/sst2/joint-s{s}/metrics.json").read_text())
        for s in (1, 2)
    ]
    expected = statistics.fmean(m["final_score"] for m in finals)
    assert summary["runs"]["joint"]["final"]["mean"] == pytest.approx(expected)
    assert summary["runs"]["acl-nograd"]["angles"]["steps"] > 0  # plain sum, angles recorded
    assert summary["data"]["splits"]["train"]["examples"] > 0


# --- the committed results --------------------------------------------------------------------


def committed_tasks() -> list[str]:
    runs = REPO / "campaign" / "runs"
    return sorted(p.name for p in runs.iterdir()) if runs.exists() else []


@pytest.mark.skipif(not committed_tasks(), reason="no campaign runs committed yet")
def test_committed_reports_match_committed_runs(tmp_path: Path) -> None:
    """reports/<task>/results.{json,md} and reports/README.md are what the committed run
    folders give (the check behind `dvc repro -s campaign/dvc.yaml:report`)."""
    cwd = os.getcwd()
    os.chdir(REPO)  # the campaign's paths are relative to the repository root
    try:
        write_reports(load_campaign(Path("campaign/params.yaml")), tmp_path)
    finally:
        os.chdir(cwd)
    for task in committed_tasks():
        for name in ("results.json", "results.md"):
            rebuilt = (tmp_path / task / name).read_text(encoding="utf-8")
            assert rebuilt == (REPO / "reports" / task / name).read_text(encoding="utf-8"), (
                f"reports/{task}/{name} is stale: run `aclpipe campaign report`"
            )
    overview = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert overview == (REPO / "reports" / "README.md").read_text(encoding="utf-8")


def test_run_pending_helpers(tmp_path: Path, params_dict) -> None:
    path = write_campaign(tmp_path, params_dict(None), runs=["ce", "joint"], seeds=[1, 2])
    campaign = load_campaign(path)
    assert parse_list([" sst2 ,sst2"], "--task") == ["sst2"]  # stripped, repeats dropped
    assert parse_list(["2,1", "2", "3"], "--seed", int) == [2, 1, 3]  # repeated and commas
    assert parse_list(None, "--seed", int) is None and parse_list([], "--seed") is None
    with pytest.raises(UserError, match="--task 'sst2,' has an empty item"):
        parse_list(["sst2,"], "--task")
    fake_run(path.parent, "sst2", "ce", "ce", 1, [0.8], [])
    assert pending(campaign) == [("sst2", "joint", 1), ("sst2", "ce", 2), ("sst2", "joint", 2)]
    assert pending(campaign, seeds=[2]) == [("sst2", "ce", 2), ("sst2", "joint", 2)]
    with pytest.raises(UserError, match="is not prepared: run `aclpipe campaign prepare"):
        run_pending(campaign, 2, Console(file=io.StringIO()))
    # a failing run leaves its traceback in its log (here: no prepared data)
    with pytest.raises(UserError):
        _run_logged(str(path), "run", "sst2", "joint", 2, 1)
    log = (path.parent / "models/sst2/joint-s2.log").read_text()
    assert "Traceback" in log and "UserError" in log
