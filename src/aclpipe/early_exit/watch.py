"""``aclpipe serve --shadow F [--recalibrate]``: the server watches its exits, and retunes them.

The pure parts are ``early_exit.shadow`` (which records, how much) and
``early_exit.recalibrate`` (what the observations say); this module runs them beside the batch
scheduler (``early_exit.scheduler.MicroBatcher``; the iteration scheduler does the same per
cohort and iteration, ``early_exit.iteration``):

1. When the scheduler takes a batch, ``Watch.pick`` draws each record (``ShadowSampler.pick``,
   before its exit is known, so the sample is uniform over the traffic).
2. The batch runs with its picked rows watched (``run_watched``: ``core.run_exits`` with an
   ``on_exit`` hook): a picked row keeps its logits at every exit it passes, and when it
   leaves before the last exit, its states and mask row (``[S, 1, T, H]``, ``[1, T]``, cut to
   its own length) become a ``Handoff``.
3. The scheduler sends the batch's answers FIRST, then ``Watch.hand_over`` puts each picked
   row on a bounded queue (full: it is dropped and counted, never waited for), whether it
   left early or reached the last exit, so that a full queue drops records whatever their
   exit and the window stays uniform over the traffic.
4. A separate thread (``aclpipe-shadow``) runs a handoff's remaining segments (none for a row
   that reached the last exit), turns its logits ``[E, C]`` into an ``Observation``, gives it
   to the ``Controller``, and charges the sampler the CPU seconds it took; the scheduler
   credits ``share`` of every served batch's CPU seconds (``Watch.served``). Both are the
   calling thread's CPU time (``time.thread_time``), so waiting for a core is not charged.
   With ``--threads`` > 1 the engine's pool threads are counted on neither side.
5. With ``--recalibrate`` a controller move is one JSON line on stderr (``Event.as_dict``),
   and the scheduler swaps the engine's threshold before its next batch (``Watch.retune``),
   never during one. Without it the controller keeps its window and never moves.

**Nothing that answers waits for the shadow work.** Only the shadow thread touches the
controller; it publishes the controller's status after a move at once, and otherwise once
its queue is empty or ``PUBLISH_SECONDS`` after the last time (the status costs about three
observations' work: 150 against 55 us), and ``/info`` and ``/metrics`` read the newest one
(``Watch.status``), so the event loop never waits for a controller update. The lock the
serving threads take (``pick``, ``served``) guards the sampler's counters only. The shadow
thread runs at the process's own CPU priority: a lowered one (``nice``) is a priority
inversion in Python, because between its ONNX calls the thread holds the GIL, and a holder
that the kernel leaves unscheduled on a busy machine stalls every thread of the process, the
event loop included (a ``--shadow`` server that shared a core with a busy process stalled for
a second at a time at nice 19). The token bucket bounds what the shadow work costs.

Runs on the onnx engine (a row's states are the segments' inputs). No torch.
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from aclpipe.early_exit.core import NUMPY_OPS, EarlyExitResult, run_exits
from aclpipe.early_exit.recalibrate import Controller
from aclpipe.early_exit.shadow import ShadowSampler, observe

MAX_PENDING = 64  # handoffs waiting for the shadow thread; more are dropped, not waited for
BURST_SECONDS = 0.25  # the sampler's bucket: shadow seconds allowed before any served work
EVENTS_SHOWN = 8  # the newest controller moves /info shows
PUBLISH_SECONDS = 0.25  # the longest a busy shadow thread goes without publishing the status


@dataclass
class Handoff:
    """A picked record after its answer: what the shadow thread needs to finish it."""

    exit: int  # 0-based exit it was served from
    seen: np.ndarray  # [k + 1, C] its logits at exits 0..k
    rest: Callable[[], np.ndarray] | None  # its logits at exits k+1..E-1 [E-k-1, C]; None:
    # it reached the last exit


class Capture:
    """``run_exits``' ``on_exit`` hook for one batch: keeps the picked rows' logits at every
    exit, and a ``Handoff`` for each (``handoffs``, by position in the batch)."""

    def __init__(self, runtime, picked: list[int]) -> None:  # runtime: OnnxEarlyExit
        self.runtime = runtime
        self.seen: dict[int, list[np.ndarray]] = {i: [] for i in picked}
        self.handoffs: dict[int, Handoff] = {}

    def __call__(self, k: int, positions, logits, leaving: list[bool], run) -> None:
        for row, position in enumerate(positions):
            if position not in self.seen:
                continue
            self.seen[position].append(np.array(logits[row], dtype=np.float32))
            if not leaving[row]:
                continue
            self.handoffs[position] = handoff(self.runtime, k, self.seen.pop(position), run, row)


def handoff(runtime, k: int, seen: list[np.ndarray], run, row: int) -> Handoff:
    """The ``Handoff`` of row ``row`` of ``run`` (a ``SegmentPass`` just past segment ``k``,
    before its leavers are dropped), whose logits at exits 0..k are ``seen``: its states after
    segment ``k`` and its mask row, cut to its own tokens (batches are right-padded)."""
    rest = None
    if k < len(runtime.exits) - 1:
        length = int(run.mask[row].sum())
        states = np.ascontiguousarray(run.states[:, row : row + 1, :length])  # [S, 1, t, H]
        mask = np.ascontiguousarray(run.mask[row : row + 1, :length])  # [1, t]
        rest = _remaining(runtime, k, states, mask)
    return Handoff(k, np.stack(seen), rest)


def _remaining(runtime, k: int, states: np.ndarray, mask: np.ndarray) -> Callable:
    def rest() -> np.ndarray:
        out, current = [], states  # [S, 1, T, H]
        for j in range(k + 1, len(runtime.exits)):
            current, logits = runtime.segment(j, current, mask)
            out.append(logits[0])
        return np.stack(out)  # [E - k - 1, C]

    return rest


def run_watched(
    runtime, arrays: dict[str, np.ndarray], picked: list[int]
) -> tuple[EarlyExitResult, dict[int, Handoff]]:
    """One padded batch through ``runtime`` (an ``OnnxEarlyExit``) as ``runtime(**arrays)``
    runs it, with a ``Handoff`` for each row of ``picked`` (positions in the batch)."""
    capture = Capture(runtime, picked)
    run = runtime.start(arrays)
    result = run_exits(run, NUMPY_OPS, runtime.exit_layers, runtime.policy, runtime.threshold,
                       runtime.window, runtime.regression, runtime.eps, capture)  # fmt: skip
    return result, capture.handoffs


class Watch:
    """The shadow sample and the controller, live (module docstring). ``engine`` is what the
    scheduler answers through; its ``set_threshold(t)`` is called between batches."""

    def __init__(
        self,
        engine,
        sampler: ShadowSampler,
        controller: Controller,
        recalibrate: bool,
        log=None,  # a text stream for the events (default: stderr)
        max_pending: int = MAX_PENDING,
    ) -> None:
        self.engine, self.sampler, self.controller = engine, sampler, controller
        self.recalibrate = recalibrate
        self.log = log
        self.lock = threading.Lock()
        self.applied = controller.threshold  # the threshold the engine serves with
        self.observed = self.dropped = self.failed = 0
        self.pending: queue.Queue[Handoff | None] = queue.Queue(max_pending)
        self._published = self._publish()  # replaced whole by the shadow thread, never edited
        self._thread = threading.Thread(target=self._run, name="aclpipe-shadow", daemon=True)
        self._thread.start()

    def pick(self, count: int) -> list[bool]:
        with self.lock:
            return [self.sampler.pick() for _ in range(count)]

    def served(self, seconds: float) -> None:
        with self.lock:
            self.sampler.served(seconds)

    def retune(self) -> None:
        """Swap the engine's threshold to the controller's, if it moved (between batches)."""
        wanted = self._published["threshold"]
        if wanted != self.applied:
            self.engine.set_threshold(wanted)
            self.applied = wanted

    def hand_over(self, handoffs: list[Handoff]) -> None:
        """After the batch's answers are sent: queue the picked rows for the shadow thread
        (a full queue drops them, whatever their exit: module docstring)."""
        for handoff in handoffs:
            try:
                self.pending.put_nowait(handoff)
            except queue.Full:
                with self.lock:
                    self.dropped += 1

    def _run(self) -> None:
        published = time.monotonic()  # when the status was last published
        while (handoff := self.pending.get()) is not None:
            began = time.thread_time()  # CPU seconds: waiting for a core costs nothing
            try:
                logits = handoff.seen if handoff.rest is None else np.concatenate(
                    [handoff.seen, handoff.rest()])  # fmt: skip  # [E, C]
            except Exception:  # noqa: BLE001 - a failed shadow run costs its observation only
                with self.lock:
                    self.failed += 1
                    self.sampler.charge(time.thread_time() - began)
                continue
            event = self.controller.observe(observe(logits, handoff.exit))
            now = time.monotonic()
            # a move at once (retune reads it); else when idle, or every PUBLISH_SECONDS
            if event is not None or self.pending.empty() or now - published >= PUBLISH_SECONDS:
                self._published, published = self._publish(), now
            with self.lock:
                self.sampler.charge(time.thread_time() - began)
                self.observed += 1
            if event is not None:
                print(json.dumps({"event": "recalibrate", **event.as_dict()}),
                      file=self.log or sys.stderr, flush=True)  # fmt: skip
        self._published = self._publish()  # drained: the final status

    def _publish(self) -> dict:
        """The controller's status and newest moves, as the shadow thread leaves them."""
        c = self.controller
        return {"threshold": c.threshold, "controller": c.status(),
                "events": [e.as_dict() for e in list(c.events)[-EVENTS_SHOWN:]]}  # fmt: skip

    def drain(self, timeout: float | None = None) -> None:
        """Let the shadow thread finish what is queued, then stop it."""
        try:
            self.pending.put(None, timeout=timeout)
        except queue.Full:  # a shadow run hung past the timeout: leave the daemon thread
            return
        self._thread.join(timeout)

    def status(self) -> dict:
        """/info's ``shadow`` section: the knobs, the counts, the controller's status and its
        newest moves as the shadow thread last published them (never waits for it)."""
        published = self._published
        with self.lock:
            s = self.sampler
            return {
                "threshold": self.applied,  # served with; the controller's is next batch's
                "fraction": s.fraction, "share": s.share, "recalibrate": self.recalibrate,
                "drawn": s.drawn, "refused": s.refused, "observed": self.observed,
                "dropped": self.dropped, "failed": self.failed,
                "pending": self.pending.qsize(), "served_seconds": s.served_cost,
                "shadow_seconds": s.shadow_cost, "controller": published["controller"],
                "events": published["events"],
            }  # fmt: skip


def register_metrics(registry, watch: Watch) -> None:
    """The watch's gauges and counters in the server's Prometheus ``registry``, read from
    ``watch.status()`` at each scrape."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    class Collector:
        def collect(self):
            status = watch.status()
            c = status["controller"]
            gauges = [
                ("threshold", "The exit threshold the engine serves with", status["threshold"]),
                ("offline_threshold", "The export's threshold (the loosest served)", c["offline"]),
                ("target_agreement", "The agreement with the full model to keep", c["target"]),
                ("window_observations", "Shadow observations in the window", c["window"]),
                ("window_agreement", "The window's agreement with the full model under the "
                 "threshold in force", c["agreement"]),
                ("window_agreement_lower_bound", "Its one-sided Wilson lower bound",
                 c["lower_bound"]),
                ("shadow_fraction", "--shadow: the share of records drawn", status["fraction"]),
                ("shadow_share", "--shadow-share: shadow seconds allowed per served second",
                 status["share"]),
                ("shadow_pending", "Handoffs waiting for the shadow thread", status["pending"]),
            ]  # fmt: skip
            for name, text, value in gauges:
                if value is not None:
                    yield GaugeMetricFamily(f"aclpipe_{name}", text, value=value)
            per_exit = GaugeMetricFamily(
                "aclpipe_exit_agreement",
                "Per exit, the share of the window's records served there whose answer was the "
                "full model's", labels=["exit_layer"],
            )  # fmt: skip
            for row in c["per_exit"]:
                if row["agreement"] is not None:
                    per_exit.add_metric([str(row["exit_layer"])], row["agreement"])
            yield per_exit
            counters = [
                ("shadow_drawn", "Records drawn for the shadow sample", status["drawn"]),
                ("shadow_refused", "Drawn records refused by the shadow share", status["refused"]),
                ("shadow_observed", "Records observed at every exit", status["observed"]),
                ("shadow_dropped", "Handoffs dropped on a full shadow queue", status["dropped"]),
                ("shadow_seconds", "Seconds of shadow work", status["shadow_seconds"]),
                ("served_seconds", "Seconds of served batches", status["served_seconds"]),
                ("threshold_moves", "Threshold moves by the controller", c["moves"]),
            ]  # fmt: skip
            for name, text, value in counters:
                yield CounterMetricFamily(f"aclpipe_{name}", text, value=value)

    registry.register(Collector())
