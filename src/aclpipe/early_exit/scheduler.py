"""How ``aclpipe serve`` turns requests into model batches: dynamic micro-batching.

One worker thread owns the model. Requests (each one record, a text or a pair, or a list of
them) wait in one bounded FIFO; the worker takes the oldest and keeps collecting until the
batch holds ``max_batch`` records or ``max_wait`` seconds have passed since that oldest one
arrived, whichever comes first, then answers the batch in one engine call (a request is never
split: a list longer than ``max_batch`` runs alone, cut into batches by ``predict``). While the
worker runs a batch, new requests queue, so under load batches fill by themselves and at a
light load a request waits at most ``max_wait``. ``aclpipe serve`` waits 0 ms by default:
batches form only from what queued while the worker was busy. On the CPU waiting did not pay
(tiny test model, open-loop load at 20, 160 and 453 requests/s, two runs each: p50 14.9/13.5,
31.2/14.0 and 1232/1167 ms at 0 ms against 20.9/22.0, 38.0/107.9 and 2521/3754 ms at 2 ms,
and a lower saturation throughput, 238-250 against 156-190 answers/s): batching gains 1.3-1.4x
in throughput there (docs/benchmarks.md, Inference), while a wait is paid in full by
every request of a light load.

The worker is a thread, not the event loop itself: a variant that ran batches inside the loop
(no hand-over between threads; commit 6f297d9) measured worse on the same load, p50 17.0/12.2
ms at 20 requests/s and 26.0/37.2 ms at 160 against the thread's 13.1/10.2 and 15.3/13.3 ms,
since the loop reads no request while a batch runs.

Admission is bounded: ``submit`` refuses a request (returns None; the server answers 503 with
Retry-After) when the records admitted but not yet running would exceed ``max_queue``. So the
queue, the memory it holds and the time a request can wait are bounded however many requests
arrive. ``close`` stops admission and lets the worker answer everything admitted before it
ends (the drain a SIGTERM asks for).

Inside a batch each record still leaves at its own exit: the engines drop finished samples
from the batch after every exit (``early_exit.onnx_runtime``, ``early_exit.runtime``), so no
layer runs for them; they wait for the batch's deepest record only in wall-clock time.

A job carries what the engine reads: the server tokenizes a request's records before it
submits them (``bodies.tokenize``, which refuses a record the tokenizer cannot take with its
request alone), so a job holds token rows and the worker only pads, runs and computes the
outputs; nothing is serialized between the two. When the engine fails on a batch of several
jobs, each job is run again alone: a job that fails alone gets the error, the others their
answers, so one poisonous record costs its own request only.

The model is reached through ``PredictorAdapter`` alone, predict's ``Predictor`` behind one
method (``Predictor.run_rows``, the path ``aclpipe predict`` takes after tokenizing), so the
scheduler answers exactly as ``aclpipe predict`` does and is re-pointed in one place when the
engines change.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

# One engine call's fixed cost in padded tokens' worth of compute: what splitting a batch
# into groups of similar length must save to pay for one more call (``length_groups``).
# Measured on MiniLM-L6's int8 segments, one thread, the full model, batches of 1-16 rows of
# 8-64 tokens, a least-squares line: 3.9 ms a call plus 0.30 ms a padded token on a loaded
# 2-core machine, so a call costs about 13 tokens.
CALL_TOKENS = 13


def length_groups(lengths: list[int], call_tokens: float = CALL_TOKENS) -> list[list[int]]:
    """Indices of ``lengths`` cut into groups of similar length, each one engine call: the
    split that minimises the padded tokens run plus ``call_tokens`` per call (a row costs its
    group's longest length; groups are runs of the sorted order, found exactly by dynamic
    programming over the cut points).

    Requests arrive in no order of length: a batch of 32 random SST-2 dev sentences, padded
    to its longest, runs 1.93x the tokens it holds, where ``predict``, which sorts 2,048
    sentences before it cuts batches, runs 1.04x."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    ranked = [lengths[i] for i in order]
    best, cut = [0.0] * (len(ranked) + 1), [0] * (len(ranked) + 1)
    for end in range(1, len(ranked) + 1):  # best[end]: cheapest split of ranked[:end]
        best[end], cut[end] = min(
            (best[start] + call_tokens + (end - start) * ranked[end - 1], start)
            for start in range(end)
        )
    groups, end = [], len(ranked)
    while end:
        groups.append(order[cut[end] : end])
        end = cut[end]
    return groups[::-1]


class PredictorAdapter:
    """The scheduler's one view of the model: a batch of token rows in, ``Predictor.outputs``
    out (``(logits, probabilities, exit layer)`` per row, same order), one engine call per
    ``length_groups`` group."""

    def __init__(self, predictor) -> None:  # aclpipe.early_exit.predict.Predictor
        self.predictor = predictor
        self.exits: list[int] = list(predictor.exits)

    def answer(self, rows: list[dict]) -> list[tuple]:
        out: list = [None] * len(rows)
        for group in length_groups([len(row["input_ids"]) for row in rows]):
            for i, output in zip(group, self.predictor.run_rows([rows[i] for i in group])):
                out[i] = output
        return out

    def answer_watched(self, rows: list[dict], picks: list[bool]) -> tuple[list, list]:
        """``answer``'s outputs, and a ``watch.Handoff`` per picked row, in row order (the
        onnx engine; ``serve --shadow``). A group with no picked row runs as ``answer`` does."""
        from aclpipe.early_exit.tokens import pad
        from aclpipe.early_exit.watch import run_watched

        out: list = [None] * len(rows)
        handoffs = {}  # row -> its Handoff
        p = self.predictor
        for group in length_groups([len(row["input_ids"]) for row in rows]):
            picked = [j for j, i in enumerate(group) if picks[i]]
            if not picked:
                outputs = p.run_rows([rows[i] for i in group])
            else:
                arrays = pad([rows[i] for i in group], p.pad_id)  # [b, T] each
                result, found = run_watched(p.runtime, arrays, picked)
                outputs = p.outputs(result.logits, result.exit_layer.tolist())
                handoffs.update((group[j], found[j]) for j in picked)
            for i, output in zip(group, outputs):
                out[i] = output
        return out, [handoffs[i] for i in sorted(handoffs)]

    def set_threshold(self, threshold: float) -> None:
        """Serve on under ``threshold`` (``serve --recalibrate``, between batches)."""
        self.predictor.runtime.set_threshold(threshold)
        self.predictor.threshold = threshold


@dataclass
class Job:
    items: list  # what the engine reads, one per record (the server: token rows)
    arrived: float = field(default_factory=time.perf_counter)
    future: Future = field(default_factory=Future)  # one answer per item, in order
    started: float = 0.0  # when the worker took it into a batch
    finished: float = 0.0  # when its answers (or its error) were set


class JobQueue:
    """What both schedulers share: admission into a bounded queue of jobs, and a close that
    drains it. A subclass sets ``max_queue``, ``on_depth``, ``_jobs``, ``_waiting``,
    ``_closing``, ``_ready`` (a Condition) and ``_worker`` (the thread that answers jobs)."""

    def submit(self, items: list) -> Job | None:
        """The admitted job (its ``future`` gets the answers), or None when the queue cannot
        take ``len(items)`` more records (or the batcher is closing)."""
        job = Job(items)
        with self._ready:
            if self._closing or self._waiting + len(items) > self.max_queue:
                return None
            self._jobs.append(job)
            self._waiting += len(items)
            depth = self._waiting
            self._ready.notify()
        self.on_depth(depth)
        return job

    def close(self, timeout: float | None = None) -> None:
        """Refuse new jobs, answer every admitted one, stop the worker."""
        with self._ready:
            self._closing = True
            self._ready.notify()
        self._worker.join(timeout)


class MicroBatcher(JobQueue):
    """Dynamic micro-batching over one worker thread (module docstring).

    ``on_batch(size)`` is called in the worker for every batch it runs, ``on_depth(n)``
    whenever the number of records waiting changes (the server's metrics). With ``watch``
    (``early_exit.watch.Watch``, ``serve --shadow``) each batch's records are drawn as it is
    taken, the batch runs through ``watch.engine.answer_watched``, its answers are sent, and
    only then are the picked rows handed over; the threshold swaps between batches."""

    def __init__(
        self,
        answer: Callable[[list], list],
        max_batch: int = 32,
        max_wait: float = 0.0,
        max_queue: int = 256,
        on_batch: Callable[[int], None] = lambda size: None,
        on_depth: Callable[[int], None] = lambda depth: None,
        watch=None,
    ) -> None:
        self.answer, self.max_batch, self.max_wait = answer, max_batch, max_wait
        self.watch = watch
        self.max_queue = max_queue
        self.on_batch, self.on_depth = on_batch, on_depth
        self._jobs: collections.deque[Job] = collections.deque()
        self._waiting = 0  # records admitted and not yet running (queued or being collected)
        self._closing = False
        self._ready = threading.Condition()
        self._worker = threading.Thread(target=self._run, name="aclpipe-batcher", daemon=True)
        self._worker.start()

    def close(self, timeout: float | None = None) -> None:
        """``JobQueue.close``, then the shadow work already queued (``watch``)."""
        super().close(timeout)
        if self.watch is not None:
            self.watch.drain(timeout)

    def _take(self) -> list[Job] | None:
        """The next batch: the oldest job, then whole jobs while they fit in ``max_batch``,
        waiting for more until ``max_wait`` after the oldest arrived; None once closed and
        empty."""
        with self._ready:
            while not self._jobs:
                if self._closing:
                    return None
                self._ready.wait()
            deadline = self._jobs[0].arrived + self.max_wait
            while not self._closing and sum(len(j.items) for j in self._jobs) < self.max_batch:
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                self._ready.wait(left)
            batch = [self._jobs.popleft()]
            size = len(batch[0].items)
            while self._jobs and size + len(self._jobs[0].items) <= self.max_batch:
                size += len(self._jobs[0].items)
                batch.append(self._jobs.popleft())
            self._waiting -= size
            depth = self._waiting
        self.on_depth(depth)
        self.on_batch(size)
        return batch

    def _run(self) -> None:
        while (batch := self._take()) is not None:
            # a job whose waiter went away (its asyncio wrapper cancelled) is cancelled too:
            # skip it, and never set a result on it (that raises and would end the worker)
            batch = [job for job in batch if job.future.set_running_or_notify_cancel()]
            started = time.perf_counter()
            for job in batch:
                job.started = started
            if not batch:
                continue
            if self.watch is None:
                self._answer(batch)
                continue
            self.watch.retune()  # a threshold the controller moved: before this batch
            picks = self.watch.pick(sum(len(job.items) for job in batch))
            cpu = time.thread_time()  # the shadow share is of CPU seconds (watch's docstring)
            self._answer(batch, picks)
            self.watch.served(time.thread_time() - cpu)

    def _answer(self, batch: list[Job], picks: list[bool] | None = None) -> None:
        """Answer the batch in one engine call; if that fails, each job alone (module
        docstring). The worker lives on whatever the engine raises. ``picks``: the shadow
        draws of the batch's records (``watch``), handed over after the answers are sent."""
        items = [item for job in batch for item in job.items]
        try:
            if picks is None:
                answers, handoffs = self.answer(items), []
            else:
                answers, handoffs = self.watch.engine.answer_watched(items, picks)
        except Exception as err:
            if len(batch) > 1:
                start = 0
                for job in batch:
                    end = start + len(job.items)
                    self._answer([job], None if picks is None else picks[start:end])
                    start = end
                return
            batch[0].finished = time.perf_counter()
            batch[0].future.set_exception(err)
            return
        start, finished = 0, time.perf_counter()
        for job in batch:
            job.finished = finished
            job.future.set_result(answers[start : start + len(job.items)])
            start += len(job.items)
        if handoffs:  # only now: the answers are on their way
            self.watch.hand_over(handoffs)
