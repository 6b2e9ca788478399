"""``aclpipe serve``: the early-exit model behind HTTP (Starlette on uvicorn).

The same engines, precisions, policies and default setting as ``aclpipe predict``
(``early_exit.predict.Predictor`` loads them), scheduled by ``early_exit.scheduler`` (or
``early_exit.iteration``), its endpoints in ``early_exit.routes``; the HTTP API is documented
in docs/serving.md:

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

import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from aclpipe import __version__
from aclpipe.early_exit.bodies import MAX_DEPTH, Limits, tokenize
from aclpipe.early_exit.iteration import IterationScheduler, SegmentAdapter
from aclpipe.early_exit.policies import NO_EXIT
from aclpipe.early_exit.routes import Metrics, build_app
from aclpipe.early_exit.scheduler import MicroBatcher, PredictorAdapter
from aclpipe.errors import UserError

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
