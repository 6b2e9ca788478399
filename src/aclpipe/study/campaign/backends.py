"""Where a study's runs go: this machine's process pool or a Ray cluster, chosen in one place.

A study lists its pending runs as :class:`Job` s (a name, the folder the run writes, a
module-level function and its arguments) and hands them to :func:`follow` with a backend from
:func:`aclpipe.study.campaign.runner.make_backend`. A backend runs the jobs and reports what happens to each as
:class:`Event` s (running, and where; done, and its folder; failed, and a one-line reason);
:func:`follow` prints them with the counts a person follows (pending / running / done /
failed) and returns the finished folders and the failures. A failed run does not stop the
others. Both backends run the same function in the same working folder, so a run's folder is
the same file for file whichever ran it.

- :class:`LocalPool` (``--backend local``, the default): ``--workers`` processes on this
  machine.
- :class:`aclpipe.study.campaign.ray_backend.RayCluster` (``--backend ray``): one Ray task per run,
  asking for the study's :class:`RunResources` and retried when its worker is lost.

Lives apart from the studies' own modules for the reason ``runner`` does: how runs are
scheduled does not decide their weights, and editing it must not make DVC retrain.
"""

from __future__ import annotations

import os
import queue
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console

from aclpipe.errors import UserError

PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"
BACKENDS = ("local", "ray")


@dataclass(frozen=True)
class RunResources:
    """What one run of a study asks of a Ray cluster (``campaign.resources`` in the campaign)."""

    cpus: int = 1  # cores one run holds; also its torch threads (unless --threads)
    gpus: float = 0  # 1: a GPU of its own; a fraction shares one (0.125: eight runs to a GPU)


def parse_resources(body: Any, key: str, source: Path) -> RunResources:
    """``{cpus: 2, gpus: 1}`` (``key`` in the file ``source``) into :class:`RunResources`;
    every problem a one-line error."""
    if body is None:
        return RunResources()
    if not isinstance(body, dict) or set(body) - {"cpus", "gpus"}:
        raise UserError(
            f"{key} in {source} takes cpus (a whole number >= 1) and gpus, got {body!r}"
        )
    cpus, gpus = body.get("cpus", 1), body.get("gpus", 0)
    if not isinstance(cpus, int) or isinstance(cpus, bool) or cpus < 1:
        raise UserError(f"{key}.cpus in {source} must be a whole number >= 1, got {cpus!r}")
    ok = isinstance(gpus, int | float) and not isinstance(gpus, bool) and gpus >= 0
    if not ok or (gpus > 1 and gpus != int(gpus)):
        raise UserError(
            f"{key}.gpus in {source} must be 0, a fraction of one GPU (0.25) or a whole "
            f"number, got {gpus!r}"
        )
    return RunResources(cpus, gpus)


@dataclass(frozen=True)
class Job:
    """One run: ``fn(*args)`` writes the folder ``out`` (relative to the working folder)
    atomically and returns its path. ``fn`` is a module-level function, so that a worker
    process or a Ray node imports it by name."""

    name: str  # what the progress lines call it: "sst2 ce seed 1"
    out: str
    fn: Callable[..., str]
    args: tuple = ()


@dataclass(frozen=True)
class Event:
    job: Job
    state: str  # RUNNING, DONE or FAILED
    detail: str = ""  # where it runs; the folder it wrote; why it failed (one line)


class Backend(Protocol):
    def describe(self) -> str:
        """How the runs go, for the first line: ``2 at a time``."""

    def threads(self, requested: int | None) -> int:
        """The torch threads of one run: ``requested`` (``--threads``) or the backend's share."""

    def start(self) -> None:
        """Get ready (join the cluster, check a run fits); a one-line error if it cannot."""

    def run(self, jobs: list[Job]) -> Iterator[Event]:
        """Run every job; report each one's events as they happen, ending with DONE or FAILED
        (a run retried after its worker was lost reports RUNNING again)."""


def one_line(err: BaseException) -> str:
    """``UserError: data/sst2 is not prepared: ...``: a failure's type and first line."""
    return f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}"


def follow(backend: Backend, jobs: list[Job], console: Console) -> tuple[list[Path], list[str]]:
    """Run ``jobs`` on ``backend``, printing one line per event with the counts; returns the
    finished folders (each once, in the order they finished) and one line per failed run."""
    done: list[Path] = []
    failed: list[str] = []
    if jobs:
        backend.start()
    console.print(f"{len(jobs)} runs to do, {backend.describe()}", highlight=False)
    if not jobs:
        return done, failed
    state = {job: PENDING for job in jobs}
    for event in backend.run(jobs):
        job, was = event.job, state[event.job]
        if was in (DONE, FAILED):  # a late or repeated report: a run is recorded once
            continue
        now = event.state
        if now == RUNNING:
            again = (
                " again: its worker was lost; it resumes from its checkpoint"
                if was == RUNNING
                else ""
            )
            line = f"running {job.name} ({event.detail}){again}"
        elif now == DONE and not Path(event.detail).is_dir():
            now = FAILED
            failed.append(
                f"{job.name}: its folder {event.detail} was written where this machine does not "
                "see it: keep the project on storage every node mounts at the same path"
            )
            line = f"failed {failed[-1]}"
        elif now == DONE:
            done.append(Path(event.detail))
            line = f"done {job.name} ({len(done)}/{len(jobs)})"
        else:
            failed.append(f"{job.name}: {event.detail}")
            line = f"failed {failed[-1]}"
        state[job] = now
        counts = ", ".join(
            f"{name} {sum(s == name for s in state.values())}"
            for name in (PENDING, RUNNING, DONE, FAILED)
        )
        console.print(f"{line}; {counts}", highlight=False, markup=False)
    return done, failed


# --- this machine's processes ----------------------------------------------------------------

_started: Any = None  # in a pool's worker: the queue that hears each job's start


def _attach(started: Any) -> None:
    global _started
    _started = started


def _local_job(index: int, job: Job) -> str:
    _started.put((index, os.getpid()))
    return job.fn(*job.args)


class LocalPool:
    """``workers`` processes on this machine (spawned: CUDA cannot be forked). Ctrl-C cancels
    the runs not yet started."""

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise UserError(f"--workers {workers}: give at least 1")
        self.workers = workers

    def describe(self) -> str:
        return f"{self.workers} at a time"

    def threads(self, requested: int | None) -> int:
        return requested or max(1, (os.cpu_count() or 1) // self.workers)

    def start(self) -> None:
        pass

    def run(self, jobs: list[Job]) -> Iterator[Event]:
        import multiprocessing
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

        context = multiprocessing.get_context("spawn")
        started = context.Queue()
        pool = ProcessPoolExecutor(
            max_workers=self.workers, mp_context=context, initializer=_attach, initargs=(started,)
        )
        finished = False
        try:
            futures = {pool.submit(_local_job, i, job): job for i, job in enumerate(jobs)}
            waiting = set(futures)
            while waiting:
                ready, waiting = wait(waiting, timeout=0.5, return_when=FIRST_COMPLETED)
                yield from _drain(started, jobs)
                for future in ready:
                    try:
                        yield Event(futures[future], DONE, future.result())
                    except Exception as err:  # one failed run does not stop the others
                        yield Event(futures[future], FAILED, one_line(err))
            finished = True
        finally:  # Ctrl-C, or the caller stopped listening: the queued runs never start
            pool.shutdown(wait=finished, cancel_futures=not finished)


def _drain(started: Any, jobs: list[Job]) -> Iterator[Event]:
    while True:
        try:
            index, pid = started.get_nowait()
        except queue.Empty:
            return
        yield Event(jobs[index], RUNNING, f"pid {pid}")
