"""The campaign report's shared wording: how a figure, an interval, a p, a verdict, the Holm
family and a claims table read in ``reports/campaign/<task>/results.md`` (``results_page``) and
``reports/README.md`` (``overview``), rendered from ``report.summarise_task``'s summaries (no
statistics computed here); and where the campaign's report files go (``campaign_reports``)."""

from __future__ import annotations

from pathlib import Path

from aclpipe.layout import CAMPAIGN
from aclpipe.study.stats.measures import ROUNDING
from aclpipe.study.stats.verdicts import NOT_EXERCISED

# The campaign's per-task results, tuning reports and figures sit in reports/campaign/, apart
# from the default pipeline's reports/<task>/ (whose tradeoff stage depends on that whole
# folder: a campaign report rebuilt inside it made that stage stale at every recorded run).
# The file names are layout's RESULTS_* (its comments still say reports/<task>/: layout.py
# is a dependency of every stage, so its comments change with the next real change there).
CAMPAIGN_REPORTS = CAMPAIGN


def campaign_reports(reports: Path, task: str | None = None) -> Path:
    """``<reports>/campaign[/<task>]``: the seeds campaign's report folder (of one task)."""
    out = reports / CAMPAIGN_REPORTS
    return out if task is None else out / task


REGENERATE = (
    "`dvc repro campaign/dvc.yaml` (trains only the runs not yet recorded in "
    "campaign/dvc.lock, then rebuilds these reports from campaign/runs/), or "
    "`aclpipe campaign report` for the reports alone"
)
MEASURE_NAMES = {
    "final": "final exit",
    "shallow": "shallow exits",
    "average": "average over exits",
    "auc": "AUC",
}
AUC_DEFINITION = (
    "AUC: the settings (full model, and each policy over its threshold grid) on the "
    "*validation* Pareto frontier (no other setting both cheaper-or-equal and better-or-equal "
    "there), each scored on dev; the area under the curve through those dev points (score "
    "against expected time ratio = mean exit layer / layers, sorted by cost, extended flat to "
    "the cheapest and the dearest exit) divided by the cost range, so it reads as a mean "
    "score. Dev never chooses a setting."
)


def pts(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def signed(x: float) -> str:
    return f"{100 * x:+.1f}"


def bound(x: float) -> str:
    """An interval's end, x100: one decimal, or two significant digits where one decimal would
    print +0.0 for a bound that is not 0 (the verdict turns on its sign)."""
    if x != 0 and abs(100 * x) < 0.05:
        return f"{100 * x:+.2g}"
    return signed(x)


def figure(f: dict | None) -> str:
    """``84.3 ± 0.7 [83.1, 85.4]`` (x100): mean ± sd over seeds [95% bootstrap interval]."""
    if not f or f.get("mean") is None:
        return "-"
    sd = f" ± {100 * f['sd']:.1f}" if f.get("sd") is not None else " (1 seed)"
    interval = f" [{pts(f['low'])}, {pts(f['high'])}]" if f.get("low") is not None else ""
    return f"{pts(f['mean'])}{sd}{interval}"


ALIKE = "the two score alike on every example"


def p_value(claim: dict) -> str:
    """The p of the printed verdict (``verdicts``), four decimals: 0.0255 must not read as
    0.025, the level. Where the two runs score alike on every example it says so."""
    if claim["verdict"] == NOT_EXERCISED:
        return "-"  # no verdict, so no p
    text = f"{claim['p']:.4f}"
    if all(abs(claim[k]) <= ROUNDING for k in ("difference", "low", "high")):
        text += f" ({ALIKE})"
    return text


def few_seeds(seeds: list[int]) -> str:
    """What an interval over so few seeds does not hold (docs/methods.md resamples seeds too)."""
    if len(seeds) == 1:
        return "1 seed: examples only"
    if len(seeds) == 2:
        return "2 seeds only"
    return ""


FEW_SEEDS_NOTE = (
    '"1 seed: examples only": the interval resamples dev examples alone. "2 seeds only": '
    "resampling two seeds has three outcomes, so the interval holds little of the "
    "seed-to-seed variation; read such a verdict as provisional until seed 3 lands"
)


def compared(summary: dict) -> list[dict]:
    """Every comparison a task's tables show: the papers' claims, the project's own controls
    and ablations, and the noise floor."""
    return [*summary["claims"], *summary.get("controls", []), summary["noise_floor"]]


def decided(claim: dict) -> bool:
    """A verdict with its test passed: better, worse or comparable."""
    return claim.get("verdict") in ("better", "worse", "comparable")


def informative(summary: dict) -> bool:
    """ce beats the majority class on this task (``verdicts``): its verdicts count."""
    return summary.get("informative", {}).get("verdict") == "better"


def few_seeds_note(claims) -> str:
    """`` <FEW_SEEDS_NOTE>.`` when some claim below rests on fewer than 3 seeds (it carries
    one of those labels); else nothing, lest the legend speak of a seed yet to land."""
    tested = (c for c in claims if "difference" in c)
    return f" {FEW_SEEDS_NOTE}." if any(few_seeds(c["seeds"]) for c in tested) else ""


FAMILY_LEVEL = 0.025  # one-sided, as each verdict's p (verdicts.ALPHA)
VERDICT_NOTE = (
    "Verdicts (src/aclpipe/study/stats/verdicts.py), from R resampled differences A - B: **better** "
    "when p_better (the share of resamples at or below 0, counted (k + 1) / (R + 1)) is at most "
    "2.5%; else **worse** when the share at or above 0 is; else **comparable** (non-inferior) "
    "when the share at or below -{margin} points (the margin fixed in campaign/params.yaml "
    "before these verdicts were read) is; else **inconclusive**. p is always the p of the "
    "printed verdict (inconclusive: of the claim's own test, superiority or non-inferiority); "
    "the 95% interval's ends are the 2.5% and 97.5% quantiles and agree with it up to one "
    "resample. A claim worded \"outperforms or performs comparably\" holds when better or "
    "comparable; one worded \"beats\" only when better. \"No difference larger than x\": "
    "the largest difference either way that the interval leaves possible. A gradient-rule "
    "comparison whose rule altered under {floor}% of the steps reads **rule not exercised**. "
    "Holm p: the papers' claims of an informative task as one family, each with its printed p, "
    "adjusted by Holm's step-down, ± its Monte Carlo error at R = {resamples}; a verdict holds "
    "family-wise when its Holm p is at most 2.5%, and is marked *borderline* when that is "
    "within 3 Monte Carlo errors of 2.5% (more resamples could move it)"
)


def verdict_note(summary: dict) -> str:
    r = summary["rules"]
    return VERDICT_NOTE.format(
        margin=f"{100 * r['margin']:g}", floor=f"{100 * r['rule_floor']:g}",
        resamples=f"{r['resamples']:,}",
    )  # fmt: skip


def seeds_text(seeds: list[int]) -> str:
    return ", ".join(map(str, seeds))


def interval(claim: dict) -> str:
    """``-1.2 [-2.3, -0.1]``: a claim's difference and 95% interval, in points."""
    return f"{signed(claim['difference'])} [{bound(claim['low'])}, {bound(claim['high'])}]"


UNINFORMATIVE = "uninformative task: ce does not beat the majority class"


def verdict_text(claim: dict, summary: dict | None = None) -> str:
    """``**inconclusive** (no difference larger than 1.9 points)``, ``**rule not exercised**
    (acl altered 0.03% of 11,250 steps)``; marked on an uninformative task."""
    verdict = claim["verdict"]
    text = f"**{verdict}**"
    if verdict == "inconclusive":
        text += f" (no difference larger than {100 * claim['detectable']:.1f} points)"
    if "rule_altered" in claim:
        text += (
            f" ({claim['a']}'s rule altered {100 * claim['rule_altered']:.2g}% of "
            f"{claim['rule_steps']:,} steps)"
        )
    if summary is not None and not informative(summary):
        text += f" [{UNINFORMATIVE}]"
    return text


def claim_line(claim: dict, summary: dict | None = None) -> str:
    """One line: the question, A - B with its interval, the verdict's p, the verdict, the
    seeds."""
    if "difference" not in claim:
        return f"- {claim['question']}: {claim['verdict']}."
    one = f"; {few_seeds(claim['seeds'])}" if few_seeds(claim["seeds"]) else ""
    return (
        f"- {claim['question']}: {claim['a']} - {claim['b']} = {interval(claim)} points, "
        f"p {p_value(claim)}: {verdict_text(claim, summary)} "
        f"(seeds {seeds_text(claim['seeds'])}{one})."
    )


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def runs_text(n: int) -> str:
    return f"{n} run{'s' if n != 1 else ''}"


def holm_text(claim: dict) -> str:
    """A claim's Holm-adjusted p ± its Monte Carlo error, four decimals; *borderline* when
    within 3 errors of the level; "-" outside the family."""
    if "holm_p" not in claim:
        return "-"
    from aclpipe.study.stats.verdicts import stable

    text = f"{claim['holm_p']:.4f} ± {claim['holm_mc_error']:.4f}"
    if not stable(claim["holm_p"], claim["holm_mc_error"], FAMILY_LEVEL):
        text += " (borderline)"
    return text


def holds_family_wise(claim: dict) -> bool:
    """Holm rejects at the family level: the adjusted p is at most the level."""
    return bool(claim.get("family_wise"))


def family_name(claim: dict) -> str:
    """``acl - ce final exit, better (p 0.0051, adjusted 0.0510 ± 0.0022)``."""
    return (
        f"{claim['a']} - {claim['b']} {MEASURE_NAMES[claim['measure']]}, {claim['verdict']} "
        f"(p {claim['p']:.4f}, adjusted {holm_text(claim)})"
    )


def family_line(summary: dict) -> str:
    """One sentence: which verdicts still hold when the task's papers' claims are taken as one
    family (Holm, 2.5% one-sided, each claim with its printed p), each with its adjusted p."""
    family = summary.get("family", 0)
    if not informative(summary):
        return f"Family-wise: none; {UNINFORMATIVE}, so its verdicts count in no family."
    if not family:
        return "Family-wise: no claim tested yet."
    head = (
        f"Family-wise (Holm over the {family} papers' claims tested here, each with its "
        f"verdict's p, {FAMILY_LEVEL:.1%} for the family): "
    )
    found = [c for c in summary["claims"] if decided(c) and "holm_p" in c]
    if not found:
        return head + "no verdict is better, worse or comparable, so none is there to correct."
    hold = [family_name(c) for c in found if holds_family_wise(c)]
    fail = [family_name(c) for c in found if not holds_family_wise(c)]
    text = head + f"{len(hold)} of the {len(found)} verdicts hold"
    text += f": {'; '.join(hold)}" if hold else ""
    text += f". Not: {'; '.join(fail)}" if fail else ""
    return text + "."


def holds_text(claim: dict) -> str:
    if "holds" not in claim or claim["verdict"] == "not in this campaign":
        return "-"
    return "yes" if claim["holds"] else "no"


def claimstable(summary: dict, claims: list[dict], family: bool = True) -> str:
    rows = []
    for claim in claims:
        if "difference" not in claim:
            rows.append([claim["question"], MEASURE_NAMES[claim["measure"]], "-", "-", "-", "-",
                         claim["verdict"], "-", "-"])  # fmt: skip
            continue
        one = f" ({few_seeds(claim['seeds'])})" if few_seeds(claim["seeds"]) else ""
        rows.append([
            claim["question"], MEASURE_NAMES[claim["measure"]],
            f"{pts(claim['a_mean'])} / {pts(claim['b_mean'])}",
            interval(claim),
            p_value(claim), holm_text(claim) if family else "-",
            verdict_text(claim, summary), holds_text(claim),
            seeds_text(claim["seeds"]) + one,
        ])  # fmt: skip
    return table(["comparison", "measure", "A / B over the seeds", "A - B, points [95% CI]",
                  "p (of the verdict)", "Holm p ± MC error", "verdict", "holds",
                  "seeds (both sides)"], rows)  # fmt: skip


def majority_test_line(summary: dict) -> str:
    """ce's final exit against the majority class, with the claims' bootstrap."""
    m = summary.get("informative", {})
    if "difference" not in m:
        return "ce against the majority class: not run yet."
    word = "informative" if informative(summary) else UNINFORMATIVE
    return (
        f"ce's final exit against a constant guess of the majority training label (the same "
        f"paired bootstrap): {interval(m)} points, p {m['p']:.4f}, **{m['verdict']}** "
        f"(seeds {seeds_text(m['seeds'])}): {word}."
    )


def resolution_line(summary: dict) -> str:
    """The smallest difference this task can see: the noise floor's interval half-width."""
    nf = summary["noise_floor"]
    if "difference" not in nf:
        return ""
    return (
        f"Resolution: two runs of the same CE recipe differ by {interval(nf)} points on the "
        f"final exit, so a difference smaller than about "
        f"{100 * (nf['high'] - nf['low']) / 2:.1f} points (the interval's half-width) is "
        "below what this task can detect."
    )
