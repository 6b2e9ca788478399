"""``reports/README.md``: the campaign-wide overview, one line per claim per task with its
interval, and where the seeds' claims do not hold here."""

from __future__ import annotations

import collections

from aclpipe.layout import RESULTS_COST_PNG, RESULTS_MD, STACK_CHECK
from aclpipe.study.campaign import stack_check
from aclpipe.study.campaign.leak_free import counts_text
from aclpipe.study.campaign.markdown import (
    CAMPAIGN_REPORTS,
    MEASURE_NAMES,
    REGENERATE,
    claim_line,
    compared,
    decided,
    family_line,
    few_seeds,
    few_seeds_note,
    figure,
    holds_family_wise,
    holm_text,
    informative,
    interval,
    majority_test_line,
    pts,
    resolution_line,
    runs_text,
    seeds_text,
    table,
)
from aclpipe.study.campaign.plan import Campaign
from aclpipe.study.stats.verdicts import NOT_EXERCISED

# GLUE dev, published, for a 6-layer encoder (docs/claims.md, last section): context for a
# reader, not targets; and the size of each GLUE training set.
REFERENCES = {
    "sst2": {"DistilBERT": 91.3, "BERT-of-Theseus": 91.8},
    "mrpc": {"DistilBERT": 87.5, "BERT-of-Theseus": 87.5},
    "rte": {"DistilBERT": 59.9, "BERT-of-Theseus": 70.1},
}
GLUE_TRAIN = {"sst2": 67349, "mrpc": 3668, "rte": 2490, "cola": 8551, "qnli": 104743}
THRESHOLDS = (
    "How exit thresholds (and the base recipe) are chosen: on a validation split carved from "
    "train (10%, stratified by label, data.seed fixed), never on dev; dev is scored once. A "
    "budget of b points admits the settings whose validation score is at least ce's minus b "
    "and takes the cheapest. SST-2's training rows are phrases of parsed sentences, and a "
    "phrase-level split leaves most validation phrases' parents and siblings in train: "
    "validation overstates dev there, so SST-2's budgets are missed on dev more often than "
    "MRPC's (data.holdout: phrase-family, src/aclpipe/data/phrase_holdout.py, splits by "
    "phrase family instead)."
)


def _verdict(claim: dict) -> str:
    """``inconclusive (no difference larger than 3.4), -1.2 [-2.3, +0.1] (seeds 1, 2, 3)``:
    a verdict is read with its interval and seeds; one that does not hold family-wise says so."""
    seeds = few_seeds(claim["seeds"]) or f"seeds {seeds_text(claim['seeds'])}"
    if decided(claim) and "holm_p" in claim and not holds_family_wise(claim):
        seeds += f"; not family-wise: adjusted p {holm_text(claim)}"
    text = claim["verdict"]
    if claim["verdict"] == "inconclusive":
        text += f" (no difference larger than {100 * claim['detectable']:.1f})"
    return f"{text}, {interval(claim)} ({seeds})"


def context_table(summaries: dict[str, dict]) -> str:
    """Per task: the training data used, ce's final exit beside the majority class and the
    published 6-layer references, and whether the task is informative."""
    rows = []
    for task, s in summaries.items():
        ce = s["runs"].get("ce", {}).get("final")
        splits = (s.get("data") or {}).get("splits", {})
        train = splits.get("train", {}).get("examples")
        full = GLUE_TRAIN.get(task)
        used = f"{train:,} of {full:,}" if train and full else (f"{train:,}" if train else "-")
        m = s.get("informative", {})
        refs = REFERENCES.get(task, {})
        rows.append([
            task, used, figure(ce), pts((s.get("majority") or {}).get("dev")),
            interval(m) if "difference" in m else "-",
            "yes" if informative(s) else "**no: uninformative**",
            " / ".join(f"{v:.1f}" for v in refs.values()) or "-",
        ])  # fmt: skip
    return table(["task", "training examples used (of GLUE's train)", "ce final exit",
                  "majority class", "ce - majority [95% CI]", "informative",
                  "DistilBERT / BERT-of-Theseus (6 layers, published)"], rows)  # fmt: skip


def _names(claims: list[dict], verdict: bool = True) -> str:
    return "; ".join(
        f"{c['a']} - {c['b']} {MEASURE_NAMES[c['measure']]}"
        + (f" ({c['verdict']})" if verdict else "")
        for c in claims
    )


def in_short(summaries: dict[str, dict]) -> list[str]:
    """What holds, what is comparable, what is inconclusive, on the informative tasks only;
    the uninformative tasks named."""
    lines = []
    counted = {t: s for t, s in summaries.items() if informative(s)}
    for t, s in counted.items():
        claims = [c for c in s["claims"] if "difference" in c or c["verdict"] == NOT_EXERCISED]
        held = [c for c in claims if c.get("holds")]
        wise = [c for c in held if holds_family_wise(c)]
        against = [c for c in claims if c["verdict"] == "worse"]
        idle = [c for c in claims if c["verdict"] == NOT_EXERCISED]
        unsure = [c for c in claims if c["verdict"] == "inconclusive"]
        text = f"- {t}: {len(held)} of {len(claims)} papers' claims hold by the per-claim rule"
        text += f" ({_names(held)}), {len(wise)} of them family-wise" if held else ""
        text += f"; against the claim (worse): {_names(against)}" if against else ""
        text += f"; inconclusive: {len(unsure)}" if unsure else ""
        text += f"; rule not exercised: {_names(idle, False)}" if idle else ""
        lines.append(text + ".")
    dropped = [t for t in summaries if t not in counted]
    if dropped:
        lines.append(
            f"- Uninformative, left out of the families and this summary: {', '.join(dropped)} "
            "(ce does not beat a constant guess of the majority class there)."
        )
    return lines


def not_holding(summaries: dict[str, dict]) -> list[str]:
    """One plain sentence per papers' claim that does not hold on some informative task: per
    task its verdict, interval (points) and seeds."""
    lines = []
    counted = {t: s for t, s in summaries.items() if informative(s)}
    if not counted:
        return lines
    questions = [c["question"] for c in next(iter(counted.values()))["claims"]]
    for i, question in enumerate(questions):
        failing = {
            t: s["claims"][i]
            for t, s in counted.items()
            if ("difference" in s["claims"][i] or s["claims"][i]["verdict"] == NOT_EXERCISED)
            and not s["claims"][i].get("holds")
        }
        if failing:
            where = "; ".join(
                f"{t}: {c['verdict']} ({c['a']}'s rule altered {100 * c['rule_altered']:.2g}% "
                "of its steps)"
                if c["verdict"] == NOT_EXERCISED
                else f"{t}: {_verdict(c)}"
                for t, c in failing.items()
            )
            lines.append(f"- Claimed: {question}. Here: {where}.")
    return lines


def recipe_lines(tuned: dict[str, dict], tasks: list[str]) -> list[str]:
    """One line: each task's recipe (``task_settings.<task>.train``) and whether its tuning
    grid picks it; a grid extended after the runs may pick another, which the line names
    with the pick's margin on validation (tuning.md has the grid). ``tuned``: the tuning
    summaries by task (``tuning.write_tuning``'s)."""
    from aclpipe.study.campaign import tuning

    parts = []
    for task in tasks:
        summary = tuned.get(task)
        if summary is None or summary["pick"] is None:
            continue
        used = tuning.knobs_text(summary["in_use"])
        if tuning.applied(summary):
            parts.append(f"{task} {used} (the pick)")
            continue
        found = summary["against_in_use"]  # the pick against the recipe in use
        versus = (
            f", {100 * found['difference']:+.2f} [{100 * found['low']:+.2f}, "
            f"{100 * found['high']:+.2f}] points over it on validation: {found['verdict']}"
            if found and found.get("seeds")
            else ""
        )
        parts.append(f"{task} {used} (not the grid's pick, {summary['pick']}{versus})")
    if not parts:
        return []
    return [
        "The base recipe each task's runs use, tuned on ce's validation score with one seed "
        f"({CAMPAIGN_REPORTS}/<task>/{tuning.TUNING_MD}): " + "; ".join(parts) + "."
    ]


def overview_markdown(
    campaign: Campaign, summaries: dict[str, dict], tuned: dict[str, dict] | None = None
) -> str:
    """The whole overview: where things ran, the context, in short, every task's claims and
    controls, and where the papers' claims do not hold."""
    parts = [
        *_head(campaign, summaries),
        *_context(summaries, tuned),
        *_claims(summaries),
        *_controls(summaries),
        *_not_holding_section(summaries),
    ]
    return "\n\n".join(parts) + "\n"


def _head(campaign: Campaign, summaries: dict[str, dict]) -> list[str]:
    """The title, runs done, the tasks' pages, and which stack ran which runs."""
    done = sum(s["finished"] for s in summaries.values())
    # every task of the campaign, those with no finished run (and no summary) included
    planned = sum(len(campaign.tasks_for(r)) * len(campaign.seeds_for(r)) for r in campaign.runs)
    stacks: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for task, summary in summaries.items():
        for name, n in summary["stacks"].items():
            stacks[name][task] += n
    parts = [
        "# Results on real GLUE",
        f"The seeds campaign (campaign/params.yaml): {done} of {planned} planned runs done. "
        f"Dev scores x100. Regenerate: {REGENERATE}.",
        "Per task, the claims with their tables, per-exit scores with bands, budgets, gradient "
        "angles and every run: "
        + ", ".join(f"[{t}]({CAMPAIGN_REPORTS}/{t}/{RESULTS_MD})" for t in summaries)
        + f". Score against expected time, every task: {CAMPAIGN_REPORTS}/{RESULTS_COST_PNG}.",
        "## What ran where",
        table(
            ["stack (device, libraries)", "runs"],
            [
                [s, ", ".join(f"{t} {runs_text(n)}" for t, n in by_task.items())]
                for s, by_task in sorted(stacks.items())
            ],
        ),
    ]
    checked = stack_check.stack_sentence(
        stack_check.load_check(campaign.root / STACK_CHECK), set(stacks)
    )
    return parts + ([checked] if checked else [])


def _context(summaries: dict[str, dict], tuned: dict[str, dict] | None) -> list[str]:
    """The context table, the thresholds, the recipes, the leak-free budgets, and in short."""
    return [
        "## Context",
        context_table(summaries),
        "ce's final exit: mean ± sd over seeds [95% bootstrap interval]; ce - majority: the "
        "paired bootstrap of ce against a constant guess of the majority training label, the "
        "same as every claim's; a task where ce is not better is uninformative: its rows stay, "
        "marked, outside every family and the summary. The published figures are full-data "
        "GLUE dev scores of other 6-layer models, for scale, not targets.",
        THRESHOLDS,
        *recipe_lines(tuned or {}, list(summaries)),
        *(
            f"{t}: budgets met on dev, chosen on all validation rows -> on its "
            f"{s['leak_free']['rows']:,} leak-free rows: {counts_text(s['leak_free'])}; "
            f"details in {CAMPAIGN_REPORTS}/{t}/{RESULTS_MD}."
            for t, s in summaries.items()
            if "leak_free" in s
        ),
        "## In short",
        "\n".join(in_short(summaries))
        + '\n\nNo stronger than this: "holds" is the per-claim rule at 2.5% one-sided; '
        "family-wise is Holm over each task's papers' claims; inconclusive says only that no "
        "difference larger than its interval's ends was seen.",
    ]


def _claims(summaries: dict[str, dict]) -> list[str]:
    """Every task's papers' claims, one line each, with its family line."""
    parts = [
        "## The papers' claims",
        "Each line: A - B in points with its 95% interval from a paired bootstrap over the "
        "seeds both runs have and the dev examples, the p of the printed verdict, the verdict "
        "(better / worse / comparable (non-inferior, margin "
        f"{_margin(summaries)} points) / inconclusive), the seeds used; the rules in each "
        "task's results.md." + few_seeds_note(c for s in summaries.values() for c in compared(s)),
    ]
    for task, summary in summaries.items():
        claims = [c for c in summary["claims"] if c["verdict"] != "not in this campaign"]
        parts += [
            f"### {task}",
            majority_test_line(summary),
            "\n".join(claim_line(c, summary) for c in claims),
            family_line(summary),
        ]
    return parts


def _controls(summaries: dict[str, dict]) -> list[str]:
    parts = ["## Own controls and ablations", "Comparisons no paper claims; never in a family."]
    for task, summary in summaries.items():
        rows = [*summary.get("controls", []), summary["noise_floor"]]
        parts += [
            f"### {task} (controls)",
            "\n".join(claim_line(c, summary) for c in rows if c["verdict"] != "not in this campaign"),
            resolution_line(summary),
        ]
    return parts


def _not_holding_section(summaries: dict[str, dict]) -> list[str]:
    """Where the papers' claims do not hold on an informative task; or that none was tested,
    or that every one tested holds."""
    failing = not_holding(summaries)
    parts = ["## Where the papers' claims do not hold here (informative tasks)"]
    tested = sum(
        1
        for s in summaries.values()
        if informative(s)
        for c in s["claims"]
        if "difference" in c or c["verdict"] == NOT_EXERCISED
    )
    if failing:
        parts.append("\n".join(failing))
    elif tested == 0:  # silence is not agreement: say that nothing was tested
        parts.append(
            "No papers' claim has been tested yet on an informative task: the runs each one "
            "compares have not finished, or ce does not beat the majority class."
        )
    else:
        parts.append(
            f"Every papers' claim tested so far ({tested} task-claim pairs) holds by the "
            "per-claim rule where it was tested (family-wise: see each task's line above)."
        )
    return parts


def _margin(summaries: dict[str, dict]) -> str:
    margins = {s["rules"]["margin"] for s in summaries.values()}
    return "/".join(f"{100 * m:g}" for m in sorted(margins))
