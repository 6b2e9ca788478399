"""Many campaign runs at once: ``aclpipe campaign run-pending --workers N`` (or
``--backend ray``).

DVC runs the campaign's stages one after another, which suits a CPU. A GPU has room for
several runs side by side, a cluster for many: this module runs every run that has no folder
yet, in worker processes or as Ray tasks (``aclpipe.study.campaign.backends``), each with
:func:`aclpipe.study.campaign.runs.run_one` (what one DVC stage runs), so a folder
made here is the one ``dvc repro`` would make; ``dvc commit -f`` on its stage (the command
:func:`commit_command` builds, which the CLI prints) then records it. It lives apart from ``plan``, ``grid`` and ``runs`` because the run stages depend on those files: the
scheduling is not what decides a run's weights, and editing it must not make DVC retrain.
"""

from __future__ import annotations

import traceback
from pathlib import Path

from rich.console import Console

from aclpipe.errors import UserError
from aclpipe.layout import DVC_YAML, META
from aclpipe.study.campaign.backends import BACKENDS, Backend, Job, LocalPool, RunResources, follow
from aclpipe.study.campaign.plan import Campaign, load_campaign
from aclpipe.study.campaign.runs import run_one, tune_one

RUN, TUNE = "run", "tune"  # the two kinds of job: a campaign run, a configuration of the grid


def pending(
    campaign: Campaign,
    tasks: list[str] | None = None,
    seeds: list[int] | None = None,
    runs: list[str] | None = None,
) -> list[tuple[str, str, int]]:
    """``(task, run, seed)`` of every run without a folder, seed by seed (so the first seed of
    every task finishes first), in the campaign's task and run order; in a few-shot study,
    N by N first (every draw of the smallest N, the cheapest runs, before any larger N), so
    a study cut off and resumed completes whole (task, N) cells as it goes. ``runs``: only
    these (a run, ``ce``, or a run at one N, ``ce-n20``)."""
    for task in tasks or []:
        campaign.overrides(task)  # a one-line error for a task outside the campaign
    every_seed = sorted({s for run in campaign.runs for s in campaign.seeds_for(run)})
    for seed in seeds or []:
        if seed not in every_seed:
            campaign.overrides(campaign.tasks[0], seed=seed)  # and for a seed outside it
    bases = {run: campaign.fewshot_runs.get(run, (run, 0))[0] for run in campaign.runs}
    for name in runs or []:
        if name not in bases and name not in bases.values():
            campaign.variant(name)  # the one-line error of an unknown run
    jobs = [
        (task, run, seed)
        for seed in seeds or every_seed
        for task in tasks or campaign.tasks
        for run in campaign.runs
        if seed in campaign.seeds_at(task, run)
        and (not runs or run in runs or bases[run] in runs)
        and not campaign.run_dir(task, run, seed).exists()
    ]
    if campaign.fewshot_runs:  # stable: seed by seed within each N
        jobs.sort(key=lambda job: campaign.fewshot_runs[job[1]][1])
    return jobs


def pending_tuning(
    campaign: Campaign, tasks: list[str] | None = None
) -> list[tuple[str, str, int]]:
    """``(task, configuration, seed)`` of every tuning run without a folder, seed by seed."""
    if campaign.tuning is None:
        raise UserError(
            f"{campaign.path} has no campaign.tune section: add one (method, seeds, grid)"
        )
    for task in tasks or []:
        campaign.overrides(task)
    return [
        (task, config, seed)
        for seed in campaign.tuning.seeds
        for task in tasks or campaign.tasks
        for config in campaign.tuning.configs_for(task)
        if not campaign.layout.tune_run(task, config, seed).exists()
    ]


def make_backend(name: str, workers: int, address: str | None, resources: RunResources) -> Backend:
    """The one place a backend is chosen (here, not in backends.py, which ray_backend imports): ``local`` (``workers`` processes) or ``ray``."""
    if name not in BACKENDS:
        raise UserError(f"--backend {name!r}: use {' or '.join(BACKENDS)}")
    if name == "local":
        if address is not None:
            raise UserError("--address names a Ray cluster: add --backend ray, or drop --address")
        return LocalPool(workers)
    from aclpipe.study.campaign.ray_backend import RayCluster

    return RayCluster(address, resources)


def run_pending(
    campaign: Campaign,
    workers: int,
    console: Console,
    tasks: list[str] | None = None,
    seeds: list[int] | None = None,
    kind: str = RUN,
    runs: list[str] | None = None,
    threads: int | None = None,
    backend: str = "local",
    address: str | None = None,
) -> tuple[list[Path], list[str]]:
    """Run every pending run (``kind`` tune: every pending configuration of the tuning grid)
    on ``backend`` (:mod:`aclpipe.study.campaign.backends`): ``local``, ``workers`` at a time in
    separate processes, or ``ray``, one task per run asking for ``campaign.resources`` on the
    Ray cluster at ``address``. Returns the finished folders and one line per failed run (its
    traceback is in its log, ``campaign/models/<task>/<run>-s<seed>.log``). Each run computes
    with ``threads`` threads (default: the local cores shared out among the workers; on Ray,
    the CPUs a run asks for). Ctrl-C cancels the runs not yet started."""
    pool = make_backend(backend, workers, address, campaign.resources)
    if threads is not None and threads < 1:
        raise UserError(f"--threads {threads}: give at least 1")
    jobs = (
        pending_tuning(campaign, tasks) if kind == TUNE else pending(campaign, tasks, seeds, runs)
    )
    for task, run, seed in jobs:
        data = campaign.data_dir(task, run if kind == RUN else None, seed)
        if not (data / META).exists():
            draw = f" --seed {seed}" if run in campaign.fewshot_runs else ""
            raise UserError(
                f"{data} is not prepared: run `aclpipe campaign prepare --task {task}{draw}` "
                f"(or `dvc repro {campaign.root / 'dvc.yaml'}`) first"
            )
    per_run = pool.threads(threads)
    folder = campaign.layout.tune_run if kind == TUNE else campaign.run_dir
    args = [(str(campaign.path), kind, task, run, seed, per_run) for task, run, seed in jobs]
    runs = [
        Job(f"{task} {run} seed {seed}", str(folder(task, run, seed)), _run_logged, a)
        for (task, run, seed), a in zip(jobs, args)
    ]
    return follow(pool, runs, console)


def commit_command(campaign: Campaign, folders: list[Path], kind: str = RUN) -> str:
    """The ``dvc commit`` that records these run folders in the campaign's dvc.lock. It names
    each stage: ``dvc commit`` on the whole dvc.yaml fails while any run has no folder yet.
    Tuning runs are one stage per task."""
    stages = []
    if kind == TUNE:
        tasks = sorted({folder.parent.name for folder in folders})
        return "dvc commit -f " + " ".join(f"{campaign.root / DVC_YAML}:tune@{t}" for t in tasks)
    for folder in folders:
        run, seed = folder.name.rsplit("-s", 1)
        stage = campaign.stage(folder.parent.name, run, int(seed))
        stages.append(f"{campaign.root / DVC_YAML}:{stage}")
    return "dvc commit -f " + " ".join(sorted(stages))


def _run_logged(path: str, kind: str, task: str, run: str, seed: int, threads: int) -> str:
    """One run in a worker process; its console output, and its traceback if it fails, go
    to a log beside its scratch model."""
    import torch

    torch.set_num_threads(threads)
    campaign = load_campaign(Path(path))
    log = campaign.layout.run_log(task, run if kind == RUN else f"tune-{run}", seed)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)  # a new file: its birth is this attempt's start (wallclock)
    one = run_one if kind == RUN else tune_one
    with open(log, "w", encoding="utf-8") as f:
        try:
            return str(one(campaign, task, run, seed, Console(file=f, width=120)))
        except Exception:
            f.write(traceback.format_exc())
            raise
