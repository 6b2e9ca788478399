"""The study's commands: ``aclpipe tradeoff``, ``angles``, ``sts-eval`` and the ``campaign``
sub-app (prepare, run, run-pending, tune, stack-compare, report), added to the main app by
``aclpipe.cli``. Each command parses its options and calls one function of the study; the
study's modules are imported inside the commands, so that other commands (``predict``) do
not load them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from aclpipe.cli_options import (
    LAYOUT,
    ParamsOpt,
    SetOpt,
    TaskOpt,
    console,
    counts,
    load,
    method_list,
    names_option,
    parse_list,
    task_list,
    user_errors,
)
from aclpipe.data.tasks import get_task
from aclpipe.layout import CAMPAIGN_PARAMS, PARAMS, STS_PARAMS

app = typer.Typer()  # its commands join the main app's (add_typer without a name)
REPORTS, STS_REPORT = LAYOUT.reports(), LAYOUT.sts_report()  # defaults of --reports, --out
STS_REPORTS = LAYOUT.sts_study_reports()  # default of sts report --reports

CompareOpt = names_option(
    "--method",
    "-m",
    what="Method to compare",
    default="Default: every method with results under reports/<task>/.",
)
AuxMethodOpt = names_option(
    "--method",
    "-m",
    what="Method with an auxiliary objective: scl, acl, romebert or acl-cl",
    default="Default: scl and acl.",
)
MethodsAlias = names_option("--methods", hidden=True)  # an earlier release's; still read
PoolingOpt = names_option(
    "--pooling",
    what="Pooling to compare: cls, mean or layer-attention",
    default="Default: all three.",
)


@app.command()
@user_errors
def tradeoff(
    task: TaskOpt = None,
    method: CompareOpt = None,
    methods: MethodsAlias = None,
    params: ParamsOpt = Path(PARAMS),
    set: SetOpt = None,
    full: Annotated[
        bool,
        typer.Option(
            "--full",
            help="Print every engine at batch 1 and 32, the scores per exit and the notes (as "
            "tradeoff.md), not one line per method and budget.",
        ),
    ] = False,
) -> None:
    """Speed-up at quality budgets of 0, 1, 2 and 5 points below the full ce model, and the
    score of every exit, for each method; writes reports/<task>/tradeoff.{md,csv} and PNGs."""
    from aclpipe.study.tradeoff import tradeoff as run_tradeoff

    p = load(params, set)
    chosen = parse_list((method or []) + (methods or []), "--method")
    for t in task_list(task, p):
        run_tradeoff(t.name, LAYOUT.reports(), chosen, console=console, full=full)


@app.command()
@user_errors
def angles(
    task: Annotated[
        str, typer.Option("--task", "-t", help="GLUE task (the paper uses rte).")
    ] = "rte",
    method: AuxMethodOpt = None,
    methods: MethodsAlias = None,
    params: ParamsOpt = Path(PARAMS),
    set: SetOpt = None,
) -> None:
    """Histogram of the angle between the CE and the contrastive gradient during fine-tuning.

    Trains each method on the prepared task with per-step gradient cosines recorded, and writes
    reports/<task>/angles/angles.json and angles.png (the ACL paper's pilot experiment)."""
    from aclpipe.study.angles import run_angles

    p = load(params, set)
    t = get_task(task)
    chosen = method_list((method or []) + (methods or []), ["scl", "acl"])
    run_angles(t, chosen, p, LAYOUT.data(t.name), LAYOUT.angles(t.name), console)


@app.command("sts-eval")
@user_errors
def sts_eval(
    params: ParamsOpt = Path(PARAMS),
    set: SetOpt = None,
    glue_dir: Annotated[
        Path | None,
        typer.Option(
            "--glue-dir",
            help="Folder in the classic glue_data layout holding STS-B/ "
            "(default: GLUE_DIR, then data.glue_dir).",
        ),
    ] = None,
    pooling: PoolingOpt = None,
    model_dir: Annotated[
        Path | None,
        typer.Option(
            "--model-dir",
            help="A trained sentence-embedding model (finetune with simcse-unsup or "
            "simcse-sup); default: only the checkpoint in model.name, zero-shot.",
        ),
    ] = None,
    dev_file: Annotated[
        Path | None,
        typer.Option("--dev-file", help="Scored pairs for dev (default: STS-B/dev.tsv)."),
    ] = None,
    test_file: Annotated[
        Path | None,
        typer.Option(
            "--test-file",
            help="Scored pairs for test (default: STS-B/original/sts-test.tsv, the STS "
            "Benchmark test with gold scores).",
        ),
    ] = None,
    out: Annotated[
        Path, typer.Option("--out", help="Where to write the JSON report.")
    ] = STS_REPORT,
) -> None:
    """Sentence-embedding quality on STS-B dev and the STS Benchmark test, per pooling and
    layer: zero-shot for the checkpoint, and for a trained model (--model-dir) its own
    trained pooling beside them.

    Spearman correlation between the cosine similarity of the pooled embeddings of the two
    sentences and the gold scores (the layer-attention paper's setting). Prints a table and
    writes JSON; bad input writes nothing."""
    from aclpipe.study.sts_scores import run_sts_eval

    p = load(params, set)
    run_sts_eval(p.model.name, p.data, glue_dir, parse_list(pooling, "--pooling"), model_dir,
                 dev_file, test_file, p.evaluate.batch_size, out, console)  # fmt: skip


sts_app = typer.Typer(
    help="The STS study (sts/params.yaml, run by sts/dvc.yaml): sentence-embedding objectives "
    "x poolings x seeds, scored on STS-B dev and the STS Benchmark test, with its own "
    "report and figure.",
    no_args_is_help=True,
)
StudyOpt = Annotated[Path, typer.Option("--study", help="STS study params: knobs plus sts:.")]


@sts_app.command("prepare")
@user_errors
def sts_prepare(
    task: Annotated[str, typer.Option("--task", "-t", help="sentences or sentence-pairs")],
    study: StudyOpt = Path(STS_PARAMS),
) -> None:
    """Build a sentence task into sts/data/<task>/ with the study's data settings."""
    from aclpipe.study.sts_study import load_study, prepare_task

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
    from aclpipe.study.sts_study import load_study, run_one

    console.print(f"wrote {run_one(load_study(study), objective, pooling, seed, console)}")


@sts_app.command("zero-shot")
@user_errors
def sts_zero_shot(study: StudyOpt = Path(STS_PARAMS)) -> None:
    """Score the untrained checkpoint (every pooling, every layer); writes sts/runs/zero-shot/."""
    from aclpipe.study.sts_study import load_study, zero_shot

    console.print(f"wrote {zero_shot(load_study(study))}", highlight=False)


@sts_app.command("report")
@user_errors
def sts_report(
    study: StudyOpt = Path(STS_PARAMS),
    reports: Annotated[
        Path, typer.Option("--reports", help="Where README.md goes.")
    ] = STS_REPORTS,
) -> None:
    """reports/sts/README.md, results.json and the per-layer figure from the runs present."""
    from aclpipe.study.sts_report import write_report
    from aclpipe.study.sts_study import load_study

    console.print(f"wrote {write_report(load_study(study), reports)}", highlight=False)


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
    from aclpipe.study import campaign_commands as commands

    commands.prepare(campaign, task, seed, console)


@campaign_app.command("run")
@user_errors
def campaign_run(
    task: Annotated[str, typer.Option("--task", "-t", help="A task of campaign.tasks.")],
    run: Annotated[str, typer.Option("--run", "-r", help="A run of campaign.runs.")],
    seed: Annotated[int, typer.Option("--seed", help="train.seed of this run.")],
    campaign: CampaignOpt = Path(CAMPAIGN_PARAMS),
) -> None:
    """Train one run, score every exit and sweep the policies; writes
    campaign/runs/<task>/<run>-s<seed>/ (the weights are not kept)."""
    from aclpipe.study import campaign_commands as commands

    commands.run(campaign, task, run, seed, console)


@campaign_app.command("params")
@user_errors
def campaign_params(
    task: Annotated[str, typer.Option("--task", "-t", help="A task of campaign.tasks.")],
    run: Annotated[str, typer.Option("--run", "-r", help="A run of campaign.runs.")],
    seed: Annotated[int, typer.Option("--seed", help="train.seed of this run.")],
    campaign: CampaignOpt = Path(CAMPAIGN_PARAMS),
) -> None:
    """Print one run's params as an ordinary params file, to rerun it by hand with
    `aclpipe prepare` and `aclpipe finetune --params <file>` (the commands head the file)."""
    from aclpipe.study import campaign_commands as commands

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
    from aclpipe.study import campaign_commands as commands

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
    reports: Annotated[
        Path, typer.Option("--reports", help="Where campaign/<task>/tuning.md goes.")
    ] = REPORTS,
) -> None:
    """Choose the base recipe: train campaign.tune.method with every configuration of
    campaign.tune.grid not yet run, score them on the validation split, and write
    reports/campaign/<task>/tuning.md with the pick (the best validation score; dev is not
    used)."""
    from aclpipe.study import campaign_commands as commands

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
    from aclpipe.study import campaign_commands as commands

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
    from aclpipe.study import campaign_commands as commands

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
    from aclpipe.study import campaign_commands as commands

    commands.record(campaign, everything, console)


@campaign_app.command("report")
@user_errors
def campaign_report(
    campaign: CampaignOpt = Path(CAMPAIGN_PARAMS),
    reports: Annotated[
        Path, typer.Option("--reports", help="Where README.md and campaign/<task>/results.md go.")
    ] = REPORTS,
) -> None:
    """Aggregate the finished runs into reports/campaign/<task>/results.{md,json}, plots, and
    reports/README.md (paired-bootstrap verdicts with 95% intervals; no model is run)."""
    from aclpipe.study import campaign_commands as commands

    commands.report(campaign, reports, console)
