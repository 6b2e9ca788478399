"""The campaign report's figures (matplotlib Agg, written atomically): per task the score of
each exit with its 95% band and the gradient-angle histograms; across tasks the dev score
against expected time of the validation-frontier settings. One colour per run, the same in
every figure; the majority-class score drawn dotted (named instead, where it lies far below
every score: ``tradeoff_plots._majority_line``). The claims' runs and the ablations get
panels of their own, each ablation beside the run it changes (:func:`panels`): a dozen
overlapping bands in one panel could not be read at a glance."""

from __future__ import annotations

from pathlib import Path

from aclpipe.stages.tradeoff_plots import _figure, _majority_line, _save
from aclpipe.study.campaign.plan import Campaign


def colours(campaign: Campaign) -> dict[str, tuple]:
    """A distinct colour per run, in campaign order: tab10, then Dark2 (18 in all)."""
    from matplotlib import colormaps

    palette = [colormaps["tab10"](i) for i in range(10)]
    palette += [colormaps["Dark2"](i) for i in range(8)]
    return {run: palette[i % len(palette)] for i, run in enumerate(campaign.runs)}


def parent(campaign: Campaign, run: str) -> str | None:
    """The claims' run an ablation changes: a variant's method (``acl-nograd`` -> ``acl``),
    else the longest claims' run its name extends (``deebert-sd`` -> ``deebert``)."""
    claims = [r for r in campaign.runs if r not in campaign.controls]
    method = campaign.variants[run].method if run in campaign.variants else None
    if method in claims and method != run:
        return method
    extended = [r for r in claims if run.startswith(f"{r}-")]
    return max(extended, key=len) if extended else None


def panels(campaign: Campaign, present: list[str]) -> list[tuple[str, list[str]]]:
    """``(title, runs)`` per panel, runs in campaign order, over the runs ``present``: the
    claims' runs, then (if any ran) the ablations with the runs they change."""
    claims = [r for r in campaign.runs if r not in campaign.controls and r in present]
    ablations = [r for r in campaign.controls if r in present]
    out = [("the claims' runs", claims)] if claims else []
    if ablations:
        parents = {parent(campaign, r) for r in ablations}
        shown = [r for r in campaign.runs if r in ablations or (r in parents and r in present)]
        out.append(("ablations, beside the runs they change", shown))
    return out


def _seeds(summary: dict) -> str:
    seeds = summary["complete"]
    if not seeds:
        return "each run's own seeds"
    text = f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
    ablations = summary.get("complete_ablations")
    if summary.get("ablations") and ablations != seeds:
        text += f"; ablations {', '.join(map(str, ablations)) if ablations else 'own seeds'}"
    return text


def draw_exit_bands(campaign: Campaign, summary: dict, path: Path) -> None:
    """Score per exit layer: mean over seeds, 95% band; single-exit runs as one marker. One
    panel for the claims' runs, one for the ablations (:func:`panels`)."""
    palette = colours(campaign)
    groups = panels(campaign, list(summary["runs"]))
    fig = _figure(6.2 * len(groups) + 1.2, 4.8)
    num_layers = max(e["num_layers"] for e in summary["runs"].values())
    axes = []
    for i, (title, runs) in enumerate(groups, start=1):
        ax = fig.add_subplot(1, len(groups), i, sharey=axes[0] if axes else None)
        axes.append(ax)
        singles = [run for run in runs if len(summary["runs"][run]["exits"]) == 1]
        for run in runs:
            e = summary["runs"][run]
            means = [100 * x["mean"] for x in e["per_exit"]]
            low = [100 * x["low"] for x in e["per_exit"]]
            high = [100 * x["high"] for x in e["per_exit"]]
            colour = palette[run]
            if len(e["exits"]) > 1:
                ax.fill_between(e["exits"], low, high, color=colour, alpha=0.15, linewidth=0)
                ax.plot(e["exits"], means, color=colour, marker="o", markersize=3.5, label=run)
            else:  # spread side by side at the last layer, so that their bars do not overlap
                x = e["exits"][0] + 0.12 * (singles.index(run) + 1)
                ax.errorbar([x], means, yerr=[[means[0] - low[0]], [high[0] - means[0]]],
                            color=colour, marker="D", markersize=5, capsize=3, label=run)  # fmt: skip
        ax.set_xticks(range(1, num_layers + 1))
        ax.set_xlabel("exit layer")
        ax.set_ylabel("dev score x100 (mean, 95% band)")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    for ax in axes:  # after every panel's data: the panels share their y-axis
        _majority_line(ax, (summary.get("majority") or {}).get("dev"))
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(f"{summary['task']}: score of each exit ({_seeds(summary)})", fontsize=10)
    _save(fig, path)


def draw_score_vs_time(campaign: Campaign, summaries: dict[str, dict], path: Path) -> None:
    """One column per task, one row per group of runs (:func:`panels`): each multi-exit
    run's dev points of its validation-frontier settings (faint, every seed) and the mean
    over seeds of the curves through them."""
    palette = colours(campaign)
    curved = {
        task: [run for run, e in summary["runs"].items() if e.get("cost_curve")]
        for task, summary in summaries.items()
    }
    present = sorted({run for runs in curved.values() for run in runs})
    rows = panels(campaign, present) or [("no multi-exit run", [])]
    fig = _figure(5.0 * len(summaries) + 1.5, 4.0 * max(len(rows), 1) + 0.4)
    for r, (title, group) in enumerate(rows):
        for c, (task, summary) in enumerate(summaries.items()):
            ax = fig.add_subplot(len(rows), len(summaries), r * len(summaries) + c + 1)
            for run in (run for run in group if run in curved[task]):
                curve = summary["runs"][run]["cost_curve"]
                for points in curve["points"].values():
                    ax.scatter(points["costs"], [100 * s for s in points["scores"]],
                               color=palette[run], s=9, alpha=0.35, linewidths=0)  # fmt: skip
                ax.plot(curve["costs"], [100 * s for s in curve["scores"]],
                        color=palette[run], linewidth=1.6, label=run)  # fmt: skip
            _majority_line(ax, (summary.get("majority") or {}).get("dev"))
            ax.set_xlim(0, 1.05)
            ax.set_xlabel("expected time ratio (dev)")
            ax.set_ylabel("dev score x100")
            ax.set_title(f"{task} ({_seeds(summary)})\n{title}", fontsize=9)
            ax.grid(alpha=0.3)
            if c == len(summaries) - 1:
                ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(
        "Score against cost: settings on the validation frontier, scored on dev "
        "(lines: mean over seeds)",
        fontsize=10,
    )
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
    fig.suptitle(f"{summary['task']}: CE against auxiliary gradient, {_seeds(summary)}")
    _save(fig, path)
