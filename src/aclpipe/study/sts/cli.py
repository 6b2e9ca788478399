"""The STS study's sub-app, ``aclpipe sts`` (prepare, run, zero-shot, report): each command
parses its options and calls one function of ``aclpipe.study.sts``, imported when it runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from aclpipe.cli_options import (
    LAYOUT,
    console,
    counts,
    reports_option,
    user_errors,
)
from aclpipe.layout import STS_PARAMS

STS_REPORTS = LAYOUT.sts_study_reports()  # default of sts report --reports

sts_app = typer.Typer(
    help="The STS study (sts/params.yaml, run by sts/dvc.yaml): sentence-embedding objectives "
    "x poolings x seeds, scored on STS-B dev and the STS Benchmark test, with its own "
    "report and figure.",
    no_args_is_help=True,
)
StudyOpt = Annotated[Path, typer.Option("--study", help="STS study params: knobs plus sts:.")]
StsReportsOpt = reports_option("Where README.md goes.")


@sts_app.command("prepare")
@user_errors
def sts_prepare(
    task: Annotated[str, typer.Option("--task", "-t", help="sentences or sentence-pairs")],
    study: StudyOpt = Path(STS_PARAMS),
) -> None:
    """Build a sentence task into sts/data/<task>/ with the study's data settings."""
    from aclpipe.study.sts.study import load_study, prepare_task

    meta = prepare_task(load_study(study), task)
    console.print(f"prepared {task}: {counts(meta)}", highlight=False)


@sts_app.command("run")
@user_errors
def sts_run(
    objective: Annotated[str, typer.Option("--objective", help="An objective of sts.objectives.")],
    pooling: Annotated[str, typer.Option("--pooling", help="cls, mean or layer-attention.")],
    seed: Annotated[int, typer.Option("--seed", help="train.seed of the run.")],
    study: StudyOpt = Path(STS_PARAMS),
) -> None:
    """Train one run, score it on STS-B dev and the STS Benchmark test; writes
    sts/runs/<objective>-<pooling>-s<seed>/ (the weights are not kept)."""
    from aclpipe.study.sts.study import load_study, run_one

    console.print(f"wrote {run_one(load_study(study), objective, pooling, seed, console)}")


@sts_app.command("zero-shot")
@user_errors
def sts_zero_shot(study: StudyOpt = Path(STS_PARAMS)) -> None:
    """Score the untrained checkpoint (every pooling, every layer); writes sts/runs/zero-shot/."""
    from aclpipe.study.sts.study import load_study, zero_shot

    console.print(f"wrote {zero_shot(load_study(study))}", highlight=False)


@sts_app.command("report")
@user_errors
def sts_report(
    study: StudyOpt = Path(STS_PARAMS),
    reports: StsReportsOpt = STS_REPORTS,
) -> None:
    """reports/sts/README.md, results.json and the per-layer figure from the runs present."""
    from aclpipe.study.sts.report import write_report
    from aclpipe.study.sts.study import load_study

    console.print(f"wrote {write_report(load_study(study), reports)}", highlight=False)

