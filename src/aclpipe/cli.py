"""The ``aclpipe`` command line: the pipeline's stages (prepare, finetune, evaluate,
export-exits, export-hf, tradeoff) and predict here, serve's options in ``aclpipe.cli_serve``;
the studies' commands (angles, sts-eval,
campaign, sts) in ``aclpipe.study.cli``; the parts they share in ``aclpipe.cli_options``.

Every stage takes ``--params`` (default params.yaml) and repeatable ``--set section.key=value``
overrides (the same dotted keys as ``dvc exp run -S``). Without ``--task`` a stage runs every
task in ``pipeline.tasks``; without ``--method``, every method in ``pipeline.methods``. Every
option that takes several names is repeatable and also reads comma-separated names
(``-m ce -m joint`` or ``-m ce,joint``; ``parse_list``). Each command parses its options and
calls one stage function; paths come from ``aclpipe.layout``. Errors a user can fix print one
line and exit with code 2 (``--debug`` shows the traceback).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from aclpipe.cli_options import (
    LAYOUT,
    MethodsAlias,
    ParamsOpt,
    SetOpt,
    TaskOpt,
    console,
    counts,
    err_console,
    load,
    names_help,
    parse_list,
    state,
    task_list,
    task_methods,
    user_errors,
)
from aclpipe.cli_serve import serve
from aclpipe.layout import PARAMS
from aclpipe.method_names import METHOD_NAMES  # predict loads nothing of training
from aclpipe.study.cli import app as study_app
from aclpipe.study.cli import campaign_app, sts_app
from aclpipe.study.params_cli import params_app

__all__ = ["app", "parse_list"]

app = typer.Typer(
    help="Contrastive and multi-exit fine-tuning of BERT-family encoders on GLUE.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
MethodOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--method",
        "-m",
        help=names_help(
            f"Method: {', '.join(METHOD_NAMES)}",
            "Default: every method in pipeline.methods of the params file.",
        ),
    ),
]  # written out, not names_option(...), so that a type checker reads it as a type


def _print_version(shown: bool) -> None:
    if shown:
        from aclpipe import __version__  # the installed metadata's (pyproject.toml)

        console.print(f"aclpipe {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def main(
    debug: Annotated[
        bool, typer.Option("--debug", help="Show the full traceback on errors.")
    ] = False,
    version: Annotated[
        bool,
        typer.Option("--version", help="Print the version and exit.", callback=_print_version,
                     is_eager=True),
    ] = False,
) -> None:
    """Contrastive and multi-exit fine-tuning of BERT-family encoders on GLUE."""
    state["debug"] = debug


@app.command()
@user_errors
def prepare(
    task: TaskOpt = None,
    params: ParamsOpt = Path(PARAMS),
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
    from aclpipe.stages.prepare import prepare as run_prepare
    from aclpipe.stages.prepare import resolve_glue_dir

    p = load(params, set)
    glue, model = resolve_glue_dir(p.data, glue_dir), p.model
    for t in task_list(task, p):
        meta = run_prepare(
            t, p.data, model.name, LAYOUT.data(t.name), glue, model.trust_remote_code
        )
        console.print(f"prepared {t.name} from {meta['source']}: {counts(meta)}", highlight=False)


@app.command()
@user_errors
def finetune(
    task: TaskOpt = None,
    method: MethodOpt = None,
    params: ParamsOpt = Path(PARAMS),
    set: SetOpt = None,
) -> None:
    """Train a method on a task; writes models/<task>/<method>/."""
    from aclpipe.stages.finetune import finetune as run_finetune

    p = load(params, set)
    for t, m in task_methods(task, method, p):
        run_finetune(t, m, p, LAYOUT.data(t.name), LAYOUT.model(t.name, m), console)
        if os.environ.get("RANK", "0") == "0":  # once under torchrun
            console.print(f"saved {LAYOUT.model(t.name, m)}", highlight=False)


@app.command()
@user_errors
def evaluate(
    task: TaskOpt = None,
    method: MethodOpt = None,
    params: ParamsOpt = Path(PARAMS),
    set: SetOpt = None,
) -> None:
    """Score every exit on the dev split(s); writes reports/<task>/<method>/metrics.json."""
    from aclpipe.modeling.device import pick_device
    from aclpipe.stages.evaluate import evaluate as run_evaluate

    p = load(params, set)
    device = pick_device(p.train.device)
    for t, m in task_methods(task, method, p):
        data, out = LAYOUT.data(t.name), LAYOUT.report(t.name, m)
        run_evaluate(t, m, LAYOUT.model(t.name, m), data, out, p.evaluate, device, console)


@app.command("export-exits")
@user_errors
def export_exits(
    task: TaskOpt = None,
    method: MethodOpt = None,
    params: ParamsOpt = Path(PARAMS),
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
    """Export a trained model for early exit into models/<task>/<method>/export/.

    ONNX graphs an early-exit runtime chains (embeddings, then one segment per exit, each checked against
    PyTorch with onnxruntime), tokenizer.json, the default exit setting (the 1-point budget's
    pick from reports/<task>/<method>/curves.json), a self-contained model folder and the dev
    split's logits at every exit (dev_logits.npz)."""
    from aclpipe.stages.export import export as run_export

    p = load(params, set)
    for t, m in task_methods(task, method, p):
        out = run_export(t, m, p, LAYOUT, opset, int8, console)
        console.print(f"exported {out}", highlight=False)


@app.command("export-hf")
@user_errors
def export_hf(
    task: TaskOpt = None,
    method: MethodOpt = None,
    params: ParamsOpt = Path(PARAMS),
    set: SetOpt = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Folder to write (one task and method); default models/<task>/<method>/hf.",
        ),
    ] = None,
    plain: Annotated[
        bool,
        typer.Option(
            "--plain",
            help="Write a stock BertForSequenceClassification folder (no remote code; for "
            "older transformers): single-exit models of a BERT encoder with cls pooling only.",
        ),
    ] = False,
    license: Annotated[
        str | None,
        typer.Option("--license", help="The model card's license (default: the base model's)."),
    ] = None,
) -> None:
    """Write a folder transformers loads (sentence-transformers for simcse-*), with a model card."""
    from aclpipe.errors import UserError
    from aclpipe.stages.export_hf import export_hf as run_export_hf

    p = load(params, set)
    pairs = task_methods(task, method, p)
    if out is not None and len(pairs) > 1:
        raise UserError(f"--out names one folder but {len(pairs)} task/method pairs were chosen: "
                        "give one --task and one --method")  # fmt: skip
    for t, m in pairs:
        folder = run_export_hf(t, m, p, LAYOUT, out, plain, license)
        console.print(f"wrote {folder}", highlight=False)


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
    """Predict with early exit: one JSON line per input record, in input order.

    Each line holds the label, its probability and the exit layer; throughput and the mean
    exit layer go to stderr at the end."""
    from aclpipe.early_exit.predict import predict_file

    predict_file(model, input, output, policy=policy, threshold=threshold, engine=engine,
                 fmt=input_format, batch_size=batch_size, max_length=max_length,
                 threads=threads, precision=precision, console=err_console)  # fmt: skip


app.command()(serve)  # its options in aclpipe.cli_serve


CompareOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--method",
        "-m",
        help=names_help(
            "Method to compare", "Default: every method with results under reports/<task>/."
        ),
    ),
]  # written out, as MethodOpt, so that a type checker reads it as a type


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
    from aclpipe.stages.tradeoff import tradeoff as run_tradeoff

    p = load(params, set)
    chosen = parse_list((method or []) + (methods or []), "--method")
    for t in task_list(task, p):
        run_tradeoff(t.name, LAYOUT.reports(), chosen, console=console, full=full)



app.add_typer(study_app)  # angles, sts-eval: the studies' commands
app.add_typer(campaign_app, name="campaign")
app.add_typer(sts_app, name="sts")
app.add_typer(params_app, name="params")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
