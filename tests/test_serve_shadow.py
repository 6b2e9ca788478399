"""``aclpipe serve --shadow F [--recalibrate]`` in process: the app over a real batcher and a
real ``Watch``, with a three-exit engine written here (confidence policy, logits from the
ids), and ``run_watched`` on a small NumPy runtime against each row run alone.

Covered: answers identical with and without the shadow sample; an answer is sent while the
shadow work for its record is still blocked; /metrics and /info show the watch; the refusals
are one line; with --recalibrate a stream whose early answers disagree moves the threshold,
and each move is a JSON line."""

from __future__ import annotations

import asyncio
import io
import json
import math
import os
import re
import threading
import time
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from cli_helpers import invoke
from test_serve_api import Model, call, post

from aclpipe.early_exit.core import NUMPY_OPS, run_exits
from aclpipe.early_exit.iteration import IterationScheduler, SegmentAdapter
from aclpipe.early_exit.onnx_runtime import SegmentPass
from aclpipe.early_exit.policies import window_size
from aclpipe.early_exit.predict import Predictor
from aclpipe.early_exit.recalibrate import Controller
from aclpipe.early_exit.routes import Metrics, build_app
from aclpipe.early_exit.scheduler import MicroBatcher
from aclpipe.early_exit.serve import ServeSettings, make_watch
from aclpipe.early_exit.shadow import ShadowSampler, observe
from aclpipe.early_exit.watch import PUBLISH_SECONDS, Handoff, Watch, register_metrics, run_watched
from aclpipe.errors import UserError

EXITS = [1, 2, 3]
TEXTS = ["good film", "bad plot", "very good film", "not good", "film", "plot very bad",
         "not bad film", "good good", "bad", "very very good plot"]  # fmt: skip


def exit_logits(ids: list[int], flip: bool) -> list[list[float]]:
    """Logits ``[E, C]`` of one row: the full model says ``sum(ids) % 2``; exit 1 says the
    same (``flip``: the other label) at max p 0.953, exit 2 the same at 0.881, exit 3 at 0.982."""
    full = sum(ids) % 2
    first = 1 - full if flip else full
    return [[3.0 * (first == 0), 3.0 * (first == 1)],
            [2.0 * (full == 0), 2.0 * (full == 1)],
            [4.0 * (full == 0), 4.0 * (full == 1)]]  # fmt: skip


def leaves_at(logits: list[list[float]], threshold: float) -> int:
    """The confidence policy, plainly: the first exit but the last whose max p >= threshold."""
    for k, row in enumerate(logits[:-1]):
        if max(math.exp(z) for z in row) / sum(math.exp(z) for z in row) >= threshold:
            return k
    return len(logits) - 1


def output(logits: list[list[float]], k: int) -> tuple:
    row = logits[k]
    total = sum(math.exp(z) for z in row)
    return row, [math.exp(z) / total for z in row], EXITS[k]


class ExitEngine:
    """The scheduler's engine: ``answer``, ``answer_watched`` and ``set_threshold``, as
    ``PredictorAdapter`` offers them. ``gate``: the shadow runs wait for it."""

    def __init__(self, threshold: float, flip: bool = False, gate=None) -> None:
        self.threshold, self.flip, self.gate = threshold, flip, gate
        self.thresholds = [threshold]  # every threshold it served with

    def answer(self, rows: list[dict]) -> list[tuple]:
        return self.answer_watched(rows, [False] * len(rows))[0]

    def answer_watched(self, rows: list[dict], picks: list[bool]):
        outputs, handoffs = [], []
        for row, picked in zip(rows, picks):
            logits = exit_logits(row["input_ids"], self.flip)
            k = leaves_at(logits, self.threshold)
            outputs.append(output(logits, k))
            if picked:
                handoffs.append(Handoff(k, np.array(logits[: k + 1]),
                                        None if k == 2 else self._rest(logits, k)))  # fmt: skip
        return outputs, handoffs

    def _rest(self, logits, k):
        def rest():
            if self.gate is not None:
                assert self.gate.wait(10)
            return np.array(logits[k + 1 :])

        return rest

    def set_threshold(self, threshold: float) -> None:
        self.threshold = threshold
        self.thresholds.append(threshold)


def make_app(engine: ExitEngine, fraction: float, recalibrate: bool = False, **knobs):
    """The app over a batcher with a ``Watch`` (None for fraction 0), its events in ``log``."""
    settings = ServeSettings(model=Path("served"), shadow=fraction, recalibrate=recalibrate)
    metrics, log, watch = Metrics(EXITS), io.StringIO(), None
    if fraction:
        controller = Controller("confidence", engine.threshold, EXITS, 0.99,
                                adjust=recalibrate, **knobs)  # fmt: skip
        watch = Watch(engine, ShadowSampler(fraction, 1e6, 1e6), controller, recalibrate, log)
        register_metrics(metrics.registry, watch)
    batcher = MicroBatcher(engine.answer, 32, 0.0, settings.max_queue, watch=watch)
    info = {"model": "served", "setting": {"policy": "confidence", "threshold": engine.threshold}}
    app = build_app(batcher, Model(), metrics, _limits(settings), settings, {}, info, watch)
    return app, batcher, watch, log


def _limits(settings):
    from aclpipe.early_exit.bodies import Limits

    return Limits(settings.max_body, settings.max_queue)


def answers(app, texts: list[str]) -> list:
    async def run():
        return [await post(app, {"text": t}) for t in texts]  # one at a time: one per batch

    return [(status, json.loads(body)) for status, _, body in asyncio.run(run())]


@pytest.mark.parametrize("threshold", [0.5, 0.9, 0.96])
@pytest.mark.parametrize("flip", [False, True])
def test_answers_are_the_same_with_every_record_shadowed(threshold: float, flip: bool) -> None:
    """F = 1 against F = 0 (recalibration off): the same answers, each the plain reference's;
    every record observed, and the window's agreement is the plain count."""
    texts = TEXTS * 3
    got = {}
    for fraction in (0.0, 1.0):
        app, batcher, watch, _ = make_app(ExitEngine(threshold, flip), fraction)
        got[fraction] = answers(app, texts)
        batcher.close(5)
        if watch is not None:
            status = watch.status()
    assert got[0.0] == got[1.0]
    tokenizer = Model().tokenizer
    agreed = 0
    for (code, answer), text in zip(got[1.0], texts):
        logits = exit_logits(tokenizer.encode(text).ids, flip)
        k = leaves_at(logits, threshold)
        probs = output(logits, k)[1]
        assert code == 200 and answer["exit_layer"] == EXITS[k]
        assert answer["label"] == probs.index(max(probs))
        agreed += answer["label"] == logits[-1].index(max(logits[-1]))
    c = status["controller"]
    assert status["observed"] == status["drawn"] == len(texts) and status["dropped"] == 0
    assert c["window"] == len(texts) and c["agreement"] == pytest.approx(agreed / len(texts))
    assert c["threshold"] == threshold and c["moves"] == 0


def test_the_answer_is_sent_while_the_shadow_work_is_blocked() -> None:
    gate = threading.Event()
    engine = ExitEngine(0.9, gate=gate)  # every record leaves at exit 1: a handoff each
    app, batcher, watch, _ = make_app(engine, 1.0)
    try:
        (status, answer), = answers(app, ["good film"])  # fmt: skip
        assert status == 200 and answer["exit_layer"] == 1
        assert watch.observed == 0 and not gate.is_set()  # the shadow thread is still waiting
    finally:
        gate.set()
        batcher.close(5)
    assert watch.observed == 1 and watch.status()["controller"]["window"] == 1


class StuckController(Controller):
    """A controller whose ``observe`` waits for ``gate``: the shadow thread stuck inside it."""

    gate: threading.Event | None = None

    def observe(self, observation):
        assert self.gate is not None and self.gate.wait(30)
        return super().observe(observation)


def in_thread(fn, timeout: float):
    """``fn()`` in its own thread; its result, or a failure when it takes over ``timeout`` s
    (an event loop blocked on a lock cannot time itself out)."""
    box: list = []
    worker = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    worker.start()
    worker.join(timeout)
    assert box, f"no answer within {timeout} s"
    return box[0]


@pytest.mark.parametrize("threshold", [0.9, 0.99])  # every record leaves early / at the last exit
def test_answers_info_and_metrics_never_wait_for_the_shadow_work(threshold: float) -> None:
    """The shadow thread stuck inside the controller (a slow update, or a thread the kernel
    does not schedule): answers, /info and /metrics still come at once, with the counts of
    the records drawn; once it goes on, every record is observed."""
    gate = threading.Event()
    engine = ExitEngine(threshold)
    controller = StuckController("confidence", threshold, EXITS, 0.99, adjust=True)
    controller.gate = gate
    watch = Watch(engine, ShadowSampler(1.0, 1e6, 1e6), controller, True, io.StringIO())
    settings = ServeSettings(model=Path("served"), shadow=1.0, recalibrate=True)
    metrics = Metrics(EXITS)
    register_metrics(metrics.registry, watch)
    batcher = MicroBatcher(engine.answer, 32, 0.0, settings.max_queue, watch=watch)
    app = build_app(batcher, Model(), metrics, _limits(settings), settings, {},
                    {"setting": {"threshold": threshold}}, watch)  # fmt: skip

    async def calls():
        out = [await post(app, {"text": text}) for text in TEXTS]
        return out, await call(app, "GET", "/info"), await call(app, "GET", "/metrics")

    try:
        sent, (code, _, body), (metrics_code, _, _) = in_thread(lambda: asyncio.run(calls()), 10)
        assert [status for status, _, _ in sent] == [200] * len(TEXTS)
        assert code == metrics_code == 200
        shown = json.loads(body)["shadow"]
        assert shown["drawn"] == len(TEXTS) and shown["observed"] == 0
        assert shown["controller"]["window"] == 0 and shown["threshold"] == threshold
    finally:
        gate.set()
        batcher.close(10)
    shown = watch.status()
    assert shown["observed"] == len(TEXTS) == shown["controller"]["window"]


def test_the_shadow_thread_runs_at_the_priority_of_the_threads_that_answer() -> None:
    """A Python thread holds the GIL between its ONNX calls; at a lower OS priority, the kernel
    leaves it unscheduled on a busy machine while every other thread of the process (the event
    loop, the batch worker) waits for that GIL: a priority inversion that stalled a loaded
    server for a second at a time."""
    getpriority = getattr(os, "getpriority", None)
    if getpriority is None:
        pytest.skip("no per-thread priority on this OS")
    app, batcher, watch, _ = make_app(ExitEngine(0.9), 1.0)
    try:
        answers(app, TEXTS[:2])
        settle(watch)
        shadow = getpriority(os.PRIO_PROCESS, watch._thread.native_id)
        worker = getpriority(os.PRIO_PROCESS, batcher._worker.native_id)
        assert shadow == worker == getpriority(os.PRIO_PROCESS, threading.get_native_id())
    finally:
        batcher.close(5)


def test_metrics_and_info_show_the_watch() -> None:
    app, batcher, watch, _ = make_app(ExitEngine(0.9, flip=True), 1.0)
    answers(app, TEXTS)
    settle(watch)

    async def read():
        return await call(app, "GET", "/metrics"), await call(app, "GET", "/info")

    (_, _, metrics), (_, _, info) = asyncio.run(read())
    batcher.close(5)
    text = metrics.decode()
    values = dict(re.findall(r"^(aclpipe_[a-z_]+(?:\{[^}]*\})?) (\S+)$", text, re.M))
    assert float(values["aclpipe_shadow_observed_total"]) == len(TEXTS)
    for name, want in [("aclpipe_threshold", 0.9), ("aclpipe_target_agreement", 0.99),
                       ("aclpipe_shadow_fraction", 1.0), ("aclpipe_shadow_drawn_total", 10),
                       ("aclpipe_shadow_refused_total", 0), ("aclpipe_threshold_moves_total", 0),
                       ("aclpipe_window_agreement", 0.0),
                       ('aclpipe_exit_agreement{exit_layer="1"}', 0.0)]:  # fmt: skip
        assert float(values[name]) == pytest.approx(want), name
    for name in ("aclpipe_window_agreement_lower_bound", "aclpipe_shadow_share",
                 "aclpipe_shadow_seconds_total", "aclpipe_served_seconds_total"):  # fmt: skip
        assert name in values, name
    shown = json.loads(info)
    assert shown["setting"]["threshold"] == 0.9
    shadow = shown["shadow"]
    assert shadow["fraction"] == 1.0 and shadow["recalibrate"] is False
    assert shadow["drawn"] == 10 and shadow["events"] == []
    assert shadow["controller"]["policy"] == "confidence" and shadow["controller"]["target"] == 0.99


@pytest.mark.parametrize("recent", [0, 10])
def test_recalibration_moves_the_threshold_on_a_disagreeing_stream(recent: int) -> None:
    """Every early answer disagrees: once the window holds min_window observations the
    controller tightens (the window rule alone: bounded steps; with the fast rule, its first
    move goes straight to the cheapest threshold the recent sample supports), the engine
    serves the new threshold from a later batch on, and each move is one JSON line with its
    reason."""
    engine = ExitEngine(0.9, flip=True)
    app, batcher, watch, log = make_app(engine, 1.0, recalibrate=True, window=20, min_window=10,
                                        every=5, max_step=0.05, recent=recent,
                                        recent_min=recent or 1)  # fmt: skip
    rounds = []
    for _ in range(5):  # each round's shadow work done before the next round is sent
        rounds.append(answers(app, TEXTS))
        settle(watch)
    batcher.close(5)
    lines = [json.loads(line) for line in log.getvalue().splitlines()]
    assert lines and all(e["event"] == "recalibrate" and e["new"] > e["old"] for e in lines)
    assert all(e["reason"].startswith(f"tighten ({e['rule']} rule)") for e in lines)
    assert all(e["new"] - e["old"] <= 0.05 + 1e-12 for e in lines if e["rule"] == "window")
    assert (lines[0]["rule"] == "fast") == bool(recent)
    assert lines[0]["old"] == 0.9 and lines[0]["seen"] >= 10
    assert engine.thresholds == [0.9] + [e["new"] for e in lines][: len(engine.thresholds) - 1]
    assert engine.threshold > 0.953  # stricter than exit 1's confidence: it runs deeper now
    assert {a["exit_layer"] for _, a in rounds[0]} == {1}
    assert {a["exit_layer"] for _, a in rounds[-1]} == {3}
    assert watch.status()["controller"]["moves"] == len(lines)


def settle(watch: Watch, timeout: float = 10.0) -> None:
    """Wait until every drawn record is observed (the shadow thread has caught up)."""
    deadline = time.monotonic() + timeout
    while watch.observed < watch.sampler.drawn - watch.sampler.refused:
        assert time.monotonic() < deadline, "the shadow thread did not catch up"
        time.sleep(0.005)


def refusal(fn) -> str:
    with pytest.raises(UserError) as err:
        fn()
    message = str(err.value)
    assert "\n" not in message and ": " in message
    return message


def test_refusals_are_one_line() -> None:
    assert "add --shadow" in refusal(lambda: ServeSettings(Path("m"), recalibrate=True))
    assert "[0, 1]" in refusal(lambda: ServeSettings(Path("m"), shadow=1.5))
    assert "above 0" in refusal(lambda: ServeSettings(Path("m"), shadow=0.1, shadow_share=0))
    onnx = SimpleNamespace(runtime=object(), policy="confidence", threshold=0.9, exits=EXITS,
                           regression=False)  # fmt: skip
    settings = ServeSettings(Path("m"), shadow=0.1, recalibrate=True)
    for change, words in [({"runtime": None}, "onnx engine only"),
                          ({"policy": "none"}, "policy none"),
                          ({"regression": True}, "regression model")]:  # fmt: skip
        predictor = SimpleNamespace(**{**vars(onnx), **change})
        message = refusal(partial(make_watch, settings, predictor, None))
        assert words in message and message.startswith("--recalibrate")
        watching = ServeSettings(Path("m"), shadow=0.1)
        assert refusal(partial(make_watch, watching, predictor, None)).startswith("--shadow")
    assert make_watch(ServeSettings(Path("m")), onnx, None) is None


def test_the_cli_refuses_recalibrate_without_shadow_in_one_line(tmp_path: Path) -> None:
    result = invoke("serve", "--model", str(tmp_path), "--recalibrate")
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "--recalibrate learns from the shadow sample" in lines[0]


# run_watched on a NumPy runtime ---------------------------------------------------------------


class NumpyRuntime:
    """What ``run_watched`` reads of ``OnnxEarlyExit``: ``start``, ``segment`` and the policy,
    over a tiny random network (per token: tanh of a linear map; head: masked mean, linear)."""

    def __init__(self, threshold: float, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.exits, self.exit_layers = EXITS, np.array(EXITS)
        self.policy, self.threshold, self.regression, self.eps = "confidence", threshold, False, 0.1
        self.window = window_size("confidence", threshold)
        self.embedding = rng.normal(size=(20, 4)).astype(np.float32)
        self.layers = rng.normal(size=(3, 4, 4)).astype(np.float32)
        self.heads = 3 * rng.normal(size=(3, 4, 2)).astype(np.float32)

    def start(self, arrays):
        states = self.embedding[arrays["input_ids"]][None]  # [1, b, T, H]
        return SegmentPass(self, states, arrays["attention_mask"])

    def segment(self, k, states, mask):
        new = np.tanh(states @ self.layers[k])  # [S, b, T, H]
        weights = mask[..., None].astype(np.float32)  # [b, T, 1]
        pooled = (new[0] * weights).sum(1) / weights.sum(1)  # [b, H]
        return new, pooled @ self.heads[k]  # [S, b, T, H], [b, C]


def full_logits(runtime: NumpyRuntime, ids: list[int]) -> np.ndarray:
    """One row alone, unpadded, through every segment: ``[E, C]``."""
    states, mask, out = runtime.embedding[np.array([ids])][None], np.ones((1, len(ids))), []
    for k in range(len(EXITS)):
        states, logits = runtime.segment(k, states, mask)
        out.append(logits[0])
    return np.stack(out)


@pytest.mark.parametrize("threshold", [0.55, 0.8, 0.95])
@pytest.mark.parametrize("seed", range(4))
def test_run_watched_answers_as_run_exits_and_hands_over_the_rest(threshold, seed) -> None:
    rng = np.random.default_rng(seed)
    runtime = NumpyRuntime(threshold, seed)
    rows = [list(rng.integers(1, 20, size=rng.integers(2, 9))) for _ in range(7)]
    width = max(len(r) for r in rows)
    ids = np.array([r + [0] * (width - len(r)) for r in rows])  # [b, T] right-padded
    mask = np.array([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    arrays = {"input_ids": ids, "attention_mask": mask}
    picked = [j for j in range(len(rows)) if rng.random() < 0.6]
    result, handoffs = run_watched(runtime, arrays, picked)
    plain = run_exits(runtime.start(arrays), NUMPY_OPS, runtime.exit_layers, "confidence",
                      threshold, runtime.window, False, 0.1)  # fmt: skip
    assert np.array_equal(result.exit_index, plain.exit_index)
    assert np.allclose(result.logits, plain.logits, atol=1e-5)
    assert sorted(handoffs) == picked
    for j, handoff in handoffs.items():
        assert handoff.exit == int(plain.exit_index[j])
        whole = handoff.seen if handoff.rest is None else np.concatenate(
            [handoff.seen, handoff.rest()])  # fmt: skip
        assert (handoff.rest is None) == (handoff.exit == len(EXITS) - 1)
        assert np.allclose(whole, full_logits(runtime, rows[j]), atol=1e-5)


def iteration_answers(runtime: NumpyRuntime, rows: list[list[int]], watch_it: bool):
    """Each row sent as its own job to an iteration scheduler over ``runtime``; the outputs,
    and (with a watch, every row drawn) the observations its controller received."""
    predictor = SimpleNamespace(pad_id=0, threshold=runtime.threshold,
                                outputs=lambda logits, layers: Predictor.outputs(None, logits, layers))  # fmt: skip
    adapter = SegmentAdapter(predictor, runtime)
    seen, watch = [], None
    if watch_it:
        controller = Controller("confidence", runtime.threshold, EXITS, 0.99, adjust=False)
        keep = controller.observe
        controller.observe = lambda observation: seen.append(observation) or keep(observation)
        watch = Watch(adapter, ShadowSampler(1.0, 1e6, 1e6), controller, False, io.StringIO())
    scheduler = IterationScheduler(adapter, max_batch=4, watch=watch)
    jobs = [scheduler.submit([{"input_ids": r, "token_type_ids": [0] * len(r)}]) for r in rows]
    outputs = [job.future.result(10)[0] for job in jobs]
    scheduler.close(10)
    return outputs, seen


@pytest.mark.parametrize("threshold", [0.55, 0.8])
@pytest.mark.parametrize("seed", range(3))
def test_iteration_scheduler_watched_answers_the_same_and_observes_the_full_model(
    threshold: float, seed: int
) -> None:
    """--shadow 1 under the iteration scheduler: the same answers as without, and each
    record's observation is the one its logits at every exit (run alone) give."""
    rng = np.random.default_rng(seed)
    runtime = NumpyRuntime(threshold, seed)
    rows = [[int(i) for i in rng.integers(1, 20, size=rng.integers(2, 9))] for _ in range(9)]
    plain, _ = iteration_answers(runtime, rows, False)
    watched, seen = iteration_answers(runtime, rows, True)
    assert [o[2] for o in watched] == [o[2] for o in plain]
    np.testing.assert_allclose([o[0] for o in watched], [o[0] for o in plain], atol=1e-5)
    want = []
    for row, out in zip(rows, plain):
        want.append(observe(full_logits(runtime, row), EXITS.index(out[2])))
    key = lambda o: (o.exit, o.labels, tuple(round(c, 4) for c in o.confidence))  # noqa: E731
    assert sorted(map(key, seen)) == sorted(map(key, want))
    assert any(o.exit < len(EXITS) - 1 for o in want)  # some were resumed from their states


def test_a_burst_is_published_once_idle_and_the_status_counts_every_observation() -> None:
    """Forty handoffs queued behind a blocked one: the shadow thread publishes the status when
    its queue runs empty (and every PUBLISH_SECONDS while busy), not after each observation,
    and what it publishes counts all forty, as a plain count of what was handed over says."""
    gate = threading.Event()
    engine = ExitEngine(0.9, gate=gate)  # exit 1's rows wait for the gate to finish
    controller = Controller("confidence", 0.9, EXITS, 0.99, adjust=False)
    watch = Watch(engine, ShadowSampler(1.0, 1e6, 1e6), controller, False, io.StringIO())
    publish, calls = watch._publish, []
    watch._publish = lambda: calls.append(time.monotonic()) or publish()
    rows = [{"input_ids": [i]} for i in range(40)]
    outputs, handoffs = engine.answer_watched(rows, [True] * len(rows))
    assert len(handoffs) == 40 and outputs[0][2] == 1  # every row left at exit 1: all resume
    watch.hand_over(handoffs)
    time.sleep(0.1)
    began = time.monotonic()
    gate.set()
    deadline = time.monotonic() + 10
    while watch.observed < 40:
        assert time.monotonic() < deadline, "the shadow thread did not catch up"
        time.sleep(0.005)
    took = time.monotonic() - began
    time.sleep(0.05)
    assert len(calls) <= 2 + took / PUBLISH_SECONDS  # not one per observation
    status = watch.status()
    assert status["observed"] == 40 and status["controller"]["window"] == 40
    watch.drain(5)
    assert watch.status()["controller"]["window"] == 40
