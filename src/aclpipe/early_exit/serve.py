"""``aclpipe serve``: the early-exit model behind HTTP (Starlette on uvicorn).

The same engines, precisions, policies and default setting as ``aclpipe predict``
(``early_exit.predict.Predictor`` loads them), scheduled by ``early_exit.scheduler``:

- ``POST /predict``: one record, ``{"text": "..."}`` or ``{"text_a": "...", "text_b": "..."}``
  (predict's JSONL records), answered by one object; or a JSON list of records, answered by a
  list in the same order. Each answer is predict's output record: ``label``, ``label_name``,
  ``probability``, ``exit_layer``, ``text``.
- ``GET /healthz``: 200 while the process serves. ``GET /readyz``: 200 once the engine has run
  its warm-up batches (the port opens only after them), 503 from the moment a SIGTERM arrives.
- ``GET /metrics``: Prometheus text (prometheus-client): request latency, exit layers, batch
  sizes, records waiting, errors by kind.

Every error is one line of JSON, ``{"error": "<what and the fix>", "kind": "<kind>"}``: 400
``bad_json``; 413 ``body_too_large`` (over ``max_body`` bytes) and ``too_many_records`` (a list
longer than the queue); 422 ``missing_field``, ``wrong_type``, ``empty_text``, ``wrong_texts`` (a pair sent to a
one-text model, or one text to a pair model, when the export names its task); 503
``overloaded`` (the bounded queue is full) with ``Retry-After``; 404/405; 500 ``internal``.

Start-up is all or nothing: the model is loaded and warmed up before the socket is bound, so a
broken export folder is one line on stderr and exit code 2 with no port ever opened. SIGTERM
(or Ctrl-C) closes the listening socket, answers every admitted request, then exits 0.

Binds 127.0.0.1 unless told otherwise. With the onnx engine nothing here imports torch.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from aclpipe.early_exit.inputs import texts_mismatch
from aclpipe.early_exit.iteration import IterationScheduler, SegmentAdapter
from aclpipe.early_exit.policies import NO_EXIT
from aclpipe.early_exit.scheduler import Job, MicroBatcher, Pair, PredictorAdapter
from aclpipe.errors import UserError

RETRY_AFTER_SECONDS = 1
LATENCY_BUCKETS = (0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
                   0.1, 0.2, 0.5, 1.0, 2.0, 5.0)  # fmt: skip
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
WARMUP_TEXT = "a warm-up sentence for the engine ."
# batch: dynamic micro-batching (scheduler.py); iteration: iteration-level (iteration.py)
SCHEDULERS = ("batch", "iteration")
# The GIL's switch interval while serving (Python's default is 5 ms). The event loop and the
# batch worker hand each request over twice; a thread that wants the GIL waits up to this long
# for the other to drop it. Measured on the tiny test model, one request at a time on a loaded
# 2-core machine: 5.75 ms a request at the default, 1.29 ms at 0.2 ms (0.5 ms in process).
SWITCH_INTERVAL = 0.0002


@dataclass(frozen=True)
class Limits:
    max_body: int  # bytes of one request body
    max_records: int  # records in one request (the queue's bound: a longer list never fits)
    texts: int | None = None  # texts per record the model reads (1, 2 for pairs; None: unknown)
    task: str | None = None  # the model's task, named in the error for a record of the wrong kind


class BadRequest(Exception):
    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, " ".join(message.split())


def parse_records(
    body: bytes, max_records: int, texts: int | None = None, task: str | None = None
) -> tuple[list[Pair], bool]:
    """``(pairs, single)`` from a request body (module docstring), or ``BadRequest``; with
    ``texts`` known, a record holding another number of texts is refused (422 ``wrong_texts``)."""
    try:
        data = json.loads(body)
    except ValueError as err:  # JSONDecodeError, or bytes that are not UTF-8
        reason = getattr(err, "msg", type(err).__name__)
        raise BadRequest(
            400,
            "bad_json",
            f'body is not JSON ({reason}): send {{"text": "..."}} or a list of them',
        ) from None
    single = not isinstance(data, list)
    items = [data] if single else data
    if not items:
        raise BadRequest(422, "missing_field", "the list holds no records: send at least one")
    if len(items) > max_records:
        raise BadRequest(
            413, "too_many_records",
            f"{len(items)} records in one request, at most {max_records}: split the list",
        )  # fmt: skip
    pairs = [_pair(item, i) for i, item in enumerate(items)]
    for i, pair in enumerate(pairs):
        where = f"record {i}" if i else "the record"
        wrong = texts_mismatch(pair, texts, task, where) if texts is not None else None
        if wrong is not None:  # predict refuses the same records (inputs.check_pair)
            send = '{"text": "..."}' if texts == 1 else '{"text_a": "...", "text_b": "..."}'
            raise BadRequest(422, "wrong_texts", f"{wrong}: send {send}")
    return pairs, single


def _pair(item, index: int) -> Pair:
    where = f"record {index}" if index else "the record"
    if not isinstance(item, dict) or not ({"text", "text_a"} & item.keys()):
        raise BadRequest(
            422, "missing_field",
            f'{where} has no "text" (or "text_a"): send {{"text": "..."}} or '
            '{"text_a": "...", "text_b": "..."}',
        )  # fmt: skip
    first = "text" if "text" in item else "text_a"
    a, b = item[first], item.get("text_b") if first == "text_a" else None
    for name, value in ((first, a), ("text_b", b)):
        if value is not None and not isinstance(value, str):
            raise BadRequest(
                422, "wrong_type", f'{where}: "{name}" is a {type(value).__name__}, not a string'
            )
    if a is None or not a.strip() or (b is not None and not b.strip()):
        raise BadRequest(422, "empty_text", f"{where} has an empty text: send words to classify")
    return a, b


class Metrics:
    """The server's Prometheus instruments, in a registry of its own."""

    def __init__(self, exits: list[int]) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "aclpipe_request_seconds", "Seconds from a /predict request read to its answer",
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.exit_layer = Histogram(
            "aclpipe_exit_layer", "The layer each answered record left the model at",
            buckets=[float(e) for e in exits], registry=self.registry,
        )  # fmt: skip
        self.batch_size = Histogram(
            "aclpipe_batch_size", "Records per engine batch",
            buckets=BATCH_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.queue_depth = Gauge(
            "aclpipe_queue_depth", "Records admitted and not yet running", registry=self.registry
        )
        self.errors = Counter(
            "aclpipe_errors", "Requests answered with an error, by kind", ["kind"],
            registry=self.registry,
        )  # fmt: skip
        self.records = Counter("aclpipe_records", "Records answered", registry=self.registry)


def build_app(
    batcher: MicroBatcher | IterationScheduler, metrics: Metrics, limits: Limits, describe: dict
):
    """The Starlette app over a running batcher; ``describe`` is /readyz's body."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    state = {"ready": True}

    def error(status: int, kind: str, message: str, headers: dict | None = None) -> Response:
        metrics.errors.labels(kind).inc()
        return JSONResponse({"error": message, "kind": kind}, status, headers)

    async def read_body(request) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limits.max_body:
            raise BadRequest(413, "body_too_large", _too_large(int(declared), limits.max_body))
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limits.max_body:
                raise BadRequest(413, "body_too_large", _too_large(len(body), limits.max_body))
        return bytes(body)

    async def predict(request) -> Response:
        began = time.perf_counter()
        try:
            body = await read_body(request)
            pairs, single = parse_records(body, limits.max_records, limits.texts, limits.task)
        except BadRequest as err:
            return error(err.status, err.kind, err.message)
        future = batcher.submit(pairs)
        if future is None:
            return error(
                503, "overloaded",
                f"the queue holds its limit of {batcher.max_queue} records: retry after "
                f"{RETRY_AFTER_SECONDS} s", {"Retry-After": str(RETRY_AFTER_SECONDS)},
            )  # fmt: skip
        try:
            rows = await asyncio.wrap_future(future)
        except Exception as err:  # noqa: BLE001 - the engine failed on this batch
            return error(500, "internal", f"the engine failed: {type(err).__name__}: {err}")
        for row in rows:
            if row.get("exit_layer") is not None:
                metrics.exit_layer.observe(row["exit_layer"])
        metrics.records.inc(len(rows))
        metrics.latency.observe(time.perf_counter() - began)
        return JSONResponse(rows[0] if single else rows)

    async def healthz(request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request) -> Response:
        if not state["ready"]:
            return JSONResponse({"ready": False, "reason": "draining"}, 503)
        return JSONResponse({"ready": True, **describe})

    async def prometheus(request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def http_error(request, exc: HTTPException) -> Response:
        kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http")
        message = f"{request.method} {request.url.path}: {exc.detail}"
        if exc.status_code in (404, 405):
            message += ": use POST /predict, GET /healthz, /readyz or /metrics"
        return error(exc.status_code, kind, message)

    async def internal_error(request, exc: Exception) -> Response:
        return error(500, "internal", f"{type(exc).__name__}: {exc}")

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        batcher.close()  # after uvicorn has drained the connections: nothing is waiting

    app = Starlette(
        routes=[
            Route("/predict", predict, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            Route("/metrics", prometheus, methods=["GET"]),
        ],
        exception_handlers={HTTPException: http_error, Exception: internal_error},
        lifespan=lifespan,
    )
    app.state.serving = state
    return app


def _too_large(size: int, limit: int) -> str:
    return f"request body of {size} bytes is over the limit of {limit}: send fewer or shorter texts"


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (0: any free port), or one-line ``UserError``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
    # without it a response's header and body writes meet delayed ACKs (40 ms a request)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as err:
        sock.close()
        raise UserError(
            f"cannot listen on {host}:{port} ({err.strerror or err}): pick another --port or --host"
        ) from None
    sock.set_inheritable(True)
    return sock


def serve(
    model: Path,
    policy: str | None = None,
    threshold: float | None = None,
    engine: str | None = None,
    precision: str = "fp32",
    host: str = "127.0.0.1",
    port: int = 8000,
    max_batch: int = 32,
    max_wait_ms: float = 0.0,
    max_queue: int = 256,
    max_body: int = 65536,
    max_length: int = 128,
    threads: int | None = None,
    scheduler: str = "batch",
) -> None:
    """Load, warm up, bind, serve until SIGTERM or Ctrl-C, drain (module docstring)."""
    if max_batch < 1 or max_queue < max_batch or max_wait_ms < 0 or max_body < 64:
        raise UserError(
            "--max-batch must be >= 1, --max-queue >= --max-batch, --max-wait-ms >= 0 and "
            "--max-body >= 64 bytes"
        )
    if threads is not None and threads < 1:
        raise UserError("--threads must be >= 1")
    if scheduler not in SCHEDULERS:
        raise UserError(f"unknown scheduler {scheduler!r}: use {' or '.join(SCHEDULERS)}")
    from aclpipe.early_exit.predict import Predictor, texts_read

    predictor = Predictor(model, policy, threshold, engine, batch_size=max_batch,
                          max_length=max_length, threads=threads, precision=precision)  # fmt: skip
    adapter = PredictorAdapter(predictor)
    for size in (1, max_batch):  # warm: first runs allocate; a broken graph fails here
        try:
            adapter.answer([(WARMUP_TEXT, None)] * size)
        except Exception as err:  # onnxruntime's errors carry C++ detail over many lines
            reason = (str(err).strip().splitlines() or [""])[0][:200]
            raise UserError(
                f"the model in {model} fails on a warm-up sentence ({type(err).__name__}: "
                f"{reason}): export it again with `aclpipe export-exits`"
            ) from err
    segments = (
        _segment_adapter(model, predictor, threads, precision) if scheduler == "iteration" else None
    )
    sock = bind(host, port)
    sys.setswitchinterval(SWITCH_INTERVAL)
    metrics = Metrics(adapter.exits)
    if segments is None:
        batcher = MicroBatcher(
            adapter.answer, max_batch, max_wait_ms / 1000, max_queue,
            on_batch=metrics.batch_size.observe, on_depth=metrics.queue_depth.set,
        )  # fmt: skip
    else:
        batcher = IterationScheduler(
            segments, max_batch, max_queue,
            on_batch=metrics.batch_size.observe, on_depth=metrics.queue_depth.set,
        )  # fmt: skip
    setting = predictor.policy if predictor.policy == NO_EXIT else (
        f"{predictor.policy} {predictor.threshold:g}")  # fmt: skip
    describe = {
        "engine": predictor.engine_name, "policy": predictor.policy,
        "threshold": predictor.threshold, "setting_source": predictor.setting_source,
        "exits": adapter.exits, "max_batch": max_batch, "max_wait_ms": max_wait_ms,
        "max_queue": max_queue, "scheduler": scheduler,
    }  # fmt: skip
    limits = Limits(max_body, max_queue, texts_read(predictor.task), predictor.task)
    app = build_app(batcher, metrics, limits, describe)
    bound_host, bound_port = sock.getsockname()[:2]
    print(
        f"aclpipe serve: http://{bound_host}:{bound_port} (engine {predictor.engine_name}, "
        f"policy {setting} ({predictor.setting_source}), scheduler {scheduler}, max batch "
        f"{max_batch}, max wait {max_wait_ms:g} ms, queue {max_queue} records); SIGTERM or Ctrl-C drains and stops",
        file=sys.stderr,
        flush=True,
    )
    _run(app, sock)


def _segment_adapter(model: Path, predictor, threads: int | None, precision: str):
    """The iteration scheduler's view of the onnx engine, warmed up (one warm-up request
    through every segment)."""
    from aclpipe.early_exit.onnx_runtime import OnnxEarlyExit

    if not predictor.engine_name.startswith("onnx"):
        raise UserError(
            "--scheduler iteration runs on the onnx engine only: drop --engine torch, or use "
            "--scheduler batch"
        )
    runtime = OnnxEarlyExit(model, predictor.policy, predictor.threshold, threads=threads,
                            precision=precision)  # fmt: skip
    segments = SegmentAdapter(predictor, runtime)
    job = Job([(WARMUP_TEXT, None)])
    try:
        cohort = segments.start([(job, 0)], job.pairs)
        while cohort.owners:
            segments.step(cohort)
    except Exception as err:  # as the batch warm-up's
        reason = (str(err).strip().splitlines() or [""])[0][:200]
        raise UserError(
            f"the model in {model} fails on a warm-up sentence ({type(err).__name__}: "
            f"{reason}): export it again with `aclpipe export-exits`"
        ) from err
    return segments


def _run(app, sock: socket.socket) -> None:
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            # uvicorn re-raises a captured signal once it has shut down, which would end a
            # drained server with -SIGTERM; not capturing it lets a drain exit 0
            app.state.serving["ready"] = False
            if self.should_exit and sig == 2:  # a second Ctrl-C: stop waiting
                self.force_exit = True
            self.should_exit = True

    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                            timeout_keep_alive=5)  # fmt: skip
    Server(config).run(sockets=[sock])
