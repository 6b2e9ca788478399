"""The export-exits stage: a trained model into models/<task>/<method>/export/ for serving.

Reads ``evaluate.batch_size`` (the dev logits' and checks' batches) and takes the default exit
setting from the evaluate stage's curves (the 1-point budget against ce's metrics); the work,
int8 copies included, is ``aclpipe.exits.export.export_exits``.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from aclpipe.config import Params
from aclpipe.data.tasks import Task
from aclpipe.exits.export import export_exits
from aclpipe.layout import CURVES_JSON, METRICS, Layout


def export(
    task: Task,
    method: str,
    params: Params,
    layout: Layout,
    opset: int | None = None,
    int8: bool = False,
    console: Console | None = None,
) -> Path:
    """Export ``method`` on ``task`` from ``layout``'s folders; return the export folder."""
    data, out = layout.data(task.name), layout.export(task.name, method)
    curves = layout.report(task.name, method) / CURVES_JSON  # the default exit setting's source
    reference = layout.report(task.name, "ce") / METRICS
    export_exits(task, layout.model(task.name, method), data, out, params.evaluate.batch_size,
                 opset, console, curves, reference, int8)  # fmt: skip
    return out
