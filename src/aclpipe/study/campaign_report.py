"""The campaign's published results: ``reports/<task>/results.{json,md}``, two plots per task,
and ``reports/README.md`` across tasks. Every figure comes from the committed run folders
(``summarise_task``); nothing here runs a model.

Statistics: scores x100 as mean and sample standard deviation (n - 1) over the seeds that
every run of the task has finished (all seeds present while none is complete).
Two runs differ only when their means differ by more than the larger of their standard
deviations; otherwise they tie (the issue's rule); below two seeds each nothing is compared.
"""

from __future__ import annotations

import collections
import json
import statistics
from pathlib import Path
from typing import Any

from aclpipe import atomic
from aclpipe.data.tasks import get_task
from aclpipe.layout import (
    CURVES_JSON,
    METRICS,
    REPORTS_README,
    RESULTS_JSON,
    RESULTS_MD,
    RUN_RECORD,
    Layout,
)
from aclpipe.study.campaign import Campaign
from aclpipe.study.tradeoff_plots import _figure, _save

BUDGETS = (0, 1, 2, 5)

REGENERATE = (
    "`dvc repro campaign/dvc.yaml` (trains only the runs not yet recorded in "
    "campaign/dvc.lock, then rebuilds these tables from campaign/runs/ in seconds), or "
    "`aclpipe campaign report` for the tables alone"
)
RESULT_FILES = ("results.json", "results.md", "results_exits.png")


# --- statistics ------------------------------------------------------------------------------


def mean_sd(values: list[float]) -> dict:
    """``{"mean", "sd", "n"}``; ``sd`` is the sample standard deviation (None below 2)."""
    n = len(values)
    return {
        "mean": statistics.fmean(values) if n else None,
        "sd": statistics.stdev(values) if n > 1 else None,
        "n": n,
    }


def verdict(a: dict, b: dict) -> str:
    """``better`` / ``worse`` (a against b) when the means differ by more than the larger
    standard deviation, ``tie`` when not, ``too few seeds`` below two seeds each."""
    if a["n"] < 2 or b["n"] < 2:
        return "too few seeds"
    gap = a["mean"] - b["mean"]
    if abs(gap) <= max(a["sd"], b["sd"]):
        return "tie"
    return "better" if gap > 0 else "worse"


def load_runs(layout: Layout, task: str) -> dict[str, dict[int, dict]]:
    """``{run: {seed: {"metrics", "curves", "run", "folder"}}}`` of the runs present."""
    found: dict[str, dict[int, dict]] = {}
    for record_path in sorted(layout.runs(task).glob(f"*/{RUN_RECORD}")):
        folder = record_path.parent
        record = json.loads(record_path.read_text(encoding="utf-8"))
        found.setdefault(record["run"], {})[record["seed"]] = {
            "run": record,
            "metrics": json.loads((folder / METRICS).read_text(encoding="utf-8")),
            "curves": json.loads((folder / CURVES_JSON).read_text(encoding="utf-8")),
            "folder": folder,  # its training log: aclpipe.run_log
        }
    return found


def summarise_task(campaign: Campaign, task: str) -> dict:
    """Every figure of a task's report, from the run folders (no forward passes)."""
    from aclpipe.study.angles import read_angles
    from aclpipe.study.angles import summarise as summarise_angles
    from aclpipe.study.tradeoff import best_within, exit_score_table, method_points

    found = load_runs(campaign.layout, task)
    runs = {  # folders of runs or seeds no longer in the campaign are not its results
        run: {s: found[run][s] for s in campaign.seeds if s in found[run]}
        for run in campaign.runs
        if run in found
    }
    out: dict[str, Any] = {"task": task, "data": None, "runs": {}, "expected_runs": {}}
    for run in campaign.runs:
        out["expected_runs"][run] = [s for s in campaign.seeds if s not in runs.get(run, {})]
    out["finished"] = sum(len(by_seed) for by_seed in runs.values())
    # Every mean is over the same seeds: those that every run has finished (a seed gives every
    # run the same data order and initial heads). Until one seed is complete, each run's
    # figures are over the seeds it has (``complete`` false; the report says so).
    complete = [s for s in campaign.seeds if all(s in runs.get(r, {}) for r in campaign.runs)]
    out["complete"] = bool(complete)
    out["seeds"] = complete or sorted({s for by_seed in runs.values() for s in by_seed})
    out["left_out"] = {
        run: sorted(s for s in by_seed if s not in out["seeds"]) for run, by_seed in runs.items()
    }
    out["left_out"] = {run: seeds for run, seeds in out["left_out"].items() if seeds}
    out["devices"] = dict(
        collections.Counter(
            r["run"].get("environment", {}).get("device", "unrecorded")
            for by_seed in runs.values()
            for r in by_seed.values()
        )
    )
    runs = {
        run: {s: r for s, r in by_seed.items() if s in out["seeds"]}
        for run, by_seed in runs.items()
    }
    for run in campaign.runs:
        by_seed = runs.get(run, {})
        if not by_seed:
            continue
        seeds = sorted(by_seed)
        out["data"] = out["data"] or by_seed[seeds[0]]["run"]["data"]  # one subsample for all
        metrics = [by_seed[s]["metrics"] for s in seeds]
        exits = metrics[0]["exits"]
        per_exit = [list(exit_score_table(by_seed[s]).values()) for s in seeds]
        entry = {
            "method": by_seed[seeds[0]]["run"]["method"],
            # the variant's own knobs; the task settings are the same for every run
            "overrides": [
                o.replace("=False", "=false").replace("=True", "=true")
                for o in by_seed[seeds[0]]["run"]["overrides"]
                if o.startswith("methods.")
            ],
            "seeds": seeds,
            "exits": exits,
            "final": mean_sd([m["final_score"] for m in metrics]),
            "per_exit": [mean_sd([row[i] for row in per_exit]) for i in range(len(exits))],
            "average_over_exits": mean_sd([m["average_over_exits"] for m in metrics]),
            # the shallower half of the exits (layers 1..3 of 6): mean per seed, then over seeds
            "shallow_exits": exits[: max(1, len(exits) // 2)],
            "shallow": mean_sd(
                [statistics.fmean(row[: max(1, len(exits) // 2)]) for row in per_exit]
            ),
            "by_seed": {
                str(s): {"final": m["final_score"], "average_over_exits": m["average_over_exits"]}
                for s, m in zip(seeds, metrics)
            },
        }
        angles = [read_angles(by_seed[s]["folder"]) for s in seeds]
        if any(a for a, _ in angles):
            pooled = [a for seed_angles, _ in angles for a in seed_angles]
            per_seed = [summarise_angles(a, f) for a, f in angles if a]
            entry["angles"] = {
                "steps": len(pooled),
                "share_over_90": mean_sd([x["share_over_90"] for x in per_seed]),
                "altered_rate": mean_sd([x["altered_rate"] for x in per_seed]),
                "mean_angle": statistics.fmean(pooled),
                "histogram": _histogram(pooled),
            }
        entry["_points"] = [method_points(by_seed[s]) for s in seeds]
        out["runs"][run] = entry
    reference = out["runs"].get("ce", {}).get("final")
    out["reference"] = reference
    for entry in out["runs"].values():
        points = entry.pop("_points")
        if len(entry["exits"]) < 2 or reference is None:
            continue
        entry["budgets"] = {}
        for budget in BUDGETS:
            floor = reference["mean"] - budget / 100
            best = [best_within(p, floor) for p in points]
            reached = [b["layer_speedup"] for b in best if b is not None]
            entry["budgets"][str(budget)] = {**mean_sd(reached), "seeds_reaching": len(reached)}
    out["questions"] = questions(out["runs"])
    return out


def _histogram(angles: list[float], width: float = 10.0) -> list[int]:
    """Counts of angles in [0, 10), [10, 20), ... [170, 180] degrees."""
    bins = [0] * int(180 / width)
    for a in angles:
        bins[min(int(a // width), len(bins) - 1)] += 1
    return bins


def questions(runs: dict) -> list[dict]:
    """The issue's questions, each answered by ``verdict`` on the figure it names."""
    asked = [
        ("Does ACL beat CE on the final exit?", "acl", "ce", "final"),
        ("Does ACL beat CE+SCL on the final exit?", "acl", "scl", "final"),
        ("Does ACL-Grad matter (ACL with it against without)?", "acl", "acl-nograd", "final"),
        ("Does ACL-CL beat RomeBERT on the shallow exits?", "acl-cl", "romebert", "shallow"),
        ("Does ACL-CL beat DeeBERT on the shallow exits?", "acl-cl", "deebert", "shallow"),
        ("Does ACL-CL beat RomeBERT on the average over exits?", "acl-cl", "romebert",
         "average_over_exits"),
        ("Does ACL-CL beat DeeBERT on the average over exits?", "acl-cl", "deebert",
         "average_over_exits"),
        ("Does GR help RomeBERT (average over exits)?", "romebert", "romebert-nogr",
         "average_over_exits"),
        ("Does the SD term help ACL-CL (average over exits)?", "acl-cl-sd", "acl-cl",
         "average_over_exits"),
    ]  # fmt: skip
    answers = []
    for question, a, b, figure in asked:
        row: dict[str, Any] = {"question": question, "a": a, "b": b, "figure": figure}
        if a not in runs or b not in runs:
            row["verdict"] = "not run yet"
        else:
            fa, fb = runs[a][figure], runs[b][figure]
            row.update(a_figure=fa, b_figure=fb, verdict=verdict(fa, fb))
        answers.append(row)
    return answers


# --- markdown and plots ---------------------------------------------------------------------


def score(figure: dict | None, scale: float = 100.0) -> str:
    """``84.3 ± 0.7`` (x100), ``84.3`` for one seed, ``-`` for none."""
    if not figure or figure["mean"] is None:
        return "-"
    if figure["sd"] is None:
        return f"{scale * figure['mean']:.1f} (n=1)"
    return f"{scale * figure['mean']:.1f} ± {scale * figure['sd']:.1f}"


def speedup(figure: dict) -> str:
    if not figure["n"]:
        return "not reached"
    spread = f" ± {figure['sd']:.2f}" if figure["sd"] is not None else ""
    return f"{figure['mean']:.2f}x{spread} ({figure['seeds_reaching']} seeds)"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def _by_run(seeds_of: dict[str, list[int]]) -> str:
    return "; ".join(f"{r} (seeds {', '.join(map(str, s))})" for r, s in seeds_of.items() if s)


def _seed_notes(summary: dict) -> list[str]:
    """Which runs are missing, and which seeds the figures are over."""
    notes = []
    if any(summary["expected_runs"].values()):
        notes.append(f"Not run yet: {_by_run(summary['expected_runs'])}.")
    seeds = ", ".join(map(str, summary["seeds"]))
    if not summary["complete"] and summary["runs"]:
        notes.append(
            "No seed is finished by every run yet, so each run's figures are over the seeds "
            "it has (the seeds column), and runs with different seeds are not yet comparable."
        )
    elif summary["left_out"]:
        notes.append(
            f"Every figure is over seed(s) {seeds}: those that every run has finished, so "
            "that all means are over the same seeds. Finished but left out until every run "
            f"has that seed: {_by_run(summary['left_out'])}."
        )
    return notes


def _devices(summaries) -> str:
    """``NVIDIA H200 (33 runs)``: where the runs ran (their run.json's environment)."""
    counts: collections.Counter = collections.Counter()
    for summary in summaries:
        counts.update(summary["devices"])
    return ", ".join(f"{d} ({n} runs)" for d, n in sorted(counts.items()))


def _setting(campaign: Campaign, task: str, meta: dict) -> str:
    p = campaign.params(task)
    counts = ", ".join(f"{s} {v['examples']}" for s, v in meta["splits"].items())
    subsample = f" (a fixed subsample, data.seed {p.data.seed})" if p.data.max_train_samples else ""
    return (
        f"{p.model.name}, {counts} examples{subsample}, max_length {p.data.max_length}, "
        f"{p.train.epochs} epoch(s), batch {p.train.batch_size}, lr {p.train.lr:g} "
        f"(heads {p.train.head_lr:g}); seeds {', '.join(map(str, campaign.seeds))} planned"
    )


def task_markdown(campaign: Campaign, summary: dict) -> str:
    task = get_task(summary["task"])
    runs = summary["runs"]
    done = summary["finished"]
    planned = len(campaign.runs) * len(campaign.seeds)
    parts = [
        f"# {task.name.upper()}: every method over seeds ({done} of {planned} runs done)",
        f"Regenerate: {REGENERATE}.",
        f"Setting: {_setting(campaign, task.name, summary['data'])}; ran on "
        f"{_devices([summary])}. Dev score x100 ({' and '.join(task.metrics)}"
        f"{', their mean' if len(task.metrics) > 1 else ''}), "
        "mean ± sample sd over the seeds. Nothing was tuned per method: every run "
        "shares campaign/params.yaml and differs only by the overrides listed.",
    ]
    parts += _seed_notes(summary)
    rows = [
        [run, e["method"], ", ".join(e["overrides"]) or "-", str(len(e["seeds"])),
         score(e["final"]), score(e["average_over_exits"]) if len(e["exits"]) > 1 else "-"]
        for run, e in runs.items()
    ]  # fmt: skip
    parts += [
        "## Final exit",
        _table(["run", "method", "overrides", "seeds", "final exit", "average over exits"], rows),
    ]
    multi = {run: e for run, e in runs.items() if len(e["exits"]) > 1}
    if multi:
        layers = next(iter(multi.values()))["exits"]
        parts += [
            "## Every exit (multi-exit runs)",
            _table(
                ["run", *(f"layer {k}" for k in layers), "shallow half", "average"],
                [
                    [
                        run,
                        *(score(x) for x in e["per_exit"]),
                        score(e["shallow"]),
                        score(e["average_over_exits"]),
                    ]
                    for run, e in multi.items()
                ],  # fmt: skip
            ),
        ]
        if summary["reference"] is not None:
            parts += [
                "## Speed-up within a quality budget",
                f"Best layer speed-up (layers of the full model / mean exit layer) whose dev "
                f"score is at most b points below ce's mean final score "
                f"({score(summary['reference'])}), per seed over the policies' threshold grid, "
                "then mean ± sd over the seeds that reach the budget. Measured wall-clock "
                "speed-ups are the early-exit benchmark's job (benchmarks/early_exit_speed.py).",
                _table(
                    ["run", *(f"-{b} points" for b in BUDGETS)],
                    [
                        [run, *(speedup(e["budgets"][str(b)]) for b in BUDGETS)]
                        for run, e in multi.items()
                        if "budgets" in e
                    ],  # fmt: skip
                ),
            ]
    angled = {run: e["angles"] for run, e in runs.items() if "angles" in e}
    if angled:
        parts += [
            "## Gradient angles",
            "Angle between the CE gradient and the auxiliary gradient at every training step "
            "(the seeds used pooled for the mean angle; shares as mean ± sd over seeds). "
            "`altered` is the share of steps the gradient rule dropped (ACL-Grad) or "
            "projected (GR). Histograms: results_angles.png.",
            _table(
                ["run", "steps", "mean angle", "share > 90° (%)", "altered (%)"],
                [
                    [
                        run,
                        str(a["steps"]),
                        f"{a['mean_angle']:.1f}°",
                        score(a["share_over_90"]),
                        score(a["altered_rate"]),
                    ]
                    for run, a in angled.items()
                ],  # fmt: skip
            ),
        ]
    parts += ["## What the results say", questions_markdown(summary["questions"])]
    seeds_rows = [
        [run, str(seed), f"campaign/runs/{task.name}/{run}-s{seed}/run.json",
         f"`aclpipe campaign run --task {task.name} --run {run} --seed {seed}`"]
        for run, e in runs.items() for seed in e["seeds"]
    ]  # fmt: skip
    parts += [
        "## Runs",
        "Each run's exact params (the shared file with its overrides applied) are in its "
        "run.json; `dvc repro campaign/dvc.yaml` reruns a run only if those change.",
        _table(["run", "seed", "params", "command"], seeds_rows),
    ]
    return "\n\n".join(parts) + "\n"


def questions_markdown(answers: list[dict]) -> str:
    """One line per question: the verdict and the two figures it rests on."""
    lines = [
        "A difference within one standard deviation (the larger of the two) is called a tie.",
        "",
    ]
    for q in answers:
        if "a_figure" in q:
            lines.append(
                f"- {q['question']} **{q['verdict']}**: {q['a']} {score(q['a_figure'])} "
                f"against {q['b']} {score(q['b_figure'])} ({q['figure'].replace('_', ' ')})."
            )
        else:
            lines.append(f"- {q['question']} **{q['verdict']}**.")
    return "\n".join(lines)


def draw_exit_scores(summary: dict, path: Path) -> None:
    """Score per exit layer, mean with ±sd bars, one line per run."""
    fig = _figure(7.5, 4.5)
    ax = fig.add_subplot(1, 1, 1)
    for run, e in summary["runs"].items():
        means = [100 * x["mean"] for x in e["per_exit"]]
        sds = [100 * (x["sd"] or 0.0) for x in e["per_exit"]]
        style = {"marker": "o"} if len(e["exits"]) > 1 else {"marker": "*", "markersize": 11}
        ax.errorbar(e["exits"], means, yerr=sds, capsize=3, label=run, **style)
    ax.set_xlabel("exit layer")
    ax.set_ylabel("dev score x100 (mean ± sd over seeds)")
    ax.set_title(f"{summary['task']}: score per exit")
    ax.legend(fontsize=7, ncol=2)
    _save(fig, path)


def draw_angle_histograms(summary: dict, path: Path) -> None:
    angled = {run: e["angles"] for run, e in summary["runs"].items() if "angles" in e}
    fig = _figure(3.2 * len(angled), 3.0)
    width = 180 / len(next(iter(angled.values()))["histogram"])
    for i, (run, a) in enumerate(angled.items(), start=1):
        ax = fig.add_subplot(1, len(angled), i)
        edges = [width * j for j in range(len(a["histogram"]))]
        ax.bar(edges, a["histogram"], width=width, align="edge", color="tab:blue", alpha=0.8)
        ax.axvline(90, color="tab:red", linestyle="--", linewidth=1)
        ax.set_xlim(0, 180)
        ax.set_title(f"{run}: {100 * a['share_over_90']['mean']:.0f}% > 90°", fontsize=9)
        ax.set_xlabel("angle (degrees)", fontsize=8)
    seeds = ", ".join(map(str, summary["seeds"]))
    fig.suptitle(f"{summary['task']}: CE against auxiliary gradient, seeds {seeds}")
    _save(fig, path)


def overview_markdown(campaign: Campaign, summaries: dict[str, dict]) -> str:
    tasks = list(summaries)
    done = sum(s["finished"] for s in summaries.values())
    planned = len(campaign.runs) * len(campaign.seeds) * len(campaign.tasks)
    rows = []
    for run in campaign.runs:
        cells = []
        for task in tasks:
            e = summaries[task]["runs"].get(run)
            cells.append(score(e["final"]) if e else "-")
            multi = e is not None and len(e["exits"]) > 1
            cells.append(score(e["average_over_exits"]) if multi else "-")
        rows.append([run, *cells])
    header = ["run"]
    for task in tasks:
        header += [f"{task} final", f"{task} avg exits"]
    parts = [
        "# Results on real GLUE",
        f"The seeds campaign (campaign/params.yaml): {done} of {planned} runs done, "
        f"MiniLM-L6, on {_devices(summaries.values())}; dev scores x100 as mean ± sd over "
        f"seeds. Regenerate: {REGENERATE}.",
        "Per task, with per-exit scores, speed-up at quality budgets, gradient angles, plots "
        "and every run's params: " + ", ".join(f"[{t}]({t}/results.md)" for t in tasks) + ".",
        _table(header, rows),
    ]
    for task in tasks:
        summary = summaries[task]
        used = sum(len(e["seeds"]) for e in summary["runs"].values())
        parts += [
            f"## {task}: what the results say",
            f"Over seed(s) {', '.join(map(str, summary['seeds']))} "
            f"({used} of the task's {summary['finished']} finished runs; "
            f"[{task}/results.md]({task}/results.md) says why any are left out).",
            questions_markdown(summary["questions"]),
        ]
    parts.append(
        "The default pipeline's single-seed quick runs (`dvc repro`) are reported beside "
        "these, in each task's tradeoff.md."
    )
    return "\n\n".join(parts) + "\n"


def write_reports(campaign: Campaign, reports_dir: Path) -> dict[str, dict]:
    """Write every task's results and the overview; returns the summaries."""
    summaries = {}
    for task in campaign.tasks:
        if not campaign.layout.runs(task).exists():
            continue
        summary = summarise_task(campaign, task)
        if not summary["runs"]:
            continue
        summaries[task] = summary
        out = reports_dir / task
        atomic.write_text(out / RESULTS_JSON, json.dumps(summary, indent=2) + "\n")
        atomic.write_text(out / RESULTS_MD, task_markdown(campaign, summary))
        draw_exit_scores(summary, out / "results_exits.png")
        if any("angles" in e for e in summary["runs"].values()):
            draw_angle_histograms(summary, out / "results_angles.png")
    if summaries:
        atomic.write_text(reports_dir / REPORTS_README, overview_markdown(campaign, summaries))
    return summaries
