"""The ``aclpipe`` command line: prepare, finetune, evaluate.

Every stage takes ``--params`` (default params.yaml) and repeatable ``--set section.key=value``
overrides (the same dotted keys as ``dvc exp run -S``). Without ``--task`` a stage runs every
task in ``pipeline.tasks``; without ``--method``, every method in ``pipeline.methods``. Every
option that takes several names is repeatable and also reads comma-separated names
(``-m ce -m joint`` or ``-m ce,joint``; ``parse_list``). Each command parses its options and
calls one stage function; paths come from ``aclpipe.layout``. Errors a user can fix print one
line and exit with code 2 (``--debug`` shows the traceback).
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from aclpipe.data.tasks import SENTENCE_TASKS, TASKS, Task, get_task
from aclpipe.errors import UserError
from aclpipe.layout import CURVES_JSON, METRICS, REPORTS_README, RESULTS_MD, Layout
from aclpipe.training.knobs import METHOD_NAMES, check_method  # torch-free: predict stays light

app = typer.Typer(
    help="Contrastive and multi-exit fine-tuning of BERT-family encoders on GLUE.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)
_state = {"debug": False}
LAYOUT = Layout()  # the default pipeline's folders, relative to where aclpipe runs
REPORTS, STS_REPORT = LAYOUT.reports(), LAYOUT.sts_report()  # defaults of --reports, --out


def _names_option(*names: str, what: str = "", default: str = "", hidden: bool = False):
    """A repeatable option of names, each value also read as comma-separated names
    (``parse_list``)."""
    text = f"{what}; repeat the option, or separate names with commas, for several. {default}"
    return Annotated[list[str] | None, typer.Option(*names, help=text, hidden=hidden)]


TaskOpt = _names_option(
    "--task",
    "-t",
    what=f"GLUE task: {', '.join(TASKS)}; sentence-embedding task: {', '.join(SENTENCE_TASKS)}",
    default="Default: every task in pipeline.tasks of the params file.",
)
MethodOpt = _names_option(
    "--method",
    "-m",
    what=f"Method: {', '.join(METHOD_NAMES)}",
    default="Default: every method in pipeline.methods of the params file.",
)
CompareOpt = _names_option(
    "--method",
    "-m",
    what="Method to compare",
    default="Default: every method with results under reports/<task>/.",
)
AuxMethodOpt = _names_option(
    "--method",
    "-m",
    what="Method with an auxiliary objective: scl, acl, romebert or acl-cl",
    default="Default: scl and acl.",
)
MethodsAlias = _names_option("--methods", hidden=True)  # an earlier release's; still read
PoolingOpt = _names_option(
    "--pooling",
    what="Pooling to compare: cls, mean or layer-attention",
    default="Default: all three.",
)
ParamsOpt = Annotated[Path, typer.Option("--params", help="Params file (YAML) holding every knob.")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        "-S",
        help="Override one param, e.g. --set train.lr=3e-5 (repeatable; same keys "
        "as `dvc exp run -S`).",
    ),
]


@app.callback()
def main(
    debug: Annotated[
        bool, typer.Option("--debug", help="Show the full traceback on errors.")
    ] = False,
) -> None:
    """Contrastive and multi-exit fine-tuning of BERT-family encoders on GLUE."""
    _state["debug"] = debug


def _counts(meta: dict) -> str:
    """``train 48, dev 16``: examples per split of a prepared task's meta.json."""
    return ", ".join(f"{s} {v['examples']}" for s, v in meta["splits"].items())


def user_errors(fn):
    """Print a UserError as one line and exit 2; any other error as one line and exit 1."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as err:
            if _state["debug"]:
                raise
            err_console.print(f"error: {err}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            err_console.print("interrupted: outputs of the unfinished step were not written")
            raise typer.Exit(130) from None
        except Exception as err:  # a bug, not bad input: still one line unless --debug
            if _state["debug"]:
                raise
            err_console.print(
                f"internal error: {type(err).__name__}: {err} (run with --debug for the traceback)",
                markup=False,  # messages may hold brackets, e.g. gloo's [/path:line]
                highlight=False,
                soft_wrap=True,
            )
            raise typer.Exit(1) from None

    return wrapper


def parse_list(values: list[str] | None, option: str, kind: type = str) -> list | None:
    """The values of a repeatable list option, each also split at commas: ``["a, b", "a"]`` ->
    ``["a", "b"]`` (stripped, repeats dropped, an empty item an error); none given -> None."""
    if not values:
        return None
    items = []
    for text in values:
        parts = [part.strip() for part in text.split(",")]
        if not all(parts):
            raise UserError(f"{option} {text!r} has an empty item: give a comma-separated list")
        try:
            items += [kind(part) for part in parts]
        except ValueError:
            raise UserError(
                f"{option} {text!r} is not a comma-separated list of whole numbers"
            ) from None
    return list(dict.fromkeys(items))


def _load(params_path: Path, overrides: list[str] | None):
    from aclpipe.config import load_params

    return load_params(params_path, overrides or [])


def _tasks(task: list[str] | None, params) -> list[Task]:
    names = parse_list(task, "--task") or params.pipeline.tasks
    if not names:
        raise UserError("no task given and pipeline.tasks is empty: pass --task")
    return [get_task(n) for n in names]


def _methods(method: list[str] | None, default: list[str]) -> list[str]:
    names = parse_list(method, "--method") or default
    if not names:
        raise UserError("no method given and pipeline.methods is empty: pass --method")
    return [check_method(n) for n in names]


def _task_methods(task: list[str] | None, method: list[str] | None, params):
    """Every (task, method) pair a stage runs: the options, else pipeline.tasks and .methods;
    all names are checked before the first pair runs."""
    tasks, methods = _tasks(task, params), _methods(method, params.pipeline.methods)
    return [(t, m) for t in tasks for m in methods]


@app.command()
@user_errors
def prepare(
    task: TaskOpt = None,
    params: ParamsOpt = Path("params.yaml"),
    set: SetOpt = None,
    glue_dir: Annotated[
        Path | None,
        typer.Option(
            "--glue-dir",
            help="Folder in the classic glue_data layout (overrides GLUE_DIR "
            "and data.glue_dir). Tasks missing there are read from the hub.",
        ),
    ] = None,
) -> None:
    """Read a GLUE task, subsample, tokenize, and save it under data/<task>/."""
    from aclpipe.data.prepare import prepare as run_prepare
    from aclpipe.data.prepare import resolve_glue_dir

    p = _load(params, set)
    glue, model = resolve_glue_dir(p.data, glue_dir), p.model
    for t in _tasks(task, p):
        meta = run_prepare(
            t, p.data, model.name, LAYOUT.data(t.name), glue, model.trust_remote_code
        )
        console.print(f"prepared {t.name} from {meta['source']}: {_counts(meta)}", highlight=False)


@app.command()
@user_errors
def finetune(
    task: TaskOpt = None,
    method: MethodOpt = None,
    params: ParamsOpt = Path("params.yaml"),
    set: SetOpt = None,
) -> None:
    """Train a method on a task; writes models/<task>/<method>/."""
    from aclpipe.training.loop import finetune as run_finetune

    p = _load(params, set)
    for t, m in _task_methods(task, method, p):
        run_finetune(t, m, p, LAYOUT.data(t.name), LAYOUT.model(t.name, m), console)
        if os.environ.get("RANK", "0") == "0":  # once under torchrun
            console.print(f"saved {LAYOUT.model(t.name, m)}", highlight=False)


@app.command()
@user_errors
def evaluate(
    task: TaskOpt = None,
    method: MethodOpt = None,
    params: ParamsOpt = Path("params.yaml"),
    set: SetOpt = None,
) -> None:
    """Score every exit on the dev split(s); writes reports/<task>/<method>/metrics.json."""
    from aclpipe.evaluation.evaluate import evaluate as run_evaluate
    from aclpipe.modeling.device import pick_device

    p = _load(params, set)
    device = pick_device(p.train.device)
    for t, m in _task_methods(task, method, p):
        data, out = LAYOUT.data(t.name), LAYOUT.report(t.name, m)
        run_evaluate(t, m, LAYOUT.model(t.name, m), data, out, p.evaluate, device, console)


@app.command("export-exits")
@user_errors
def export_exits(
    task: TaskOpt = None,
    method: MethodOpt = None,
    params: ParamsOpt = Path("params.yaml"),
    set: SetOpt = None,
    opset: Annotated[
        int | None, typer.Option("--opset", help="ONNX opset (default: the exporter's).")
    ] = None,
    int8: Annotated[
        bool,
        typer.Option(
            "--int8",
            help="Also write int8 copies of the segments (ONNX Runtime dynamic quantization; "
            "`predict --precision int8`) and score them on dev against the model.",
        ),
    ] = False,
) -> None:
    """Export a trained model for early exit into models/<task>/<method>/export/: ONNX graphs
    an early-exit runtime chains (embeddings, then one segment per exit, each checked against
    PyTorch with onnxruntime), tokenizer.json, the default exit setting (the 1-point budget's
    pick from reports/<task>/<method>/curves.json), a self-contained model folder and the dev
    split's logits at every exit (dev_logits.npz)."""
    from aclpipe.early_exit.export import export_exits as run_export

    p = _load(params, set)
    for t, m in _task_methods(task, method, p):
        data, out = LAYOUT.data(t.name), LAYOUT.export(t.name, m)
        curves = LAYOUT.report(t.name, m) / CURVES_JSON  # the default exit setting's source
        reference = LAYOUT.report(t.name, "ce") / METRICS
        run_export(t, LAYOUT.model(t.name, m), data, out, p.evaluate.batch_size, opset, console,
                   curves, reference, int8)  # fmt: skip
        console.print(f"exported {out}", highlight=False)


@app.command()
@user_errors
def predict(
    model: Annotated[
        Path,
        typer.Option(
            "--model",
            help="The folder `aclpipe export-exits` writes (models/<task>/<method>/export), or "
            "a model folder (its model/ or a trained models/<task>/<method>; --engine torch).",
        ),
    ],
    policy: Annotated[
        str | None,
        typer.Option(
            "--policy",
            help="Exit policy: entropy, patience, confidence, or none (the full model). "
            "Default: the export's default_setting (the 1-point budget's pick), else entropy.",
        ),
    ] = None,
    threshold: Annotated[
        float | None,
        typer.Option(
            "--threshold",
            help="Entropy S in [0, log C], patience t >= 1, or confidence delta in [0, 1]. "
            "Default: the export's for its policy, else entropy 0.3, confidence 0.9, patience 2.",
        ),
    ] = None,
    engine: Annotated[
        str | None,
        typer.Option(
            "--engine",
            help="onnx (ONNX Runtime; no torch needed) or torch. Default: onnx for an export "
            "folder, torch for a model folder.",
        ),
    ] = None,
    input: Annotated[
        str,
        typer.Option(
            "--input",
            "-i",
            help="Input file, - for stdin: plain text (one sentence, or a tab-separated pair, "
            'per line), TSV with a header, or JSONL ({"text": ...} or {"text_a": ..., '
            '"text_b": ...}).',
        ),
    ] = "-",
    input_format: Annotated[
        str,
        typer.Option(
            "--format", help="auto (by file name: .tsv, .jsonl, else text), text, tsv or jsonl."
        ),
    ] = "auto",
    output: Annotated[
        str, typer.Option("--output", "-o", help="JSON-lines output file; - for stdout.")
    ] = "-",
    batch_size: Annotated[int, typer.Option("--batch-size", help="Sentences per batch.")] = 32,
    max_length: Annotated[
        int, typer.Option("--max-length", help="Tokens per input after truncation.")
    ] = 128,
    threads: Annotated[
        int | None,
        typer.Option("--threads", help="Intra-op threads of the engine (default: the engine's)."),
    ] = None,
    precision: Annotated[
        str,
        typer.Option(
            "--precision",
            help="onnx engine: fp32 (the exported model), or int8 (its int8 segments from "
            "`export-exits --int8`: faster, approximate; export.json has their dev scores).",
        ),
    ] = "fp32",
) -> None:
    """Predict with early exit: one JSON line per input record (label, probability, exit
    layer), in input order; throughput and the mean exit layer on stderr at the end."""
    from aclpipe.early_exit.inputs import input_format as pick_format
    from aclpipe.early_exit.inputs import read_lines
    from aclpipe.early_exit.predict import Predictor, write_jsonl

    if batch_size < 1 or max_length < 2 or (threads is not None and threads < 1):
        raise UserError("--batch-size and --threads must be >= 1 and --max-length >= 2")
    fmt = pick_format(input, input_format)
    predictor = Predictor(model, policy, threshold, engine, batch_size, max_length,
                          threads=threads, precision=precision)  # fmt: skip
    lines = read_lines(input)
    total = _count_records(input, fmt)
    rows = predictor.records(lines, fmt)
    if total is not None and err_console.is_terminal:
        from rich.progress import Progress

        with Progress(console=err_console, transient=True) as progress:
            bar = progress.add_task("predict", total=total)
            rows = _advancing(rows, progress, bar)
            write_jsonl(rows, sys.stdout if output == "-" else Path(output))
    else:
        write_jsonl(rows, sys.stdout if output == "-" else Path(output))
    err_console.print(predictor.summary(), highlight=False, soft_wrap=True)


def _count_records(source: str, fmt: str) -> int | None:
    """Records in an input file (lines, less a TSV header); None for stdin."""
    if source == "-" or not Path(source).is_file():
        return None
    with open(source, "rb") as f:
        lines = sum(1 for _ in f)
    return max(lines - (fmt == "tsv"), 0)


def _advancing(rows, progress, bar):
    for row in rows:
        progress.advance(bar)
        yield row


@app.command()
@user_errors
def tradeoff(
    task: TaskOpt = None,
    method: CompareOpt = None,
    methods: MethodsAlias = None,
    params: ParamsOpt = Path("params.yaml"),
    set: SetOpt = None,
) -> None:
    """Speed-up at quality budgets of 0, 1, 2 and 5 points below the full ce model, and the
    score of every exit, for each method; writes reports/<task>/tradeoff.{md,csv} and PNGs."""
    from aclpipe.study.tradeoff import tradeoff as run_tradeoff

    p = _load(params, set)
    chosen = parse_list((method or []) + (methods or []), "--method")
    for t in _tasks(task, p):
        run_tradeoff(t.name, LAYOUT.reports(), chosen, console=console)


@app.command()
@user_errors
def angles(
    task: Annotated[
        str, typer.Option("--task", "-t", help="GLUE task (the paper uses rte).")
    ] = "rte",
    method: AuxMethodOpt = None,
    methods: MethodsAlias = None,
    params: ParamsOpt = Path("params.yaml"),
    set: SetOpt = None,
) -> None:
    """Histogram of the angle between the CE and the contrastive gradient during fine-tuning.

    Trains each method on the prepared task with per-step gradient cosines recorded, and writes
    reports/<task>/angles/angles.json and angles.png (the ACL paper's pilot experiment)."""
    from aclpipe.study.angles import run_angles

    p = _load(params, set)
    t = get_task(task)
    chosen = _methods((method or []) + (methods or []), ["scl", "acl"])
    run_angles(t, chosen, p, LAYOUT.data(t.name), LAYOUT.angles(t.name), console)


@app.command("sts-eval")
@user_errors
def sts_eval(
    params: ParamsOpt = Path("params.yaml"),
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
    from aclpipe.data.prepare import resolve_glue_dir
    from aclpipe.study import sts_eval as sts
    from aclpipe.study.sts_scores import default_pair_files, render_sts_scores, sts_scores

    p = _load(params, set)
    names = parse_list(pooling, "--pooling")
    files = default_pair_files(resolve_glue_dir(p.data, glue_dir))
    files.update({k: v for k, v in (("dev", dev_file), ("test", test_file)) if v is not None})
    result, _ = sts_scores(
        p.model.name, files, model_dir, names, p.data.max_length, p.evaluate.batch_size
    )
    console.print(render_sts_scores(result))
    sts.write_sts_report(result, out)
    console.print(f"wrote {out}", highlight=False)


campaign_app = typer.Typer(
    help="The seeds campaign on real GLUE (campaign/params.yaml, run by campaign/dvc.yaml): "
    "every method over several seeds, aggregated into reports/campaign/<task>/results.md.",
    no_args_is_help=True,
)
app.add_typer(campaign_app, name="campaign")
CampaignOpt = Annotated[
    Path,
    typer.Option("--campaign", help="Campaign params: shared knobs plus a campaign: section."),
]
RunTasksOpt = _names_option("--task", "-t", what="Task", default="Default: campaign.tasks.")
RunSeedsOpt = _names_option("--seed", what="Seed", default="Default: campaign.seeds.")
ThreadsOpt = Annotated[
    int | None,
    typer.Option(
        "--threads",
        help="Threads per worker (default: the cores shared out among the workers); lower it "
        "when other work shares the machine.",
    ),
]


@campaign_app.command("prepare")
@user_errors
def campaign_prepare(
    task: RunTasksOpt = None,
    campaign: CampaignOpt = Path("campaign/params.yaml"),
) -> None:
    """Read, subsample and tokenize tasks into campaign/data/<task>/ with their settings."""
    from aclpipe.study.campaign import load_campaign, prepare_task

    spec = load_campaign(campaign)
    names = parse_list(task, "--task") or spec.tasks
    for name in names:  # every name checked before any is written
        spec.overrides(name)
    for name in names:
        meta = prepare_task(spec, name, console)
        console.print(f"prepared {name} from {meta['source']}: {_counts(meta)}", highlight=False)


@campaign_app.command("run")
@user_errors
def campaign_run(
    task: Annotated[str, typer.Option("--task", "-t", help="A task of campaign.tasks.")],
    run: Annotated[str, typer.Option("--run", "-r", help="A run of campaign.runs.")],
    seed: Annotated[int, typer.Option("--seed", help="train.seed of this run.")],
    campaign: CampaignOpt = Path("campaign/params.yaml"),
) -> None:
    """Train one run, score every exit and sweep the policies; writes
    campaign/runs/<task>/<run>-s<seed>/ (the weights are not kept)."""
    from aclpipe.study.campaign import load_campaign, run_one

    spec = load_campaign(campaign)
    out = run_one(spec, task, run, seed, console)
    console.print(f"wrote {out}", highlight=False)


@campaign_app.command("run-pending")
@user_errors
def campaign_run_pending(
    workers: Annotated[
        int, typer.Option("--workers", "-w", help="Runs at a time (a GPU takes several).")
    ] = 1,
    task: RunTasksOpt = None,
    seed: RunSeedsOpt = None,
    threads: ThreadsOpt = None,
    campaign: CampaignOpt = Path("campaign/params.yaml"),
) -> None:
    """Every run without a folder yet, seed by seed, several at a time in separate processes.
    Then the `dvc commit -f ...` it prints records them, so `dvc repro` does not train them
    again."""
    from aclpipe.study.campaign import load_campaign
    from aclpipe.study.campaign_runner import commit_command, run_pending

    spec = load_campaign(campaign)
    task_list, seed_list = parse_list(task, "--task"), parse_list(seed, "--seed", int)
    done, failed = run_pending(spec, workers, console, task_list, seed_list, threads=threads)
    if done:  # also when some failed: the finished ones are kept and can be recorded
        console.print(
            f"{len(done)} runs written; record them in DVC's lock with: "
            f"{commit_command(spec, done)}",
            highlight=False,
        )
    if failed:
        raise UserError(
            f"{len(failed)} of {len(done) + len(failed)} runs failed (first: {failed[0]}); "
            f"see campaign/models/<task>/<run>-s<seed>.log, fix, and run again"
        )


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
    campaign: CampaignOpt = Path("campaign/params.yaml"),
    reports: Annotated[
        Path, typer.Option("--reports", help="Where campaign/<task>/tuning.md goes.")
    ] = REPORTS,
) -> None:
    """Choose the base recipe: train campaign.tune.method with every configuration of
    campaign.tune.grid not yet run, score them on the validation split, and write
    reports/campaign/<task>/tuning.md with the pick (the best validation score; dev is not
    used)."""
    from aclpipe.study.campaign import load_campaign, tune_one
    from aclpipe.study.campaign_markdown import campaign_reports
    from aclpipe.study.campaign_runner import TUNE, commit_command, run_pending
    from aclpipe.study.tuning import TUNING_MD, write_tuning

    spec = load_campaign(campaign)
    task_list = parse_list(task, "--task")
    if config is not None:
        if len(task_list or []) != 1 or seed is None:
            raise UserError("--config needs one --task and a --seed")
        console.print(
            f"wrote {tune_one(spec, task_list[0], config, seed, console)}", highlight=False
        )
        failed: list[str] = []
    else:
        done, failed = run_pending(spec, workers, console, task_list, kind=TUNE, threads=threads)
        if done:
            console.print(f"record them with: {commit_command(spec, done, TUNE)}", highlight=False)
    for name, summary in write_tuning(spec, reports).items():
        pick = summary["pick"] or "none yet"
        console.print(
            f"{name}: pick {pick}; wrote {campaign_reports(reports, name) / TUNING_MD}",
            highlight=False,
        )
    if failed:
        raise UserError(
            f"{len(failed)} configurations failed (first: {failed[0]}); see "
            "campaign/models/<task>/tune-<config>-s<seed>.log, fix, and run again"
        )


@campaign_app.command("stack-compare")
@user_errors
def campaign_stack_compare(
    first: Annotated[Path, typer.Argument(help="A finished run's folder, on one stack.")],
    second: Annotated[Path, typer.Argument(help="The same run's folder, on another stack.")],
    campaign: CampaignOpt = Path("campaign/params.yaml"),
) -> None:
    """Compare one run trained on two library stacks, file by file (sha256); writes
    campaign/stack_check.json, which reports/README.md cites under its stacks
    (campaign/stack_check.sh trains both runs first)."""
    import json

    from aclpipe import atomic
    from aclpipe.layout import STACK_CHECK
    from aclpipe.study.campaign import load_campaign
    from aclpipe.study.stack_check import compare_runs

    spec = load_campaign(campaign)
    check = compare_runs(first, second)
    out = spec.root / STACK_CHECK
    atomic.write_text(out, json.dumps(check, indent=2) + "\n")
    same = check["files"] - len(check["differing"])
    console.print(
        f"{same} of {check['files']} files identical ({' | '.join(check['stacks'])}); wrote {out}",
        highlight=False,
    )
    if check["differing"]:
        console.print(f"differing: {', '.join(check['differing'])}", highlight=False)


@campaign_app.command("report")
@user_errors
def campaign_report(
    campaign: CampaignOpt = Path("campaign/params.yaml"),
    reports: Annotated[
        Path, typer.Option("--reports", help="Where README.md and campaign/<task>/results.md go.")
    ] = REPORTS,
) -> None:
    """Aggregate the finished runs into reports/campaign/<task>/results.{md,json}, plots, and
    reports/README.md (paired-bootstrap verdicts with 95% intervals; no model is run)."""
    from aclpipe.study.campaign import load_campaign
    from aclpipe.study.campaign_markdown import campaign_reports
    from aclpipe.study.campaign_report import write_reports
    from aclpipe.study.tuning import TUNING_MD, write_tuning

    spec = load_campaign(campaign)
    for name in write_tuning(spec, reports):
        console.print(f"wrote {campaign_reports(reports, name) / TUNING_MD}", highlight=False)
    summaries = write_reports(spec, reports)
    if not summaries:
        raise UserError(
            f"no finished runs under {spec.layout.runs()}: run `dvc repro campaign/dvc.yaml` "
            "(or `aclpipe campaign run ...`) first"
        )
    for task, summary in summaries.items():
        console.print(
            f"wrote {campaign_reports(reports, task) / RESULTS_MD} ({summary['finished']} runs)",
            highlight=False,
        )
    console.print(f"wrote {reports / REPORTS_README}", highlight=False)


sts_app = typer.Typer(
    help="The STS study (sts/params.yaml, run by sts/dvc.yaml): sentence-embedding objectives "
    "x poolings x seeds, scored on STS-B dev and the STS Benchmark test, reported in "
    "reports/sts/README.md.",
    no_args_is_help=True,
)
app.add_typer(sts_app, name="sts")
StudyOpt = Annotated[Path, typer.Option("--study", help="STS study params: knobs plus sts:.")]


@sts_app.command("prepare")
@user_errors
def sts_prepare(
    task: Annotated[str, typer.Option("--task", "-t", help="sentences or sentence-pairs")],
    study: StudyOpt = Path("sts/params.yaml"),
) -> None:
    """Build a sentence task into sts/data/<task>/ with the study's data settings."""
    from aclpipe.study.sts_study import load_study, prepare_task

    meta = prepare_task(load_study(study), task)
    console.print(f"prepared {task}: {_counts(meta)}", highlight=False)


@sts_app.command("run")
@user_errors
def sts_run(
    objective: Annotated[str, typer.Option("--objective", help="An objective of sts.objectives.")],
    pooling: Annotated[str, typer.Option("--pooling", help="cls, mean or layer-attention.")],
    seed: Annotated[int, typer.Option("--seed", help="train.seed of the run.")],
    study: StudyOpt = Path("sts/params.yaml"),
) -> None:
    """Train one run, score it on STS-B dev and the STS Benchmark test; writes
    sts/runs/<objective>-<pooling>-s<seed>/ (the weights are not kept)."""
    from aclpipe.study.sts_study import load_study, run_one

    console.print(f"wrote {run_one(load_study(study), objective, pooling, seed, console)}")


@sts_app.command("zero-shot")
@user_errors
def sts_zero_shot(study: StudyOpt = Path("sts/params.yaml")) -> None:
    """Score the untrained checkpoint (every pooling, every layer); writes sts/runs/zero-shot/."""
    from aclpipe.study.sts_study import load_study, zero_shot

    console.print(f"wrote {zero_shot(load_study(study))}", highlight=False)


@sts_app.command("report")
@user_errors
def sts_report(
    study: StudyOpt = Path("sts/params.yaml"),
    reports: Annotated[Path, typer.Option("--reports", help="Where README.md goes.")] = Path(
        "reports/sts"
    ),
) -> None:
    """reports/sts/README.md, results.json and the per-layer figure from the runs present."""
    from aclpipe.study.sts_report import write_report
    from aclpipe.study.sts_study import load_study

    console.print(f"wrote {write_report(load_study(study), reports)}", highlight=False)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
