"""The campaign report from synthetic run folders (run.json, metrics.json, predictions.npz
written by hand): figures against plain references, the claims with intervals, the waves
disclosure, the majority marks, the plots, and the one-line error for an old run folder."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pytest
import yaml
from paths import at
from typer.testing import CliRunner

from aclpipe.cli import app
from aclpipe.data.tasks import TASKS
from aclpipe.errors import UserError
from aclpipe.evaluation.metrics import compute_metrics, task_score
from aclpipe.layout import (
    CAMPAIGN,
    CAMPAIGN_PARAMS,
    LEGACY_STEPS,
    METRICS,
    PREDICTIONS,
    REPORTS_README,
    RESULTS_COST_PNG,
    RESULTS_EXITS_PNG,
    RESULTS_JSON,
    RESULTS_MD,
    RUN_RECORD,
    Layout,
)
from aclpipe.study import measures as scoring
from aclpipe.study.campaign import load_campaign
from aclpipe.study.campaign_markdown import campaign_reports
from aclpipe.study.campaign_overview import overview_markdown
from aclpipe.study.campaign_report import summarise_task, write_reports

TASK = TASKS["sst2"]
N_DEV, N_VAL, EXITS = 40, 30, 6
STACK = {"device": "cpu", "torch": "2.0", "cuda": "none", "transformers": "4.0", "python": "3.11"}


def outputs(seed: int, size: int, skill: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """Logits ``[E, size, 2]`` and labels of a run whose exit e is right with probability
    ``skill[e]`` (a single-exit run: one entry), with varied confidence."""
    rng = np.random.default_rng(seed)
    labels = np.arange(size) % 2
    logits = np.zeros((len(skill), size, 2), dtype=np.float32)
    for e, p in enumerate(skill):
        right = rng.random(size) < p
        winner = np.where(right, labels, 1 - labels)
        logits[e, np.arange(size), winner] = rng.uniform(0.1, 4.0, size)
    return logits, labels


def write_run(root: Path, run: str, method: str, seed: int, skill: list[float],
              data_seed: int | None = None, stack: dict | None = None,
              predictions: bool = True, majority: float = 0.5,
              cosines: list[float] | None = None) -> Path:  # fmt: skip
    """A run folder as ``campaign run`` writes it; ``data_seed`` fixes its outputs."""
    folder = Layout(root).run("sst2", run, seed)
    folder.mkdir(parents=True)
    data_seed = seed if data_seed is None else data_seed
    dev_logits, dev_labels = outputs(data_seed, N_DEV, skill)
    val_logits, val_labels = outputs(1000 + data_seed, N_VAL, skill)
    exits = list(range(EXITS - len(skill) + 1, EXITS + 1))
    if predictions:
        np.savez_compressed(
            folder / PREDICTIONS, exits=np.array(exits), num_layers=np.array(EXITS),
            dev_logits=dev_logits, dev_labels=dev_labels,
            validation_logits=val_logits, validation_labels=val_labels,
        )  # fmt: skip
    split = {"majority_score": majority, "per_exit": []}
    metrics = {"exits": exits, "splits": {"dev": split, "validation": split}}
    record = {
        "task": "sst2", "run": run, "method": method, "seed": seed,
        "overrides": [f"train.seed={seed}"], "environment": stack or STACK,
        "params": {"evaluate": {"grid_points": 5, "patience_eps": 0.1}},
        "data": {"splits": {"train": {"examples": 100}, "dev": {"examples": N_DEV}}},
        "command": f"aclpipe campaign run --task sst2 --run {run} --seed {seed}",
    }  # fmt: skip
    (folder / METRICS).write_text(json.dumps(metrics))
    (folder / RUN_RECORD).write_text(json.dumps(record))
    if cosines:  # the training log (its legacy form): one cosine per step
        rows = [{"step": i + 1, "cosine": c, "altered": c < 0} for i, c in enumerate(cosines)]
        (folder / LEGACY_STEPS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def write_campaign(folder: Path, base: dict, **spec) -> Path:
    campaign = {"tasks": ["sst2"], "seeds": [1, 2, 3], **spec}
    path = folder / CAMPAIGN_PARAMS
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({**base, "campaign": campaign}), encoding="utf-8")
    return path


MULTI = [0.55, 0.6, 0.7, 0.8, 0.85, 0.9]


@pytest.fixture
def built(tmp_path: Path, params_dict) -> Path:
    """ce, acl, deebert, joint, acl-cl over seeds 1-3, in waves: acl-cl has not run seed 3,
    deebert only seed 1. acl is always right; acl-cl has joint's outputs exactly."""
    path = write_campaign(tmp_path, params_dict(None),
                          runs=["ce", "acl", "deebert", "joint", "acl-cl"])  # fmt: skip
    root = path.parent
    for seed in (1, 2, 3):
        write_run(root, "ce", "ce", seed, [0.7])
        write_run(root, "acl", "acl", seed, [1.0], cosines=[1.0, 0.0, -1.0, 0.5][: seed + 1])
        write_run(root, "joint", "joint", seed, MULTI, data_seed=50 + seed)
    for seed in (1, 2):
        write_run(root, "acl-cl", "acl-cl", seed, MULTI, data_seed=50 + seed)
    write_run(root, "deebert", "deebert", 1, MULTI, data_seed=1, stack={**STACK, "device": "gpu"})
    return path


def plain(predictions, labels) -> float:
    return task_score(TASK, compute_metrics(TASK, predictions, labels))


def test_figures_against_plain_references(built: Path) -> None:
    campaign = load_campaign(built)
    summary = summarise_task(campaign, "sst2", resamples=200)
    assert summary["complete"] == [1]  # seed 2: deebert missing; seed 3: also acl-cl
    assert summary["missing"] == {"ce": [], "acl": [], "deebert": [2, 3], "joint": [],
                                  "acl-cl": [3]}  # fmt: skip
    assert summary["left_out"]["ce"] == [2, 3]
    ce = summary["runs"]["ce"]
    logits, labels = outputs(1, N_DEV, [0.7])
    assert ce["seeds"] == [1]
    assert ce["final"]["mean"] == pytest.approx(plain(logits[-1].argmax(-1), labels))
    joint = summary["runs"]["joint"]
    logits, labels = outputs(51, N_DEV, MULTI)
    per_exit = [plain(logits[e].argmax(-1), labels) for e in range(EXITS)]
    assert [x["mean"] for x in joint["per_exit"]] == pytest.approx(per_exit)
    assert joint["shallow"]["mean"] == pytest.approx(statistics.fmean(per_exit[:3]))
    assert joint["average"]["mean"] == pytest.approx(statistics.fmean(per_exit))
    # Budgets: every table seed counts, each picked on validation (measures.budget_pick),
    # counted from ce's full model of the same seed.
    from aclpipe.study.campaign_report import load_run

    ce_outputs = load_run("sst2", campaign.run_dir("sst2", "ce", 1))["outputs"]
    reference = scoring.final_scores(ce_outputs)
    assert reference[1] == pytest.approx(ce["final"]["mean"])  # ce's dev final exit, seed 1
    joint_outputs = load_run("sst2", campaign.run_dir("sst2", "joint", 1))["outputs"]
    pick = scoring.budget_pick(joint_outputs, 2, reference)
    assert summary["budget_reference"] == "ce"
    cell = joint["budgets"]["2"]
    assert cell["seeds"] == 1 and cell["speedup"] == pytest.approx(pick["dev_speedup"])
    assert cell["met"] == int(pick["met"]) and cell["own_reference"] == 0
    assert cell["dev_score"]["mean"] == pytest.approx(pick["dev_score"])
    assert pick["validation_floor"] == pytest.approx(reference[0] - 0.02)
    assert pick["dev_floor"] == pytest.approx(reference[1] - 0.02)
    assert "budgets" not in ce and ce["auc"] is None
    # Angles of the table seed (1): cosines 1, 0 -> 0 and 90 degrees.
    angles = summary["runs"]["acl"]["angles"]
    assert angles["steps"] == 2 and angles["mean_angle"] == pytest.approx(45)


def test_claims_use_the_seeds_both_runs_have(built: Path) -> None:
    summary = summarise_task(load_campaign(built), "sst2", resamples=200)
    claims = {c["question"]: c for c in summary["claims"]}
    acl_ce = claims["ACL beats CE on the final exit"]
    assert acl_ce["seeds"] == [1, 2, 3] and acl_ce["verdict"] == "better" and acl_ce["p"] == 0
    finals = [plain(outputs(s, N_DEV, [0.7])[0][0].argmax(-1), np.arange(N_DEV) % 2)
              for s in (1, 2, 3)]  # fmt: skip
    assert acl_ce["difference"] == pytest.approx(1 - statistics.fmean(finals))
    same = claims["ACL-CL beats joint on the average over exits"]
    assert same["seeds"] == [1, 2]  # acl-cl has no seed 3 yet
    assert (same["difference"], same["low"], same["high"]) == (0, 0, 0)
    assert same["verdict"] == "no detectable difference"
    auc = claims["ACL-CL beats joint on speed-quality (AUC)"]
    assert auc["verdict"] == "no detectable difference" and auc["difference"] == 0
    assert claims["ACL beats CE+SCL on the final exit"]["verdict"] == "not in this campaign"
    floor = summary["noise_floor"]
    assert floor["seeds"] == [1]  # deebert has seed 1 only
    # The family: the 7 tested claims (acl-ce; acl-cl against deebert and joint on three
    # measures each), Holm over their two-sided p; the noise floor and untested claims are out.
    tested = [c for c in summary["claims"] if "difference" in c]
    assert summary["family"] == len(tested) == 7
    assert all("holm_p" in c for c in tested) and "holm_p" not in floor
    assert "holm_p" not in claims["ACL beats CE+SCL on the final exit"]
    from aclpipe.study.paired import holm

    assert [c["holm_p"] for c in tested] == holm([c["p_two_sided"] for c in tested])
    assert acl_ce["p_two_sided"] == pytest.approx(2 / 201)  # no resample at or below 0
    assert acl_ce["holm_p"] == pytest.approx(7 * 2 / 201)  # the smallest p: times the family
    assert same["holm_p"] == 1.0


@pytest.mark.slow
def test_report_files(built: Path, tmp_path: Path) -> None:
    reports = at(tmp_path).reports()
    write_reports(load_campaign(built), reports)
    text = (campaign_reports(reports, "sst2") / RESULTS_MD).read_text()
    assert "(12 of 15 runs done)" in text
    assert "Not run yet: deebert (seeds 2, 3); acl-cl (seeds 3)" in text
    assert "Finished but left out of the tables until every run of its set has that seed" in text
    line = next(r for r in text.splitlines() if r.startswith("| ACL beats CE on the final"))
    assert "**better**" in line and "[+" in line and "| 1, 2, 3 |" in line
    assert "(1 seed: examples only)" in text  # the noise floor: deebert has one seed
    from aclpipe.study.campaign_markdown import FEW_SEEDS_NOTE

    assert FEW_SEEDS_NOTE in text  # the label comes with its legend
    assert text.count("Majority-class score") >= 4  # claims, every exit, budgets (+ scores)
    assert "cpu, torch 2.0, transformers 4.0, Python 3.11 (11 runs)" in text
    assert "| budget 0 points | budget 1 point |" in text
    for name in (RESULTS_JSON, RESULTS_EXITS_PNG):
        assert (campaign_reports(reports, "sst2") / name).stat().st_size > 0
    assert (campaign_reports(reports) / RESULTS_COST_PNG).stat().st_size > 0
    # nothing in reports/<task>/: the default pipeline's tradeoff stage depends on that folder
    assert sorted(p.name for p in reports.iterdir()) == sorted([REPORTS_README, CAMPAIGN])
    overview = (reports / REPORTS_README).read_text()
    assert "12 of 15 planned runs done" in overview
    assert "[sst2](campaign/sst2/results.md)" in overview
    assert "every task: campaign/results_score_vs_time.png" in overview
    assert "- ACL beats CE on the final exit: acl - ce = +" in overview
    assert "## Where the seeds' claims do not hold here" in overview
    assert FEW_SEEDS_NOTE in overview
    # each failing verdict with its interval and the seeds it rests on (acl-cl has seeds 1-2)
    assert ("- Claimed: ACL-CL beats joint on the average over exits. Here: sst2: no detectable "
            "difference, +0.0 [+0.0, +0.0] (2 seeds only).\n") in overview  # fmt: skip
    assert "| gpu, torch 2.0, transformers 4.0, Python 3.11 | sst2 1 run |" in overview
    # the family-wise view, at 2,000 resamples: 7 x 2 / 2001 = 0.0070 < 0.05
    family = ("Family-wise (Holm over the 7 claims tested here, two-sided bootstrap p, 5% for "
              "the family): the one better/worse verdict holds: acl - ce final exit (two-sided "
              "p 0.0010, adjusted 0.0070).")  # fmt: skip
    assert family in text and family in overview
    assert "| p | Holm p (family) | verdict |" in text
    assert "| 0.0070 | **better** |" in line
    floor_row = next(r for r in text.splitlines() if r.startswith("| Noise floor"))
    assert "| 0.9960 | - | **worse** |" in floor_row  # not in the family
    assert "but not when each task's claims are taken as one family" not in overview
    first = (campaign_reports(reports, "sst2") / RESULTS_JSON).read_text()
    write_reports(load_campaign(built), reports)  # deterministic: rebuilt byte for byte
    assert (campaign_reports(reports, "sst2") / RESULTS_JSON).read_text() == first


@pytest.mark.slow
def test_ablations_on_fewer_seeds_and_waves(tmp_path: Path, params_dict) -> None:
    """seeds 1-3, the ablation deebert on 1-2; ce and joint finished 1 and 3, deebert only 2:
    seed 3 is the only complete one, so deebert has no table row yet, only claims."""
    path = write_campaign(tmp_path, params_dict(None), runs=["ce", "joint"], tasks=["sst2", "mrpc"],
                          ablations=["deebert"], ablation_seeds=[1, 2])  # fmt: skip
    for seed in (1, 3):
        write_run(path.parent, "ce", "ce", seed, [0.7])
        write_run(path.parent, "joint", "joint", seed, MULTI)
    write_run(path.parent, "deebert", "deebert", 2, MULTI)
    summary = summarise_task(load_campaign(path), "sst2", resamples=200)
    # the claims' runs complete seeds 1 and 3; the ablation no seed of those (seed 3 is not
    # planned for it): its row is over its own seed 2, and it holds nobody back
    assert summary["complete"] == [1, 3] and summary["complete_ablations"] == []
    assert list(summary["runs"]) == ["ce", "joint", "deebert"]
    assert summary["runs"]["deebert"]["seeds"] == [2] and summary["left_out"] == {}
    assert summary["missing"] == {"ce": [2], "joint": [2], "deebert": [1]}
    assert summary["noise_floor"]["verdict"] == "no common seed"
    # ce has no seed 2: deebert's budgets count from its own full model there, and say so
    assert all(c["own_reference"] == 1 for c in summary["runs"]["deebert"]["budgets"].values())
    assert all(c["own_reference"] == 0 for c in summary["runs"]["joint"]["budgets"].values())
    write_reports(load_campaign(path), at(tmp_path).reports())
    text = (campaign_reports(at(tmp_path).reports(), "sst2") / RESULTS_MD).read_text()
    assert "(seeds 1, 3; the ablations' rows over each one's own seeds" in text
    overview = (at(tmp_path).reports() / REPORTS_README).read_text()
    assert (
        "Noise floor: ce against deebert's final exit (the same CE fine-tune): no common"
        in overview
    )
    assert "5 of 16 planned runs done" in overview  # mrpc has none yet and still counts
    # only ce and joint ran: no seed claim compares those two, so none is tested, and the
    # page must not read as if every claim held
    assert "No seed claim has been tested yet" in overview
    assert "holds where it was tested" not in overview


def test_the_overview_says_how_many_claims_were_tested(built: Path, tmp_path: Path) -> None:
    """With some claims tested and none failing, the page says how many held, not 'all'."""
    write_run(built.parent, "deebert", "deebert", 2, MULTI, data_seed=2)
    write_run(built.parent, "deebert", "deebert", 3, MULTI, data_seed=3)
    summaries = {"sst2": summarise_task(load_campaign(built), "sst2", resamples=200)}
    tested = [c for c in summaries["sst2"]["claims"] if c["seed_claim"] and "difference" in c]
    assert tested
    for claim in summaries["sst2"]["claims"]:  # as if every tested claim had held
        if claim in tested:
            claim["verdict"] = "better"
    text = overview_markdown(load_campaign(built), summaries)
    assert (
        f"Every seed claim tested so far ({len(tested)} task-claim pairs) holds by the per-claim rule"
        in text
    )
    # ... but only by that rule: their Holm p (computed before the verdicts were forced) say
    # which would not hold family-wise, and the page lists them
    lone = [f"sst2: {c['a']} - {c['b']}" for c in tested if c["holm_p"] >= 0.05]
    assert lone[0] == "sst2: acl - ce"  # 7 x 2 / 201 = 0.0697 at 200 resamples
    assert (
        "but not when each task's claims are taken as one family (Holm, family-wise 5%): "
        "sst2: acl - ce final exit (two-sided p 0.0100, adjusted 0.0697); sst2: acl-cl - "
        "deebert shallow exits"
    ) in text
    where = text[text.index("## Where the seeds") :]
    assert where.count("(two-sided p ") == len(lone)


def test_budgets_below_the_majority_class_are_marked(tmp_path: Path, params_dict) -> None:
    path = write_campaign(tmp_path, params_dict(None), runs=["ce", "joint"], seeds=[1, 2])
    for seed in (1, 2):  # a majority class above every exit's score: every floor is below it
        write_run(path.parent, "ce", "ce", seed, [0.7], majority=0.99)
        write_run(path.parent, "joint", "joint", seed, MULTI, majority=0.99)
    summary = summarise_task(load_campaign(path), "sst2", resamples=200)
    budgets = summary["runs"]["joint"]["budgets"]
    assert all(cell["below_majority"] and cell["seeds"] == 2 for cell in budgets.values())
    write_reports(load_campaign(path), at(tmp_path).reports())
    text = (campaign_reports(at(tmp_path).reports(), "sst2") / RESULTS_MD).read_text()
    assert text.count("†") >= 5 and "a constant guess would pass it" in text
    assert "dev 99.0, validation 99.0" in text


def test_a_pick_no_better_than_the_majority_class_is_marked(tmp_path: Path, params_dict) -> None:
    """Floors far above the majority class (ce always right), but a run worse than a constant
    guess: nothing is admitted, its full model is the pick, and its score marks the cell."""
    path = write_campaign(tmp_path, params_dict(None), runs=["ce", "joint"], seeds=[1])
    write_run(path.parent, "ce", "ce", 1, [1.0])
    write_run(path.parent, "joint", "joint", 1, [0.3] * EXITS)
    cells = summarise_task(load_campaign(path), "sst2", resamples=200)["runs"]["joint"]["budgets"]
    for cell in cells.values():
        assert cell["admitted"] == 0 and cell["speedup"] == 1.0 and cell["met"] == 0
        assert cell["pick_below_majority"] and not cell["floor_below_majority"]
        assert cell["below_majority"]
    write_reports(load_campaign(path), at(tmp_path).reports())
    text = (campaign_reports(at(tmp_path).reports(), "sst2") / RESULTS_MD).read_text()
    assert "1.00x; " in text and "met 0/1; no pick 1/1 †" in text


@pytest.mark.slow
def test_a_late_ablation_does_not_hold_the_claims_rows_back(tmp_path: Path, params_dict) -> None:
    """ce and joint finished seeds 1-2, the ablation deebert only seed 1 of its 1-2: the
    claims' rows are over seeds 1-2, the ablation's over seed 1."""
    path = write_campaign(tmp_path, params_dict(None), runs=["ce", "joint"], seeds=[1, 2],
                          ablations=["deebert"], ablation_seeds=[1, 2])  # fmt: skip
    for seed in (1, 2):
        write_run(path.parent, "ce", "ce", seed, [0.7])
        write_run(path.parent, "joint", "joint", seed, MULTI)
    write_run(path.parent, "deebert", "deebert", 1, MULTI)
    summary = summarise_task(load_campaign(path), "sst2", resamples=200)
    assert summary["complete"] == [1, 2] and summary["complete_ablations"] == [1]
    assert summary["runs"]["joint"]["seeds"] == [1, 2]
    assert summary["runs"]["deebert"]["seeds"] == [1]
    assert summary["left_out"] == {}
    write_reports(load_campaign(path), at(tmp_path).reports())
    text = (campaign_reports(at(tmp_path).reports(), "sst2") / RESULTS_MD).read_text()
    assert "(seeds 1, 2; the ablations' rows over seeds 1, those every ablation" in text


def test_budget_cells_against_a_plain_reference(tmp_path: Path, params_dict) -> None:
    """Over three seeds: the speed-up is the inverse of the mean dev time ratio, the range
    the per-seed speed-ups', and every seed counts, met or not, picked or not."""
    from aclpipe.study.campaign_report import load_run

    path = write_campaign(tmp_path, params_dict(None), runs=["ce", "joint"])
    for seed in (1, 2, 3):
        write_run(path.parent, "ce", "ce", seed, [0.9 if seed == 3 else 0.6])
        write_run(path.parent, "joint", "joint", seed, MULTI)
    campaign = load_campaign(path)
    summary = summarise_task(campaign, "sst2", resamples=200)
    for budget in scoring.BUDGETS:
        picks = []
        for seed in (1, 2, 3):
            ce_out = load_run("sst2", campaign.run_dir("sst2", "ce", seed))["outputs"]
            joint_out = load_run("sst2", campaign.run_dir("sst2", "joint", seed))["outputs"]
            picks.append(scoring.budget_pick(joint_out, budget, scoring.final_scores(ce_out)))
        cell = summary["runs"]["joint"]["budgets"][str(budget)]
        ratios = [p["dev_time_ratio"] for p in picks]
        assert cell["speedup"] == pytest.approx(3 / sum(ratios))
        assert cell["speedup_range"] == pytest.approx([1 / max(ratios), 1 / min(ratios)])
        assert cell["met"] == sum(p["met"] for p in picks)
        assert cell["admitted"] == sum(p["admitted"] for p in picks) and cell["seeds"] == 3
        assert cell["dev_score"]["mean"] == pytest.approx(
            statistics.fmean(p["dev_score"] for p in picks)
        )
    text_cell = summary["runs"]["joint"]["budgets"]["0"]
    assert text_cell["admitted"] < 3  # seed 3's ce (0.9 on validation) is out of joint's reach


def test_an_old_run_folder_is_a_one_line_error(tmp_path: Path, params_dict) -> None:
    path = write_campaign(tmp_path, params_dict(None), runs=["ce", "joint"])
    write_run(path.parent, "ce", "ce", 1, [0.7])
    old = write_run(path.parent, "joint", "joint", 1, MULTI, predictions=False)
    with pytest.raises(UserError, match=f"{old} has no predictions.npz"):
        summarise_task(load_campaign(path), "sst2")
    result = CliRunner().invoke(app, ["campaign", "report", "--campaign", str(path)])
    assert result.exit_code == 2 and "rerun it" in result.output
    assert "Traceback" not in result.output


def test_plot_panels_put_each_ablation_beside_the_run_it_changes() -> None:
    from aclpipe.study.campaign import Campaign, Variant
    from aclpipe.study.campaign_plots import panels, parent

    campaign = Campaign(
        path=Path(CAMPAIGN_PARAMS),
        base={},
        tasks=["rte"],
        seeds=[1, 2],
        runs=["ce", "acl", "deebert", "romebert", "acl-cl",
              "acl-nograd", "romebert-nogr", "deebert-sd", "acl-cl-sd", "odd"],
        variants={"acl-nograd": Variant("acl", {"acl_grad": False}),
                  "romebert-nogr": Variant("romebert", {"gr": False}),
                  "acl-cl-sd": Variant("acl-cl", {"sd": True})},
        task_settings={},
        ablations=["acl-nograd", "romebert-nogr", "deebert-sd", "acl-cl-sd", "odd"],
        ablation_seeds=[1],
    )  # fmt: skip
    assert parent(campaign, "acl-nograd") == "acl"  # a variant: its method
    assert parent(campaign, "acl-cl-sd") == "acl-cl"  # not "acl": the variant's method wins
    assert parent(campaign, "deebert-sd") == "deebert"  # a method of its own: the name it extends
    assert parent(campaign, "odd") is None
    everything = list(reversed(campaign.runs))  # the campaign's order, whatever order given
    assert panels(campaign, everything) == [
        ("the claims' runs", ["ce", "acl", "deebert", "romebert", "acl-cl"]),
        ("ablations, beside the runs they change",
         ["acl", "deebert", "romebert", "acl-cl", "acl-nograd", "romebert-nogr", "deebert-sd",
          "acl-cl-sd", "odd"]),
    ]  # fmt: skip
    # a parent that has not run is left out; no ablation ran: no second panel
    assert panels(campaign, ["ce", "deebert-sd"]) == [
        ("the claims' runs", ["ce"]),
        ("ablations, beside the runs they change", ["deebert-sd"]),
    ]
    assert panels(campaign, ["ce", "acl"]) == [("the claims' runs", ["ce", "acl"])]
    assert panels(campaign, []) == []


def test_a_claim_line_keeps_p_apart_from_the_interval_edge() -> None:
    """p 0.0255 must not print as 0.025 (the two-sided 95% interval's edge); two seeds say
    how little of the seed variation the interval holds."""
    from aclpipe.study.campaign_markdown import claim_line

    claim = {"question": "ACL beats CE+SCL on the final exit", "a": "acl", "b": "scl",
             "difference": 0.017, "low": 0.0, "high": 0.034, "p": 0.0255, "resamples": 2000,
             "verdict": "no detectable difference", "seeds": [1, 2]}  # fmt: skip
    line = claim_line(claim)
    assert "p 0.0255:" in line and "[+0.0, +3.4]" in line
    assert "(seeds 1, 2; 2 seeds only)" in line
    assert "only" not in claim_line({**claim, "seeds": [1, 2, 3]})
    # a bound that one decimal would print as +0.0 shows its sign
    assert "[+0.0083, +3.4]" in claim_line({**claim, "low": 0.000083, "verdict": "better"})
    assert "[-0.0037, +3.4]" in claim_line({**claim, "low": -0.000037})
    assert "1 seed: examples only" in claim_line({**claim, "seeds": [1]})
    # runs alike on every example: every resample gives 0, and p says so rather than 1.0000
    alike = {**claim, "difference": 0.0, "low": 0.0, "high": 0.0, "p": 1.0}
    assert ("= +0.0 [+0.0, +0.0] points, p 1 (every resample gives 0: the two score alike on "
            "every example): **no detectable difference**") in claim_line(alike)  # fmt: skip
    # a difference of 0 whose interval is not 0 is an ordinary p
    assert "p 0.5125:" in claim_line({**alike, "low": -0.004, "high": 0.004, "p": 0.5125})


def test_runs_scored_on_other_data_are_a_one_line_error(tmp_path: Path, params_dict) -> None:
    path = write_campaign(tmp_path, params_dict(None), runs=["ce", "joint"])
    write_run(path.parent, "ce", "ce", 1, [0.7])
    odd = write_run(path.parent, "joint", "joint", 1, MULTI)
    record = json.loads((odd / RUN_RECORD).read_text())
    record["data"]["max_length"] = 128  # prepared at another length: other examples' tokens
    (odd / RUN_RECORD).write_text(json.dumps(record))
    with pytest.raises(UserError, match=r"other data than .* differs in max_length\)"):
        summarise_task(load_campaign(path), "sst2")
    result = CliRunner().invoke(app, ["campaign", "report", "--campaign", str(path)])
    assert result.exit_code == 2 and "rerun it" in result.output
    assert "Traceback" not in result.output


def test_runs_scored_on_other_dev_examples_are_a_one_line_error(tmp_path: Path,
                                                                params_dict) -> None:  # fmt: skip
    path = write_campaign(tmp_path, params_dict(None), runs=["ce", "joint"])
    write_run(path.parent, "ce", "ce", 1, [0.7])
    odd = write_run(path.parent, "joint", "joint", 1, MULTI)
    with np.load(odd / PREDICTIONS) as z:
        arrays = dict(z)
    arrays["dev_labels"] = arrays["dev_labels"][::-1].copy()  # the same labels, another order
    np.savez_compressed(odd / PREDICTIONS, **arrays)
    with pytest.raises(UserError, match="scored other dev examples than"):
        summarise_task(load_campaign(path), "sst2")


def test_the_few_seeds_legend_shows_only_while_a_claim_rests_on_one_or_two_seeds() -> None:
    """The legend of "1 seed: examples only" / "2 seeds only" goes with those labels: none
    is printed once every tested claim has 3 seeds or more; untested claims do not count."""
    from aclpipe.study.campaign_markdown import FEW_SEEDS_NOTE, few_seeds_note

    def claim(seeds, tested=True):
        return {"seeds": seeds} | ({"difference": 0.01} if tested else {})

    assert few_seeds_note([claim([1, 2, 3]), claim([1, 2, 3, 4, 5])]) == ""
    assert few_seeds_note([claim([1, 2, 3]), claim([], tested=False)]) == ""
    assert few_seeds_note([]) == ""
    for few in ([1], [1, 2]):
        assert few_seeds_note([claim([1, 2, 3]), claim(few)]) == f" {FEW_SEEDS_NOTE}."
    assert few_seeds_note(iter([claim([2])])) == f" {FEW_SEEDS_NOTE}."  # any iterable


def test_where_claims_do_not_hold_gives_interval_and_seeds() -> None:
    """A failing verdict is shown with its interval and how many seeds it rests on; a claim
    that holds everywhere, a control (not a seed claim) and an untested claim are left out."""
    from aclpipe.study.campaign_overview import not_holding

    def claim(question, verdict, seeds, seed_claim=True, tested=True):
        c = {"question": question, "verdict": verdict, "seeds": seeds, "seed_claim": seed_claim}
        return c | ({"difference": -0.012, "low": -0.023, "high": -0.001} if tested else {})

    summaries = {
        "mrpc": {"claims": [claim("A beats B", "better", [1, 2, 3]),
                            claim("C beats D", "no detectable difference", [1, 2, 3]),
                            claim("control", "worse", [1, 2, 3], seed_claim=False),
                            claim("E beats F", "not run yet", [], tested=False)]},
        "sst2": {"claims": [claim("A beats B", "better", [1]),
                            claim("C beats D", "worse", [1]),
                            claim("control", "worse", [1], seed_claim=False),
                            claim("E beats F", "not run yet", [], tested=False)]},
    }  # fmt: skip
    assert not_holding(summaries) == [
        "- Claimed: C beats D. Here: mrpc: no detectable difference, -1.2 [-2.3, -0.1] "
        "(seeds 1, 2, 3); sst2: worse, -1.2 [-2.3, -0.1] (1 seed: examples only)."
    ]
    # a "worse" that Holm does not reject at the family level says so; one it does, not
    summaries["sst2"]["claims"][1] |= {"seeds": [1, 2, 3], "holm_p": 0.4618}
    assert not_holding(summaries)[0].endswith(
        "sst2: worse, -1.2 [-2.3, -0.1] (seeds 1, 2, 3; not family-wise: adjusted p 0.4618)."
    )
    summaries["sst2"]["claims"][1]["holm_p"] = 0.05  # at the level: Holm still rejects
    assert not_holding(summaries)[0].endswith("sst2: worse, -1.2 [-2.3, -0.1] (seeds 1, 2, 3).")
    summaries["mrpc"]["claims"][1]["holm_p"] = 0.9  # no verdict to qualify
    assert "(seeds 1, 2, 3); sst2" in not_holding(summaries)[0]


def test_the_family_wise_view_names_each_verdict_with_its_adjusted_p() -> None:
    """Which better/worse verdicts survive Holm (adjusted p at most 0.05), in results.md and
    the overview; "better" seed claims that do not are listed apart in the overview;
    controls are not seed claims."""
    from aclpipe.study.campaign_markdown import family_line
    from aclpipe.study.campaign_overview import not_family_wise

    def claim(a, verdict, holm_p, seed_claim=True):
        return {"a": a, "b": "ce", "measure": "final", "verdict": verdict, "holm_p": holm_p,
                "p_two_sided": holm_p / 3, "seed_claim": seed_claim, "difference": 0.01}  # fmt: skip

    summary = {"family": 3, "claims": [claim("acl", "better", 0.012),
                                       claim("scl", "worse", 0.0501),
                                       claim("joint", "better", 0.3, seed_claim=False),
                                       {"a": "x", "b": "y", "measure": "auc",
                                        "verdict": "not run yet", "seed_claim": True}]}  # fmt: skip
    assert family_line(summary) == (
        "Family-wise (Holm over the 3 claims tested here, two-sided bootstrap p, 5% for the "
        "family): 1 of the 3 better/worse verdicts hold: acl - ce final exit (two-sided p "
        "0.0040, adjusted 0.0120); not: scl - ce final exit (two-sided p 0.0167, adjusted "
        "0.0501), joint - ce final exit (two-sided p 0.1000, adjusted 0.3000)."
    )
    assert not_family_wise({"mrpc": summary}) == []  # scl is worse, joint a control
    summary["claims"][0]["holm_p"] = 0.05  # at the level: Holm still rejects
    assert not_family_wise({"mrpc": summary}) == []
    summary["claims"][0]["holm_p"] = 0.07
    assert not_family_wise({"mrpc": summary}) == [
        "mrpc: acl - ce final exit (two-sided p 0.0040, adjusted 0.0700)"
    ]
    one = {"family": 2, "claims": summary["claims"][:1]}
    assert family_line(one).endswith(
        "the one better/worse verdict does not hold: acl - ce final exit (two-sided p 0.0040, "
        "adjusted 0.0700)."
    )
    quiet = {"family": 2, "claims": [claim("acl", "no detectable difference", 0.4)]}
    assert family_line(quiet).endswith(
        "no verdict is better or worse, so none is there to correct."
    )
    assert family_line({"family": 0, "claims": []}) == "Family-wise: no claim tested yet."
