"""The few-shot study's results: ``reports/fewshot/{README.md,results.json}`` and its figures,
from the run folders (``fewshot/runs/<task>/<run>-n<N>-s<seed>/``, read as the campaign's are:
``aclpipe.study.campaign.run_folders.load_run``); nothing here runs a model.

Per (task, N), over the draws (a draw is one seed) and the dev examples, scores x1 here, x100
in the markdown:

- each method's final-exit dev score: the mean over draws, the sample sd over draws and the
  95% interval of ``paired.seed_mean_interval``;
- the claims (``CLAIMS``), judged as the campaign's are (``aclpipe.study.campaign.report.judge_pair``: the
  paired bootstrap over draws and dev examples on the draws both runs have, each run of a draw
  on the same examples; ``verdicts.judge`` under ``campaign.verdicts``): better / worse /
  comparable / inconclusive, and whether the claim *holds* as its paper words it (a
  superiority claim when better, a non-inferiority one when better or comparable); A3 is
  *rule not exercised* where ACL-Grad's rule altered under ``rule_floor`` of the steps
  (``aclpipe.study.campaign.run_folders.rule_use``); Holm's step-down over each task's tested claims, every N
  (``verdicts.family``);
- the spread claim (``SPREADS``, S2): the ratio of the sds over draws, A's over B's, with a 95%
  interval from the same resamples (draws and examples drawn together, ``paired.draw``):
  ``lower`` when the interval lies below 1, ``higher`` above, else ``inconclusive``; only
  where A beats the majority class (a method that guesses one class has no spread to speak
  of);
- each method against the majority class (the constant prediction of the draw's most
  frequent class, scored on the same resamples): ``better`` only when its superiority test
  says so; otherwise the method sits on the majority class (or below it), and a claim between
  two methods that both do is ``uninformative``.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import numpy as np

from aclpipe import atomic
from aclpipe.data.tasks import get_task
from aclpipe.errors import UserError
from aclpipe.layout import (
    FEWSHOT_PEERS_PNG,
    FEWSHOT_REPORTS,
    FEWSHOT_SCORES_PNG,
    FEWSHOT_SPREAD_PNG,
    REPORTS_README,
    RESULTS_JSON,
    RUN_RECORD,
)
from aclpipe.study.campaign.peers import PEER_NAMES
from aclpipe.study.campaign.plan import Campaign
from aclpipe.study.campaign.report import judge_pair
from aclpipe.study.campaign.run_folders import angle_summary, load_run, rule_use
from aclpipe.study.campaign.stack_check import stack
from aclpipe.study.fewshot.markdown import BELOW, ON, SPREAD_DRAWS
from aclpipe.study.fewshot.peers import draw_peers, missing, peer_claims, peer_family
from aclpipe.study.stats import measures as scoring
from aclpipe.study.stats import paired, verdicts
from aclpipe.study.stats.verdicts import NON_INFERIORITY, NOT_EXERCISED, SUPERIORITY, Rules

# (claim id, question, A, B, kind, the run whose gradient rule it tests): on the final exit,
# per (task, N), worded as docs/claims.md words them
CLAIMS: list[tuple[str, str, str, str, str, str | None]] = [
    ("S1", "CE+SCL beats CE", "scl", "ce", SUPERIORITY, None),
    ("A1", "ACL outperforms or performs comparably with CE", "acl", "ce", NON_INFERIORITY, None),
    ("A1", "ACL outperforms or performs comparably with CE+SCL", "acl", "scl", NON_INFERIORITY,
     None),
    ("A3", "ACL-Grad helps ACL (acl against acl-nograd)", "acl", "acl-nograd", SUPERIORITY, "acl"),
]  # fmt: skip
# (claim id, question, A, B): "A's scores vary less over draws than B's"
SPREADS: list[tuple[str, str, str, str]] = [
    ("S2", "CE+SCL varies less over draws than CE", "scl", "ce"),
    ("S2", "ACL varies less over draws than CE", "acl", "ce"),
]


def load_cell(campaign: Campaign, task: str, n: int) -> dict[str, dict[int, dict]]:
    """``{run: {seed: run folder}}`` of the finished runs at N; runs are named as in
    ``campaign.runs`` of the file (``ce``, not ``ce-n20``)."""
    found: dict[str, dict[int, dict]] = {}
    for name, (run, size) in campaign.fewshot_runs.items():
        if size != n:
            continue
        for seed in campaign.seeds_at(task, name):
            folder = campaign.run_dir(task, name, seed)
            if (folder / RUN_RECORD).exists():
                found.setdefault(run, {})[seed] = load_run(task, folder)
    check_draws(found)
    return found


def _without_draw(data: dict | None) -> dict:
    """A run's data record less what differs between draws (the draw, the training split)."""
    data = dict(data or {})
    data.pop("fewshot", None)
    data["splits"] = {k: v for k, v in data.get("splits", {}).items() if k != "train"}
    return data


def check_draws(found: dict[str, dict[int, dict]]) -> None:
    """Every run scored the same dev examples from the same data (``paired.check_same_examples``,
    the draw aside), and the runs of one seed trained on the same draw: a paired comparison
    pairs the same training examples."""
    runs = [r for by_seed in found.values() for r in by_seed.values()]
    paired.check_same_examples(
        [(r["folder"], r["outputs"].dev_labels, _without_draw(r["record"].get("data"))) for r in runs],
        "dev",
        "rerun it on the study's prepared data",
    )  # fmt: skip
    drawn: dict[int, tuple[Path, list[int]]] = {}
    for r in runs:
        seed, ids = r["record"]["seed"], r["record"].get("data", {}).get("fewshot", {}).get("ids")
        if ids is None:
            raise UserError(f"{r['folder']} has no few-shot draw in run.json: rerun it")
        first = drawn.setdefault(seed, (r["folder"], ids))
        if first[1] != ids:
            raise UserError(
                f"{r['folder']} trained on another draw than {first[0]} (seed {seed}): "
                "prepare the draw again and rerun both"
            )


def against_majority(
    task, runs: dict[int, scoring.Measure], floor: dict[int, scoring.Measure],
    labels: np.ndarray, rules: Rules,
) -> dict:  # fmt: skip
    """A method against the majority-class guess of its draws (the claims' test, superiority):
    better, below it (worse), else on it (not told apart)."""
    found = judge_pair(task, runs, {s: floor[s] for s in runs}, labels, rules, SUPERIORITY)
    return {**found, "verdict": {"better": "better", "worse": BELOW}.get(found["verdict"], ON)}


def majority_measure(run: dict) -> scoring.Measure:
    """The majority-class floor as a run: the draw's most frequent class on every dev example
    (ties to the lower class index, as ``evaluation.scoring.majority_prediction``)."""
    task = run["outputs"].task
    counts = run["record"]["data"]["splits"]["train"]["labels"]
    per_class = [counts[name] for name in task.labels]
    constant = int(np.argmax(per_class))
    return scoring.Measure("final", np.full((1, len(run["outputs"].dev_labels)), constant))


def spread_ratio(
    task, a: dict[int, scoring.Measure], b: dict[int, scoring.Measure], labels: np.ndarray,
    resamples: int = paired.RESAMPLES, level: float = paired.LEVEL,
) -> dict:  # fmt: skip
    """The ratio of A's sd over draws to B's, on the draws both have, with a bootstrap interval
    over draws and dev examples (the draws of ``paired.draw``, shared by A and B). A resample
    where B's sd is 0 gives +inf when A's is not, and is undefined (left out) when both are;
    past 2.5% of such resamples the ratio gets no interval (``_undefined`` says why)."""
    seeds = sorted(set(a) & set(b))
    if len(seeds) < SPREAD_DRAWS:
        return {"draws": seeds, "verdict": f"too few draws ({SPREAD_DRAWS} needed)"}
    weights, counts = paired.draw(len(labels), len(seeds), resamples, 0)
    ones = np.ones((1, len(labels)))
    sd = {}
    for name, runs in (("a", a), ("b", b)):
        original = np.array([runs[s].values(task, labels, ones)[0] for s in seeds])
        values = np.stack([runs[s].values(task, labels, weights) for s in seeds], axis=1)  # [R, n]
        sd[name] = (float(np.std(original, ddof=1)), _weighted_sd(values, counts))
    ratio = np.divide(sd["a"][1], sd["b"][1], out=np.full(resamples, np.nan), where=sd["b"][1] > 0)
    ratio[(sd["b"][1] == 0) & (sd["a"][1] > 0)] = np.inf
    undefined = float(np.mean(np.isnan(ratio)))
    out: dict[str, Any] = {
        "draws": seeds,
        "sd_a": sd["a"][0],
        "sd_b": sd["b"][0],
        "ratio": sd["a"][0] / sd["b"][0] if sd["b"][0] > 0 else None,
        "undefined_share": undefined,
        "resamples": resamples,
    }
    if undefined > (1 - level) / 2:  # 0 / 0 too often for the interval to mean anything
        return {**out, "low": None, "high": None, "verdict": _undefined(out, undefined)}
    low, high = quantiles(ratio, [(1 - level) / 2, 1 - (1 - level) / 2])
    verdict = "lower" if high < 1 else "higher" if low > 1 else verdicts.INCONCLUSIVE
    return {**out, "low": float(low), "high": float(high), "verdict": verdict}


def _undefined(found: dict, share: float) -> str:
    """Why S2 has no interval: neither method varies over the draws, or too many resamples
    have neither vary (draws of equal scores drawn alone)."""
    if found["sd_a"] == 0 and found["sd_b"] == 0:
        return "undefined (neither varies over the draws)"
    return f"undefined (neither sd above 0 in {share:.0%} of the resamples: too few distinct draws)"


def quantiles(values: np.ndarray, qs: list[float]) -> list[float]:
    """``np.nanquantile``'s linear quantiles of ``values`` (NaN left out), where +inf may
    occur: a quantile that interpolates towards +inf is +inf."""
    if not np.isinf(values).any():
        return [float(q) for q in np.nanquantile(values, qs)]
    ordered = np.sort(values[~np.isnan(values)])
    out = []
    for q in qs:
        position = q * (len(ordered) - 1)
        lower, upper = int(np.floor(position)), int(np.ceil(position))
        if np.isinf(ordered[lower]) or (np.isinf(ordered[upper]) and upper > lower):
            out.append(float(np.inf))
        else:
            gap = ordered[upper] - ordered[lower]
            out.append(float(ordered[lower] + gap * (position - lower)))
    return out


def _weighted_sd(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``[R]``: the sample sd of each resample's drawn seeds (``values [R, n]``, each seed
    counted ``counts [R, n]`` times); float rounding (under ``measures.ROUNDING``) is 0, so a
    resample of equal scores has no spread."""
    total = counts.sum(axis=1)  # [R]
    mean = (counts * values).sum(axis=1) / total
    sd = np.sqrt((counts * (values - mean[:, None]) ** 2).sum(axis=1) / (total - 1))
    return np.where(sd < scoring.ROUNDING, 0.0, sd)


def summarise_cell(campaign: Campaign, task_name: str, n: int) -> dict:
    """Every figure of one (task, N): scores, claims, spreads, the majority class, under the
    study's ``campaign.verdicts``; the family-wise columns are ``family``'s, over every N."""
    task, rules = get_task(task_name), campaign.verdicts
    resamples = rules.resamples
    found = load_cell(campaign, task_name, n)
    runs = [r for r in campaign.runs if campaign.fewshot_runs[r][1] == n and campaign.seeds_at(task_name, r)]
    bases = [campaign.fewshot_runs[r][0] for r in runs]
    out: dict[str, Any] = {
        "task": task_name,
        "n": n,
        "finished": sum(len(s) for s in found.values()),
        "planned": sum(len(campaign.seeds_at(task_name, r)) for r in runs),
        "bases": bases,  # the runs planned at this (task, N)
        "runs": {},
        "stacks": dict(
            collections.Counter(
                stack(r["record"]) for by_seed in found.values() for r in by_seed.values()
            )
        ),
    }
    any_run = next((r for by_seed in found.values() for r in by_seed.values()), None)
    if any_run is None:  # nothing finished here yet: its peer claims wait (or are not planned)
        if set(bases) & set(PEER_NAMES):
            out["peers"] = cell_peers(campaign, task, n, {}, set(), np.empty(0), bases)
        return out
    labels = any_run["outputs"].dev_labels
    dev = task.dev_splits[0][0]
    out["majority"] = any_run["metrics"]["splits"][dev]["majority_score"]
    out["dev_examples"] = len(labels)
    out["per_class"] = any_run["record"]["data"]["fewshot"]["per_stratum"]
    measures = {
        run: {s: scoring.measure(r["outputs"], "final") for s, r in by_seed.items()}
        for run, by_seed in found.items()
    }
    floor = {s: majority_measure(r) for by_seed in found.values() for s, r in by_seed.items()}
    for run in bases:
        if run not in found:
            continue
        entry = paired.seed_mean_interval(task, measures[run], labels, resamples)
        entry["scores"] = {
            s: float(m.values(task, labels, np.ones((1, len(labels))))[0])
            for s, m in sorted(measures[run].items())
        }
        entry["vs_majority"] = against_majority(task, measures[run], floor, labels, rules)
        entry.update(angle_summary(found[run]))
        out["runs"][run] = entry
    informative = {r for r, e in out["runs"].items() if e["vs_majority"]["verdict"] == "better"}
    out["claims"] = []
    for claim, question, a, b, kind, rule_run in CLAIMS:
        row: dict[str, Any] = {"claim": claim, "question": question, "a": a, "b": b, "kind": kind}
        if a not in measures or b not in measures:
            row["verdict"] = missing(a, b, bases)
        elif not set(measures[a]) & set(measures[b]):
            row["verdict"] = "no common seed"
        else:
            row.update(judge_pair(task, measures[a], measures[b], labels, rules, kind))
            if rule_run is not None:
                row.update(rule_use(found[rule_run], row["seeds"], rules))
            if not {a, b} & informative:
                row["verdict"], row["holds"] = verdicts.UNINFORMATIVE, False
            elif rule_run is not None and not row["rule_exercised"]:
                row["verdict"], row["holds"] = NOT_EXERCISED, False
        row["planned"] = min(len(campaign.seeds_at(task_name, f"{r}-n{n}")) for r in (a, b))
        out["claims"].append(row)
    out["spreads"] = [
        {"claim": claim, "question": question, "a": a, "b": b,
         **spread_claim(task, measures, a, b, bases, informative, labels, resamples)}
        for claim, question, a, b in SPREADS
    ]  # fmt: skip
    if set(bases) & set(PEER_NAMES):  # the peers' claims (fewshot_peers)
        out["peers"] = cell_peers(campaign, task, n, measures, informative, labels, bases)
    return out


def cell_peers(campaign: Campaign, task, n: int, measures: dict, informative: set[str],
               labels: np.ndarray, bases: list[str]) -> list[dict]:  # fmt: skip
    """The peer claims of one (task, N) (``peers.peer_claims``), each with the draws planned
    for it (the fewer of its two runs')."""
    rows = peer_claims(task, measures, informative, labels, campaign.verdicts, bases)
    for row in rows:
        row["planned"] = min(
            len(campaign.seeds_at(task.name, f"{r}-n{n}")) for r in (row["a"], row["b"])
        )
    return rows


def spread_claim(
    task, measures: dict[str, dict[int, scoring.Measure]], a: str, b: str, bases: list[str],
    informative: set[str], labels: np.ndarray, resamples: int = paired.RESAMPLES,
) -> dict:  # fmt: skip
    """S2 for A against B (``spread_ratio``); uninformative unless A beats the majority class
    (``informative``: the runs that do): a method that guesses one class varies little over
    draws without being any steadier."""
    if a not in measures or b not in measures:
        return {"verdict": missing(a, b, bases)}
    found = spread_ratio(task, measures[a], measures[b], labels, resamples)
    if a not in informative and found.get("low") is not None:
        found["verdict"] = verdicts.UNINFORMATIVE
    return found


TESTED = ("better", "worse", "comparable", "inconclusive")  # a claim judged: in its task's family


def family(cells: list[dict], rules: Rules) -> None:
    """Holm's step-down (``verdicts.family``) over each task's judged claims, every N, in place:
    each such claim gets ``holm_p``, ``holm_mc_error`` and ``family_wise``; the uninformative,
    the unexercised and those not run are left out."""
    for task in dict.fromkeys(c["task"] for c in cells):
        tested = [
            row for c in cells if c["task"] == task
            for row in c.get("claims", []) if row["verdict"] in TESTED
        ]  # fmt: skip
        verdicts.family(tested, rules, rules.resamples)


def write_fewshot_report(campaign: Campaign, reports_dir: Path) -> list[Path]:
    """Write reports/fewshot/README.md, results.json and the figures; returns their paths."""
    from aclpipe.study.fewshot import markdown as fewshot_markdown
    from aclpipe.study.fewshot import plots as fewshot_plots
    from aclpipe.study.fewshot import wallclock

    cells = [summarise_cell(campaign, t, n) for t in campaign.tasks for n in campaign.fewshot]
    cells = [c for c in cells if c["planned"]]  # a (task, N) the study plans a run at
    family(cells, campaign.verdicts)
    peer_family(cells, campaign.verdicts)
    if not any(c["runs"] for c in cells):
        raise UserError(
            f"no finished runs under {campaign.layout.runs()}: run "
            f"`dvc repro {campaign.root / 'dvc.yaml'}` (or `aclpipe campaign run ...`) first"
        )
    out = reports_dir / FEWSHOT_REPORTS
    out.mkdir(parents=True, exist_ok=True)
    timed = wallclock.finished_here(campaign, wallclock.read(wallclock.ledger_path(campaign)))
    clock = wallclock.summarise(timed) if timed else None
    summary = {"tasks": campaign.tasks, "fewshot": campaign.fewshot, "cells": cells}
    summary |= {"wallclock": clock} if clock else {}
    written = [out / RESULTS_JSON, out / FEWSHOT_SCORES_PNG, out / FEWSHOT_SPREAD_PNG]
    written.append(out / REPORTS_README)
    if any("peers" in c for c in cells):
        written.append(out / FEWSHOT_PEERS_PNG)
        draw_peers(campaign, cells, written[-1])
    atomic.write_text(written[0], json.dumps(summary, indent=2) + "\n")
    fewshot_plots.draw_scores(campaign, cells, written[1])
    fewshot_plots.draw_spread(campaign, cells, written[2])
    atomic.write_text(written[3], fewshot_markdown.fewshot_markdown(campaign, cells, clock))
    return written
