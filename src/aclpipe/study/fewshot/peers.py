"""The few-shot report's comparison with the peers (``aclpipe.study.campaign.peers``), S2's power, the
regime in one place, and the peer figure.

- Peer claims (``PEER_CLAIMS``), per (task, N), judged as the study's claims are
  (``campaign_report.judge_pair``: the paired bootstrap over draws and dev examples) but with
  ``PEER_RESAMPLES`` resamples: each of the project's methods against SetFit (non-inferiority:
  "outperforms or performs comparably", margin ``campaign.verdicts.margin``), and ce against
  the linear probe (superiority). Uninformative where neither side beats its draws' majority
  class. Holm's step-down over each task's judged peer claims at every N: the family
  ``peers/<task>``, apart from the study's own claims.
- S2's power: the smallest ratio of sds over draws that a test on k draws detects, from the F
  distribution of a ratio of two sample variances (normal scores, two-sided 95%, at half
  power: the ratio at which the interval's upper end reaches 1), and per cell the ratio at
  which the bootstrap interval shown would have excluded 1 (the point ratio over the
  interval's upper end).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np

from aclpipe.study.campaign.plan import Campaign
from aclpipe.study.stats import verdicts
from aclpipe.study.stats.verdicts import NON_INFERIORITY, SUPERIORITY, Rules

PEER_RESAMPLES = 10_000  # docs/methods.md: 10,000 resamples for published verdicts
PROJECT_METHODS = ("ce", "scl", "acl", "cosine-pairs")
# (claim id, question, A, B, kind)
PEER_CLAIMS: list[tuple[str, str, str, str, str]] = [
    *[("P1", f"{m} outperforms or performs comparably with SetFit", m, "setfit", NON_INFERIORITY)
      for m in PROJECT_METHODS],
    ("P2", "ce beats the linear probe", "ce", "linear-probe", SUPERIORITY),
]  # fmt: skip
TESTED = ("better", "worse", "comparable", "inconclusive")


def missing(a: str, b: str, planned: Collection[str]) -> str:
    """The verdict of a comparison of ``a`` with ``b`` that lacks a run: "not run yet" where the
    study plans both at that (task, N), else "not in this study"."""
    return "not run yet" if a in planned and b in planned else "not in this study"


def peer_claims(
    task, measures: dict, informative: set[str], labels: np.ndarray, rules: Rules,
    planned: Collection[str],
) -> list[dict]:  # fmt: skip
    """The peer claims of one (task, N) on the runs found there (``measures``: run -> seed ->
    measure; ``informative``: the runs that beat the majority class; ``planned``: the runs the
    study plans there). A claim whose runs are planned but not all found is "not run yet"; one
    naming a run not planned there is "not in this study"."""
    from aclpipe.study.campaign.report import judge_pair

    strict = dataclasses.replace(rules, resamples=PEER_RESAMPLES)
    out = []
    for claim, question, a, b, kind in PEER_CLAIMS:
        row: dict[str, Any] = {"claim": claim, "question": question, "a": a, "b": b, "kind": kind}
        if a not in measures or b not in measures:
            row["verdict"] = missing(a, b, planned)
        elif not set(measures[a]) & set(measures[b]):
            row["verdict"] = "no common seed"
        else:
            row.update(judge_pair(task, measures[a], measures[b], labels, strict, kind))
            if not {a, b} & informative:
                row["verdict"], row["holds"] = verdicts.UNINFORMATIVE, False
        out.append(row)
    return out


def peer_family(cells: list[dict], rules: Rules) -> None:
    """Holm's step-down over each task's judged peer claims, every N (family ``peers/<task>``)."""
    for task in dict.fromkeys(c["task"] for c in cells):
        tested = [
            r
            for c in cells
            if c["task"] == task
            for r in c.get("peers", [])
            if r["verdict"] in TESTED
        ]
        verdicts.family(tested, rules, PEER_RESAMPLES)
        for row in tested:
            row["family"] = f"peers/{task}"


def detectable_ratio(draws: int, level: float = 0.95) -> float | None:
    """The largest ratio of sds below 1 that ``draws`` draws of each method declare lower at
    half power: sqrt of the F(k-1, k-1) quantile at (1 - level) / 2."""
    from scipy.stats import f

    if draws < 3:
        return None
    return float(np.sqrt(f.ppf((1 - level) / 2, draws - 1, draws - 1)))


def interval_detectable(row: dict) -> float | None:
    """The point ratio at which this bootstrap interval's upper end would reach 1."""
    if row.get("ratio") is None or row.get("high") in (None, 0) or not np.isfinite(row["high"]):
        return None
    return row["ratio"] / row["high"]


# --- markdown -------------------------------------------------------------------------------


def _pts(x: float | None, signed: bool = False) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}" if signed else f"{100 * x:.1f}"


def holds_cell(row: dict) -> str:
    """A table's "holds": ``yes`` when the claim holds as its paper words it and, in a Holm
    family, still after Holm's step-down; ``no (not after Holm)`` when it holds on its own p
    alone (as "Verdicts at a glance" marks it); else ``no``."""
    if not row["holds"]:
        return "no"
    if "holm_p" in row and not row.get("family_wise"):
        return "no (not after Holm)"
    return "yes"


def peer_section(campaign: Campaign, cells: list[dict]) -> list[str]:
    """The peer claims at every (task, N), one table."""
    rows = [(c, r) for c in cells for r in c.get("peers", [])]
    if not any("difference" in r for _, r in rows):
        return [
            "## Against the peers",
            "",
            "No peer run has finished beside a method of this project yet.",
            "",
        ]
    margin = 100 * campaign.verdicts.margin
    lines = [
        "## Against the peers",
        "",
        "What a user with N labelled sentences picks instead (aclpipe.study.campaign.peers): **setfit** "
        "(the `setfit` package in its own pinned environment, the SetFit paper's recipe: 20 "
        "pair iterations, one epoch, batch 16, CosineSimilarityLoss, a logistic-regression "
        "head; its version and every argument in each run.json) and **linear-probe** (logistic "
        "regression, C = 1, on the frozen checkpoint's own mean-pooled, normalised sentence "
        "embeddings), on the same draws, scored on the same dev examples. Each method of this "
        "project (cosine-pairs among them: SetFit's recipe built into the project, "
        "docs/methods.md) against setfit (P1, non-inferiority, margin "
        f"{margin:g} point) and ce against the linear probe (P2, superiority): the paired "
        f"bootstrap over draws and dev examples with {PEER_RESAMPLES:,} resamples; Holm's "
        "step-down over the family `peers/<task>` (every judged P1 and P2 row of the task, "
        "every N); uninformative where neither side beats its draws' majority class. A row "
        "holds when its verdict does after Holm too: \"no (not after Holm)\" where only its "
        "own p is at most the level.",
        "",
        "| task | N | claim | question | A - B | 95% interval | p (one-sided) | Holm p | draws | verdict | holds |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    waiting = [(c, r) for c, r in rows if r["verdict"] == "not run yet"]
    for cell, row in rows:
        head = f"| {cell['task']} | {cell['n']} | {row['claim']} | {row['question']}"
        if row["verdict"] in ("not run yet", "not in this study"):
            continue
        if "difference" not in row:
            lines.append(f"{head} | | | | | | {row['verdict']} | |")
            continue
        draws, planned = len(row["seeds"]), row.get("planned", len(row["seeds"]))
        partial = f" (provisional: {draws} of {planned} draws)" if draws < planned else ""
        p = "< 0.001" if row["p"] < 0.001 else f"{row['p']:.3f}"
        holm = f"{row['holm_p']:.3f} ± {row['holm_mc_error']:.3f}" if "holm_p" in row else ""
        lines.append(
            f"{head} | {_pts(row['difference'], True)} | [{_pts(row['low'], True)}, "
            f"{_pts(row['high'], True)}] | {p} | {holm} | {draws} | {row['verdict']}{partial} | "
            f"{holds_cell(row)} |"
        )
    cells_waiting = sorted({(c["task"], c["n"]) for c, _ in waiting}, key=lambda tn: (tn[0], tn[1]))
    if cells_waiting:
        lines += ["", "Not run yet: " + ", ".join(f"{t} N = {n}" for t, n in cells_waiting) + "."]
    return [*lines, ""]


def s2_power_section(campaign: Campaign, cells: list[dict]) -> list[str]:
    """S2's power at the draws planned, and per S2 row the ratio its interval could show."""
    counts = sorted({len(campaign.seeds_at(c["task"], f"ce-n{c['n']}")) for c in cells} - {0})
    lines = [
        "## S2: how small a spread ratio the draws can detect",
        "",
        "With k draws of each method and normal scores, a ratio of sds over draws is declared "
        "lower (its 95% interval below 1) at half power when it is at most sqrt(F(k-1, k-1) at "
        "0.025): "
        + "; ".join(f"{k} draws: {detectable_ratio(k):.2f}" for k in counts if detectable_ratio(k))
        + ". Per S2 row below, the point ratio at which the interval shown would have excluded "
        "1 (the ratio over the interval's upper end).",
        "",
        "| task | N | question | draws | ratio | 95% interval | detectable at | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for cell in cells:
        for row in cell.get("spreads", []):
            if row.get("ratio") is None:
                continue
            found = interval_detectable(row)
            interval = "" if row.get("low") is None else f"[{row['low']:.2f}, {row['high']:.2f}]"
            lines.append(
                f"| {cell['task']} | {cell['n']} | {row['question']} | {len(row['draws'])} | "
                f"{row['ratio']:.2f} | {interval} | {'' if found is None else f'{found:.2f}'} | "
                f"{row['verdict']} |"
            )
    below = [r for c in cells if c["n"] in _grid_sizes(campaign) for r in c.get("spreads", [])
             if r.get("ratio") is not None]  # fmt: skip
    lines += [
        "",
        f"Point ratios below 1 at the grid's N ({', '.join(map(str, _grid_sizes(campaign)))}): "
        f"{sum(r['ratio'] < 1 for r in below)} of {len(below)}; with an interval below 1: "
        f"{sum(r['verdict'] == 'lower' for r in below)}.",
        "",
    ]
    return lines


def _grid_sizes(campaign: Campaign) -> list[int]:
    grid = {
        n
        for run, (_, n) in campaign.fewshot_runs.items()
        for p in campaign.fewshot_plan[run]
        if p.stage == "run"
    }
    return sorted(grid)


def regime_section(campaign: Campaign, cells: list[dict]) -> list[str]:
    """What the regime is, and when each analysis rule was fixed, in one place."""
    return [
        "## The regime, in one place",
        "",
        "- **Checkpoint**: all-MiniLM-L6-v2, 6 layers, already trained contrastively on about "
        "1 billion sentence pairs with mean pooling: close to the worst case for a contrastive "
        "fine-tuning objective to add anything (SCL's gains were shown on RoBERTa-large). "
        "Single exit; mean pooling instead of SCL's [CLS] (docs/methods.md, Pooling: this "
        "checkpoint's [CLS] vector carries almost nothing below its last layers).",
        "- **Tasks**: SST-2, CoLA, MRPC and RTE. QNLI and MNLI, where SCL's paper shows its "
        "largest gains at N = 20 (QNLI 65.0 -> 75.7, MNLI 39.3 -> 42.7), are not in the study: "
        "their GLUE files are not among the data it reads. RTE stays out of SetFit's shot "
        "counts (N = 16-128) and of the peers: no method beat its majority class there at "
        "N = 20, 100 or 1000, so every comparison on it is uninformative.",
        "- **Knobs**: tau and lambda of scl and acl are docs/methods.md's defaults, untuned (no "
        "validation split exists at these N); one recipe for every method at each N "
        f"({campaign.path}), the new N's by a rule written there before any of their runs.",
        "- **Analysis rules, and when each was fixed**: the non-inferiority margin (1 point) "
        "before any run; the claim kinds (superiority or non-inferiority per claim), Holm's "
        "families and the uninformative rule after 231 of the grid's 480 runs had finished; "
        "the peer claims, their family `peers/<task>` and their 10,000 resamples before any "
        "peer run of the study (after one trial: setfit on SST-2, N = 20, draw 1).",
        "- **Uninformative**, where used: in the campaign (reports/README.md), a claim on a task "
        "where ce does not beat the majority class; here, a claim where neither side beats its "
        "draws' majority class, and an S2 ratio whose A does not.",
        "",
    ]


# --- figure ----------------------------------------------------------------------------------


def draw_peers(campaign: Campaign, cells: list[dict], path: Path) -> None:
    """Per task with peer runs: the dev score (x100) of ce, scl, acl, setfit and linear-probe
    against N (log axis), mean over draws with a +-1 sd band; the majority dotted."""
    from aclpipe.stages.tradeoff_plots import _figure, _save
    from aclpipe.study.fewshot.plots import _colours, _legend, _line, _majority, _series

    runs = [*PROJECT_METHODS, "setfit", "linear-probe"]
    tasks = [
        t
        for t in campaign.tasks
        if any(
            c["task"] == t and ("setfit" in c["runs"] or "linear-probe" in c["runs"]) for c in cells
        )
    ]
    tasks = tasks or campaign.tasks[:1]
    fig = _figure(4.0 * len(tasks), 3.6)
    axes = [fig.add_subplot(1, len(tasks), i + 1) for i in range(len(tasks))]
    colours, partial = _colours(campaign), False
    sizes_all = sorted({c["n"] for c in cells if c["task"] in tasks})
    for ax, task in zip(axes, tasks):
        for run in runs:
            sizes, entries = _series(cells, task, run)
            if not sizes:
                continue
            mean = [100 * e["mean"] for e in entries]
            sd = [100 * (e["sd"] or 0.0) for e in entries]
            planned = [len(campaign.seeds_at(task, f"{run}-n{n}")) for n in sizes]
            before = len(ax.lines)
            partial |= _line(ax, sizes, mean, [e["n"] for e in entries], planned, colours[run], run)
            if run in ("setfit", "linear-probe"):  # the peers dashed
                ax.lines[before].set_linestyle("--")
            ax.fill_between(sizes, [m - s for m, s in zip(mean, sd)], [m + s for m, s in zip(mean, sd)],
                            color=colours[run], alpha=0.12)  # fmt: skip
        majority = [c["majority"] for c in cells if c["task"] == task and "majority" in c]
        if majority:
            _majority(ax, 100 * majority[0])
        ax.set_xscale("log")
        if sizes_all:
            ax.set_xlim(sizes_all[0] / 1.3, sizes_all[-1] * 1.3)
            ax.set_xticks(sizes_all, [str(n) for n in sizes_all], rotation=45, fontsize=7)
        ax.set_title(task)
        ax.set_xlabel("training examples N")
        ax.set_ylabel("dev score (x100); band: +-1 sd over draws")
    _legend(fig, axes, partial)
    _save(fig, path)
