"""The campaign report's markdown: ``reports/campaign/<task>/results.md`` and
``reports/README.md``, rendered from ``campaign_report.summarise_task``'s summaries (no
statistics computed here); and where the campaign's report files go (``campaign_reports``)."""

from __future__ import annotations

from pathlib import Path

from aclpipe.data.tasks import get_task
from aclpipe.layout import (
    CAMPAIGN,
    RESULTS_ANGLES_PNG,
    RESULTS_COST_PNG,
    RESULTS_EXITS_PNG,
    Layout,
)
from aclpipe.study import campaign_speed
from aclpipe.study.campaign import Campaign
from aclpipe.study.measures import ROUNDING

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


ALIKE = "every resample gives 0: the two score alike on every example"


def p_value(claim: dict) -> str:
    """Four decimals: 0.0255 must not read as 0.025, the two-sided interval's edge. Where
    the difference and both ends of its interval are 0 (SST-2's acl and acl-nograd, which
    ACL-Grad never told apart), a bare "1.0000" would read as strong evidence against A; it
    says why instead."""
    if all(abs(claim[k]) <= ROUNDING for k in ("difference", "low", "high")):
        return f"1 ({ALIKE})"
    if claim["p"] == 0:
        return f"< {1 / claim['resamples']:.2g}"
    return f"{claim['p']:.4f}"


def few_seeds(seeds: list[int]) -> str:
    """What an interval over so few seeds does not hold (METHODS.md resamples seeds too)."""
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
    """A task's claims and then its noise floor: every comparison its table shows."""
    return [*summary["claims"], summary["noise_floor"]]


def decided(claim: dict) -> bool:
    """A better or worse verdict: the interval excludes 0."""
    return claim.get("verdict") in ("better", "worse")


def few_seeds_note(claims) -> str:
    """`` <FEW_SEEDS_NOTE>.`` when some claim below rests on fewer than 3 seeds (it carries
    one of those labels); else nothing, lest the legend speak of a seed yet to land."""
    tested = (c for c in claims if "difference" in c)
    return f" {FEW_SEEDS_NOTE}." if any(few_seeds(c["seeds"]) for c in tested) else ""


FAMILY_LEVEL = 0.05  # the family-wise error rate Holm's correction keeps
FAMILY_NOTE = (
    "Holm p: the claims tested on this task taken as one family (the noise floor is not in "
    "it), each claim's two-sided bootstrap p ((k + 1) / (R + 1) per tail, doubled) adjusted "
    "by Holm's step-down; a better/worse verdict holds family-wise when its Holm p is at most "
    f"{FAMILY_LEVEL}. The verdicts themselves follow METHODS.md (per claim, 95% percentile "
    "interval); the two-sided p is another test of the same claim and can disagree with the "
    "interval at its edge (an interval that ends just above 0 can have a two-sided p just "
    "above 0.05). The column says which verdicts would survive testing every claim at once"
)


def seeds_text(seeds: list[int]) -> str:
    return ", ".join(map(str, seeds))


def interval(claim: dict) -> str:
    """``-1.2 [-2.3, -0.1]``: a claim's difference and 95% interval, in points."""
    return f"{signed(claim['difference'])} [{bound(claim['low'])}, {bound(claim['high'])}]"


def claim_line(claim: dict) -> str:
    """One line: the question, A - B with its interval, p, the verdict, the seeds."""
    if "difference" not in claim:
        return f"- {claim['question']}: {claim['verdict']}."
    one = f"; {few_seeds(claim['seeds'])}" if few_seeds(claim["seeds"]) else ""
    return (
        f"- {claim['question']}: {claim['a']} - {claim['b']} = {interval(claim)} points, "
        f"p {p_value(claim)}: "
        f"**{claim['verdict']}** (seeds {seeds_text(claim['seeds'])}{one})."
    )


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def runs_text(n: int) -> str:
    return f"{n} run{'s' if n != 1 else ''}"


def _by_run(seeds_of: dict[str, list[int]]) -> str:
    return "; ".join(f"{r} (seeds {seeds_text(s)})" for r, s in seeds_of.items() if s)


def majority_line(summary: dict) -> str:
    m = summary.get("majority") or {}
    text = f"Majority-class score (a constant guess of the most frequent train label): dev {pts(m.get('dev'))}"
    if m.get("validation") is not None:
        text += f", validation {pts(m['validation'])}"
    return text + "."


def seed_notes(summary: dict) -> list[str]:
    notes = []
    if any(summary["missing"].values()):
        notes.append(f"Not run yet: {_by_run(summary['missing'])}.")
    if not summary["complete"]:
        notes.append(
            "No seed is finished by every run planned for it yet, so each row is over the "
            "seeds that run has (the seeds column); rows with other seeds are not yet "
            "comparable, the claims are (each over the seeds both of its runs have)."
        )
    else:
        ablations = ""
        if summary["ablations"]:
            done = summary["complete_ablations"]
            ablations = (
                f"; the ablations' rows over seeds {seeds_text(done)}, those every ablation "
                "planned for them has finished too"
                if done
                else "; the ablations' rows over each one's own seeds, as none of these seeds "
                "is finished by every ablation yet"
            )
        notes.append(
            f"Tables and plots are over the seeds every claims' run has finished "
            f"(seeds {seeds_text(summary['complete'])}{ablations}). "
            "Each claim is over the seeds both of its runs have finished, listed with it."
        )
    if summary["left_out"]:
        notes.append(
            "Finished but left out of the tables until every run of its set has that seed: "
            f"{_by_run(summary['left_out'])}."
        )
    mixed = {run: e["stacks"] for run, e in summary["runs"].items() if len(e["stacks"]) > 1}
    for run, stacks in mixed.items():
        notes.append(f"{run}'s seeds ran on more than one stack: {'; '.join(stacks)}.")
    return notes


def _setting(campaign: Campaign, summary: dict) -> str:
    p = campaign.params(summary["task"])
    data = summary.get("data") or {}
    counts = ", ".join(f"{s} {v['examples']}" for s, v in data.get("splits", {}).items())
    subsample = f" (a fixed subsample, data.seed {p.data.seed})" if p.data.max_train_samples else ""
    return (
        f"{p.model.name}, {counts} examples{subsample}, max_length {p.data.max_length}, "
        f"{p.train.epochs} epoch(s), batch {p.train.batch_size}, lr {p.train.lr:g} "
        f"(heads {p.train.head_lr:g}), warm-up {p.train.warmup_ratio:g}"
    )


def holm_text(claim: dict) -> str:
    """A claim's Holm-adjusted p, four decimals; "-" outside the family (the noise floor,
    untested claims)."""
    return f"{claim['holm_p']:.4f}" if "holm_p" in claim else "-"


def holds_family_wise(claim: dict) -> bool:
    """Holm rejects at the family level when the adjusted p is at most that level."""
    return claim["holm_p"] <= FAMILY_LEVEL


def family_name(claim: dict) -> str:
    """``acl - ce final exit (two-sided p 0.0510, adjusted 0.6627)``."""
    return (
        f"{claim['a']} - {claim['b']} {MEASURE_NAMES[claim['measure']]} "
        f"(two-sided p {claim['p_two_sided']:.4f}, adjusted {holm_text(claim)})"
    )


def family_line(summary: dict) -> str:
    """One sentence: which better/worse verdicts still hold when the task's tested claims
    are taken as one family (Holm, family-wise 5%), each with its adjusted p."""
    family = summary.get("family", 0)
    if not family:
        return "Family-wise: no claim tested yet."
    head = (
        f"Family-wise (Holm over the {family} claims tested here, two-sided bootstrap p, "
        f"{FAMILY_LEVEL:.0%} for the family): "
    )
    verdicts = [c for c in summary["claims"] if decided(c)]
    if not verdicts:
        return head + "no verdict is better or worse, so none is there to correct."

    hold = [family_name(c) for c in verdicts if holds_family_wise(c)]
    fail = [family_name(c) for c in verdicts if not holds_family_wise(c)]
    if len(verdicts) == 1:
        verb = "holds" if hold else "does not hold"
        return head + f"the one better/worse verdict {verb}: {(hold or fail)[0]}."
    text = head + f"{len(hold)} of the {len(verdicts)} better/worse verdicts hold"
    text += f": {', '.join(hold)}" if hold else ""
    text += f"; not: {', '.join(fail)}" if fail else ""
    return text + "."


def claimstable(summary: dict) -> str:
    rows = []
    for claim in compared(summary):
        if "difference" not in claim:
            rows.append([claim["question"], MEASURE_NAMES[claim["measure"]], "-", "-", "-",
                         claim["verdict"], "-"])  # fmt: skip
            continue
        one = f" ({few_seeds(claim['seeds'])})" if few_seeds(claim["seeds"]) else ""
        rows.append([
            claim["question"], MEASURE_NAMES[claim["measure"]],
            interval(claim),
            p_value(claim), holm_text(claim), f"**{claim['verdict']}**",
            seeds_text(claim["seeds"]) + one,
        ])  # fmt: skip
    return table(["claim (A beats B)", "measure", "A - B, points [95% CI]", "p",
                  "Holm p (family)", "verdict", "seeds"], rows)  # fmt: skip


def task_markdown(campaign: Campaign, summary: dict) -> str:
    task = get_task(summary["task"])
    runs = summary["runs"]
    metrics = " and ".join(task.metrics) + (", their mean" if len(task.metrics) > 1 else "")
    parts = [
        f"# {task.name.upper()}: every method over seeds "
        f"({summary['finished']} of {summary['planned']} runs done)",
        f"Regenerate: {REGENERATE}.",
        f"Setting: {_setting(campaign, summary)}. Every run shares campaign/params.yaml and "
        "differs only by the overrides listed. Ran on: "
        + "; ".join(f"{s} ({runs_text(n)})" for s, n in sorted(summary["stacks"].items()))
        + ".",
        f"Dev score x100 ({metrics}). Figures: mean ± sample sd over seeds [95% interval of "
        f"a bootstrap over seeds and dev examples, {summary['resamples']} resamples].",
        *seed_notes(summary),
        "## Claims",
        "Paired bootstrap (METHODS.md, Comparisons): each resample draws the common seeds and "
        "the dev examples with replacement, one example draw shared by both runs; A - B is the "
        "mean over drawn seeds. p: share of resamples at or below 0. **better**/**worse** only "
        "when the 95% interval excludes 0, else **no detectable difference**: the interval "
        "says how large a difference could still hide. The noise floor (last row) compares two "
        "runs of the same CE recipe: a difference of its size means nothing."
        + few_seeds_note(compared(summary))
        + " "
        + FAMILY_NOTE,
        claimstable(summary),
        family_line(summary),
        majority_line(summary),
        "## Scores per run",
        table(
            [
                "run",
                "method",
                "overrides",
                "seeds",
                "final exit",
                "shallow exits",
                "average over exits",
                "AUC",
            ],
            [
                [
                    run,
                    e["method"],
                    ", ".join(e["overrides"]) or "-",
                    seeds_text(e["seeds"]),
                    figure(e["final"]),
                    *(
                        figure(e[m]) if len(e["exits"]) > 1 else "-"
                        for m in ("shallow", "average", "auc")
                    ),
                ]
                for run, e in runs.items()
            ],
        ),  # fmt: skip
        majority_line(summary),
        f"Shallow exits: the shallower half of the exits (layers 1..3 of 6). {AUC_DEFINITION}",
    ]
    multi = {run: e for run, e in runs.items() if len(e["exits"]) > 1}
    if multi:
        layers = next(iter(multi.values()))["exits"]
        parts += [
            "## Every exit",
            f"Score of each exit layer (plot: {RESULTS_EXITS_PNG}, with the 95% bands).",
            table(
                ["run", *(f"layer {k}" for k in layers)],
                [[run, *(figure(x) for x in e["per_exit"])] for run, e in multi.items()],
            ),
            majority_line(summary),
        ]
        text, header, rows, note = campaign_speed.section(summary, multi)
        parts += ["## Speed-up within a quality budget", text]
        if rows:
            parts += [table(header, rows), majority_line(summary)] + ([note] if note else [])
        parts.append(f"Score against expected time, every task: ../{RESULTS_COST_PNG}.")
    angled = {run: e["angles"] for run, e in runs.items() if "angles" in e}
    if angled:
        parts += [
            "## Gradient angles",
            "Angle between the CE gradient and the auxiliary gradient at every training step "
            "(the table seeds pooled for the mean angle; shares as mean ± sd over seeds). "
            f"`altered`: the share of steps the rule dropped (ACL-Grad) or projected (GR). "
            f"Histograms: {RESULTS_ANGLES_PNG}.",
            table(
                ["run", "steps", "mean angle", "share > 90° (%)", "altered (%)"],
                [
                    [
                        run,
                        str(a["steps"]),
                        f"{a['mean_angle']:.1f}°",
                        figure(a["share_over_90"]),
                        figure(a["altered_rate"]),
                    ]
                    for run, a in angled.items()
                ],
            ),  # fmt: skip
        ]
    parts += [
        "## Runs",
        "Each run's exact params (the shared file with its overrides applied) and the stack "
        "it ran on are in its run.json; its per-example outputs in predictions.npz.",
        table(
            ["run", "seed", "folder", "command"],
            [
                [
                    run,
                    str(s),
                    f"{Layout(Path(CAMPAIGN)).run(task.name, run, s).as_posix()}/",
                    f"`aclpipe campaign run --task {task.name} --run {run} --seed {s}`",
                ]
                for run, e in runs.items()
                for s in e["seeds"]
            ],
        ),  # fmt: skip
    ]
    return "\n\n".join(parts) + "\n"
