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
from aclpipe.early_exit.budget import BUDGETS
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
from aclpipe.study.campaign.markdown import campaign_reports
from aclpipe.study.campaign.overview import overview_markdown
from aclpipe.study.campaign.plan import load_campaign
from aclpipe.study.campaign.report import summarise_task, write_reports
from aclpipe.study.stats import measures as scoring

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
        "data": {"splits": {"train": {"examples": 100, "labels": {"0": 60, "1": 40}},
                            "dev": {"examples": N_DEV}}},
        "command": f"aclpipe campaign run --task sst2 --run {run} --seed {seed}",
    }  # fmt: skip
    (folder / METRICS).write_text(json.dumps(metrics))
    (folder / RUN_RECORD).write_text(json.dumps(record))
    if cosines:  # the training log (its legacy form): one cosine per step
        rows = [{"step": i + 1, "cosine": c, "altered": c < 0} for i, c in enumerate(cosines)]
        (folder / LEGACY_STEPS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def write_campaign(folder: Path, base: dict, **spec) -> Path:
    campaign = {"tasks": ["sst2"], "seeds": [1, 2, 3], "verdicts": {"resamples": 2000}, **spec}
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
    from aclpipe.study.campaign.run_folders import load_run

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


ACL_CE = "ACL outperforms or performs comparably with CE (final exit; A1)"
CL_JOINT = "ACL-CL against joint (the same exits without contrastive terms) on the {}"


def test_claims_use_the_seeds_both_runs_have(built: Path) -> None:
    summary = summarise_task(load_campaign(built), "sst2", resamples=200)
    claims = {c["question"]: c for c in summary["claims"]}
    controls = {c["question"]: c for c in summary["controls"]}
    acl_ce = claims[ACL_CE]
    assert acl_ce["seeds"] == [1, 2, 3] and acl_ce["verdict"] == "better" and acl_ce["holds"]
    assert acl_ce["p"] == acl_ce["p_better"] == pytest.approx(1 / 2001)  # no resample <= 0
    finals = [plain(outputs(s, N_DEV, [0.7])[0][0].argmax(-1), np.arange(N_DEV) % 2)
              for s in (1, 2, 3)]  # fmt: skip
    assert acl_ce["difference"] == pytest.approx(1 - statistics.fmean(finals))
    assert acl_ce["a_mean"] == 1.0 and acl_ce["b_mean"] == pytest.approx(statistics.fmean(finals))
    # acl-cl and joint: the same outputs; a control now, and comparable (identical runs)
    same = controls[CL_JOINT.format("average over exits")]
    assert same["seeds"] == [1, 2]  # acl-cl has no seed 3 yet
    assert (same["difference"], same["low"], same["high"]) == (0, 0, 0)
    assert same["verdict"] == "comparable" and not same["holds"]  # "beats" needs better
    auc = controls[CL_JOINT.format("speed-quality curve (AUC)")]
    assert auc["verdict"] == "comparable" and auc["difference"] == 0
    scl = "ACL outperforms or performs comparably with CE+SCL (final exit; A1)"
    assert claims[scl]["verdict"] == "not in this campaign"
    floor = summary["noise_floor"]
    assert floor["seeds"] == [1]  # deebert has seed 1 only
    # ce beats a constant guess of the majority label (0): the task is informative
    assert summary["informative"]["verdict"] == "better"
    # The family: the papers' claims tested (acl-ce; acl-cl against deebert on three
    # measures), Holm over each one's printed p; controls and the noise floor are out.
    tested = [c for c in summary["claims"] if "difference" in c]
    assert summary["family"] == len(tested) == 4
    assert all("holm_p" in c for c in tested) and "holm_p" not in floor
    assert all("holm_p" not in c for c in summary["controls"])
    from aclpipe.study.stats.paired import holm

    assert [c["holm_p"] for c in tested] == pytest.approx(holm([c["p"] for c in tested]))
    assert acl_ce["holm_p"] == pytest.approx(4 / 2001)  # the smallest p: times the family
    assert acl_ce["family_wise"]


@pytest.mark.slow
def test_report_files(built: Path, tmp_path: Path) -> None:
    reports = at(tmp_path).reports()
    write_reports(load_campaign(built), reports)
    text = (campaign_reports(reports, "sst2") / RESULTS_MD).read_text()
    assert "(12 of 15 runs done)" in text
    assert "Not run yet: deebert (seeds 2, 3); acl-cl (seeds 3)" in text
    assert "Finished but left out of the tables until every run of its set has that seed" in text
    line = next(r for r in text.splitlines() if r.startswith(f"| {ACL_CE}"))
    assert "**better** | yes |" in line and "[+" in line and "| 1, 2, 3 |" in line
    assert "| 100.0 / 73.3 |" in line  # both sides over the claim's own seeds
    assert "(1 seed: examples only)" in text  # the noise floor: deebert has one seed
    from aclpipe.study.campaign.markdown import FEW_SEEDS_NOTE

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
    assert f"- {ACL_CE}: acl - ce = +" in overview
    assert "## Where the papers' claims do not hold here (informative tasks)" in overview
    assert FEW_SEEDS_NOTE in overview
    # each failing verdict with its interval and the seeds it rests on (deebert: seed 1)
    assert ("- Claimed: ACL-CL surpasses DeeBERT on the shallow exits (A4). Here: sst2: "
            "inconclusive (no difference larger than 13.3), +0.0 [-13.3, +13.3] (1 seed: "
            "examples only).\n") in overview  # fmt: skip
    assert "| gpu, torch 2.0, transformers 4.0, Python 3.11 | sst2 1 run |" in overview
    # the family at 2,000 resamples: the 4 papers' claims, acl - ce's p 1 / 2001 times 4
    family = ("Family-wise (Holm over the 4 papers' claims tested here, each with its "
              "verdict's p, 2.5% for the family): 1 of the 1 verdicts hold: acl - ce final "
              "exit, better (p 0.0005, adjusted 0.0020 ± 0.0020).")  # fmt: skip
    assert family in text and family in overview
    assert "| p (of the verdict) | Holm p ± MC error | verdict | holds |" in text
    assert "| 0.0005 | 0.0020 ± 0.0020 | **better** |" in line
    floor_row = next(r for r in text.splitlines() if r.startswith("| Noise floor"))
    assert "| 0.0095 | - | **worse** |" in floor_row  # not in the family
    # the controls in a section of their own, after the papers' claims
    assert text.index("## Own controls and ablations") > text.index(f"| {ACL_CE}")
    assert text.index("| ACL-CL against joint") > text.index("## Own controls and ablations")
    # the context: training data used, ce beside the majority class and the references
    assert ("| sst2 | 100 of 67,349 | 70.0 (1 seed) [55.0, 85.0] | 50.0 | +23.3 [+5.0, +41.7] "
            "| yes | 91.3 / 91.8 |") in overview  # fmt: skip
    assert "How exit thresholds (and the base recipe) are chosen" in overview
    assert "- sst2: 1 of 4 papers' claims hold by the per-claim rule" in overview
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
    assert "No papers' claim has been tested yet on an informative task" in overview
    assert "holds by the per-claim rule where it was tested" not in overview


def test_the_overview_says_how_many_claims_were_tested(built: Path, tmp_path: Path) -> None:
    """With some claims tested and none failing, the page says how many held, not 'all'."""
    write_run(built.parent, "deebert", "deebert", 2, MULTI, data_seed=2)
    write_run(built.parent, "deebert", "deebert", 3, MULTI, data_seed=3)
    summaries = {"sst2": summarise_task(load_campaign(built), "sst2", resamples=200)}
    tested = [c for c in summaries["sst2"]["claims"] if "difference" in c]
    assert len(tested) == 4
    for claim in tested:  # as if every tested claim had held
        claim["verdict"], claim["holds"] = "better", True
    text = overview_markdown(load_campaign(built), summaries)
    assert (
        "Every papers' claim tested so far (4 task-claim pairs) holds by the per-claim rule"
        in text
    )
    assert "- sst2: 4 of 4 papers' claims hold by the per-claim rule" in text


def test_an_uninformative_task_is_marked_and_left_out(built: Path, tmp_path: Path) -> None:
    """ce no better than a constant guess: every verdict stays, marked, out of every family
    and of the summary."""
    campaign = load_campaign(built)
    for seed in (1, 2, 3):  # ce now always predicts the majority label 0: 50% on dev
        folder = campaign.run_dir("sst2", "ce", seed)
        with np.load(folder / "predictions.npz") as z:
            arrays = dict(z)
        arrays["dev_logits"][..., 0], arrays["dev_logits"][..., 1] = 1.0, 0.0
        np.savez_compressed(folder / "predictions.npz", **arrays)
    summary = summarise_task(campaign, "sst2", resamples=200)
    assert summary["informative"]["verdict"] != "better"
    assert summary["informative"]["difference"] == 0.0
    assert summary["family"] == 0 and all("holm_p" not in c for c in summary["claims"])
    reports = tmp_path / "reports"
    write_reports(campaign, reports)
    text = (reports / "campaign" / "sst2" / "results.md").read_text()
    assert "Family-wise: none; uninformative task: ce does not beat the majority class" in text
    line = next(r for r in text.splitlines() if r.startswith(f"| {ACL_CE}"))
    assert "[uninformative task: ce does not beat the majority class]" in line
    overview = (reports / "README.md").read_text()
    assert "| no: uninformative** |" in overview.replace("**no", "no")
    assert "- Uninformative, left out of the families and this summary: sst2" in overview
    assert "No papers' claim has been tested yet on an informative task" in overview


def test_a_gradient_rule_that_altered_under_1_percent_was_not_exercised(
    tmp_path: Path, params_dict
) -> None:
    """acl against acl-nograd: acl's log says how many steps its rule dropped the ACL term;
    under 1% the claim reads "rule not exercised" and leaves the family, from 1% it is judged."""
    path = write_campaign(tmp_path, params_dict(None), runs=["ce", "acl"], seeds=[1, 2],
                          ablations=["acl-nograd"], ablation_seeds=[1, 2],
                          variants={"acl-nograd": {"method": "acl", "set": {"acl_grad": False}}})  # fmt: skip
    for seed in (1, 2):
        write_run(path.parent, "ce", "ce", seed, [0.9])  # well above the majority class
        write_run(path.parent, "acl-nograd", "acl", seed, [0.7])
        write_run(path.parent, "acl", "acl", seed, [0.7], data_seed=seed,
                  cosines=[0.5] * 199 + [-0.5])  # 1 of 200 steps dropped: 0.5%  # fmt: skip
    summary = summarise_task(load_campaign(path), "sst2", resamples=200)
    grad = next(c for c in summary["claims"] if c["b"] == "acl-nograd")
    assert grad["verdict"] == "rule not exercised" and not grad["holds"]
    assert grad["rule_altered"] == pytest.approx(2 / 400) and grad["rule_steps"] == 400
    assert "holm_p" not in grad and summary["family"] == 1  # acl - ce alone
    from aclpipe.study.campaign.markdown import claim_line

    assert "p -: **rule not exercised** (acl's rule altered 0.5% of 400 steps)" in claim_line(grad)
    for seed in (1, 2):  # now 4 of 200 steps: 2%, exercised
        log = path.parent / "runs" / "sst2" / f"acl-s{seed}" / "steps.jsonl"
        rows = [{"step": i + 1, "cosine": c, "altered": c < 0}
                for i, c in enumerate([0.5] * 196 + [-0.5] * 4)]  # fmt: skip
        log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = summarise_task(load_campaign(path), "sst2", resamples=200)
    grad = next(c for c in summary["claims"] if c["b"] == "acl-nograd")
    assert grad["rule_exercised"] and grad["verdict"] in ("comparable", "inconclusive")
    assert grad["rule_altered"] == pytest.approx(0.02) and "holm_p" in grad


def test_ablation_rows_sit_beside_their_run_over_the_same_seeds(tmp_path: Path,
                                                                params_dict) -> None:  # fmt: skip
    """acl over seeds 1-3, its ablation over 1-2: the ablations' table shows acl over 1-2."""
    path = write_campaign(tmp_path, params_dict(None), runs=["ce", "acl"],
                          ablations=["acl-nograd"], ablation_seeds=[1, 2],
                          variants={"acl-nograd": {"method": "acl", "set": {"acl_grad": False}}})  # fmt: skip
    for seed in (1, 2, 3):
        write_run(path.parent, "ce", "ce", seed, [0.6])
        write_run(path.parent, "acl", "acl", seed, [0.9 if seed == 3 else 0.7])
    for seed in (1, 2):
        write_run(path.parent, "acl-nograd", "acl", seed, [0.7], data_seed=10 + seed)
    summary = summarise_task(load_campaign(path), "sst2", resamples=200)
    beside = summary["beside"]["acl-nograd"]
    assert beside["run"] == "acl" and beside["seeds"] == [1, 2]
    finals = [plain(outputs(s, N_DEV, [0.7])[0][0].argmax(-1), np.arange(N_DEV) % 2)
              for s in (1, 2)]  # fmt: skip
    assert beside["final"]["mean"] == pytest.approx(statistics.fmean(finals))
    assert summary["runs"]["acl"]["seeds"] == [1, 2, 3]
    write_reports(load_campaign(path), tmp_path / "reports")
    text = (tmp_path / "reports" / "campaign" / "sst2" / "results.md").read_text()
    section = text[text.index("### Ablations and the experiment") :]
    assert "| acl (beside acl-nograd) | acl | - | 1, 2 |" in section
    assert "| acl-nograd | acl | - | 1, 2 |" in section
    main = text[text.index("## Scores per run") : text.index("### Ablations and the experiment")]
    assert "| acl-nograd |" not in main


def test_the_experiment_runs_on_its_own_tasks_and_seeds(tmp_path: Path, params_dict) -> None:
    """campaign.experiment: scl-grad on one task over its own seeds, its own dvc stage."""
    from aclpipe.study.campaign.runner import commit_command, pending

    path = write_campaign(tmp_path, params_dict(None), runs=["ce", "scl"], seeds=[1],
                          tasks=["sst2", "mrpc"],
                          experiment={"runs": ["scl-grad"], "tasks": ["sst2"], "seeds": [1, 2]},
                          variants={"scl-grad": {"method": "scl", "set": {"acl_grad": True}}})  # fmt: skip
    campaign = load_campaign(path)
    assert campaign.tasks_for("scl-grad") == ["sst2"] and campaign.seeds_for("scl-grad") == [1, 2]
    assert campaign.params("sst2", "scl-grad", 2).method("scl").acl_grad is True
    assert campaign.params("sst2", "scl", 1).method("scl").acl_grad is False
    jobs = pending(campaign)
    assert ("sst2", "scl-grad", 2) in jobs and ("mrpc", "scl-grad", 1) not in jobs
    assert len(jobs) == 2 * 2 + 2  # ce and scl on both tasks at seed 1, scl-grad twice
    with pytest.raises(UserError, match="planned for sst2 only"):
        campaign.overrides("mrpc", "scl-grad", 1)
    with pytest.raises(UserError, match="campaign.experiment.seeds"):
        campaign.overrides("sst2", "scl-grad", 3)
    folder = campaign.run_dir("sst2", "scl-grad", 1)
    assert commit_command(campaign, [folder]).endswith("dvc.yaml:experiment@1-sst2-scl-grad")
    bad = write_campaign(tmp_path / "bad", params_dict(None), runs=["ce"],
                         experiment={"runs": ["ce"], "tasks": ["sst2"], "seeds": [1]})  # fmt: skip
    with pytest.raises(UserError, match="not in runs or ablations"):
        load_campaign(bad)


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
    from aclpipe.study.campaign.run_folders import load_run

    path = write_campaign(tmp_path, params_dict(None), runs=["ce", "joint"])
    for seed in (1, 2, 3):
        write_run(path.parent, "ce", "ce", seed, [0.9 if seed == 3 else 0.6])
        write_run(path.parent, "joint", "joint", seed, MULTI)
    campaign = load_campaign(path)
    summary = summarise_task(campaign, "sst2", resamples=200)
    for budget in BUDGETS:
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
    from aclpipe.study.campaign.plan import Campaign, Variant
    from aclpipe.study.campaign.plots import panels, parent

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
    """p 0.0255 must not print as 0.025 (the level); two seeds say how little of the seed
    variation the interval holds; an inconclusive line says how large a difference it rules
    out."""
    from aclpipe.study.campaign.markdown import claim_line

    claim = {"question": "ACL beats CE+SCL on the final exit", "a": "acl", "b": "scl",
             "difference": 0.017, "low": -0.001, "high": 0.034, "p": 0.0255, "resamples": 2000,
             "verdict": "inconclusive", "detectable": 0.034, "seeds": [1, 2]}  # fmt: skip
    line = claim_line(claim)
    assert "p 0.0255:" in line and "[-0.1, +3.4]" in line
    assert "**inconclusive** (no difference larger than 3.4 points)" in line
    assert "(seeds 1, 2; 2 seeds only)" in line
    assert "only" not in claim_line({**claim, "seeds": [1, 2, 3]})
    # a bound that one decimal would print as +0.0 shows its sign
    assert "[+0.0083, +3.4]" in claim_line({**claim, "low": 0.000083, "verdict": "better"})
    assert "[-0.0037, +3.4]" in claim_line({**claim, "low": -0.000037})
    assert "1 seed: examples only" in claim_line({**claim, "seeds": [1]})
    # runs alike on every example: comparable, and p says why
    alike = {**claim, "difference": 0.0, "low": 0.0, "high": 0.0, "p": 0.0005,
             "verdict": "comparable"}  # fmt: skip
    assert ("= +0.0 [+0.0, +0.0] points, p 0.0005 (the two score alike on every example): "
            "**comparable**") in claim_line(alike)  # fmt: skip


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
    from aclpipe.study.campaign.markdown import FEW_SEEDS_NOTE, few_seeds_note

    def claim(seeds, tested=True):
        return {"seeds": seeds} | ({"difference": 0.01} if tested else {})

    assert few_seeds_note([claim([1, 2, 3]), claim([1, 2, 3, 4, 5])]) == ""
    assert few_seeds_note([claim([1, 2, 3]), claim([], tested=False)]) == ""
    assert few_seeds_note([]) == ""
    for few in ([1], [1, 2]):
        assert few_seeds_note([claim([1, 2, 3]), claim(few)]) == f" {FEW_SEEDS_NOTE}."
    assert few_seeds_note(iter([claim([2])])) == f" {FEW_SEEDS_NOTE}."  # any iterable


def test_where_claims_do_not_hold_gives_interval_and_seeds() -> None:
    """A claim that does not hold is shown with its interval and how many seeds it rests on;
    one that holds, an untested one and every claim of an uninformative task are left out."""
    from aclpipe.study.campaign.overview import not_holding

    def claim(question, verdict, seeds, holds=False, tested=True):
        c = {"question": question, "verdict": verdict, "seeds": seeds, "holds": holds}
        return c | ({"difference": -0.012, "low": -0.023, "high": -0.001, "detectable": 0.023}
                    if tested else {})  # fmt: skip

    good = {"informative": {"verdict": "better"}}
    summaries = {
        "mrpc": good | {"claims": [claim("A beats B", "better", [1, 2, 3], holds=True),
                                   claim("C beats D", "inconclusive", [1, 2, 3]),
                                   claim("E beats F", "not run yet", [], tested=False)]},
        "sst2": good | {"claims": [claim("A beats B", "comparable", [1]),
                                   claim("C beats D", "worse", [1]),
                                   claim("E beats F", "not run yet", [], tested=False)]},
        "rte": {"informative": {"verdict": "inconclusive"},
                "claims": [claim("A beats B", "worse", [1, 2, 3]),
                           claim("C beats D", "worse", [1, 2, 3]),
                           claim("E beats F", "worse", [1, 2, 3])]},
    }  # fmt: skip
    assert not_holding(summaries) == [
        "- Claimed: A beats B. Here: sst2: comparable, -1.2 [-2.3, -0.1] (1 seed: examples "
        "only).",
        "- Claimed: C beats D. Here: mrpc: inconclusive (no difference larger than 2.3), "
        "-1.2 [-2.3, -0.1] (seeds 1, 2, 3); sst2: worse, -1.2 [-2.3, -0.1] (1 seed: examples "
        "only).",
    ]
    # a "worse" that Holm does not reject at the family level says so
    summaries["sst2"]["claims"][1] |= {"seeds": [1, 2, 3], "holm_p": 0.4618,
                                       "holm_mc_error": 0.005, "family_wise": False}  # fmt: skip
    assert not_holding(summaries)[1].endswith(
        "sst2: worse, -1.2 [-2.3, -0.1] (seeds 1, 2, 3; not family-wise: adjusted p "
        "0.4618 ± 0.0050)."
    )
    summaries["sst2"]["claims"][1] |= {"holm_p": 0.02, "family_wise": True}
    assert not_holding(summaries)[1].endswith("sst2: worse, -1.2 [-2.3, -0.1] (seeds 1, 2, 3).")


def test_the_family_wise_view_names_each_verdict_with_its_adjusted_p() -> None:
    """Which decided verdicts survive Holm (adjusted p at most 2.5%), each with its Monte
    Carlo error, borderline when within 3 errors of the level."""
    from aclpipe.study.campaign.markdown import family_line

    def claim(a, verdict, holm_p, error=0.001):
        return {"a": a, "b": "ce", "measure": "final", "verdict": verdict, "p": holm_p / 3,
                "holm_p": holm_p, "holm_mc_error": error, "family_wise": holm_p <= 0.025,
                "difference": 0.01}  # fmt: skip

    good = {"informative": {"verdict": "better"}}
    summary = good | {"family": 3, "claims": [claim("acl", "better", 0.012),
                                              claim("scl", "worse", 0.0501),
                                              claim("joint", "comparable", 0.024, 0.002),
                                              {"a": "x", "b": "y", "measure": "auc",
                                               "verdict": "not run yet"}]}  # fmt: skip
    assert family_line(summary) == (
        "Family-wise (Holm over the 3 papers' claims tested here, each with its verdict's p, "
        "2.5% for the family): 2 of the 3 verdicts hold: acl - ce final exit, better (p "
        "0.0040, adjusted 0.0120 ± 0.0010); joint - ce final exit, comparable (p 0.0080, "
        "adjusted 0.0240 ± 0.0020 (borderline)). Not: scl - ce final exit, worse (p 0.0167, "
        "adjusted 0.0501 ± 0.0010)."
    )
    quiet = good | {"family": 2, "claims": [claim("acl", "inconclusive", 0.4)]}
    assert family_line(quiet).endswith(
        "no verdict is better, worse or comparable, so none is there to correct."
    )
    assert family_line(good | {"family": 0, "claims": []}) == "Family-wise: no claim tested yet."


def test_the_majority_label_from_a_data_record_with_named_classes() -> None:
    """RTE's record names its classes; SST-2's numbers them; a tie takes the smaller index."""
    from aclpipe.study.campaign.report import majority_label

    def record(labels):
        return {"splits": {"train": {"labels": labels}}}

    assert majority_label(TASKS["rte"], record({"entailment": 1124, "not_entailment": 1117})) == 0
    assert majority_label(TASKS["rte"], record({"entailment": 1, "not_entailment": 9})) == 1
    assert majority_label(TASKS["sst2"], record({"0": 8959, "1": 11041})) == 1
    assert majority_label(TASKS["sst2"], record({"0": 5, "1": 5})) == 0
    assert majority_label(TASKS["sst2"], None) is None
