"""The results campaign: every method, several seeds, real GLUE, run through DVC.

``campaign/params.yaml`` is an ordinary params file (the knobs every run shares, written only
where they differ from the code's defaults: ``load_campaign`` fills in the rest and the knobs of
every method the study runs, ``aclpipe.config.resolved``) plus a ``campaign:`` section that says
what to run::

    campaign:
      tasks: [mrpc, rte, sst2]
      seeds: [1, 2, 3]                   # train.seed of each run; the data subsample is fixed
      runs: [ce, scl, acl]               # the table order; a run is a method or a variant
      ablations: [acl-nograd]            # runs that only need ablation_seeds (after runs)
      ablation_seeds: [1, 2, 3]
      experiment:                        # runs on some tasks only, over their own seeds
        runs: [scl-grad]
        tasks: [mrpc]
        seeds: [1, 2, 3, 4, 5]
      variants:                          # runs that change a method's knobs
        acl-nograd: {method: acl, set: {acl_grad: false}}
      task_settings:                     # per task, over the shared knobs
        sst2: {data: {max_train_samples: 10000, max_length: 64}, train: {epochs: 1}}
      resources: {cpus: 1, gpus: 0}      # what one run asks of a Ray cluster (--backend ray)
      tune:                              # the base recipe, chosen once per task on ce
        method: ce
        seeds: [1]
        grid:                            # a mapping of lists (every combination), or a
          train.lr: [2.0e-5, 5.0e-5]     # list of such mappings (their union)
          train.epochs: [3, 5]
        extend:                          # per task, configurations tried on it alone (the
          mrpc:                          # same form as grid): a grid past the shared edge
            {train.lr: [5.0e-5], train.epochs: [8]}

A few-shot study (``fewshot/params.yaml``) is a campaign with two more keys::

      fewshot: [20, 100, 1000]           # N: each run trains on a stratified draw of N examples
      fewshot_settings:                  # per N, over the shared knobs (the recipe at N)
        20: {train: {epochs: 100, batch_size: 20}}

Its runs are ``<run>-n<N>`` for every run and N (``ce-n20``), and seed s of a run draws its
N examples with ``data.fewshot_seed`` s and trains with ``train.seed`` s: a draw is one seed.
Each draw is prepared once per task and seed into ``data/<task>/s<seed>/n<N>/``
(``aclpipe.data.fewshot``) and shared by every method, so that runs of one seed pair on the
same examples; ``aclpipe.study.fewshot.report`` writes its verdicts.

``aclpipe campaign tune`` trains the grid's configurations on the task's validation split
(carved from train by ``data.validation_fraction``; dev is never looked at to choose) into
``campaign/tune/<task>/<config>-s<seed>/``; the best mean validation score is the recipe that
``task_settings.<task>.train`` then gives every run (``aclpipe.study.campaign.tuning``).

``campaign/dvc.yaml`` turns it into stages: ``prepare`` per task, ``tune`` per task, ``run`` per seed x task x
run (train, score every exit, sweep the policies; the run's folder ``campaign/runs/<task>/
<run>-s<seed>/`` is committed, the weights are not kept) and ``report``, which aggregates the
runs into ``reports/<task>/results.{md,json}``, plots and ``reports/README.md``. DVC records
each finished run, so an interrupted campaign resumes where it stopped, and the report is
rebuilt from the committed runs in seconds.

A run's stages (prepare, run, tune) are ``aclpipe.study.campaign.runs``; the tuning grid is
``grid``. The published results are ``aclpipe.study.campaign.report`` (figures and verdicts
from the run folders' per-example predictions), ``markdown``, ``overview`` and ``plots``. What a run is scored by (each exit's score, the average over exits,
budget picks on validation, the area under the score-cost curve) is ``aclpipe.study.stats.measures``;
the paired bootstrap over seeds and dev examples is ``aclpipe.study.stats.paired``; budgets
and the cost curve over seeds are ``aclpipe.study.campaign.speed``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aclpipe.config import Params, apply_overrides, params_from_dict, resolved
from aclpipe.errors import UserError
from aclpipe.layout import Layout
from aclpipe.study.campaign.backends import RunResources, parse_resources
from aclpipe.study.campaign.cells import GRID, Cells, Planned, build_plan, parse_cells
from aclpipe.study.campaign.grid import Tuning, read_tuning
from aclpipe.study.campaign.sections import (
    cells_runs,
    check_sections,
    read_fewshot,
    read_lists,
    read_spec,
)
from aclpipe.study.stats.verdicts import Rules, rules_from


@dataclass
class Variant:
    method: str
    knobs: dict[str, Any]  # over methods.<method> of the shared params


@dataclass
class Experiment:
    """``campaign.experiment``: runs planned on some of the tasks only, over their own seeds
    (their own stage in campaign/dvc.yaml)."""

    runs: list[str] = dataclasses.field(default_factory=list)
    tasks: list[str] = dataclasses.field(default_factory=list)
    seeds: list[int] = dataclasses.field(default_factory=list)


@dataclass
class Campaign:
    path: Path  # campaign/params.yaml
    # the params file without its campaign section, every value written out (config.resolved):
    # the code's defaults under the file's, and the knobs of every method the study runs
    base: dict[str, Any]
    tasks: list[str]
    seeds: list[int]
    runs: list[str]  # every run in table order: campaign.runs, campaign.ablations, experiment.runs
    variants: dict[str, Variant]
    task_settings: dict[str, dict[str, Any]]
    tuning: Tuning | None = None
    ablations: list[str] = dataclasses.field(default_factory=list)
    ablation_seeds: list[int] = dataclasses.field(default_factory=list)
    fewshot: list[int] = dataclasses.field(default_factory=list)  # every N of a few-shot study
    fewshot_settings: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    # a few-shot study's run name -> (its run of campaign.runs in the file, its N)
    fewshot_runs: dict[str, tuple[str, int]] = dataclasses.field(default_factory=dict)
    resources: RunResources = RunResources()  # one run's ask of a Ray cluster
    experiment: Experiment = dataclasses.field(default_factory=Experiment)
    verdicts: Rules = dataclasses.field(default_factory=Rules)  # margin, resamples, rule floor
    # a few-shot study's blocks beside its grid (campaign.cells), and where each run is planned
    cells: dict[str, Cells] = dataclasses.field(default_factory=dict)
    fewshot_plan: dict[str, list[Planned]] = dataclasses.field(default_factory=dict)
    peers: dict[str, Any] = dataclasses.field(default_factory=dict)  # campaign.peers, typed

    def seeds_for(self, run: str) -> list[int]:
        """The seeds a run is planned for: ablation_seeds for an ablation, the experiment's
        seeds for one of its runs, in a few-shot study every seed planned on any task, else
        seeds."""
        if run in self.fewshot_plan:
            return sorted({s for p in self.fewshot_plan[run] for s in p.seeds})
        if run in self.experiment.runs:
            return self.experiment.seeds
        return self.ablation_seeds if run in self.ablations else self.seeds

    @property
    def controls(self) -> list[str]:
        """The runs that are not the claims' own: the ablations and the experiment's runs."""
        return self.ablations + self.experiment.runs

    def tasks_for(self, run: str) -> list[str]:
        """The tasks a run is planned for: the experiment's tasks for one of its runs, in a
        few-shot study every task any block plans it on, else tasks."""
        if run in self.fewshot_plan:
            return [t for t in self.tasks if any(t in p.tasks for p in self.fewshot_plan[run])]
        return self.experiment.tasks if run in self.experiment.runs else self.tasks

    def seeds_at(self, task: str, run: str) -> list[int]:
        """The seeds a run is planned for on one task (a few-shot block may plan some tasks
        only, over seeds of its own)."""
        if run not in self.fewshot_plan:
            return self.seeds_for(run) if task in self.tasks_for(run) else []
        return sorted({s for p in self.fewshot_plan[run] if task in p.tasks for s in p.seeds})

    def draws_on(self, task: str) -> list[int]:
        """A few-shot study's seeds that draw on ``task``: those any run is planned for there."""
        return sorted({s for run in self.fewshot_plan for s in self.seeds_at(task, run)})

    def seed_key(self, run: str | None) -> str:
        """Where ``run``'s seeds are listed in the campaign file."""
        if run in self.experiment.runs:
            return "experiment.seeds"
        return "ablation_seeds" if run in self.ablations else "seeds"

    @property
    def root(self) -> Path:
        """The campaign's folder: data/, runs/ and the scratch models/ live here."""
        return self.path.parent

    @property
    def layout(self) -> Layout:
        return Layout(self.root)

    def run_dir(self, task: str, run: str, seed: int) -> Path:
        return self.layout.run(task, run, seed)

    def data_dir(self, task: str, run: str | None = None, seed: int | None = None) -> Path:
        """The prepared data a run trains on: the task's, or a few-shot run's draw."""
        if run in self.fewshot_runs and seed is not None:
            return self.layout.fewshot_data(task, self.fewshot_runs[run][1], seed)
        return self.layout.data(task)

    def stage(self, task: str, run: str, seed: int) -> str:
        """The DVC stage (in the campaign's dvc.yaml) that records a run's folder."""
        if run in self.fewshot_runs:
            base, n = self.fewshot_runs[run]
            kind = next(
                (p.stage for p in self.fewshot_plan[run] if task in p.tasks and seed in p.seeds),
                GRID,
            )
            return f"{kind}@{seed}-{task}-{n}-{base}"
        kind = (
            "experiment"
            if run in self.experiment.runs
            else "ablation"
            if run in self.ablations
            else "run"
        )
        return f"{kind}@{seed}-{task}-{run}"

    def variant(self, run: str) -> Variant:
        if run not in self.runs:
            raise UserError(
                f"unknown run {run!r}: campaign.runs in {self.path} lists {', '.join(self.runs)}"
            )
        run = self.fewshot_runs.get(run, (run, 0))[0]
        return self.variants.get(run, Variant(run, {}))

    def overrides(self, task: str, run: str | None = None, seed: int | None = None) -> list[str]:
        """``section.key=value`` overrides that turn the shared params into this run's."""
        if task not in self.tasks:
            raise UserError(
                f"task {task!r} is not in campaign.tasks of {self.path} "
                f"({', '.join(self.tasks)}): add it there"
            )
        if run is not None and task not in self.tasks_for(run):
            raise UserError(
                f"run {run!r} is planned for {', '.join(self.tasks_for(run))} only "
                f"(campaign.experiment.tasks of {self.path}): add {task} there"
            )
        out = []
        for section, knobs in self.task_settings.get(task, {}).items():
            out += [f"{section}.{key}={_yaml_value(value)}" for key, value in knobs.items()]
        if run is not None:
            variant = self.variant(run)
            out += [
                f"methods.{variant.method}.{key}={_yaml_value(value)}"
                for key, value in variant.knobs.items()
            ]
        if run in self.fewshot_runs:  # the recipe at N, and the draw (seed: below)
            n = self.fewshot_runs[run][1]
            for section, knobs in self.fewshot_settings.get(n, {}).items():
                out += [f"{section}.{key}={_yaml_value(value)}" for key, value in knobs.items()]
            out.append(f"data.fewshot_examples={n}")
        if seed is not None:
            planned = self.seeds_for(run) if run is not None else self.seeds
            if run in self.fewshot_plan:
                planned = self.seeds_at(task, run)
            if seed not in planned:
                raise UserError(
                    f"seed {seed} is not in campaign.{self.seed_key(run)} of {self.path} "
                    f"({', '.join(map(str, planned))}): add it there"
                )
            if run in self.fewshot_runs:
                out.append(f"data.fewshot_seed={seed}")  # a draw is one seed
            out.append(f"train.seed={seed}")
        return out

    def params(self, task: str, run: str | None = None, seed: int | None = None) -> Params:
        return params_from_dict(self.raw_params(task, run, seed))

    def raw_params(self, task: str, run: str | None = None, seed: int | None = None) -> dict:
        """A run's params as a params.yaml mapping: the shared knobs with its overrides."""
        return apply_overrides(copy.deepcopy(self.base), self.overrides(task, run, seed))

    def tune_overrides(self, task: str, config: str, seed: int) -> list[str]:
        """A tuning run's overrides: the task's data and model settings (not its train
        settings, which hold the recipe being chosen), the configuration, the seed."""
        tuning = self.tuning
        if tuning is None:
            raise UserError(
                f"{self.path} has no campaign.tune section: add one (method, seeds, grid)"
            )
        configs = tuning.configs_for(task)
        if config not in configs:
            raise UserError(
                f"unknown configuration {config!r}: campaign.tune gives {task} {', '.join(configs)}"
            )
        self.overrides(task)  # a one-line error for a task outside the campaign
        out = [
            f"{section}.{key}={_yaml_value(value)}"
            for section, knobs in self.task_settings.get(task, {}).items()
            if section != "train"
            for key, value in knobs.items()
        ]
        out += [f"{key}={_yaml_value(value)}" for key, value in configs[config].items()]
        return out + [f"train.seed={seed}"]

    def tune_params(self, task: str, config: str, seed: int) -> Params:
        raw = apply_overrides(copy.deepcopy(self.base), self.tune_overrides(task, config, seed))
        return params_from_dict(raw)


def _yaml_value(value: Any) -> str:
    return "null" if value is None else json.dumps(value) if isinstance(value, str) else str(value)


def load_campaign(path: Path) -> Campaign:
    """Read and check ``campaign/params.yaml``; every problem is a one-line ``UserError``."""
    raw, spec = read_spec(path)
    from aclpipe.study.campaign.peers import PEER_NAMES, parse_peers
    from aclpipe.training.knobs import METHOD_NAMES, check_method

    tasks, seeds, runs, ablations, ablation_seeds = read_lists(spec, path)
    experiment = _experiment(spec.get("experiment"), path, tasks, runs + ablations)
    runs = runs + ablations + experiment.runs
    variants = {}
    for name, body in (spec.get("variants") or {}).items():
        method = body.get("method") if isinstance(body, dict) else None
        variants[name] = Variant(
            check_method(method, f"campaign.variants.{name} needs method"),
            dict(body.get("set") or {}),
        )
    cells = parse_cells(spec.get("cells"), path, tasks)
    for name in runs + cells_runs(cells):
        if name not in METHOD_NAMES and name not in variants and name not in PEER_NAMES:
            raise UserError(
                f"campaign.runs has {name!r}, which is neither a method ({', '.join(METHOD_NAMES)}), "
                f"a peer ({', '.join(PEER_NAMES)}) nor a variant under campaign.variants"
            )
    peers = parse_peers(spec.get("peers"), f"campaign.peers in {path}")
    settings = spec.get("task_settings") or {}
    for task, body in settings.items():
        if task not in tasks or not isinstance(body, dict):
            raise UserError(f"campaign.task_settings.{task}: not a task of campaign.tasks")
        check_sections(body, f"campaign.task_settings.{task}", "task")
    tuning = read_tuning(spec["tune"], path, tasks) if spec.get("tune") is not None else None
    fewshot, fewshot_settings = read_fewshot(spec, path, cells)
    if cells and not fewshot:
        raise UserError(
            f"campaign.cells in {path}: only a few-shot study (campaign.fewshot) has cells"
        )
    plan = build_plan(runs, fewshot, tasks, seeds, cells) if fewshot else {}
    fewshot_runs = {name: (name.rsplit("-n", 1)[0], int(name.rsplit("-n", 1)[1])) for name in plan}
    fewshot = sorted({n for _, n in fewshot_runs.values()})  # the grid's N and the cells'
    # the knobs written out are those of the grid's and the tuning's methods; a method only a
    # cell runs (cosine-pairs) reads its code defaults and records none, so adding one leaves
    # every recorded run's params as they were
    trained = [variants[r].method if r in variants else r for r in runs]
    trained += [tuning.method] if tuning else []
    base = resolved(raw, [name for name in trained if name in METHOD_NAMES])  # the rest filled in
    campaign = Campaign(
        path, base, tasks, seeds, list(fewshot_runs) or runs, variants, settings, tuning,
        ablations, ablation_seeds, fewshot, fewshot_settings, fewshot_runs,
        parse_resources(spec.get("resources"), "campaign.resources", path),
        experiment, rules_from(spec.get("verdicts"), f"campaign.verdicts in {path}"),
        cells, plan, peers,
    )  # fmt: skip
    for task in tasks:  # every run's params must build: fail now, not hours in
        for run in campaign.runs:
            if task in campaign.tasks_for(run):
                campaign.params(task, run, campaign.seeds_at(task, run)[0])
        for config in tuning.configs_for(task) if tuning else []:
            campaign.tune_params(task, config, tuning.seeds[0])
    return campaign


def _experiment(body: Any, path: Path, tasks: list[str], others: list[str]) -> Experiment:
    """``campaign.experiment``: runs (not in runs or ablations), tasks of the campaign, seeds."""
    where = f"campaign.experiment in {path}"
    if body is None:
        return Experiment()
    if not isinstance(body, dict) or set(body) != {"runs", "tasks", "seeds"}:
        raise UserError(f"{where} takes runs, tasks and seeds (three lists)")
    runs, on, seeds = body["runs"], body["tasks"], body["seeds"]
    if not isinstance(runs, list) or not runs or set(runs) & set(others):
        raise UserError(f"{where}: runs must be a non-empty list of runs not in runs or ablations")
    if not isinstance(on, list) or not on or not set(on) <= set(tasks):
        raise UserError(
            f"{where}: tasks must be a non-empty list of campaign.tasks ({', '.join(tasks)})"
        )
    if (
        not isinstance(seeds, list)
        or not seeds
        or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)
    ):
        raise UserError(f"{where}: seeds must be a non-empty list of whole numbers, got {seeds!r}")
    return Experiment(list(runs), list(on), list(seeds))
