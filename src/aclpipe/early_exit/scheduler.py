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

The model is reached through ``PredictorAdapter`` alone, predict's ``Predictor`` behind one
method, so the scheduler answers exactly as ``aclpipe predict`` does and is re-pointed in one
place when the engines change.
"""

from __future__ import annotations

import collections
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

Pair = tuple[str, "str | None"]  # (text, second text or None)


class PredictorAdapter:
    """The scheduler's one view of the model: a batch of records in, ``predict``'s output
    records out (same order), through ``Predictor.records`` (tokenize, sort by length, pad,
    run the engine, format)."""

    def __init__(self, predictor) -> None:  # aclpipe.early_exit.predict.Predictor
        self.predictor = predictor
        self.exits: list[int] = list(predictor.exits)

    def answer(self, pairs: list[Pair]) -> list[dict]:
        # predict's JSONL records: exact for any text (tabs, newlines), as predict echoes them
        lines = [
            json.dumps({"text": a} if b is None else {"text_a": a, "text_b": b}) for a, b in pairs
        ]
        rows = list(self.predictor.records(lines, "jsonl"))
        self.predictor.layers.clear()  # predict's running tally: a server would grow it forever
        return rows


@dataclass
class Job:
    pairs: list[Pair]
    arrived: float = field(default_factory=time.perf_counter)
    future: Future = field(default_factory=Future)  # list[dict], predict's records


class JobQueue:
    """What both schedulers share: admission into a bounded queue of jobs, and a close that
    drains it. A subclass sets ``max_queue``, ``on_depth``, ``_jobs``, ``_waiting``,
    ``_closing``, ``_ready`` (a Condition) and ``_worker`` (the thread that answers jobs)."""

    def submit(self, pairs: list[Pair]) -> Future | None:
        """The job's future, or None when the queue cannot take ``len(pairs)`` more records
        (or the batcher is closing)."""
        job = Job(pairs)
        with self._ready:
            if self._closing or self._waiting + len(pairs) > self.max_queue:
                return None
            self._jobs.append(job)
            self._waiting += len(pairs)
            depth = self._waiting
            self._ready.notify()
        self.on_depth(depth)
        return job.future

    def close(self, timeout: float | None = None) -> None:
        """Refuse new jobs, answer every admitted one, stop the worker."""
        with self._ready:
            self._closing = True
            self._ready.notify()
        self._worker.join(timeout)


class MicroBatcher(JobQueue):
    """Dynamic micro-batching over one worker thread (module docstring).

    ``on_batch(size)`` is called in the worker for every batch it runs, ``on_depth(n)``
    whenever the number of records waiting changes (the server's metrics)."""

    def __init__(
        self,
        answer: Callable[[list[Pair]], list[dict]],
        max_batch: int = 32,
        max_wait: float = 0.0,
        max_queue: int = 256,
        on_batch: Callable[[int], None] = lambda size: None,
        on_depth: Callable[[int], None] = lambda depth: None,
    ) -> None:
        self.answer, self.max_batch, self.max_wait = answer, max_batch, max_wait
        self.max_queue = max_queue
        self.on_batch, self.on_depth = on_batch, on_depth
        self._jobs: collections.deque[Job] = collections.deque()
        self._waiting = 0  # records admitted and not yet running (queued or being collected)
        self._closing = False
        self._ready = threading.Condition()
        self._worker = threading.Thread(target=self._run, name="aclpipe-batcher", daemon=True)
        self._worker.start()

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
            while not self._closing and sum(len(j.pairs) for j in self._jobs) < self.max_batch:
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                self._ready.wait(left)
            batch = [self._jobs.popleft()]
            size = len(batch[0].pairs)
            while self._jobs and size + len(self._jobs[0].pairs) <= self.max_batch:
                size += len(self._jobs[0].pairs)
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
            if not batch:
                continue
            pairs = [pair for job in batch for pair in job.pairs]
            try:
                rows = self.answer(pairs)
            except Exception as err:  # every job of the batch learns it; the worker lives on
                for job in batch:
                    job.future.set_exception(err)
                continue
            start = 0
            for job in batch:
                job.future.set_result(rows[start : start + len(job.pairs)])
                start += len(job.pairs)
