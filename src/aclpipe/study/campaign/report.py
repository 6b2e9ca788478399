"""The campaign's published results: ``reports/<task>/results.{json,md}`` with plots, the
campaign-wide score-against-cost figure and ``reports/README.md``. Every figure comes from
the run folders (``campaign/runs/<task>/<run>-s<seed>/``: run.json, metrics.json and the
per-example outputs of every exit, predictions.npz); nothing here runs a model.

Statistics (``aclpipe.study.stats.measures``, ``paired``; docs/methods.md, "How a claim is judged"), scores x100:

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
from pathlib import Path
from typing import Any

import numpy as np

from aclpipe import atomic
from aclpipe.data.tasks import get_task
from aclpipe.layout import (
    REPORTS_README,
    RESULTS_ANGLES_PNG,
    RESULTS_COST_PNG,
    RESULTS_EXITS_PNG,
    RESULTS_JSON,
    RESULTS_MD,
    VALIDATION,
)
from aclpipe.study.campaign import leak_free
from aclpipe.study.campaign import speed as campaign_speed
from aclpipe.study.campaign.plan import Campaign
from aclpipe.study.campaign.plots import parent
from aclpipe.study.campaign.run_folders import angle_summary, load_runs, rule_use
from aclpipe.study.campaign.stack_check import stack
from aclpipe.study.stats import measures as scoring
from aclpipe.study.stats import paired, verdicts
from aclpipe.study.stats.verdicts import NON_INFERIORITY, NOT_EXERCISED, SUPERIORITY

# The papers' claims, worded as the papers word them (docs/claims.md): (question, A, B,
# measure, kind: superiority "A beats B" | non-inferiority "A outperforms or performs
# comparably with B", the run whose gradient rule the claim is about or None).
CLAIMS: list[tuple[str, str, str, str, str, str | None]] = [
    *(
        (f"ACL outperforms or performs comparably with {name} (final exit; A1)", "acl", run,
         "final", NON_INFERIORITY, None)
        for run, name in (("ce", "CE"), ("scl", "CE+SCL"))
    ),
    ("ACL-Grad helps ACL (with against without, final exit; A3)", "acl", "acl-nograd", "final",
     SUPERIORITY, "acl"),
    *(
        (f"ACL-CL surpasses {name} on the {where} (A4)", "acl-cl", run, measure, SUPERIORITY, None)
        for run, name in (("romebert", "RomeBERT"), ("deebert", "DeeBERT"))
        for measure, where in (("shallow", "shallow exits"), ("average", "average over exits"),
                               ("auc", "speed-quality curve (AUC)"))
    ),
    ("GR helps RomeBERT (average over exits; R4)", "romebert", "romebert-nogr", "average",
     SUPERIORITY, "romebert"),
]  # fmt: skip
# The project's own controls and ablations: no paper claims them; never in a family.
CONTROLS: list[tuple[str, str, str, str, str, str | None]] = [
    *(
        (f"ACL-CL against joint (the same exits without contrastive terms) on the {where}",
         "acl-cl", "joint", measure, SUPERIORITY, None)
        for measure, where in (("shallow", "shallow exits"), ("average", "average over exits"),
                               ("auc", "speed-quality curve (AUC)"))
    ),
    ("The SD term on ACL-CL (average over exits)", "acl-cl-sd", "acl-cl", "average",
     SUPERIORITY, None),
    ("RomeBERT with its released KL scaling (KL / C) against ours, final exit",
     "romebert-klmean", "romebert", "final", SUPERIORITY, None),
    ("ACL-Grad's drop rule on CE+SCL, where it fires (final exit)", "scl-grad", "scl", "final",
     SUPERIORITY, "scl-grad"),
]  # fmt: skip
NOISE_FLOOR = ("Noise floor: ce against deebert's final exit (the same CE fine-tune)",
               "ce", "deebert", "final", SUPERIORITY, None)  # fmt: skip


# --- one task ---------------------------------------------------------------------------------


def summarise_task(campaign: Campaign, task: str, resamples: int = paired.RESAMPLES) -> dict:
    """Every figure of a task's report, from its run folders (no forward passes)."""
    t = get_task(task)
    found = load_runs(campaign, task)
    out, planned, table_seeds = _seed_sets(campaign, task, found, resamples)
    any_run = next((r for by_seed in found.values() for r in by_seed.values()), None)
    if any_run is None:
        return out
    _describe_data(out, t, found, any_run)
    labels = any_run["outputs"].dev_labels
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
    out["beside"] = _beside(campaign, t, out, found, measures, labels, resamples)
    _judge_claims(campaign, t, out, {"found": found, "measures": measures, "planned": planned,
                                     "labels": labels})  # fmt: skip
    leaks = leak_free.summarise(campaign, task, found)
    if leaks is not None:
        out["leak_free"] = leaks
    return out


def _seed_sets(
    campaign: Campaign, task: str, found: dict, resamples: int
) -> tuple[dict[str, Any], dict[str, list[int]], dict[str, list[int]]]:
    """The summary's head (which runs are planned, finished, missing, and the seeds every run
    of a set has finished), the planned seeds by run, and the seeds each run's table row is
    over."""
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
    return out, planned, table_seeds


def _describe_data(out: dict[str, Any], t, found: dict, any_run: dict) -> None:
    """The data, the majority-class scores, whether every run has validation rows, the stacks."""
    splits = any_run["metrics"].get("splits", {})
    out["data"] = any_run["record"].get("data")
    out["majority"] = {
        "dev": splits.get(t.dev_splits[0][0], {}).get("majority_score"),
        "validation": splits.get(VALIDATION, {}).get("majority_score"),
    }
    out["has_validation"] = all(
        r["outputs"].validation_logits is not None for s in found.values() for r in s.values()
    )
    out["stacks"] = dict(
        collections.Counter(stack(r["record"]) for s in found.values() for r in s.values())
    )


def _beside(
    campaign: Campaign, t, out: dict[str, Any], found: dict, measures: dict, labels, resamples: int
) -> dict[str, dict]:
    """Like with like: an ablation's row sits beside the run it changes over the same seeds."""
    beside = {}
    for run in out["ablations"]:
        base = parent(campaign, run)
        if run in out["runs"] and base in found:
            seeds = [s for s in out["runs"][run]["seeds"] if s in found[base]]
            if seeds:
                beside[run] = {
                    "run": base,
                    "seeds": seeds,
                    **{
                        m: paired.seed_mean_interval(
                            t, {s: measures[base][m][s] for s in seeds}, labels, resamples
                        )
                        if all(s in measures[base][m] for s in seeds)
                        else None
                        for m in scoring.MEASURES
                    },
                }
    return beside


def _judge_claims(campaign: Campaign, t, out: dict[str, Any], judged: dict) -> None:
    """The rules, ce against the majority class, the claims, the controls, the noise floor and
    the Holm family of the papers' claims."""
    rules = campaign.verdicts
    out["rules"] = {"margin": rules.margin, "resamples": rules.resamples,
                    "rule_floor": rules.rule_floor, "alpha": rules.alpha}  # fmt: skip
    out["informative"] = _against_majority(t, judged["found"], out["data"], judged["labels"], rules)
    out["claims"] = [_claim(t, c, judged, rules) for c in CLAIMS]
    out["controls"] = [_claim(t, c, judged, rules) for c in CONTROLS]
    out["noise_floor"] = _claim(t, NOISE_FLOOR, judged, rules)
    # The family: the papers' claims tested on an informative task (not the controls, not the
    # noise floor, not a rule that was never exercised), each with its verdict's own p.
    informative = out["informative"].get("verdict") == "better"
    tested = [c for c in out["claims"] if c["verdict"] in verdicts.VERDICTS and informative]
    verdicts.family(tested, rules, rules.resamples)
    out["family"] = len(tested)


def majority_label(task, data: dict | None) -> int | None:
    """The most frequent training label in a run's data record, as a class index (the record
    names each class as ``task.labels`` does; ties: the smaller index)."""
    counts = ((data or {}).get("splits", {}).get("train", {}) or {}).get("labels") or {}
    if not counts:
        return None
    index = {name: i for i, name in enumerate(task.labels)}
    return min(index[k] for k in counts if counts[k] == max(counts.values()))


def _against_majority(task, found: dict, data: dict | None, labels, rules) -> dict:
    """ce's final exit against a constant guess of the majority training label, with the
    claims' paired bootstrap: the task says something only when ce is better."""
    label = majority_label(task, data)
    ce = {s: scoring.measure(r["outputs"], "final") for s, r in found.get("ce", {}).items()}
    if label is None or not ce:
        return {"verdict": "not run yet"}
    constant = scoring.Measure("final", np.full((1, len(labels)), label))
    return judge_pair(task, ce, {s: constant for s in ce}, labels, rules, SUPERIORITY)


def judge_pair(task, a: dict, b: dict, labels, rules, kind: str) -> dict:
    difference, diffs = paired.bootstrap_differences(task, a, b, labels, rules.resamples)
    low, high = paired.percentile_interval(diffs, paired.LEVEL)
    seeds = sorted(set(a) & set(b))
    ones = np.ones((1, len(labels)))
    return {
        "seeds": seeds,
        "a_mean": float(np.mean([a[s].values(task, labels, ones)[0] for s in seeds])),
        "b_mean": float(np.mean([b[s].values(task, labels, ones)[0] for s in seeds])),
        "difference": difference,
        "low": low,
        "high": high,
        "detectable": verdicts.detectable(low, high),
        "resamples": rules.resamples,
        **verdicts.judge(diffs, kind, rules),
    }


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
    entry.update(angle_summary(by_seed))
    return entry


def _claim(task, claim, judged: dict, rules) -> dict:
    question, a, b, measure, kind, rule_run = claim
    row: dict[str, Any] = {"question": question, "a": a, "b": b, "measure": measure,
                           "kind": kind}  # fmt: skip
    measures, planned = judged["measures"], judged["planned"]
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
    seeds = sorted(set(ma) & set(mb))
    if not seeds:
        row["verdict"] = "no common seed"
        return row
    row.update(judge_pair(task, ma, mb, judged["labels"], rules, kind))
    if rule_run is not None:
        row.update(rule_use(judged["found"][rule_run], seeds, rules))
        if not row["rule_exercised"]:
            row["verdict"], row["holds"] = NOT_EXERCISED, False
    return row


# --- files ------------------------------------------------------------------------------------


def write_reports(
    campaign: Campaign, reports_dir: Path, tuned: dict[str, dict] | None = None
) -> dict[str, dict]:
    """Write every task's results and plots, the campaign-wide figure and the overview
    (``tuned``: the tuning summaries by task, for its recipe line, computed when not given);
    returns the summaries."""
    from aclpipe.study.campaign import markdown as campaign_markdown
    from aclpipe.study.campaign import overview as campaign_overview
    from aclpipe.study.campaign import plots as campaign_plots
    from aclpipe.study.campaign import results_page, tuning

    summaries = {}
    for task in campaign.tasks:
        summary = summarise_task(campaign, task)
        if not summary["runs"]:
            continue
        summaries[task] = summary
        out = campaign_markdown.campaign_reports(reports_dir, task)
        atomic.write_text(out / RESULTS_JSON, json.dumps(summary, indent=2) + "\n")
        atomic.write_text(out / RESULTS_MD, results_page.task_markdown(campaign, summary))
        campaign_plots.draw_exit_bands(campaign, summary, out / RESULTS_EXITS_PNG)
        if any("angles" in e for e in summary["runs"].values()):
            campaign_plots.draw_angle_histograms(summary, out / RESULTS_ANGLES_PNG)
    if summaries:
        cost_png = campaign_markdown.campaign_reports(reports_dir) / RESULTS_COST_PNG
        campaign_plots.draw_score_vs_time(campaign, summaries, cost_png)
        tuned = tuning.summaries(campaign) if tuned is None else tuned
        overview = campaign_overview.overview_markdown(campaign, summaries, tuned)
        atomic.write_text(reports_dir / REPORTS_README, overview)
    return summaries
