"""The gradient-angle pilot experiment: how often the contrastive gradient fights the CE one.

For each method, fine-tune with ``train.record_angles`` on, so that every step records the
cosine between the main (CE) gradient and the auxiliary (contrastive or distillation)
gradient over the rule's scope; then draw the histogram of the angles, one panel per method,
as the ACL paper's pilot experiment does on RTE. Writes ``angles.json`` and ``angles.png``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from aclpipe import atomic
from aclpipe.config import Params
from aclpipe.data.tasks import Task
from aclpipe.errors import UserError
from aclpipe.layout import ANGLES_JSON, ANGLES_PNG
from aclpipe.run_log import read_run_log
from aclpipe.stages.finetune import finetune


def read_angles(run_dir: Path) -> tuple[list[float], list[bool]]:
    """Angles in degrees, and whether the rule altered the step, from the training log of the
    run in ``run_dir`` (a model folder or a campaign run; ``aclpipe.run_log``)."""
    angles, altered = [], []
    for row in read_run_log(run_dir).steps:
        cosine = row.get("cosine")
        if cosine is None or cosine != cosine:  # no second gradient, or a zero gradient
            continue
        angles.append(math.degrees(math.acos(max(-1.0, min(1.0, cosine)))))
        altered.append(bool(row.get("altered")))
    return angles, altered


def summarise(angles: list[float], altered: list[bool]) -> dict:
    n = len(angles)
    return {
        "steps": n,
        "mean_angle": sum(angles) / n if n else None,
        "share_over_90": sum(a > 90 for a in angles) / n if n else None,
        "altered_rate": sum(altered) / n if n else None,
        "angles": [round(a, 3) for a in angles],
    }


def run_angles(
    task: Task,
    methods: list[str],
    params: Params,
    data_dir: Path,
    out_dir: Path,
    console: Console | None = None,
) -> dict:
    """Train each method with angle recording and write the histogram and its data."""
    console = console or Console()
    params = dataclasses.replace(
        params, train=dataclasses.replace(params.train, record_angles=True)
    )
    result = {"task": task.name, "methods": {}}
    for method in methods:
        with tempfile.TemporaryDirectory(prefix="aclpipe-angles-") as tmp:
            run_dir = Path(tmp) / method
            finetune(task, method, params, data_dir, run_dir, console)
            angles, altered = read_angles(run_dir)
        if not angles:
            raise UserError(
                f"method {method!r} has no auxiliary objective, so there is no "
                "angle to measure: use methods such as scl, acl, romebert, acl-cl"
            )
        result["methods"][method] = summarise(angles, altered)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic.write_text(out_dir / ANGLES_JSON, json.dumps(result, indent=2) + "\n")
    draw_histograms(result, out_dir / ANGLES_PNG)
    console.print(render_angles_table(result))
    console.print(f"wrote {out_dir / ANGLES_JSON} and {out_dir / ANGLES_PNG}", highlight=False)
    return result


def draw_histograms(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(result["methods"])
    fig, axes = plt.subplots(
        1, len(methods), figsize=(4 * len(methods), 3.2), squeeze=False, sharey=True
    )
    for ax, method in zip(axes[0], methods):
        angles = result["methods"][method]["angles"]
        ax.hist(angles, bins=range(0, 181, 5), color="tab:blue", alpha=0.8)
        ax.axvline(90, color="tab:red", linestyle="--", linewidth=1)
        share = result["methods"][method]["share_over_90"]
        ax.set_title(f"{method}: {100 * share:.0f}% of steps > 90°")
        ax.set_xlabel("angle between CE and auxiliary gradients (degrees)")
        ax.set_xlim(0, 180)
    axes[0][0].set_ylabel("training steps")
    fig.suptitle(f"{result['task']}: gradient angles during fine-tuning")
    fig.tight_layout()
    try:
        with atomic.atomic_path(path, suffix=".png") as tmp:
            fig.savefig(tmp, dpi=110, format="png")
    finally:
        plt.close(fig)


def render_angles_table(result: dict) -> Table:
    table = Table(title=f"{result['task']}: angle between the CE and the auxiliary gradient")
    for column in ("method", "steps", "mean angle", "> 90°", "dropped / projected"):
        table.add_column(column, justify="left" if column == "method" else "right")
    for method, s in result["methods"].items():
        table.add_row(
            method,
            str(s["steps"]),
            f"{s['mean_angle']:.1f}°",
            f"{100 * s['share_over_90']:.1f}%",
            f"{100 * s['altered_rate']:.1f}%",
        )
    return table
