"""The campaign's published results: ``reports/<task>/results.{json,md}`` with plots, the
campaign-wide score-against-cost figure and ``reports/README.md``. Every figure comes from
the run folders (``campaign/runs/<task>/<run>-s<seed>/``: run.json, metrics.json and the
per-example outputs of every exit, predictions.npz); nothing here runs a model.

Statistics (``aclpipe.study.measures``, ``paired``; METHODS.md "Comparisons"), scores x100:

- A run's row (final exit, shallow half, average over exits, AUC, every exit, budgets) is
  the mean over its seeds, with the sample sd over seeds and a 95% interval from the
  bootstrap over seeds and dev examples. Rows are over the *table seeds*, per set of runs:
  the claims' runs over the seeds every one of them has finished, the ablations over those
  of these seeds that every ablation planned for them has finished too (ablations are
  planned on fewer seeds), so that every row of a set is over the same data orders and a
  late ablation does not hold the claims' rows back; before a set has a complete seed, each
  of its rows is over the seeds it has, and the report says so.
- A claim "A beats B" is judged by the paired bootstrap over the seeds *both* runs have
  finished (not only the table seeds), and says which.
- Budgets count from ce's full model of the same seed, choose each seed's exit setting on
  the validation split and report dev; every table seed counts (``measures.budget_pick``).
"""

from __future__ import annotations

import collections
import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from aclpipe import atomic
from aclpipe.data.tasks import get_task
from aclpipe.errors import UserError
from aclpipe.layout import (
    METRICS,
    PREDICTIONS,
    REPORTS_README,
    RESULTS_ANGLES_PNG,
    RESULTS_COST_PNG,
    RESULTS_EXITS_PNG,
    RESULTS_JSON,
    RESULTS_MD,
    RUN_RECORD,
    VALIDATION,
)
from aclpipe.study import campaign_speed, paired
from aclpipe.study import measures as scoring
from aclpipe.study.campaign import Campaign
from aclpipe.study.stack_check import stack

# (question, A, B, measure, a seed claim: one the papers make, answered in README.md)
CLAIMS: list[tuple[str, str, str, str, bool]] = [
    ("ACL beats CE on the final exit", "acl", "ce", "final", True),
    ("ACL beats CE+SCL on the final exit", "acl", "scl", "final", True),
    ("ACL-Grad helps ACL (with against without, final exit)", "acl", "acl-nograd", "final", True),
    *(
        (f"ACL-CL beats {name} on the {where}", "acl-cl", run, measure, True)
        for run, name in (("romebert", "RomeBERT"), ("deebert", "DeeBERT"), ("joint", "joint"))
        for measure, where in (("shallow", "shallow exits"), ("average", "average over exits"))
    ),
    *(
        (f"ACL-CL beats {name} on speed-quality (AUC)", "acl-cl", run, "auc", True)
        for run, name in (("deebert", "DeeBERT"), ("romebert", "RomeBERT"), ("joint", "joint"))
    ),
    ("GR helps RomeBERT (average over exits)", "romebert", "romebert-nogr", "average", True),
    ("The SD term helps ACL-CL (average over exits)", "acl-cl-sd", "acl-cl", "average", True),
    ("RomeBERT with its released KL scaling (KL / C) against ours, final exit",
     "romebert-klmean", "romebert", "final", False),
]  # fmt: skip
NOISE_FLOOR = ("Noise floor: ce against deebert's final exit (the same CE fine-tune)",
               "ce", "deebert", "final", False)  # fmt: skip


# --- run folders ------------------------------------------------------------------------------


def load_run(task_name: str, folder: Path) -> dict:
    """One run folder: ``{"record", "metrics", "outputs": scoring.RunOutputs, "folder"}``."""
    task = get_task(task_name)
    record = json.loads((folder / RUN_RECORD).read_text(encoding="utf-8"))
    if not (folder / PREDICTIONS).exists():
        raise UserError(
            f"{folder} has no {PREDICTIONS} (a run from before per-example outputs were kept): "
            f"rerun it: delete the folder, then `{record.get('command', 'aclpipe campaign run')}`"
        )
    dev = task.dev_splits[0][0]
    with np.load(folder / PREDICTIONS) as data:
        arrays = {key: data[key] for key in data.files}
    evaluate = record.get("params", {}).get("evaluate", {})
    outputs = scoring.RunOutputs(
        task,
        arrays["exits"].astype(np.int64),
        int(arrays["num_layers"]),
        arrays[f"{dev}_logits"],
        arrays[f"{dev}_labels"],
        arrays.get(f"{VALIDATION}_logits"),
        arrays.get(f"{VALIDATION}_labels"),
        evaluate.get("grid_points", 11),
        evaluate.get("patience_eps", 0.1),
    )
    metrics = json.loads((folder / METRICS).read_text(encoding="utf-8"))
    return {"record": record, "metrics": metrics, "outputs": outputs, "folder": folder}


def load_runs(campaign: Campaign, task: str) -> dict[str, dict[int, dict]]:
    """``{run: {seed: run folder}}`` of the campaign's planned runs that have finished."""
    found: dict[str, dict[int, dict]] = {}
    for run in (r for r in campaign.runs if task in campaign.tasks_for(r)):
        for seed in campaign.seeds_for(run):
            folder = campaign.run_dir(task, run, seed)
            if (folder / RUN_RECORD).exists():
                found.setdefault(run, {})[seed] = load_run(task, folder)
    check_same_data([r for s in found.values() for r in s.values()])
    return found


def check_same_data(runs: list[dict]) -> None:
    """Every run of a task was trained and scored on the same prepared data (the same dev
    labels in the same order and the same data record), so that a paired comparison pairs
    the same examples: ``paired.check_same_examples``."""
    paired.check_same_examples(
        [(r["folder"], r["outputs"].dev_labels, r["record"].get("data")) for r in runs],
        "dev",
        "rerun it on the campaign's prepared data",
    )


# --- one task ---------------------------------------------------------------------------------


def summarise_task(campaign: Campaign, task: str, resamples: int = paired.RESAMPLES) -> dict:
    """Every figure of a task's report, from its run folders (no forward passes)."""
    t = get_task(task)
    found = load_runs(campaign, task)
    finished = {run: sorted(by_seed) for run, by_seed in found.items()}
    planned = {r: campaign.seeds_for(r) for r in campaign.runs if task in campaign.tasks_for(r)}
    all_seeds = sorted({s for seeds in planned.values() for s in seeds})
    # the ablations and the experiment's runs: controls, each over its own seeds
    ablations = [r for r in planned if r in campaign.ablations + campaign.experiment.runs]
    claims_runs = [r for r in planned if r not in ablations]

    def done(runs: list[str], s: int) -> bool:
        return all(s in finished.get(r, []) for r in runs if s in planned[r])

    complete = [s for s in all_seeds if done(claims_runs, s)]
    complete_ablations = [  # a seed no ablation is planned for completes nothing
        s for s in complete if any(s in planned[r] for r in ablations) and done(ablations, s)
    ]
    out: dict[str, Any] = {
        "task": task,
        "finished": sum(len(s) for s in finished.values()),
        "planned": sum(len(s) for s in planned.values()),
        "missing": {r: [s for s in planned[r] if s not in finished.get(r, [])] for r in planned},
        "complete": complete,
        "complete_ablations": complete_ablations,
        "ablations": ablations,
        "resamples": resamples,
        "runs": {},
    }
    table_seeds = {}
    for run, seeds in finished.items():
        of_set = complete_ablations if run in ablations else complete
        table_seeds[run] = [s for s in seeds if s in of_set] if of_set else seeds
    out["left_out"] = {
        run: [s for s in finished[run] if s not in seeds]
        for run, seeds in table_seeds.items()
        if len(seeds) < len(finished[run])
    }
    any_run = next((r for by_seed in found.values() for r in by_seed.values()), None)
    if any_run is None:
        return out
    splits = any_run["metrics"].get("splits", {})
    out["data"] = any_run["record"].get("data")
    out["majority"] = {
        "dev": splits.get(t.dev_splits[0][0], {}).get("majority_score"),
        "validation": splits.get(VALIDATION, {}).get("majority_score"),
    }
    out["has_validation"] = all(
        r["outputs"].validation_logits is not None for s in found.values() for r in s.values()
    )
    labels = any_run["outputs"].dev_labels
    out["stacks"] = dict(
        collections.Counter(stack(r["record"]) for s in found.values() for r in s.values())
    )
    references = campaign_speed.references(found)
    out["budget_reference"] = campaign_speed.BUDGET_REFERENCE if references else None
    measures: dict[str, dict[str, dict[int, scoring.Measure]]] = {}
    for run in campaign.runs:
        if run not in found:
            continue
        by_seed = found[run]
        measures[run] = {
            m: {s: x for s, r in by_seed.items() if (x := scoring.measure(r["outputs"], m))}
            for m in scoring.MEASURES
        }
        if not table_seeds[run]:  # none of its seeds is complete yet: in left_out, claims only
            continue
        out["runs"][run] = _run_entry(
            t, run, {s: by_seed[s] for s in table_seeds[run]}, measures[run], labels, resamples,
            out["majority"], references,
        )  # fmt: skip
    out["claims"] = [_claim(t, c, measures, planned, labels, resamples) for c in CLAIMS]
    # The family-wise view: Holm over the claims tested on this task (the noise floor is a
    # yardstick, not a claim, and stays out of the family).
    tested = [c for c in out["claims"] if "p_two_sided" in c]
    for c, adjusted in zip(tested, paired.holm([c["p_two_sided"] for c in tested])):
        c["holm_p"] = adjusted
    out["family"] = len(tested)
    out["noise_floor"] = _claim(t, NOISE_FLOOR, measures, planned, labels, resamples)
    return out


def _run_entry(task, run, by_seed, measures, labels, resamples, majority, references) -> dict:
    seeds = sorted(by_seed)
    first = by_seed[seeds[0]]
    outputs = first["outputs"]
    entry: dict[str, Any] = {
        "method": first["record"]["method"],
        "overrides": [
            o.replace("=False", "=false").replace("=True", "=true")
            for o in first["record"].get("overrides", [])
            if o.startswith("methods.")
        ],
        "seeds": seeds,
        "exits": outputs.exits.tolist(),
        "num_layers": outputs.num_layers,
        "stacks": sorted({stack(r["record"]) for r in by_seed.values()}),
    }
    for m in scoring.MEASURES:
        chosen = {s: x for s, x in measures[m].items() if s in by_seed}
        entry[m] = paired.seed_mean_interval(task, chosen, labels, resamples) if chosen else None
    entry["per_exit"] = paired.exit_bands(
        task, {s: r["outputs"].exit_predictions() for s, r in by_seed.items()}, labels, resamples
    )
    multi = outputs.multi_exit and all(
        r["outputs"].validation_logits is not None for r in by_seed.values()
    )
    if multi:
        entry["budgets"] = campaign_speed.budgets(by_seed, majority, references)
        entry["cost_curve"] = campaign_speed.cost_curve(task, by_seed)
    entry.update(_angles(by_seed))
    return entry


def _angles(by_seed: dict) -> dict:
    from aclpipe.run_log import has_run_log
    from aclpipe.study.angles import read_angles
    from aclpipe.study.angles import summarise as summarise_angles

    folders = [r["folder"] for _, r in sorted(by_seed.items())]
    angles = [read_angles(f) if has_run_log(f) else ([], []) for f in folders]
    if not any(a for a, _ in angles):
        return {}
    pooled = [a for seed_angles, _ in angles for a in seed_angles]
    per_seed = [summarise_angles(a, f) for a, f in angles if a]
    bins = [0] * 18  # [0, 10), [10, 20), ... [170, 180] degrees
    for a in pooled:
        bins[min(int(a // 10), 17)] += 1
    return {
        "angles": {
            "steps": len(pooled),
            "share_over_90": campaign_speed.over_seeds([x["share_over_90"] for x in per_seed]),
            "altered_rate": campaign_speed.over_seeds([x["altered_rate"] for x in per_seed]),
            "mean_angle": statistics.fmean(pooled),
            "histogram": bins,
        }
    }


def _claim(task, claim, measures, planned, labels, resamples) -> dict:
    question, a, b, measure, seed_claim = claim
    row: dict[str, Any] = {"question": question, "a": a, "b": b, "measure": measure,
                           "seed_claim": seed_claim}  # fmt: skip
    if a not in planned or b not in planned:
        row["verdict"] = "not in this campaign"
        return row
    if a not in measures or b not in measures:
        row["verdict"] = "not run yet"
        return row
    ma, mb = measures[a][measure], measures[b][measure]
    if not ma or not mb:
        row["verdict"] = (
            "not available" if measure != "auc" else "no AUC (needs a validation split)"
        )
        return row
    row.update(paired.paired_bootstrap(task, ma, mb, labels, resamples))
    return row


# --- files ------------------------------------------------------------------------------------


def write_reports(campaign: Campaign, reports_dir: Path) -> dict[str, dict]:
    """Write every task's results and plots, the campaign-wide figure and the overview;
    returns the summaries."""
    from aclpipe.study import campaign_markdown, campaign_overview, campaign_plots

    summaries = {}
    for task in campaign.tasks:
        summary = summarise_task(campaign, task)
        if not summary["runs"]:
            continue
        summaries[task] = summary
        out = campaign_markdown.campaign_reports(reports_dir, task)
        atomic.write_text(out / RESULTS_JSON, json.dumps(summary, indent=2) + "\n")
        atomic.write_text(out / RESULTS_MD, campaign_markdown.task_markdown(campaign, summary))
        campaign_plots.draw_exit_bands(campaign, summary, out / RESULTS_EXITS_PNG)
        if any("angles" in e for e in summary["runs"].values()):
            campaign_plots.draw_angle_histograms(summary, out / RESULTS_ANGLES_PNG)
    if summaries:
        cost_png = campaign_markdown.campaign_reports(reports_dir) / RESULTS_COST_PNG
        campaign_plots.draw_score_vs_time(campaign, summaries, cost_png)
        overview = campaign_overview.overview_markdown(campaign, summaries)
        atomic.write_text(reports_dir / REPORTS_README, overview)
    return summaries
