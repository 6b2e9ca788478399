"""The studies' commands, added to the main app by ``aclpipe.cli``: ``angles`` and ``sts-eval``
here, the ``campaign`` sub-app (``aclpipe.study.campaign.cli``) and the ``sts`` sub-app
(``aclpipe.study.sts.cli``). Each command parses its options and calls one function of a
study, imported inside the command, so that other commands (``predict``) do not load them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from aclpipe.cli_options import (
    LAYOUT,
    MethodsAlias,
    ParamsOpt,
    SetOpt,
    console,
    load,
    method_list,
    names_option,
    parse_list,
    user_errors,
)
from aclpipe.data.tasks import get_task
from aclpipe.layout import PARAMS
from aclpipe.study.campaign.cli import campaign_app
from aclpipe.study.sts.cli import sts_app

__all__ = ["app", "campaign_app", "sts_app"]

app = typer.Typer()  # its commands join the main app's (add_typer without a name)
STS_REPORT = LAYOUT.sts_report()  # default of sts-eval --out

AuxMethodOpt = names_option(
    "--method",
    "-m",
    what="Method with an auxiliary objective: scl, acl, romebert or acl-cl",
    default="Default: scl and acl.",
)
PoolingOpt = names_option(
    "--pooling",
    what="Pooling to compare: cls, mean or layer-attention",
    default="Default: all three.",
)



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
    from aclpipe.study.sts.scores import run_sts_eval

    p = load(params, set)
    run_sts_eval(p.model.name, p.data, glue_dir, parse_list(pooling, "--pooling"), model_dir,
                 dev_file, test_file, p.evaluate.batch_size, out, console)  # fmt: skip
