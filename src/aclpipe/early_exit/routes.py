"""The HTTP endpoints of ``aclpipe serve`` (``early_exit.serve`` starts them): ``build_app``
puts the ``Routes`` over a running batcher into a Starlette app, counted in ``Metrics``; every
error is one line of JSON with its kind (listed in ``early_exit.serve`` and docs/serving.md)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import time
from typing import TYPE_CHECKING

from aclpipe.early_exit.bodies import BadRequest, Body, Limits, read_body, tokenize

if TYPE_CHECKING:
    from aclpipe.early_exit.iteration import IterationScheduler
    from aclpipe.early_exit.scheduler import MicroBatcher

RETRY_AFTER_SECONDS = 1
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015,
                   0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)  # fmt: skip
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


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
        answers: list  # TEI's label lists, or predict's records
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
    settings,
    describe: dict,
    info: dict,
    watch=None,
):
    """The Starlette app over a running batcher (``settings``: ``early_exit.serve.ServeSettings``,
    of which the routes read the API key); ``describe`` is /readyz's body, ``info``
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
                 settings, describe: dict, info: dict, watch=None) -> None:  # fmt: skip
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
