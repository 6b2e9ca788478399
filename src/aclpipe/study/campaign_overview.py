"""``reports/README.md``: the campaign-wide overview, one line per claim per task with its
interval, and where the seeds' claims do not hold here."""

from __future__ import annotations

import collections

from aclpipe.layout import RESULTS_COST_PNG, RESULTS_MD, STACK_CHECK
from aclpipe.study import stack_check
from aclpipe.study.campaign import Campaign
from aclpipe.study.campaign_markdown import (
    CAMPAIGN_REPORTS,
    FAMILY_LEVEL,
    REGENERATE,
    claim_line,
    compared,
    decided,
    family_line,
    family_name,
    few_seeds,
    few_seeds_note,
    holds_family_wise,
    holm_text,
    interval,
    runs_text,
    seeds_text,
    table,
)


def _verdict(claim: dict) -> str:
    """``worse, -1.2 [-2.3, -0.1] (1 seed: examples only)``: a verdict is read with its
    interval and with how many seeds it rests on; a better/worse verdict that Holm does not
    reject at the family level says so, ``(seeds 1, 2, 3; not family-wise: adjusted p
    0.4618)``, lest a per-claim "worse" read as settled."""
    seeds = few_seeds(claim["seeds"]) or f"seeds {seeds_text(claim['seeds'])}"
    if decided(claim) and "holm_p" in claim and not holds_family_wise(claim):
        seeds += f"; not family-wise: adjusted p {holm_text(claim)}"
    return f"{claim['verdict']}, {interval(claim)} ({seeds})"


def not_holding(summaries: dict[str, dict]) -> list[str]:
    """One plain sentence per seed claim that is not "better" on some task: per task its
    verdict, interval (points) and seeds."""
    lines = []
    questions = [c["question"] for c in next(iter(summaries.values()))["claims"]]
    for i, question in enumerate(questions):
        verdicts = {t: s["claims"][i] for t, s in summaries.items() if s["claims"][i]["seed_claim"]}
        failing = {
            t: c for t, c in verdicts.items() if "difference" in c and c["verdict"] != "better"
        }
        if failing:
            where = "; ".join(f"{t}: {_verdict(c)}" for t, c in failing.items())
            lines.append(f"- Claimed: {question}. Here: {where}.")
    return lines


def not_family_wise(summaries: dict[str, dict]) -> list[str]:
    """Each seed claim judged "better" that Holm does not reject at the family level:
    ``mrpc: acl - ce final exit (two-sided p 0.0510, adjusted 0.6627)``."""
    return [
        f"{t}: {family_name(c)}"
        for t, s in summaries.items()
        for c in s["claims"]
        if c["seed_claim"] and c["verdict"] == "better" and not holds_family_wise(c)
    ]


def overview_markdown(campaign: Campaign, summaries: dict[str, dict]) -> str:
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
    parts += [checked] if checked else []
    parts += [
        "## The claims",
        "Each line: A - B in points with its 95% interval from a paired bootstrap over the "
        "seeds both runs have and the dev examples, the one-sided p-value, the verdict "
        "(better/worse only when the interval excludes 0), the seeds used."
        + few_seeds_note(c for s in summaries.values() for c in compared(s)),
    ]
    for task, summary in summaries.items():
        parts += [
            f"### {task}",
            "\n".join(
                claim_line(c) for c in summary["claims"] if c["verdict"] != "not in this campaign"
            ),
            claim_line(summary["noise_floor"]),
            family_line(summary),
        ]
    failing = not_holding(summaries)
    parts += ["## Where the seeds' claims do not hold here"]
    tested = sum(
        1
        for summary in summaries.values()
        for c in summary["claims"]
        if c["seed_claim"] and "difference" in c
    )
    lone = not_family_wise(summaries)
    if failing:
        parts.append("\n".join(failing))
    elif tested == 0:  # silence is not agreement: say that nothing was tested
        parts.append(
            "No seed claim has been tested yet: the runs each one compares have not finished."
        )
    else:
        rule = " by the per-claim rule" if lone else ""
        parts.append(
            f"Every seed claim tested so far ({tested} task-claim pairs) holds{rule} where it "
            "was tested."
        )
    if lone:
        parts.append(
            "Better by the per-claim rule, but not when each task's claims are taken as one "
            f"family (Holm, family-wise {FAMILY_LEVEL:.0%}): " + "; ".join(lone) + "."
        )
    return "\n\n".join(parts) + "\n"
