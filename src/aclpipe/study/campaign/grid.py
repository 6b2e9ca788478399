"""The tuning grid of a campaign (``campaign.tune``): the base recipe's configurations, each
named by its knobs (``lr5e-05-ep3-bs32-wu0.1``), over the shared grid and a task's own
extension, checked as ``aclpipe.study.campaign.plan`` reads the rest of the plan."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aclpipe.errors import UserError


@dataclass
class Tuning:
    method: str
    seeds: list[int]
    configs: dict[str, dict[str, Any]]  # a configuration's name -> {"train.lr": 5e-05, ...}
    extend: dict[str, dict[str, dict[str, Any]]] = dataclasses.field(default_factory=dict)

    def configs_for(self, task: str) -> dict[str, dict[str, Any]]:
        """The shared grid's configurations, then those ``extend`` adds for ``task``."""
        return {**self.configs, **self.extend.get(task, {})}


_SHORT = {"lr": "lr", "epochs": "ep", "batch_size": "bs", "warmup_ratio": "wu"}


def _knob_order(key: str) -> tuple[int, str]:
    short = key.split(".")[-1]
    return (list(_SHORT).index(short) if short in _SHORT else len(_SHORT), short)


def config_name(knobs: dict[str, Any]) -> str:
    """``lr5e-05_ep3_bs32_wu0.1``: a tuning configuration's folder name, from its knobs
    (lr, epochs, batch size, warm-up first, then the others by name, whatever their order
    in the file)."""
    parts = []
    for key, value in sorted(knobs.items(), key=lambda kv: _knob_order(kv[0])):
        short = _SHORT.get(key.split(".")[-1], key.split(".")[-1])
        parts.append(f"{short}{value:g}" if isinstance(value, float) else f"{short}{value}")
    return "_".join(parts)


def read_tuning(body: Any, path: Path, tasks: list[str]) -> Tuning:
    """``campaign.tune``: the method, the seeds, every configuration of the grid and, per
    task, the configurations ``extend`` adds."""
    from aclpipe.training.knobs import check_method

    where = f"campaign.tune in {path}"
    if not isinstance(body, dict) or set(body) - {"method", "seeds", "grid", "extend"}:
        raise UserError(f"{where} takes method, seeds, grid and extend")
    method = check_method(
        body.get("method", "ce"), f"{where}: method {body.get('method')!r} is unknown"
    )
    seeds = body.get("seeds") or [1]
    if not isinstance(seeds, list) or not all(isinstance(s, int) for s in seeds):
        raise UserError(f"{where}: seeds must be a list of whole numbers, got {seeds!r}")
    configs = _grid_configs(body.get("grid"), f"{where}: grid")
    extend = body.get("extend") or {}
    if not isinstance(extend, dict) or not set(extend) <= set(tasks):
        raise UserError(
            f"{where}: extend must map tasks of campaign.tasks ({', '.join(tasks)}) to grids"
        )
    extra = {
        task: {
            name: knobs
            for name, knobs in _grid_configs(grid, f"{where}: extend.{task}").items()
            if name not in configs
        }
        for task, grid in extend.items()
    }
    return Tuning(method, seeds, configs, extra)


def _grid_configs(grids: Any, where: str) -> dict[str, dict[str, Any]]:
    """Every configuration of a grid (a mapping of lists, or a list of such mappings: their
    union), by name, in the order the grid gives them."""
    grids = [grids] if isinstance(grids, dict) else grids
    if not isinstance(grids, list) or not grids or not all(isinstance(g, dict) for g in grids):
        raise UserError(
            f"{where} must map train.<key> to a list of values (or be a list of such maps)"
        )
    configs: dict[str, dict[str, Any]] = {}
    for grid in grids:
        for key, values in grid.items():
            if not str(key).startswith("train.") or not isinstance(values, list) or not values:
                raise UserError(
                    f"{where}: key {key!r} must be train.<knob> with a non-empty list of values"
                )
        for combination in itertools.product(*grid.values()):
            knobs = dict(sorted(zip(grid, combination), key=lambda kv: _knob_order(kv[0])))
            configs.setdefault(config_name(knobs), knobs)
    return configs
