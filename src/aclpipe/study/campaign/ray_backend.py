"""A study's runs on a Ray cluster: ``run-pending --backend ray [--address auto|host:port|
ray://host:port]``.

Each pending run is one Ray task asking for the study's :class:`RunResources` (CPUs, and a GPU
or a share of one); Ray places it on a node with room. A task whose worker process or node is
lost is retried (``max_retries``); the retry finds the run's checkpoint beside its scratch
model (``campaign/models/<task>/.<run>-s<seed>.checkpoint``, written every
``train.save_every`` steps) and resumes from it, bit for bit as a cut-off local run does.

Workers write where the study keeps its runs, on storage every node mounts at the same path
(docs/scaling.md): the retry on another node needs the checkpoint the lost worker
left, every run reads the prepared data, and the run folder lands by the same atomic rename as
a local run's (``aclpipe.atomic``), so it is whole or absent. The driver checks that it sees
each finished folder. A retry that finds the folder already there (its worker was lost after
the rename) returns it without training again.

Without ``--address`` the driver joins the Ray instance already running on this machine, or
starts one with this machine's cores; ``--address`` joins a cluster's head (``auto``: the one
named by ``RAY_ADDRESS`` or started here with ``ray start``).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aclpipe.errors import UserError
from aclpipe.study.campaign.backends import (
    DONE,
    FAILED,
    RUNNING,
    Event,
    Job,
    RunResources,
    one_line,
)

MAX_RETRIES = 3  # a run survives three lost workers (a node drained, a process killed)
INSTALL = "pip install 'aclpipe[cluster]'"


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UserError(f"--backend ray needs Ray, which is not installed: {INSTALL}") from None
    return ray


def check_address(address: str | None, timeout: float = 5.0) -> None:
    """A one-line error for an address nothing answers at (Ray itself retries for minutes)."""
    if address is None or address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"--address {address!r}: give auto, host:port or ray://host:port")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise UserError(
            f"--address {address}: nothing answers there ({reason}); start a head with "
            "`ray start --head` (it prints the address) or fix the address"
        ) from None


class _Board:
    """An actor that hears when each task starts (and starts again after a lost worker)."""

    def __init__(self) -> None:
        self.started: list[tuple[int, str]] = []

    def start(self, index: int, where: str) -> None:
        self.started.append((index, where))

    def take(self) -> list[tuple[int, str]]:
        out, self.started = self.started, []
        return out


def _ray_job(cwd: str, board: Any, index: int, job: Job) -> str:
    """One run in a Ray worker, in the driver's working folder (the same path on every node)."""
    import ray

    node = ray.util.get_node_ip_address()
    if not Path(cwd).is_dir():
        raise UserError(
            f"{cwd} is not on node {node}: keep the project on storage every node mounts at "
            "the same path"
        )
    os.chdir(cwd)
    ray.get(board.start.remote(index, f"node {node}, pid {os.getpid()}"))
    if Path(job.out).is_dir():  # written by an attempt whose worker was lost after the rename
        return job.out
    return job.fn(*job.args)


class RayCluster:
    """One Ray task per run, asking for ``resources``, retried ``max_retries`` times when its
    worker is lost. Ctrl-C cancels the tasks not finished."""

    def __init__(
        self, address: str | None, resources: RunResources, max_retries: int = MAX_RETRIES
    ) -> None:
        self.ray = import_ray()
        check_address(address)
        self.address, self.resources, self.max_retries = address, resources, max_retries
        self.joined = False  # whether start() joined (or started) the cluster, so run() leaves it

    def describe(self) -> str:
        ask = f"{self.resources.cpus} CPU" + ("s" if self.resources.cpus > 1 else "")
        if self.resources.gpus:
            ask += f" and {self.resources.gpus:g} GPU"
        where = self.address or "this machine"
        return f"as Ray tasks on {where}, each asking {ask}, retried {self.max_retries} times"

    def threads(self, requested: int | None) -> int:
        return requested or self.resources.cpus

    def start(self) -> None:
        """Join (or start) the cluster and check that some node can hold a run."""
        ray = self.ray
        if ray.is_initialized():  # a caller (a test, a notebook) already joined one
            self._check_fits()
            return
        quiet: dict[str, Any] = {"logging_level": logging.ERROR, "log_to_driver": False}
        if self.address is None:
            quiet["include_dashboard"] = False
        try:
            ray.init(address=self.address, **quiet)
        except (ConnectionError, ValueError) as err:
            first = (str(err).splitlines() or [""])[0]
            raise UserError(f"--address {self.address}: {first}") from None
        self.joined = True
        try:
            self._check_fits()
        except UserError:
            ray.shutdown()
            self.joined = False
            raise

    def _check_fits(self) -> None:
        """A one-line error when no node could ever take a run (Ray would wait forever)."""
        want = {"CPU": self.resources.cpus, "GPU": self.resources.gpus}
        nodes = [n["Resources"] for n in self.ray.nodes() if n.get("Alive")]
        if any(all(res.get(k, 0) >= v for k, v in want.items() if v) for res in nodes):
            return
        biggest = max(nodes, key=lambda r: (r.get("GPU", 0), r.get("CPU", 0)), default={})
        raise UserError(
            f"each run asks {want['CPU']} CPUs and {want['GPU']:g} GPUs, more than any node of "
            f"the cluster has (the largest: {biggest.get('CPU', 0):g} CPUs, "
            f"{biggest.get('GPU', 0):g} GPUs): lower campaign.resources or add such nodes"
        )

    def run(self, jobs: list[Job]) -> Iterator[Event]:
        ray = self.ray
        refs: dict[Any, Job] = {}
        try:
            board = ray.remote(num_cpus=0)(_Board).remote()
            task = ray.remote(_ray_job).options(
                num_cpus=self.resources.cpus,
                num_gpus=self.resources.gpus,
                max_retries=self.max_retries,
                retry_exceptions=False,  # a run that raises fails; only lost workers retry
            )
            cwd = os.getcwd()
            refs = {task.remote(cwd, board, i, job): job for i, job in enumerate(jobs)}
            waiting = list(refs)
            while waiting:
                ready, waiting = ray.wait(waiting, num_returns=1, timeout=0.5)
                for index, where in ray.get(board.take.remote()):
                    yield Event(jobs[index], RUNNING, where)
                for ref in ready:
                    yield self._outcome(refs[ref], ref)
            refs = {}
        finally:  # Ctrl-C, an error, or the caller stopped listening: nothing keeps running
            for ref in refs:
                ray.cancel(ref, force=True)
            if self.joined:
                ray.shutdown()
                self.joined = False

    def _outcome(self, job: Job, ref: Any) -> Event:
        ray = self.ray
        try:
            return Event(job, DONE, ray.get(ref))
        except ray.exceptions.RayTaskError as err:  # the run raised: its own exception
            cause = err.cause if isinstance(err.cause, BaseException) else err
            return Event(job, FAILED, one_line(cause))
        except ray.exceptions.RayError as err:  # lost more often than max_retries, cancelled
            return Event(job, FAILED, one_line(err))
