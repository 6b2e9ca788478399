"""Iteration-level scheduling for ``aclpipe serve --scheduler iteration`` (the onnx engine).

As LLM servers schedule tokens, this schedules segments: the running set is a list of
cohorts, each a batch of records at the same depth (the next segment to run). One iteration
starts a new cohort from the requests waiting (up to ``max_batch`` records running in all),
then runs one segment for every cohort, oldest first. After each segment the exit policy
decides per record (``core.decide``, as both engines do); a record that leaves is answered
at once, its job's answer sent as soon as its last record is done, and it frees its place for
the requests waiting, which join at the next iteration. So an easy record answers after its
first segments, whatever the rest of the traffic, and a request waits at most one iteration to
start. Cohorts at different depths run different segments, so they cannot share an engine
call: an iteration makes one call per live depth.

The engine is reached through ``SegmentAdapter`` alone: the ONNX runtime's public steps
(``OnnxEarlyExit.start`` embeds a padded batch into a ``SegmentPass``, whose ``logits(k)`` runs
segment ``k``), the early-exit core's per-exit steps (``core.decide`` who leaves,
``core.keep_running`` for the rest, trimmed), the same ones ``core.run_exits`` takes, and
predict's ``Predictor`` for the outputs (``Predictor.outputs``), so the answers are predict's.
Jobs arrive tokenized (``scheduler``'s module docstring), and the runtime is the predictor's
own (``Predictor.runtime``): the server loads each graph once.

With a watch (``serve --shadow``, ``early_exit.watch``) records are drawn as they join; a
drawn row keeps its logits at every exit, and when it leaves early its states become a
handoff, given to the watch after the iteration's answers are delivered. A threshold the
controller moved is swapped in between iterations, so a record already running meets it at
its remaining exits.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from aclpipe.early_exit.core import decide, keep_running
from aclpipe.early_exit.onnx_runtime import SegmentPass
from aclpipe.early_exit.scheduler import Job, JobQueue
from aclpipe.early_exit.tokens import pad


@dataclass
class Cohort:
    run: SegmentPass  # the rows still running: states [S, b, T, H], mask [b, T]
    seen: list  # per row: its policy window (the logits of its newest exits)
    owners: list  # per row: (job, index of the record in the job)
    depth: int = 0  # the next segment to run
    history: list | None = None  # per row: None, or (drawn for the shadow sample, serve
    # --shadow) its logits at every exit so far
    handoffs: list = field(default_factory=list)  # watch.Handoff of drawn rows that left


class SegmentAdapter:
    """One segment at a time over ``runtime`` (an ``OnnxEarlyExit``; default: the
    predictor's) with ``predictor``'s padding and outputs."""

    def __init__(self, predictor, runtime=None) -> None:
        self.predictor = predictor
        self.runtime = runtime if runtime is not None else predictor.runtime
        self.exits: list[int] = list(self.runtime.exits)

    def start(self, owners: list, rows: list[dict], picks: list[bool] | None = None) -> Cohort:
        """A cohort of token rows (``tokens.encode``), embedded; ``picks``: the rows drawn for
        the shadow sample (``serve --shadow``)."""
        arrays = pad(rows, self.predictor.pad_id)  # [b, T]
        history: list[list | None] | None = None if picks is None or not any(picks) else [[] if p else None for p in picks]
        return Cohort(self.runtime.start(arrays), [[] for _ in rows], owners, history=history)

    def set_threshold(self, threshold: float) -> None:
        """Serve on under ``threshold`` (``serve --recalibrate``, between iterations)."""
        self.runtime.set_threshold(threshold)
        self.predictor.threshold = threshold

    def step(self, cohort: Cohort) -> list[tuple[tuple, tuple]]:
        """Run the cohort's next segment; ``(owner, output)`` for every row that leaves (its
        ``Predictor.outputs``; the cohort keeps the others, its padding trimmed as
        ``core.run_exits`` trims it)."""
        rt, k = self.runtime, cohort.depth
        logits = cohort.run.logits(k)  # [b, C]
        cohort.seen, leave = decide(k, len(self.exits) - 1, logits, cohort.seen, rt.policy,
                                    rt.threshold, rt.window, rt.regression, rt.eps)  # fmt: skip
        cohort.depth = k + 1
        if cohort.history is not None:  # drawn rows keep every exit; those leaving hand over
            from aclpipe.early_exit.watch import handoff

            for row, seen in enumerate(cohort.history):
                if seen is None:
                    continue
                seen.append(np.array(logits[row], dtype=np.float32))
                if leave[row]:
                    cohort.handoffs.append(handoff(rt, k, seen, cohort.run, row))
        if not any(leave):
            return []
        gone = np.array(leave)  # [b]
        leaving = [o for o, out in zip(cohort.owners, leave) if out]
        outputs = self.predictor.outputs(logits[gone], [self.exits[k]] * len(leaving))
        cohort.owners = [o for o, out in zip(cohort.owners, leave) if not out]
        cohort.seen = [w for w, out in zip(cohort.seen, leave) if not out]
        if cohort.history is not None:
            cohort.history = [h for h, out in zip(cohort.history, leave) if not out]
        if cohort.owners:
            keep_running(cohort.run, ~gone)
        return list(zip(leaving, outputs))


class IterationScheduler(JobQueue):
    """``submit``/``close`` as ``scheduler.MicroBatcher``; a worker thread runs iterations
    (module docstring). ``max_batch`` bounds the records running at once, ``max_queue`` those
    waiting; ``on_batch`` sees the records running in each iteration."""

    def __init__(
        self,
        adapter: SegmentAdapter,
        max_batch: int = 32,
        max_queue: int = 256,
        on_batch: Callable[[int], None] = lambda size: None,
        on_depth: Callable[[int], None] = lambda depth: None,
        watch=None,
    ) -> None:
        self.adapter, self.max_batch, self.max_queue = adapter, max_batch, max_queue
        self.watch = watch  # early_exit.watch.Watch over ``adapter`` (serve --shadow)
        self.on_batch, self.on_depth = on_batch, on_depth
        self._jobs: collections.deque[Job] = collections.deque()
        self._waiting = 0
        self._closing = False
        self._ready = threading.Condition()
        self._answers: dict[int, list] = {}  # id(job) -> [records so far, records left]
        self._worker = threading.Thread(target=self._run, name="aclpipe-iterations", daemon=True)
        self._worker.start()

    def _admit(self, running: int) -> list[Job] | None:
        """Jobs that join now: whole jobs while the running records stay within max_batch (a
        job longer than that joins alone when nothing runs); None once closed and idle."""
        with self._ready:
            while not self._jobs and not running:
                if self._closing:
                    return None
                self._ready.wait()
            joined, size = [], running
            while self._jobs and (size + len(self._jobs[0].items) <= self.max_batch or size == 0):
                size += len(self._jobs[0].items)
                joined.append(self._jobs.popleft())
            self._waiting -= size - running
            depth = self._waiting
        if joined:
            self.on_depth(depth)
        started = time.perf_counter()
        for job in joined:
            job.started = started
        return [job for job in joined if job.future.set_running_or_notify_cancel()]

    def _run(self) -> None:
        cohorts: list[Cohort] = []
        watch = self.watch
        while True:
            running = sum(len(c.owners) for c in cohorts)
            joined = self._admit(running)
            if joined is None:
                return  # closed, and nothing left
            began = time.thread_time()  # the shadow share is of CPU seconds (watch)
            if watch is not None:
                watch.retune()  # a threshold the controller moved: between iterations
            if joined:
                owners = [(job, i) for job in joined for i in range(len(job.items))]
                for job in joined:
                    self._answers[id(job)] = [[None] * len(job.items), len(job.items)]
                picks = None if watch is None else watch.pick(len(owners))
                try:
                    rows = [r for j in joined for r in j.items]
                    cohorts.append(self.adapter.start(owners, rows, picks))
                except Exception as err:  # these jobs learn it; the worker lives on
                    self._fail(joined, err)
            self.on_batch(sum(len(c.owners) for c in cohorts))
            for cohort in cohorts:
                try:
                    finished = self.adapter.step(cohort)
                except Exception as err:
                    self._fail({id(job): job for job, _ in cohort.owners}.values(), err)
                    cohort.owners, cohort.handoffs = [], []
                    continue
                for (job, index), output in finished:
                    self._deliver(job, index, output)
                if cohort.handoffs:  # only now: their answers are on their way
                    watch.hand_over(cohort.handoffs)
                    cohort.handoffs = []
            cohorts = [c for c in cohorts if c.owners]
            if watch is not None:
                watch.served(time.thread_time() - began)

    def close(self, timeout: float | None = None) -> None:
        """``JobQueue.close``, then the shadow work already queued (``watch``)."""
        super().close(timeout)
        if self.watch is not None:
            self.watch.drain(timeout)

    def _deliver(self, job: Job, index: int, output: tuple) -> None:
        answer = self._answers.get(id(job))
        if answer is None:  # the job already failed
            return
        answer[0][index] = output
        answer[1] -= 1
        if answer[1] == 0:
            del self._answers[id(job)]
            job.finished = time.perf_counter()
            job.future.set_result(answer[0])

    def _fail(self, jobs, err: Exception) -> None:
        for job in jobs:
            if self._answers.pop(id(job), None) is not None:
                job.finished = time.perf_counter()
                job.future.set_exception(err)
