"""A tiny few-shot study end to end on the tiny model: the campaign's runner with N as one more
axis (draws prepared per seed, runs named <run>-n<N>), its records, and its report."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from aclpipe.cli import app
from aclpipe.errors import UserError
from aclpipe.layout import RUN_RECORD, Layout
from aclpipe.study import wallclock
from aclpipe.study.campaign import load_campaign
from aclpipe.study.fewshot_report import (
    BELOW,
    ON,
    _weighted_sd,
    against_majority,
    spread_claim,
    spread_ratio,
)
from aclpipe.study.measures import Measure

STUDY = {
    "tasks": ["sst2"],
    "seeds": [1, 2, 3],
    "runs": ["ce", "acl-nograd"],
    "variants": {"acl-nograd": {"method": "acl", "set": {"acl_grad": False}}},
    "fewshot": [4, 8],
    "fewshot_settings": {4: {"train": {"epochs": 3}}, 8: {"train": {"epochs": 2}}},
}


def write_study(folder: Path, base: dict, **spec) -> Path:
    path = folder / "fewshot" / "params.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = {**base, "campaign": {**STUDY, **spec}}
    raw["train"].update(batch_size=4, score_each_epoch=False)
    raw["data"].update(validation_fraction=0.25)
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def test_study_params_set_the_draw_the_recipe_and_the_seed(tmp_path, params_dict) -> None:
    study = load_campaign(write_study(tmp_path, params_dict(None)))
    assert study.runs == ["ce-n4", "acl-nograd-n4", "ce-n8", "acl-nograd-n8"]
    params = study.params("sst2", "acl-nograd-n8", 3)
    assert (params.data.fewshot_examples, params.data.fewshot_seed, params.train.seed) == (8, 3, 3)
    assert params.train.epochs == 2 and params.method("acl").acl_grad is False
    assert study.data_dir("sst2", "ce-n8", 3) == tmp_path / "fewshot/data/sst2/s3/n8"
    assert study.stage("sst2", "ce-n8", 3) == "run@3-sst2-8-ce"  # fewshot/dvc.yaml's matrix


def test_pending_runs_go_n_by_n_then_seed_by_seed(tmp_path, params_dict) -> None:
    from aclpipe.study.campaign_runner import pending

    study = load_campaign(write_study(tmp_path, params_dict(None), tasks=["sst2", "rte"]))
    study.run_dir("sst2", "ce-n4", 1).mkdir(parents=True)  # done: not pending
    jobs = pending(study)
    assert len(jobs) == 2 * 4 * 3 - 1
    n4 = [(t, r, s) for s in (1, 2, 3) for t in ("sst2", "rte") for r in ("ce-n4", "acl-nograd-n4")]
    n8 = [(t, r, s) for s in (1, 2, 3) for t in ("sst2", "rte") for r in ("ce-n8", "acl-nograd-n8")]
    assert jobs == [job for job in n4 if job != ("sst2", "ce-n4", 1)] + n8
    assert pending(study, seeds=[2], tasks=["rte"]) == [
        ("rte", "ce-n4", 2), ("rte", "acl-nograd-n4", 2), ("rte", "ce-n8", 2), ("rte", "acl-nograd-n8", 2)
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "message"),
    [({"fewshot": [8, 4]}, "each N once, ascending"),
     ({"fewshot": [0]}, "whole numbers > 0"),
     ({"fewshot_settings": {5: {"train": {}}}}, "not an N of campaign.fewshot"),
     ({"fewshot_settings": {4: {"methods": {}}}}, "only data, train"),
     ({"ablations": ["scl"]}, "no ablations")],
)  # fmt: skip
def test_bad_study_files_fail_in_one_line(tmp_path, params_dict, spec, message) -> None:
    with pytest.raises(UserError, match=message):
        load_campaign(write_study(tmp_path, params_dict(None), **spec))


def test_weighted_sd_is_the_sd_of_the_drawn_multiset() -> None:
    rng = np.random.default_rng(0)
    values, counts = rng.normal(size=(5, 4)), rng.integers(0, 3, size=(5, 4))
    counts[:, 0] += 2  # at least two draws per resample
    for r in range(5):
        multiset = np.repeat(values[r], counts[r])
        assert _weighted_sd(values, counts)[r] == pytest.approx(np.std(multiset, ddof=1))


def test_spread_ratio_of_a_constant_baseline_is_undefined_and_of_itself_one() -> None:
    from aclpipe.data.tasks import get_task

    task, rng = get_task("sst2"), np.random.default_rng(1)
    labels = rng.integers(0, 2, 40)
    runs = {s: Measure("final", rng.integers(0, 2, (1, 40))) for s in range(1, 6)}
    same = spread_ratio(task, runs, runs, labels, resamples=200)
    assert same["ratio"] == pytest.approx(1.0) and same["low"] == same["high"] == pytest.approx(1)
    assert same["verdict"] == "inconclusive"
    constant = {s: Measure("final", np.zeros((1, 40), dtype=int)) for s in range(1, 6)}
    assert spread_ratio(task, runs, constant, labels, 200)["verdict"].startswith("undefined")


def test_a_method_is_above_on_or_below_the_majority_class() -> None:
    from aclpipe.data.tasks import get_task
    from aclpipe.study.fewshot_markdown import _on_majority

    task = get_task("sst2")
    labels = np.array([1] * 30 + [0] * 10)  # the majority guess (1) scores 75%
    floor = {s: Measure("final", np.ones((1, 40), dtype=int)) for s in (1, 2, 3)}
    perfect = {s: Measure("final", labels[None]) for s in (1, 2, 3)}
    minority = {s: Measure("final", np.zeros((1, 40), dtype=int)) for s in (1, 2, 3)}  # 25%
    mixed = {s: Measure("final", np.r_[np.ones(38), np.zeros(2)][None].astype(int)) for s in (1, 2, 3)}
    verdict = {name: against_majority(task, runs, floor, labels, 200)["verdict"]
               for name, runs in (("ce", perfect), ("scl", minority), ("acl", mixed))}  # fmt: skip
    assert verdict == {"ce": "better", "scl": BELOW, "acl": ON}  # acl: 2 more of 40 right, not told apart
    cell = {"task": "sst2", "n": 20, "majority": 0.75,
            "runs": {r: {"vs_majority": {"verdict": v}} for r, v in verdict.items()}}  # fmt: skip
    assert _on_majority([cell]) == ["- sst2 at N = 20: scl, acl at or below the majority class (75.0); scl below it"]
    cell["runs"]["ce"]["vs_majority"]["verdict"] = ON
    assert _on_majority([cell])[0].endswith("(75.0); scl below it: its comparisons are uninformative")


def test_a_spread_between_majority_guessers_is_uninformative() -> None:
    from aclpipe.data.tasks import get_task

    task, rng = get_task("sst2"), np.random.default_rng(2)
    labels = rng.integers(0, 2, 40)
    measures = {run: {s: Measure("final", rng.integers(0, 2, (1, 40))) for s in range(1, 9)}
                for run in ("ce", "scl")}  # fmt: skip
    bases = ["ce", "scl", "acl"]
    judged = spread_claim(task, measures, "scl", "ce", bases, {"scl"}, labels, 200)
    assert judged["verdict"] in {"lower", "higher", "inconclusive"} and judged["low"] is not None
    assert judged == spread_ratio(task, measures["scl"], measures["ce"], labels, 200)
    unjudged = spread_claim(task, measures, "scl", "ce", bases, set(), labels, 200)
    assert unjudged == {**judged, "verdict": "uninformative"}  # the numbers stay, shown
    assert spread_claim(task, measures, "acl", "ce", bases, set(), labels)["verdict"] == "not run yet"
    assert spread_claim(task, measures, "acl", "ce", ["ce"], set(), labels)["verdict"] == "not in this study"
    few = {run: dict(list(m.items())[:2]) for run, m in measures.items()}
    assert spread_claim(task, few, "scl", "ce", bases, set(), labels)["verdict"].startswith("too few")


def test_tiny_study_end_to_end(tmp_path: Path, params_dict, glue_dir: Path, monkeypatch) -> None:
    write_study(tmp_path, params_dict(glue_dir))
    monkeypatch.chdir(tmp_path)
    runner, flag = CliRunner(), ["--campaign", "fewshot/params.yaml"]
    result = runner.invoke(app, ["campaign", "run-pending", "--workers", "1", *flag])
    assert result.exit_code == 2 and "fewshot/data/sst2/s1/n4 is not prepared" in result.output
    assert "--seed 1" in result.output
    result = runner.invoke(app, ["campaign", "prepare", *flag])  # every seed's draws
    assert result.exit_code == 0 and "(draw of 8, seed 3)" in result.output, result.output
    args = ["campaign", "run", "--task", "sst2", "--run", "ce-n4", "--seed", "1", *flag]
    assert runner.invoke(app, args).exit_code == 0  # one run, as a DVC stage runs it
    result = runner.invoke(app, ["campaign", "run-pending", "--workers", "2", *flag])
    assert result.exit_code == 0 and "11 runs to do, 2 at a time" in result.output, result.output
    assert "fewshot/dvc.yaml:run@3-sst2-8-acl-nograd" in " ".join(result.output.split())
    records = {
        p.parent.name: json.loads(p.read_text())
        for p in (tmp_path / "fewshot/runs/sst2").glob("*/run.json")
    }
    assert len(records) == 12
    for name, record in records.items():  # the draw is recorded with every run
        run, n, seed = name.rsplit("-n", 1)[0], *map(int, name.rsplit("-n", 1)[1].split("-s"))
        draw = record["data"]["fewshot"]
        assert (draw["examples"], draw["seed"], record["params"]["train"]["seed"]) == (n, seed, seed)
        twin = records[f"{'ce' if run != 'ce' else 'acl-nograd'}-n{n}-s{seed}"]
        assert twin["data"]["fewshot"]["ids"] == draw["ids"]  # one draw per seed, every method
        assert "validation" not in record["data"]["splits"]  # no validation split scored
    assert records["ce-n4-s1"]["data"]["fewshot"]["ids"] != records["ce-n4-s2"]["data"]["fewshot"]["ids"]
    result = runner.invoke(app, ["campaign", "report", *flag])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "reports/fewshot/results.json").read_text())
    cell = next(c for c in summary["cells"] if c["n"] == 8)
    assert cell["finished"] == cell["planned"] == 6
    ce = cell["runs"]["ce"]
    metrics = [
        json.loads((tmp_path / f"fewshot/runs/sst2/ce-n8-s{s}/metrics.json").read_text())
        for s in (1, 2, 3)
    ]
    finals = [m["final_score"] for m in metrics]
    assert ce["mean"] == pytest.approx(np.mean(finals)) and ce["n"] == 3
    assert ce["sd"] == pytest.approx(np.std(finals, ddof=1))
    assert cell["majority"] == metrics[0]["splits"]["dev"]["majority_score"]
    allowed = {"better", "comparable", "worse", "inconclusive", "uninformative", "not in this study"}
    assert {c["verdict"] for c in cell["claims"]} <= allowed
    spread = next(s for s in cell["spreads"] if s["a"] == "acl")  # acl is not run here
    assert spread["verdict"] == "not in this study"
    readme = (tmp_path / "reports/fewshot/README.md").read_text()
    assert "Runs done: 12 of 12" in readme and "## sst2" in readme
    for png in ("fewshot_scores.png", "fewshot_spread.png"):
        assert (tmp_path / "reports/fewshot" / png).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("low", "high", "word"),
    [(0.002, 0.03, "better"), (-0.03, -0.001, "worse"), (-0.009, 0.02, "comparable"),
     (-0.011, 0.02, "inconclusive"), (0.0, 0.0, "comparable")],
)  # fmt: skip
def test_verdict_words_follow_the_interval_and_the_margin(low, high, word) -> None:
    from aclpipe.study.verdicts import MARGIN, verdict

    assert MARGIN == 0.01 and verdict(low, high) == word


def test_prepare_seed_needs_a_few_shot_study(tmp_path, params_dict, monkeypatch) -> None:
    path = tmp_path / "campaign" / "params.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump({**params_dict(None), "campaign": {
        "tasks": ["sst2"], "seeds": [1], "runs": ["ce"]}}), encoding="utf-8")  # fmt: skip
    args = ["campaign", "prepare", "--seed", "1", "--campaign", str(path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "has no campaign.fewshot" in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1


def test_campaign_params_prints_an_ordinary_params_file(tmp_path, params_dict) -> None:
    from aclpipe.config import params_from_dict

    path = write_study(tmp_path, params_dict(None))
    args = ["campaign", "params", "--task", "sst2", "--run", "acl-nograd-n8", "--seed", "2"]
    result = CliRunner().invoke(app, [*args, "--campaign", str(path)])
    assert result.exit_code == 0, result.output
    assert "aclpipe finetune --params FILE --task sst2 --method acl" in result.output
    params = params_from_dict(yaml.safe_load(result.output))  # the comments are YAML comments
    assert params == load_campaign(path).params("sst2", "acl-nograd-n8", 2)
    assert (params.data.fewshot_examples, params.data.fewshot_seed, params.train.seed) == (8, 2, 2)
    result = CliRunner().invoke(app, [*args[:-1], "7", "--campaign", str(path)])
    assert result.exit_code == 2 and "seed 7 is not in campaign.seeds" in result.output


# the study's wall clock (aclpipe.study.wallclock): runs timed from their logs, merged into
# the ledger, summed into the union of their intervals
T0 = 1_796_400_000  # 2026-12-04T16:00:00 UTC


@pytest.mark.parametrize(
    ("intervals", "union"),
    [([], 0), ([(0, 10)], 10), ([(0, 10), (5, 15), (20, 30)], 25), ([(0, 10), (2, 3)], 10),
     ([(20, 30), (0, 10), (10, 20)], 30), ([(0, 5), (1, 2), (3, 8)], 8)],
)  # fmt: skip
def test_union_counts_overlapping_runs_once_and_gaps_not_at_all(intervals, union) -> None:
    assert wallclock.union_seconds(intervals) == union


def finish(root: Path, task: str, run: str, seed: int, start: int, end: int) -> None:
    """A finished run under the study folder ``root``: its folder with run.json, its log with
    modification time ``end`` (birth times are the file system's: the test fixes them)."""
    layout = Layout(root)
    (layout.run(task, run, seed)).mkdir(parents=True)
    (layout.run(task, run, seed) / RUN_RECORD).write_text("{}")
    log = layout.run_log(task, run, seed)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"started {start}\n")
    os.utime(log, (end, end))


def test_record_times_finished_runs_and_keeps_earlier_rows(
    tmp_path: Path, params_dict, monkeypatch
) -> None:
    study = load_campaign(write_study(tmp_path, params_dict(None)))
    # the test's birth time: the log's first line (real logs: the file system's)
    monkeypatch.setattr(
        wallclock, "born_and_modified",
        lambda log: (int(log.read_text().split()[1]), int(log.stat().st_mtime)),
    )  # fmt: skip
    worktree = tmp_path / "worktree" / "fewshot"
    finish(worktree, "sst2", "ce-n4", 1, T0, T0 + 60)
    finish(worktree, "sst2", "acl-nograd-n4", 1, T0 + 30, T0 + 100)  # side by side
    Layout(worktree).run_log("sst2", "ce-n8", 2).write_text(f"started {T0}\n")  # still running
    path, rows = wallclock.record(study, worktree)
    assert (path, len(rows)) == (study.root / wallclock.LEDGER, 2)
    first = wallclock.read(path)
    assert first == rows  # what it returns is what it wrote
    assert first[0] == {"task": "sst2", "run": "acl-nograd", "n": "4", "seed": "1",
                        "start_utc": "2026-12-04T16:00:30", "end_utc": "2026-12-04T16:01:40",
                        "seconds": "70"}  # fmt: skip
    # a later session in another worktree: the first one's logs are gone, its rows stay
    later = tmp_path / "later" / "fewshot"
    finish(later, "sst2", "ce-n8", 1, T0 + 7200, T0 + 7210)
    _, rows = wallclock.record(study, later)
    summary = wallclock.summarise(wallclock.read(path))
    assert len(rows) == summary["runs"] == 3
    assert summary["run_seconds"] == 60 + 70 + 10
    assert summary["wall_seconds"] == 100 + 10  # [T0, T0 + 100] and the later run
    assert [(c["n"], c["runs"], c["run_seconds"]) for c in summary["cells"]] == [(4, 2, 130), (8, 1, 10)]
    assert [(c["min_seconds"], c["max_seconds"]) for c in summary["cells"]] == [(60, 70), (10, 10)]
    assert (summary["first"], summary["last"]) == ("2026-12-04T16:00:00", "2026-12-04T18:00:10")
    # the report counts the runs finished in its own checkout only
    assert wallclock.finished_here(study, wallclock.read(path)) == []
    finish(study.root, "sst2", "ce-n8", 1, T0, T0 + 1)
    assert [r["n"] for r in wallclock.finished_here(study, wallclock.read(path))] == ["8"]


def test_wall_clock_section_gives_each_cells_mean_fastest_and_slowest(tmp_path, params_dict) -> None:
    from aclpipe.study.fewshot_markdown import _wallclock

    study = load_campaign(write_study(tmp_path, params_dict(None)))
    rows = [
        {"task": "sst2", "run": run, "n": "4", "seed": "1", "start_utc": start,
         "end_utc": end, "seconds": seconds}
        for run, start, end, seconds in [
            ("ce", "2026-12-04T16:00:00", "2026-12-04T16:01:00", "60"),
            ("scl", "2026-12-04T16:00:30", "2026-12-04T16:02:30", "120"),
        ]
    ]  # fmt: skip
    text = "\n".join(_wallclock(study, wallclock.summarise(rows), finished=3))
    assert "2 of the 3 finished runs are timed (1 ran before the ledger, untimed)" in text
    assert "| 4 | sst2 | 2 | 90 (60-120) | 0.05 |" in text
    assert _wallclock(study, None, finished=3) == []


def test_birth_time_of_a_new_file_is_read_where_the_file_system_keeps_it(tmp_path) -> None:
    log = tmp_path / "run.log"
    log.write_text("x")
    times = wallclock.born_and_modified(log)
    if times is None:
        pytest.skip("this file system keeps no birth times")
    assert times[0] <= times[1] and abs(times[1] - log.stat().st_mtime) < 1


def test_wallclock_without_a_runs_folder_fails_in_one_line(tmp_path, params_dict, monkeypatch) -> None:
    path = write_study(tmp_path, params_dict(None))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["campaign", "wallclock", "--campaign", str(path),
                                      "--from", str(tmp_path / "nowhere")])  # fmt: skip
    assert result.exit_code != 0
    assert result.output.strip().count("\n") == 0 and "has no runs/ folder" in result.output
    assert not (path.parent / wallclock.LEDGER).exists()
