"""The few-shot study's figures (matplotlib Agg, written atomically, as the campaign's):

- ``fewshot_scores.png``: per task, the dev score (x100) against N on a log axis, one line per
  method (the mean over draws) with a band of one sd over draws either side, and the
  majority-class score dotted;
- ``fewshot_spread.png``: per task, each method's sd over draws against N (S2's measure).

A point over fewer draws than planned (a partial cell) is drawn hollow. One legend below the
panels serves them all; the majority line is named on the line.

One colour per method, the same in both figures and in the campaign's (``campaign_plots.colours``
over the study's runs of the file).
"""

from __future__ import annotations

from pathlib import Path

from aclpipe.stages.tradeoff_plots import _figure, _save
from aclpipe.study.campaign.plan import Campaign


def _colours(campaign: Campaign) -> dict[str, tuple]:
    from matplotlib import colormaps

    bases = list(dict.fromkeys(run for run, _ in campaign.fewshot_runs.values()))
    return {run: colormaps["tab10"](i % 10) for i, run in enumerate(bases)}


def _grid(campaign: Campaign, height: float):
    count = len(campaign.tasks)
    fig = _figure(4.0 * count, height)
    return fig, [fig.add_subplot(1, count, i + 1) for i in range(count)]


def _axis(ax, campaign: Campaign, task: str) -> None:
    """Log N axis with a tick at every N; a task without runs says so."""
    ax.set_xscale("log")
    ax.set_xlim(campaign.fewshot[0] / 1.5, campaign.fewshot[-1] * 1.5)
    ax.set_xticks(campaign.fewshot, [str(n) for n in campaign.fewshot], rotation=45, fontsize=7)  # 16 and 20 sit close
    ax.set_title(task)
    ax.set_xlabel("training examples N")
    if not ax.has_data():
        ax.text(0.5, 0.5, "no finished run yet", transform=ax.transAxes, ha="center", color="grey")


def _series(cells: list[dict], task: str, run: str) -> tuple[list[int], list[dict]]:
    points = [(c["n"], c["runs"][run]) for c in cells if c["task"] == task and run in c["runs"]]
    return [n for n, _ in points], [e for _, e in points]


def _line(ax, sizes: list[int], values: list[float], draws: list[int], planned: list[int],
          colour, label: str) -> bool:  # fmt: skip
    """A method's line, each point filled where every draw planned at its N is in and hollow
    where not; whether any point is hollow."""
    ax.plot(sizes, values, color=colour, label=label)
    partial = [d < w for d, w in zip(draws, planned)]
    for hollow in (False, True):
        chosen = [(n, v) for n, v, p in zip(sizes, values, partial) if p is hollow]
        if chosen:
            ax.plot(*zip(*chosen), linestyle="none", marker="o", markeredgecolor=colour,
                    markerfacecolor="white" if hollow else colour)  # fmt: skip
    return any(partial)


def _legend(fig, axes, partial: bool) -> None:
    """One legend for every panel, below them: the methods' colours are the same in each, and a
    legend inside a panel covered its points (CoLA's, MRPC's)."""
    handles: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="upper center", ncol=len(handles),
                   fontsize=8, frameon=False, bbox_to_anchor=(0.5, 0.0),
                   title="hollow point: fewer draws than planned" if partial else None,
                   title_fontsize=8)  # fmt: skip


def _majority(ax, value: float) -> None:
    """The majority class's score, dotted, named on the line itself (its value differs per task,
    so it stays out of the shared legend)."""
    ax.axhline(value, color="grey", linestyle=":", linewidth=1.2)
    ax.annotate(f"majority class {value:.1f}", (0.02, value), xycoords=("axes fraction", "data"),
                xytext=(0, 2), textcoords="offset points", fontsize=7, color="dimgrey",
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.7, "pad": 1})  # fmt: skip


def draw_scores(campaign: Campaign, cells: list[dict], path: Path) -> None:
    """Score against N per task: mean over draws, a band of +-1 sd, the majority dotted."""
    _draw_per_task(campaign, cells, path, 3.6, _score_line,
                   "dev score (x100); band: +-1 sd over draws", majority=True)  # fmt: skip


def draw_spread(campaign: Campaign, cells: list[dict], path: Path) -> None:
    """Each method's sd over draws (x100) against N, per task."""
    _draw_per_task(campaign, cells, path, 3.2, _spread_line,
                   "sd of the dev score over draws (x100)", from_zero=True)  # fmt: skip


def _score_line(ax, sizes: list[int], entries: list[dict], planned: list[int], colour,
                run: str) -> bool:  # fmt: skip
    """A method's mean score over draws with a band of one sd either side."""
    mean = [100 * e["mean"] for e in entries]
    sd = [100 * (e["sd"] or 0.0) for e in entries]
    draws = [e["n"] for e in entries]
    partial = _line(ax, sizes, mean, draws, planned, colour, run)
    ax.fill_between(sizes, [m - s for m, s in zip(mean, sd)],
                    [m + s for m, s in zip(mean, sd)], color=colour, alpha=0.15)  # fmt: skip
    return partial


def _spread_line(ax, sizes: list[int], entries: list[dict], planned: list[int], colour,
                 run: str) -> bool:  # fmt: skip
    """A method's sd over draws, where it has one (no sd before a second draw)."""
    points = [(n, 100 * e["sd"], e["n"], w) for n, e, w in zip(sizes, entries, planned)
              if e["sd"] is not None]  # fmt: skip
    if not points:
        return False
    n, sd, draws, wanted = (list(x) for x in zip(*points))
    return _line(ax, n, sd, draws, wanted, colour, run)


def _draw_per_task(campaign: Campaign, cells: list[dict], path: Path, height: float, line,
                   ylabel: str, majority: bool = False, from_zero: bool = False) -> None:  # fmt: skip
    """One panel per task, one ``line(ax, sizes, entries, planned, colour, run)`` per method
    with runs there (``planned``: the draws planned at each N; it says whether a point is
    partial); the majority class dotted when asked, one legend below."""
    fig, axes = _grid(campaign, height)
    colours = _colours(campaign)
    anything_partial = False
    for ax, task in zip(axes, campaign.tasks):
        for run, colour in colours.items():
            sizes, entries = _series(cells, task, run)
            if sizes:
                planned = [len(campaign.seeds_at(task, f"{run}-n{n}")) for n in sizes]
                anything_partial |= line(ax, sizes, entries, planned, colour, run)
        scores = [c["majority"] for c in cells if c["task"] == task and "majority" in c]
        if majority and scores:
            _majority(ax, 100 * scores[0])
        _axis(ax, campaign, task)
        if from_zero:
            ax.set_ylim(bottom=0)
        ax.set_ylabel(ylabel)
    _legend(fig, axes, anything_partial)
    _save(fig, path)
