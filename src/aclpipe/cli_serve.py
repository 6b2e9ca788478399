"""``aclpipe serve``'s options and command (registered on the app in ``aclpipe.cli``): each
option a module-level ``Annotated`` type, so that the command reads as its list of settings."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from aclpipe.cli_options import user_errors

ModelOpt = Annotated[
    Path,
    typer.Option("--model", help="As predict's: the folder `aclpipe export-exits` writes."),
]
PolicyOpt = Annotated[
    str | None,
    typer.Option("--policy", help="As predict's: entropy, patience, confidence, or none."),
]
ThresholdOpt = Annotated[float | None, typer.Option("--threshold", help="As predict's.")]
EngineOpt = Annotated[str | None, typer.Option("--engine", help="As predict's.")]
PrecisionOpt = Annotated[str, typer.Option("--precision", help="As predict's.")]
HostOpt = Annotated[
    str, typer.Option("--host", help="Address to bind; 0.0.0.0 opens it to the network.")
]
PortOpt = Annotated[int, typer.Option("--port", help="TCP port; 0 takes a free one.")]
MaxBatchOpt = Annotated[int, typer.Option("--max-batch", help="Most records in one engine batch.")]
MaxWaitMsOpt = Annotated[
    float,
    typer.Option("--max-wait-ms", help="Longest wait for a batch to fill, from its oldest record."),
]
MaxQueueOpt = Annotated[
    int,
    typer.Option("--max-queue", help="Records waiting before requests get 503 and Retry-After."),
]
MaxBodyOpt = Annotated[
    int, typer.Option("--max-body", help="Largest request body in bytes (413 above).")
]
MaxLengthOpt = Annotated[
    int, typer.Option("--max-length", help="Tokens per input after truncation.")
]
ThreadsOpt = Annotated[
    int | None,
    typer.Option("--threads", help="Intra-op threads of the engine (default: the engine's)."),
]
SchedulerOpt = Annotated[
    str,
    typer.Option(
        "--scheduler",
        help="batch (dynamic micro-batching) or iteration (onnx: records leave at their "
        "exit, waiting requests join at the next segment).",
    ),
]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        envvar="ACLPIPE_API_KEY",
        show_envvar=True,
        help="Require Authorization: Bearer <key> on /predict, /info and /metrics (401 "
        "without it); set it whenever --host is reachable beyond this machine.",
    ),
]
ShadowOpt = Annotated[
    float,
    typer.Option(
        "--shadow",
        help="Also run this fraction of the records to the last exit, after their answer, "
        "and report each exit's agreement with the full model (/metrics, /info).",
    ),
]
ShadowShareOpt = Annotated[
    float,
    typer.Option("--shadow-share", help="Shadow CPU seconds allowed per served CPU second."),
]
RecalibrateOpt = Annotated[
    bool,
    typer.Option(
        "--recalibrate",
        help="Move the exit threshold to keep the shadow sample's agreement at the "
        "budget's target (needs --shadow); each move is a JSON line on stderr.",
    ),
]


@user_errors
def serve(
    model: ModelOpt,
    policy: PolicyOpt = None,
    threshold: ThresholdOpt = None,
    engine: EngineOpt = None,
    precision: PrecisionOpt = "fp32",
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8000,
    max_batch: MaxBatchOpt = 32,
    max_wait_ms: MaxWaitMsOpt = 0.0,
    max_queue: MaxQueueOpt = 256,
    max_body: MaxBodyOpt = 65536,
    max_length: MaxLengthOpt = 128,
    threads: ThreadsOpt = None,
    scheduler: SchedulerOpt = "batch",
    api_key: ApiKeyOpt = None,
    shadow: ShadowOpt = 0.0,
    shadow_share: ShadowShareOpt = 0.15,
    recalibrate: RecalibrateOpt = False,
) -> None:
    """Serve the model over HTTP: POST /predict (predict's records or TEI's body), /info,
    /healthz, /readyz, /metrics (Prometheus); micro-batched; SIGTERM drains and exits 0."""
    from aclpipe.early_exit.serve import ServeSettings
    from aclpipe.early_exit.serve import serve as run_server

    run_server(ServeSettings(
        model=model, policy=policy, threshold=threshold, engine=engine, precision=precision,
        host=host, port=port, max_batch=max_batch, max_wait_ms=max_wait_ms, max_queue=max_queue,
        max_body=max_body, max_length=max_length, threads=threads, scheduler=scheduler,
        api_key=api_key, shadow=shadow, shadow_share=shadow_share, recalibrate=recalibrate,
    ))  # fmt: skip
