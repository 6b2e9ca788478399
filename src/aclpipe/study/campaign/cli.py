"""The seeds campaign's sub-app, ``aclpipe campaign`` (prepare, run, params, run-pending, tune,
stack-compare, wallclock, record, report), also the few-shot study's: each command parses
its options and calls one function of ``aclpipe.study.campaign.commands``, imported when it
runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from aclpipe.cli_options import (
    LAYOUT,
    console,
    names_option,
    reports_option,
    user_errors,
)
from aclpipe.layout import CAMPAIGN_PARAMS

REPORTS = LAYOUT.reports()  # default of --reports

campaign_app = typer.Typer(
    help="The seeds campaign on real GLUE (campaign/params.yaml, run by campaign/dvc.yaml): "
    "every method over several seeds, aggregated into reports/campaign/<task>/results.md.",
    no_args_is_help=True,
)
CampaignOpt = Annotated[
    Path,
    typer.Option("--campaign", help="Campaign params: shared knobs plus a campaign: section."),
]
RunTasksOpt = names_option("--task", "-t", what="Task", default="Default: campaign.tasks.")
RunSeedsOpt = names_option("--seed", what="Seed", default="Default: campaign.seeds.")
RunRunsOpt = names_option(
    "--run", what="Run (ce, or one N of a few-shot study: ce-n20)", default="Default: every run."
)
TuningReportsOpt = reports_option("Where campaign/<task>/tuning.md goes.")
ResultsReportsOpt = reports_option("Where README.md and campaign/<task>/results.md go.")
# one run of the campaign: run and params name it alike
OneTaskOpt = Annotated[str, typer.Option("--task", "-t", help="A task of campaign.tasks.")]
OneRunOpt = Annotated[str, typer.Option("--run", "-r", help="A run of campaign.runs.")]
OneSeedOpt = Annotated[int, typer.Option("--seed", help="train.seed of this run.")]
ThreadsOpt = Annotated[
    int | None,
    typer.Option(
        "--threads",
        help="Threads per worker (default: the cores shared out among the workers); lower it "
        "when other work shares the machine.",
    ),
]
BackendOpt = Annotated[
    str,
    typer.Option(
        "--backend",
        help="local: --workers processes here; ray: one Ray task per run, asking for "
        "campaign.resources, as many at once as the cluster holds (pip install 'aclpipe[cluster]').",
    ),
]
AddressOpt = Annotated[
    str | None,
    typer.Option(
        "--address",
        help="With --backend ray: the cluster's head, auto, host:port or ray://host:port "
        "(default: the Ray instance on this machine, else a new one).",
    ),
]


@campaign_app.command("prepare")
@user_errors
def campaign_prepare(
    task: RunTasksOpt = None,
    seed: RunSeedsOpt = None,
    campaign: CampaignOpt = Path(CAMPAIGN_PARAMS),
) -> None:
    """Read, subsample and tokenize tasks into campaign/data/<task>/ with their settings; in a
    few-shot study, each seed's draw at every N into <study>/data/<task>/s<seed>/n<N>/."""
    from aclpipe.study.campaign import commands

    commands.prepare(campaign, task, seed, console)


@campaign_app.command("run")
@user_errors
def campaign_run(
    task: OneTaskOpt,
    run: OneRunOpt,
    seed: OneSeedOpt,
    campaign: CampaignOpt = Path(CAMPAIGN_PARAMS),
) -> None:
    """Train one run, score every exit and sweep the policies; writes
    campaign/runs/<task>/<run>-s<seed>/ (the weights are not kept)."""
    from aclpipe.study.campaign import commands

    commands.run(campaign, task, run, seed, console)


@campaign_app.command("params")
@user_errors
def campaign_params(
    task: OneTaskOpt,
    run: OneRunOpt,
    seed: OneSeedOpt,
    campaign: CampaignOpt = Path(CAMPAIGN_PARAMS),
) -> None:
    """Print one run's params as an ordinary params file, to rerun it by hand with
    `aclpipe prepare` and `aclpipe finetune --params <file>` (the commands head the file)."""
    from aclpipe.study.campaign import commands

    commands.params(campaign, task, run, seed)


@campaign_app.command("run-pending")
@user_errors
def campaign_run_pending(
    workers: Annotated[
        int, typer.Option("--workers", "-w", help="Runs at a time (a GPU takes several).")
    ] = 1,
    task: RunTasksOpt = None,
    seed: RunSeedsOpt = None,
    threads: ThreadsOpt = None,
    backend: BackendOpt = "local",
    address: AddressOpt = None,
    campaign: CampaignOpt = Path(CAMPAIGN_PARAMS),
    run: RunRunsOpt = None,
) -> None:
    """Every run without a folder yet, seed by seed, several at a time in separate processes.
    Then the `dvc commit -f ...` it prints records them, so `dvc repro` does not train them
    again."""
    from aclpipe.study.campaign import commands

    commands.run_pending(campaign, workers, task, seed, threads, console, backend, address, run)


@campaign_app.command("tune")
@user_errors
def campaign_tune(
    task: RunTasksOpt = None,
    config: Annotated[
        str | None, typer.Option("--config", help="One configuration of the grid (default: all).")
    ] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="With --config: its seed.")] = None,
    workers: Annotated[int, typer.Option("--workers", "-w", help="Configurations at a time.")] = 1,
    threads: ThreadsOpt = None,
    backend: BackendOpt = "local",
    address: AddressOpt = None,
    campaign: CampaignOpt = Path(CAMPAIGN_PARAMS),
    reports: TuningReportsOpt = REPORTS,
) -> None:
    """Choose the base recipe: train campaign.tune.method with every configuration of
    campaign.tune.grid not yet run, score them on the validation split, and write
    reports/campaign/<task>/tuning.md with the pick (the best validation score; dev is not
    used)."""
    from aclpipe.study.campaign import commands

    commands.tune(
        campaign, task, config, seed, workers, threads, reports, console, backend, address
    )


@campaign_app.command("stack-compare")
@user_errors
def campaign_stack_compare(
    first: Annotated[Path, typer.Argument(help="A finished run's folder, on one stack.")],
    second: Annotated[Path, typer.Argument(help="The same run's folder, on another stack.")],
    campaign: CampaignOpt = Path(CAMPAIGN_PARAMS),
) -> None:
    """Compare one run trained on two library stacks, file by file (sha256); writes
    campaign/stack_check.json, which reports/README.md cites under its stacks
    (campaign/stack_check.sh trains both runs first)."""
    from aclpipe.study.campaign import commands

    commands.stack_compare(campaign, first, second, console)


@campaign_app.command("wallclock")
@user_errors
def campaign_wallclock(
    runs_in: Annotated[
        Path | None,
        typer.Option(
            "--from",
            help="The study's folder in the checkout that ran the runs, e.g. a worktree's "
            "fewshot/ (default: this one's).",
        ),
    ] = None,
    campaign: CampaignOpt = Path(CAMPAIGN_PARAMS),
) -> None:
    """Merge each finished run's start and end (its log's birth and last change) into
    <study>/wallclock.tsv, and print the wall clock per task and N."""
    from aclpipe.study.campaign import commands

    commands.wallclock(campaign, runs_in, console)


@campaign_app.command("record")
@user_errors
def campaign_record(
    everything: Annotated[
        bool,
        typer.Option(
            "--all",
            help="Re-record every finished stage, not only those the lock lacks (after a "
            "change shown to be behaviour-neutral).",
        ),
    ] = False,
    campaign: CampaignOpt = Path(CAMPAIGN_PARAMS),
) -> None:
    """Record the finished prepare, tune and run stages in <study>/dvc.lock in one pass: what
    `dvc commit -f <stage> ...` does, with one parse and one write of the lock (seconds for
    hundreds of stages, where dvc commit takes seconds a stage). Not the report."""
    from aclpipe.study.campaign import commands

    commands.record(campaign, everything, console)


@campaign_app.command("report")
@user_errors
def campaign_report(
    campaign: CampaignOpt = Path(CAMPAIGN_PARAMS),
    reports: ResultsReportsOpt = REPORTS,
) -> None:
    """Aggregate the finished runs into reports/campaign/<task>/results.{md,json}, plots, and
    reports/README.md (paired-bootstrap verdicts with 95% intervals; no model is run)."""
    from aclpipe.study.campaign import commands

    commands.report(campaign, reports, console)
