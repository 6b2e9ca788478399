"""``aclpipe serve``: the early-exit model behind HTTP (Starlette on uvicorn).

The same engines, precisions, policies and default setting as ``aclpipe predict``
(``early_exit.predict.Predictor`` loads them), scheduled by ``early_exit.scheduler`` (or
``early_exit.iteration``); the HTTP API is documented in docs/serving.md:

- ``POST /predict``: predict's records, or TEI's ``{"inputs": ...}`` (``early_exit.bodies``
  reads both and checks every record before it joins a batch). A record is answered by
  predict's output record: ``label``, ``label_name``, ``probability``, ``exit_layer``,
  ``text``; a TEI body TEI's way (every label with its score).
- ``GET /info``: the model, task, labels, exits, exit setting, engine and limits.
- ``GET /healthz``: 200 while the process serves. ``GET /readyz``: 200 once the engine has run
  its warm-up batches (the port opens only after them), 503 from the moment a SIGTERM arrives.
- ``GET /metrics``: Prometheus text (prometheus-client): request latency and its parts
  (tokenization, queue, inference), exit layers, batch sizes, records waiting, errors by kind.

``--shadow F`` also runs a fraction of the early-exited records through their skipped
segments after their answers are sent, and ``--recalibrate`` moves the threshold from what
they show (``early_exit.watch``; /info's ``shadow`` section, the /metrics gauges it adds).

Every error is one line of JSON, ``{"error": "<what and the fix>", "kind": "<kind>"}``: 400
``bad_json``, ``too_deep``; 401 ``unauthorized`` (``--api-key`` set, and no ``Authorization:
Bearer <key>`` with it); 413 ``body_too_large`` (over ``max_body`` bytes) and
``too_many_records`` (a list longer than the queue); 422 ``missing_field``, ``wrong_type``,
``empty_text``, ``bad_text`` (a lone surrogate, a control character, or what the tokenizer
refuses), ``wrong_texts`` (a pair sent to a one-text model, or one text to a pair model, when
the export names its task); 503 ``overloaded`` (the bounded queue is full) with
``Retry-After``; 404/405; 500 ``engine`` (the engine failed on this request's records: only
their request gets it) and ``internal``.

Start-up is all or nothing: the model is loaded and warmed up before the socket is bound, so a
broken export folder is one line on stderr and exit code 2 with no port ever opened. SIGTERM
(or Ctrl-C) closes the listening socket, answers every admitted request, then exits 0.

Binds 127.0.0.1 unless told otherwise. With the onnx engine nothing here imports torch.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from aclpipe import __version__
from aclpipe.early_exit.bodies import MAX_DEPTH, BadRequest, Body, Limits, read_body, tokenize
from aclpipe.early_exit.iteration import IterationScheduler, SegmentAdapter
from aclpipe.early_exit.policies import NO_EXIT
from aclpipe.early_exit.scheduler import MicroBatcher, PredictorAdapter
from aclpipe.errors import UserError

RETRY_AFTER_SECONDS = 1
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015,
                   0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)  # fmt: skip
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
WARMUP_TEXT = "a warm-up sentence for the engine ."
# batch: dynamic micro-batching (scheduler.py); iteration: iteration-level (iteration.py)
SCHEDULERS = ("batch", "iteration")
# The GIL's switch interval while serving (Python's default is 5 ms). The event loop and the
# batch worker hand each request over twice; a thread that wants the GIL waits up to this long
# for the other to drop it. Measured on the tiny test model, one request at a time on a loaded
# 2-core machine: 5.75 ms a request at the default, 1.29 ms at 0.2 ms (0.5 ms in process).
SWITCH_INTERVAL = 0.0002
OPEN_ROUTES = ("/healthz", "/readyz")  # probes answer without the API key


@dataclass(frozen=True)
class ServeSettings:
    """``aclpipe serve``'s options, checked once here and handed down whole."""

    model: Path  # the folder `aclpipe export-exits` writes (or a model folder: --engine torch)
    policy: str | None = None  # exit policy; None: the export's default setting
    threshold: float | None = None  # the policy's threshold; None: the export's, or its default
    engine: str | None = None  # onnx or torch; None: onnx for an export folder
    precision: str = "fp32"  # onnx: fp32 or int8 segments
    host: str = "127.0.0.1"  # address to bind; beyond loopback, set api_key
    port: int = 8000  # 0: any free port
    max_batch: int = 32  # most records in one engine batch
    max_wait_ms: float = 0.0  # longest wait for a batch to fill, from its oldest record
    max_queue: int = 256  # records waiting before 503; also the most records in one request
    max_body: int = 65536  # bytes of one request body
    max_length: int = 128  # tokens per input after truncation
    threads: int | None = None  # intra-op threads of the engine (None: its default)
    scheduler: str = "batch"  # batch (micro-batching) or iteration (onnx only)
    api_key: str | None = None  # the Bearer token every route but the probes asks for
    shadow: float = 0.0  # share of records also run to the last exit after their answer
    shadow_share: float = 0.15  # shadow CPU seconds per served CPU second (a token bucket)
    recalibrate: bool = False  # move the threshold from the shadow sample (early_exit.watch)

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_queue < self.max_batch or self.max_wait_ms < 0 or (
            self.max_body < 64
        ):
            raise UserError(
                "--max-batch must be >= 1, --max-queue >= --max-batch, --max-wait-ms >= 0 and "
                "--max-body >= 64 bytes"
            )
        if self.threads is not None and self.threads < 1:
            raise UserError("--threads must be >= 1")
        if self.scheduler not in SCHEDULERS:
            raise UserError(
                f"unknown scheduler {self.scheduler!r}: use {' or '.join(SCHEDULERS)}"
            )
        if not 0 <= self.shadow <= 1 or self.shadow_share <= 0:
            raise UserError(
                f"--shadow {self.shadow:g} must be in [0, 1] and --shadow-share "
                f"{self.shadow_share:g} above 0: e.g. --shadow 0.05 --shadow-share 0.15"
            )
        if self.recalibrate and self.shadow == 0:
            raise UserError(
                "--recalibrate learns from the shadow sample: add --shadow F with F > 0 "
                "(e.g. --shadow 0.05)"
            )
        if self.api_key is not None and (
            len(self.api_key) < 8 or not self.api_key.isprintable() or " " in self.api_key
        ):
            raise UserError(
                "--api-key must be at least 8 printable characters without spaces: generate "
                "one, e.g. with `python -c 'import secrets; print(secrets.token_urlsafe(32))'`"
            )

    def limits(self) -> dict:
        """The limits a client meets, as /info shows them."""
        return {
            "max_batch": self.max_batch, "max_wait_ms": self.max_wait_ms,
            "max_queue": self.max_queue, "max_records": self.max_queue,
            "max_body": self.max_body, "max_length": self.max_length, "max_depth": MAX_DEPTH,
        }  # fmt: skip


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
        parts = Histogram(
            "aclpipe_request_part_seconds",
            "Seconds of each answered /predict request spent in one part: tokenization (in the "
            "event loop, before admission), queue (admitted, waiting for the engine) and "
            "inference (its batch in the engine, outputs included)",
            ["part"], buckets=LATENCY_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.tokenization, self.queue, self.inference = (
            parts.labels(part) for part in ("tokenization", "queue", "inference")
        )


class Answers:
    """The answer shapes: predict's records, and TEI's labels with scores."""

    def __init__(self, predictor) -> None:
        self.record, self.regression = predictor.record, predictor.regression
        count = predictor.num_labels
        self.names = predictor.names or [f"LABEL_{i}" for i in range(count)]

    def __call__(self, body: Body, outputs: list[tuple]):
        if body.tei:
            answers = [self.tei(output, body.raw_scores) for output in outputs]
        else:
            answers = [
                {**self.record(*output), "text": a if b is None else f"{a}\t{b}"}
                for output, (a, b) in zip(outputs, body.pairs)
            ]
        return answers[0] if body.single else answers

    def tei(self, output: tuple, raw: bool) -> list[dict]:
        logits, probs, _ = output
        if self.regression:
            return [{"score": logits[0], "label": self.names[0]}]
        scores = logits if raw else probs
        ranked = sorted(range(len(scores)), key=lambda i: -scores[i])
        return [{"score": scores[i], "label": self.names[i]} for i in ranked]


def build_app(
    batcher: MicroBatcher | IterationScheduler,
    predictor,
    metrics: Metrics,
    limits: Limits,
    settings: ServeSettings,
    describe: dict,
    info: dict,
    watch=None,
):
    """The Starlette app over a running batcher; ``describe`` is /readyz's body, ``info``
    /info's (with ``watch``, ``early_exit.watch.Watch``, its live ``shadow`` section and the
    threshold in force)."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.routing import Route

    routes = Routes(batcher, predictor, metrics, limits, settings, describe, info, watch)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        batcher.close()  # after uvicorn has drained the connections: nothing is waiting

    app = Starlette(
        routes=[
            Route("/predict", routes.predict, methods=["POST"]),
            Route("/info", routes.information, methods=["GET"]),
            Route("/healthz", routes.healthz, methods=["GET"]),
            Route("/readyz", routes.readyz, methods=["GET"]),
            Route("/metrics", routes.prometheus, methods=["GET"]),
        ],
        exception_handlers={HTTPException: routes.http_error, Exception: routes.internal_error},
        lifespan=lifespan,
    )
    app.state.serving = routes.state
    return app


class Routes:
    """The app's endpoints and error handlers over one batcher (``build_app``): every error is
    one line of JSON with its kind, counted in ``metrics.errors``."""

    def __init__(self, batcher, predictor, metrics: Metrics, limits: Limits,
                 settings: ServeSettings, describe: dict, info: dict, watch=None) -> None:  # fmt: skip
        from starlette.responses import JSONResponse, Response

        self.json, self.response = JSONResponse, Response
        self.batcher, self.metrics, self.limits = batcher, metrics, limits
        self.describe, self.info, self.watch = describe, info, watch
        self.state = {"ready": True}
        self.answers, self.tokenizer = Answers(predictor), predictor.tokenizer
        # digests compared, so neither the key's bytes nor its length show in the timing
        self.expected = (
            None if settings.api_key is None else _digest(f"Bearer {settings.api_key}")
        )

    def error(self, status: int, kind: str, message: str, headers: dict | None = None):
        self.metrics.errors.labels(kind).inc()
        return self.json({"error": message, "kind": kind}, status, headers)

    def refused(self, request):
        """401 unless the request carries the API key (compared in constant time)."""
        if self.expected is None:
            return None
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if hmac.compare_digest(_digest(f"{scheme.capitalize()} {token.strip()}"), self.expected):
            return None
        why = "no Authorization header" if not given else "a wrong or malformed key"
        return self.error(
            401, "unauthorized",
            f"{request.url.path} needs the server's API key ({why}): send the header "
            "Authorization: Bearer <key>", {"WWW-Authenticate": "Bearer"},
        )  # fmt: skip

    async def read_bytes(self, request) -> bytes:
        limit = self.limits.max_body
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise BadRequest(413, "body_too_large", _too_large(int(declared), limit))
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise BadRequest(413, "body_too_large", _too_large(len(body), limit))
        return bytes(body)

    async def predict(self, request):
        began = time.perf_counter()
        if (denied := self.refused(request)) is not None:
            return denied
        try:
            body = read_body(await self.read_bytes(request), self.limits)
            tokenizing = time.perf_counter()
            rows = tokenize(self.tokenizer, body.pairs)  # [n] token rows: checked before admission
            tokenized = time.perf_counter()
        except BadRequest as err:
            return self.error(err.status, err.kind, err.message)
        job = self.batcher.submit(rows)
        if job is None:
            return self.error(
                503, "overloaded",
                f"the queue holds its limit of {self.batcher.max_queue} records: retry after "
                f"{RETRY_AFTER_SECONDS} s", {"Retry-After": str(RETRY_AFTER_SECONDS)},
            )  # fmt: skip
        try:
            outputs = await asyncio.wrap_future(job.future)
        except Exception as err:  # noqa: BLE001 - the engine failed on this request's records
            reason = (str(err).strip().splitlines() or [""])[0][:200]
            return self.error(
                500, "engine",
                f"the engine failed on this request's records ({type(err).__name__}: "
                f"{reason}); other requests are unaffected: retry, and report it if it persists",
            )  # fmt: skip
        metrics = self.metrics
        for _, _, layer in outputs:
            metrics.exit_layer.observe(layer)
        metrics.records.inc(len(outputs))
        metrics.tokenization.observe(tokenized - tokenizing)
        metrics.queue.observe(job.started - job.arrived)
        metrics.inference.observe(job.finished - job.started)
        metrics.latency.observe(time.perf_counter() - began)
        return self.json(self.answers(body, outputs))

    async def healthz(self, request):
        return self.json({"status": "ok"})

    async def readyz(self, request):
        if not self.state["ready"]:
            return self.json({"ready": False, "reason": "draining"}, 503)
        return self.json({"ready": True, **self.describe})

    async def information(self, request):
        if (denied := self.refused(request)) is not None:
            return denied
        if self.watch is None:
            return self.json(self.info)
        shadow = self.watch.status()
        setting = {**self.info.get("setting", {}), "threshold": shadow["threshold"]}
        return self.json({**self.info, "setting": setting, "shadow": shadow})

    async def prometheus(self, request):
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        if (denied := self.refused(request)) is not None:
            return denied
        return self.response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def http_error(self, request, exc):
        kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http")
        message = f"{request.method} {request.url.path}: {exc.detail}"
        if exc.status_code in (404, 405):
            message += ": use POST /predict, GET /info, /healthz, /readyz or /metrics"
        return self.error(exc.status_code, kind, message)

    async def internal_error(self, request, exc: Exception):
        reason = (str(exc).strip().splitlines() or [""])[0][:200]
        return self.error(500, "internal", f"{type(exc).__name__}: {reason}")


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).digest()


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


def make_watch(settings: ServeSettings, predictor, engine):
    """The ``early_exit.watch.Watch`` that ``--shadow`` asks for over ``engine`` (the
    scheduler's adapter), None without it; a one-line ``UserError`` where it cannot run."""
    s = settings
    if s.shadow == 0:
        return None
    flag = "--recalibrate" if s.recalibrate else "--shadow"
    if predictor.runtime is None:
        raise UserError(
            f"{flag} runs on the onnx engine only (the shadow thread resumes a record from its "
            "segments' states): drop --engine torch and give the export folder"
        )
    if predictor.policy == NO_EXIT:
        raise UserError(
            f"{flag} watches early exits, and policy none serves every record from the last "
            "exit: pick a policy (--policy confidence, entropy or patience), or drop it"
        )
    if predictor.regression:
        raise UserError(
            f"{flag} compares an early answer's label with the full model's, and this export "
            "is a regression model (no labels): drop it"
        )
    from aclpipe.early_exit.recalibrate import Controller, target_agreement
    from aclpipe.early_exit.settings import BUDGET_POINTS
    from aclpipe.early_exit.shadow import ShadowSampler
    from aclpipe.early_exit.watch import BURST_SECONDS, Watch

    sampler = ShadowSampler(s.shadow, s.shadow_share, BURST_SECONDS)
    controller = Controller(predictor.policy, predictor.threshold, list(predictor.exits),
                            target_agreement(BUDGET_POINTS), adjust=s.recalibrate)  # fmt: skip
    return Watch(engine, sampler, controller, s.recalibrate)


def serve(settings: ServeSettings) -> None:
    """Load, warm up, bind, serve until SIGTERM or Ctrl-C, drain (module docstring)."""
    from aclpipe.early_exit.predict import Predictor, texts_read

    s = settings
    predictor = Predictor(s.model, s.policy, s.threshold, s.engine, batch_size=s.max_batch,
                          max_length=s.max_length, threads=s.threads,
                          precision=s.precision)  # fmt: skip
    if s.scheduler == "iteration" and predictor.runtime is None:
        raise UserError(
            "--scheduler iteration runs on the onnx engine only: drop --engine torch, or use "
            "--scheduler batch"
        )
    adapter = PredictorAdapter(predictor)
    segments = SegmentAdapter(predictor) if s.scheduler == "iteration" else None
    _warm_up(s, predictor, adapter, segments)
    watch = make_watch(s, predictor, adapter if segments is None else segments)
    sock = bind(s.host, s.port)
    sys.setswitchinterval(SWITCH_INTERVAL)
    metrics = Metrics(adapter.exits)
    if watch is not None:
        from aclpipe.early_exit.watch import register_metrics

        register_metrics(metrics.registry, watch)
    if segments is None:
        batcher = MicroBatcher(
            adapter.answer, s.max_batch, s.max_wait_ms / 1000, s.max_queue,
            on_batch=metrics.batch_size.observe, on_depth=metrics.queue_depth.set, watch=watch,
        )  # fmt: skip
    else:
        batcher = IterationScheduler(
            segments, s.max_batch, s.max_queue,
            on_batch=metrics.batch_size.observe, on_depth=metrics.queue_depth.set, watch=watch,
        )  # fmt: skip
    describe, info = _descriptions(s, predictor, adapter.exits, watch)
    limits = Limits(s.max_body, s.max_queue, texts_read(predictor.task), predictor.task)
    app = build_app(batcher, predictor, metrics, limits, s, describe, info, watch)
    _announce(s, predictor, sock, watch)
    _run(app, sock)


def _warm_up(s: ServeSettings, predictor, adapter, segments) -> None:
    """Run a warm-up sentence at batch 1 and at the largest batch, through the segments too
    under --scheduler iteration: first runs allocate, and a broken graph fails here."""
    warm = tokenize(predictor.tokenizer, [(WARMUP_TEXT, None)])
    for size in (1, s.max_batch):
        try:
            adapter.answer(warm * size)
            if segments is not None:
                cohort = segments.start([(None, i) for i in range(size)], warm * size)
                while cohort.owners:
                    segments.step(cohort)
        except Exception as err:  # onnxruntime's errors carry C++ detail over many lines
            reason = (str(err).strip().splitlines() or [""])[0][:200]
            raise UserError(
                f"the model in {s.model} fails on a warm-up sentence ({type(err).__name__}: "
                f"{reason}): export it again with `aclpipe export-exits`"
            ) from err


def _descriptions(s: ServeSettings, predictor, exits: list[int], watch) -> tuple[dict, dict]:
    """``(describe, info)``: /readyz's body and /info's."""
    describe = {
        "engine": predictor.engine_name, "policy": predictor.policy,
        "threshold": predictor.threshold, "setting_source": predictor.setting_source,
        "exits": exits, "max_batch": s.max_batch, "max_wait_ms": s.max_wait_ms,
        "max_queue": s.max_queue, "scheduler": s.scheduler,
    }  # fmt: skip
    info = {
        "model": str(s.model), "task": predictor.task, "labels": predictor.names,
        "num_labels": predictor.num_labels, "regression": predictor.regression,
        "exits": exits,
        "setting": {"policy": predictor.policy, "threshold": predictor.threshold,
                    "source": predictor.setting_source},
        "engine": predictor.engine_name, "precision": s.precision, "scheduler": s.scheduler,
        "threads": s.threads, "limits": s.limits(), "api_key_required": s.api_key is not None,
        "version": __version__,
    }  # fmt: skip
    if watch is not None:
        describe["shadow"], describe["recalibrate"] = s.shadow, s.recalibrate
    return describe, info


def _announce(s: ServeSettings, predictor, sock: socket.socket, watch) -> None:
    """The address and the settings on stderr; a note when the port is open beyond this
    machine without an API key."""
    setting = predictor.policy if predictor.policy == NO_EXIT else (
        f"{predictor.policy} {predictor.threshold:g}")  # fmt: skip
    bound_host, bound_port = sock.getsockname()[:2]
    print(
        f"aclpipe serve: http://{bound_host}:{bound_port} (engine {predictor.engine_name}, "
        f"policy {setting} ({predictor.setting_source}), scheduler {s.scheduler}, max batch "
        f"{s.max_batch}, max wait {s.max_wait_ms:g} ms, queue {s.max_queue} records"
        f"{', API key required' if s.api_key else ''}"
        f"{f', shadow {s.shadow:g} at share {s.shadow_share:g}' if watch else ''}"
        f"{', recalibrating' if s.recalibrate else ''}); SIGTERM or Ctrl-C drains and stops",
        file=sys.stderr,
        flush=True,
    )
    if s.api_key is None and not _loopback(bound_host):
        print(
            f"note: {bound_host} is reachable beyond this machine and no --api-key is set: "
            "anyone who reaches the port can use the model (docs/serving.md)",
            file=sys.stderr,
            flush=True,
        )


def _loopback(host: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


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
