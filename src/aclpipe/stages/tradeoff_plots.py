"""The trade-off report's two figures, drawn with matplotlib's Agg canvas and written atomically.

``draw_score_vs_time``: score against expected time ratio, per method the best-score envelope
(the papers' quality/speed curves) over its faint sweep points, the ce reference dashed.
``draw_exit_scores``: score per exit layer per method (the papers' layer-score curves).
Both draw the majority-class score (a constant prediction) dotted, when it is known: what lies
on or below it is no result (far below every score, it is named on the axis instead of drawn:
``_majority_line``).
"""

from __future__ import annotations

from pathlib import Path

from aclpipe.atomic import atomic_path

_MARKERS = {"full": "*", "entropy": "o", "patience": "s", "confidence": "^"}


def _figure(width: float, height: float):
    # A bare Figure with its own Agg canvas: no pyplot state, no global backend switch.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: Path) -> None:
    """Write the PNG atomically (``atomic.atomic_path``: a temporary name beside ``path``,
    renamed into place with the usual mode)."""
    with atomic_path(path, suffix=".png") as tmp:
        fig.tight_layout()
        fig.savefig(tmp, dpi=110, format="png", bbox_inches="tight")


# The majority line stays off an axis where the data would fill less than this share of it
# with the line drawn (SST-2: scores 78-91 over a majority of 50.9 would squeeze every curve
# into a third of the height): the axis keeps to the data and says where the majority lies.
MAJORITY_SQUEEZE = 0.5


def _majority_line(ax, majority: float | None) -> None:
    """The majority-class score (x100), dotted. Call it after the data are drawn: it reads
    their y-range, over every axis sharing this one's y. A majority far below the data (the
    data would fill less than ``MAJORITY_SQUEEZE`` of the axis) is named in a note on the
    axis and in the legend instead; at or above the lowest score it is always drawn."""
    if majority is None:
        return
    value = 100 * majority
    label = f"majority class ({value:.2f})"
    shared = [a for a in ax.get_shared_y_axes().get_siblings(ax) if a.has_data()]
    low = min((a.dataLim.y0 for a in shared), default=value)
    high = max((a.dataLim.y1 for a in shared), default=value)
    if value >= low or high - low >= MAJORITY_SQUEEZE * (high - value):
        ax.axhline(value, color="grey", linestyle=":", linewidth=1.2, label=label)
        return
    ax.plot([], [], color="grey", linestyle=":", linewidth=1.2, label=f"{label}, below the axis")
    ax.annotate(f"majority class {value:.2f}: below this axis", xy=(0.99, 0.015),
                xycoords="axes fraction", ha="right", va="bottom", fontsize=7, color="grey")  # fmt: skip


def envelope(points: list[dict]) -> list[dict]:
    """Points not beaten by a cheaper one: sorted by time ratio, each scores above all cheaper."""
    front, best = [], float("-inf")
    for p in sorted(points, key=lambda p: (p["expected_time_ratio"], -p["score"])):
        if p["score"] > best:
            front.append(p)
            best = p["score"]
    return front


def draw_score_vs_time(
    task: str, points: dict[str, list[dict]], reference: float, path: Path,
    majority: float | None = None,
) -> None:  # fmt: skip
    """Score (x100) against expected time ratio; one colour per method, markers by policy."""
    fig = _figure(7.5, 4.8)
    ax = fig.add_subplot()
    colours = [f"C{i % 10}" for i in range(len(points))]
    for colour, (method, pts) in zip(colours, points.items()):
        for policy in sorted({p["policy"] for p in pts} - {"full"}):
            own = [p for p in pts if p["policy"] == policy]
            ax.scatter(
                [p["expected_time_ratio"] for p in own],
                [100 * p["score"] for p in own],
                color=colour, marker=_MARKERS.get(policy, "x"), alpha=0.35, s=22, linewidths=0,
            )  # fmt: skip
        full = [p for p in pts if p["policy"] == "full"]
        ax.scatter([p["expected_time_ratio"] for p in full], [100 * p["score"] for p in full],
                   color=colour, marker=_MARKERS["full"], s=110, zorder=3)  # fmt: skip
        front = envelope(pts)
        ax.plot(
            [p["expected_time_ratio"] for p in front],
            [100 * p["score"] for p in front],
            color=colour, marker=".", linewidth=1.6, label=method,
        )  # fmt: skip
    ax.axhline(100 * reference, color="black", linestyle="--", linewidth=1,
               label=f"ce full model ({100 * reference:.2f})")  # fmt: skip
    _majority_line(ax, majority)
    for policy, marker in _MARKERS.items():  # legend entries for the markers' shapes
        ax.scatter(
            [], [], color="grey", marker=marker, label="full model" if policy == "full" else policy
        )
    ax.set_xlabel("expected time ratio (layers run / all layers)")
    ax.set_ylabel("dev score (x100)")
    ax.set_xlim(0, 1.05)
    ax.set_title(f"{task}: score against early-exit cost\n(lines: best score at each cost; faint: every setting)",
                 fontsize=10)  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _save(fig, path)


def draw_exit_scores(
    task: str, exit_scores: dict[str, dict[int, float]], num_layers: int, reference: float,
    path: Path, majority: float | None = None,
) -> None:  # fmt: skip
    """Score (x100) of each exit layer, one line per method (a marker for single exits)."""
    fig = _figure(7.5, 4.8)
    ax = fig.add_subplot()
    for i, (method, scores) in enumerate(exit_scores.items()):
        layers = sorted(scores)
        ax.plot(
            layers, [100 * scores[k] for k in layers],
            color=f"C{i % 10}", marker="o" if len(layers) > 1 else "D",
            markersize=4 if len(layers) > 1 else 7, linewidth=1.6, label=method,
        )  # fmt: skip
    ax.axhline(100 * reference, color="black", linestyle="--", linewidth=1,
               label=f"ce full model ({100 * reference:.2f})")  # fmt: skip
    _majority_line(ax, majority)
    ax.set_xticks(range(1, num_layers + 1))
    ax.set_xlim(0.5, num_layers + 0.5)
    ax.set_xlabel("exit layer")
    ax.set_ylabel("dev score (x100)")
    ax.set_title(f"{task}: score of each exit")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _save(fig, path)
