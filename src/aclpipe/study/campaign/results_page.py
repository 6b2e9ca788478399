"""``reports/campaign/<task>/results.md``: one task's page of the campaign report, section by
section, rendered from ``report.summarise_task``'s summary (no statistics computed here; the
shared wording and tables are ``markdown``'s)."""

from __future__ import annotations

from pathlib import Path

from aclpipe.data.tasks import get_task
from aclpipe.layout import CAMPAIGN, RESULTS_ANGLES_PNG, RESULTS_COST_PNG, RESULTS_EXITS_PNG, Layout
from aclpipe.study.campaign import speed as campaign_speed
from aclpipe.study.campaign.markdown import (
    AUC_DEFINITION,
    REGENERATE,
    claimstable,
    compared,
    family_line,
    few_seeds_note,
    figure,
    majority_test_line,
    pts,
    resolution_line,
    runs_text,
    seeds_text,
    table,
    verdict_note,
)
from aclpipe.study.campaign.plan import Campaign


def task_markdown(campaign: Campaign, summary: dict) -> str:
    """The whole page: its head, the papers' claims, the controls, the scores per run, every
    exit with the speed-ups, the leak-free budgets, the gradient angles and the runs."""
    parts = [
        *_head(campaign, summary),
        *_claims_section(summary),
        *_controls_section(summary),
        *_scores_section(summary),
        *_exits_section(summary),
    ]
    if "leak_free" in summary:
        from aclpipe.study.campaign.leak_free import section

        parts.append(section(summary["leak_free"], summary["leak_free"]["budgets"]))
    parts += _angles_section(summary["runs"])
    parts += _runs_section(get_task(summary["task"]).name, summary["runs"])
    return "\n\n".join(parts) + "\n"


def _head(campaign: Campaign, summary: dict) -> list[str]:
    """The title, how to regenerate, the setting, what the figures are, and the seeds' notes."""
    task = get_task(summary["task"])
    metrics = " and ".join(task.metrics) + (", their mean" if len(task.metrics) > 1 else "")
    return [
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
    ]


def _claims_section(summary: dict) -> list[str]:
    return [
        "## The papers' claims",
        "Each claim as its paper words it (docs/claims.md). Paired bootstrap (docs/methods.md, "
        "How a claim is judged): each resample draws the common seeds and the dev examples with "
        "replacement, one example draw shared by both runs; A - B is the mean over drawn seeds. "
        + verdict_note(summary)
        + "."
        + few_seeds_note(compared(summary)),
        majority_test_line(summary),
        resolution_line(summary),
        claimstable(summary, summary["claims"]),
        family_line(summary),
    ]


def _controls_section(summary: dict) -> list[str]:
    return [
        "## Own controls and ablations",
        "Comparisons no paper claims, run to read the claims: joint separates ACL-CL's "
        "contrastive terms from multi-exit training itself; the SD term and RomeBERT's KL "
        "scaling are ablations; scl with ACL-Grad's drop rule tests the rule where it fires. "
        "Same rules, no family. The noise floor (last row) compares two runs of the same CE "
        "recipe: a difference of its size means nothing.",
        claimstable(summary, [*summary.get("controls", []), summary["noise_floor"]], False),
        majority_line(summary),
    ]


def _scores_section(summary: dict) -> list[str]:
    """The claims' runs; then the ablations, each beside the run it changes."""
    runs = summary["runs"]
    parts = [
        "## Scores per run",
        "The claims' runs, each over the seeds listed. The ablations follow in a table of "
        "their own, each beside the run it changes over the same seeds, so that no two rows "
        "side by side average different seeds.",
        scores_table([(run, e) for run, e in runs.items() if run not in summary["ablations"]]),
    ]
    ablation_rows = []
    for run in summary["ablations"]:
        if run not in runs:
            continue
        base = summary.get("beside", {}).get(run)
        if base:
            multi = len(runs[run]["exits"]) > 1
            ablation_rows.append((f"{base['run']} (beside {run})", {
                "method": runs.get(base["run"], {}).get("method", base["run"]),
                "overrides": [], "seeds": base["seeds"], "exits": runs[run]["exits"] if multi
                else [0], **{m: base[m] for m in ("final", "shallow", "average", "auc")},
            }))  # fmt: skip
        ablation_rows.append((run, runs[run]))
    if ablation_rows:
        parts += ["### Ablations and the experiment, beside the runs they change",
                  scores_table(ablation_rows)]  # fmt: skip
    return parts + [
        majority_line(summary),
        f"Shallow exits: the shallower half of the exits (layers 1..3 of 6). {AUC_DEFINITION}",
    ]


def _exits_section(summary: dict) -> list[str]:
    """Every exit's score and the speed-ups within a quality budget (multi-exit runs only)."""
    multi = {run: e for run, e in summary["runs"].items() if len(e["exits"]) > 1}
    if not multi:
        return []
    layers = next(iter(multi.values()))["exits"]
    parts = [
        "## Every exit",
        f"Score of each exit layer (plot: {RESULTS_EXITS_PNG}, with the 95% bands).",
        table(
            ["run", "seeds", *(f"layer {k}" for k in layers)],
            [[run, seeds_text(e["seeds"]), *(figure(x) for x in e["per_exit"])]
             for run, e in multi.items()],  # fmt: skip
        ),
        majority_line(summary),
    ]
    text, header, rows, note = campaign_speed.section(summary, multi)
    parts += ["## Speed-up within a quality budget", text]
    if rows:
        parts += [table(header, rows), majority_line(summary)] + ([note] if note else [])
    parts.append(f"Score against expected time, every task: ../{RESULTS_COST_PNG}.")
    return parts


def _angles_section(runs: dict[str, dict]) -> list[str]:
    angled = {run: e["angles"] for run, e in runs.items() if "angles" in e}
    if not angled:
        return []
    return [
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


def _runs_section(task: str, runs: dict[str, dict]) -> list[str]:
    return [
        "## Runs",
        "Each run's exact params (the shared file with its overrides applied) and the stack "
        "it ran on are in its run.json; its per-example outputs in predictions.npz.",
        table(
            ["run", "seed", "folder", "command"],
            [
                [
                    run,
                    str(s),
                    f"{Layout(Path(CAMPAIGN)).run(task, run, s).as_posix()}/",
                    f"`aclpipe campaign run --task {task} --run {run} --seed {s}`",
                ]
                for run, e in runs.items()
                for s in e["seeds"]
            ],
        ),  # fmt: skip
    ]


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


def scores_table(rows: list[tuple[str, dict]]) -> str:
    header = ["run", "method", "overrides", "seeds", "final exit", "shallow exits",
              "average over exits", "AUC"]  # fmt: skip
    return table(header, [
        [
            run, e["method"], ", ".join(e["overrides"]) or "-", seeds_text(e["seeds"]),
            figure(e["final"]),
            *(figure(e[m]) if len(e["exits"]) > 1 else "-" for m in ("shallow", "average", "auc")),
        ]
        for run, e in rows
    ])  # fmt: skip
