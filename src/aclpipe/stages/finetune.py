"""The finetune stage: one method trained on one prepared task, into models/<task>/<method>/.

Reads params.yaml's ``model:``, ``train:`` and ``methods.<method>`` sections (and
``evaluate.batch_size`` for the per-epoch dev scores) and hands them to the written-out loop,
``aclpipe.training.loop.train``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from aclpipe.config import Params
from aclpipe.data.tasks import Task
from aclpipe.training.loop import train
from aclpipe.training.methods import build_method


def finetune(
    task: Task,
    method_name: str,
    params: Params,
    data_dir: Path,
    out_dir: Path,
    console: Console | None = None,
    **loop_options: Any,
) -> dict:
    """Train ``method_name`` on ``task``; write the model and its logs into ``out_dir``.

    ``loop_options`` (``progress``, ``collate``) go to ``aclpipe.training.loop.train`` as they
    are; it resumes an interrupted run with the same params.
    """
    knobs = params.method(method_name)
    method = build_method(method_name, knobs)
    return train(task, method, knobs, params.model, params.train, params.evaluate.batch_size,
                 data_dir, out_dir, console, **loop_options)  # fmt: skip
