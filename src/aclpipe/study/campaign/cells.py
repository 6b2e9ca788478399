"""Which runs a few-shot study plans: its grid, and the cells it adds beside the grid.

A few-shot study's grid is every run of ``campaign.runs`` at every N of ``campaign.fewshot``
on every task and seed (``run`` in its dvc.yaml). ``campaign.cells`` adds named blocks beside
it, each its own product of runs, tasks, N and seeds (and its own stage of the dvc.yaml,
named after the block), so that a study can grow where it needs to without planning the
whole product::

    cells:
      peers: {runs: [setfit, linear-probe], tasks: [sst2], fewshot: [20, 100], seeds: [1, 2]}
      draws: {runs: [ce, scl], tasks: [sst2], fewshot: [20], seeds: [11, 12, 13]}

A run is named ``<run>-n<N>`` as in the grid; :func:`build_plan` says, for each such name,
which stages plan it, on which tasks, over which seeds. A (task, run, seed) is planned by at
most one stage: a block may not repeat what the grid or another block plans.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aclpipe.errors import UserError

GRID = "run"  # the grid's stage in the study's dvc.yaml


@dataclass(frozen=True)
class Cells:
    """One block of ``campaign.cells``: runs x tasks x N x seeds, recorded by its own stage."""

    runs: list[str]
    tasks: list[str]
    fewshot: list[int]
    seeds: list[int]


@dataclass(frozen=True)
class Planned:
    """Where a run (``ce-n20``) is planned: by ``stage`` on ``tasks`` over ``seeds``."""

    stage: str
    tasks: list[str]
    seeds: list[int]


def parse_cells(body: Any, path: Path, tasks: list[str]) -> dict[str, Cells]:
    """``campaign.cells``: a mapping of block names to runs, tasks, fewshot and seeds."""
    if body is None:
        return {}
    where = f"campaign.cells in {path}"
    if not isinstance(body, dict):
        raise UserError(f"{where} must map a block's name to runs, tasks, fewshot and seeds")
    out = {}
    for name, block in body.items():
        here = f"campaign.cells.{name} in {path}"
        if name == GRID or not str(name).replace("-", "").isalnum():
            raise UserError(f"{here}: name a block with letters, digits and '-', not {GRID!r}")
        if not isinstance(block, dict) or set(block) != {"runs", "tasks", "fewshot", "seeds"}:
            raise UserError(f"{here} takes runs, tasks, fewshot and seeds (four lists)")
        for key in ("runs", "tasks", "fewshot", "seeds"):
            if not isinstance(block[key], list) or not block[key]:
                raise UserError(f"{here}: {key} must be a non-empty list")
        if not set(block["tasks"]) <= set(tasks):
            raise UserError(f"{here}: tasks must be tasks of campaign.tasks ({', '.join(tasks)})")
        for key in ("fewshot", "seeds"):
            values = block[key]
            if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
                raise UserError(f"{here}: {key} must be whole numbers > 0, got {values}")
            if values != sorted(set(values)):
                raise UserError(f"{here}: {key} must list each value once, ascending")
        out[str(name)] = Cells(
            list(block["runs"]), list(block["tasks"]), block["fewshot"], block["seeds"]
        )
    return out


def build_plan(
    runs: list[str], fewshot: list[int], tasks: list[str], seeds: list[int], cells: dict[str, Cells]
) -> dict[str, list[Planned]]:
    """``{"<run>-n<N>": [Planned, ...]}``: the grid's runs, then each block's, ordered by N and
    then by the order the runs are first listed (the grid's runs first)."""
    order = list(dict.fromkeys(runs + [r for block in cells.values() for r in block.runs]))
    sizes = sorted(set(fewshot) | {n for block in cells.values() for n in block.fewshot})
    plan: dict[str, list[Planned]] = {}
    for n in sizes:
        for run in order:
            entries = []
            if run in runs and n in fewshot:
                entries.append(Planned(GRID, list(tasks), list(seeds)))
            for name, block in cells.items():
                if run in block.runs and n in block.fewshot:
                    entries.append(Planned(name, block.tasks, block.seeds))
            if entries:
                _check_disjoint(f"{run}-n{n}", entries)
                plan[f"{run}-n{n}"] = entries
    return plan


def _check_disjoint(name: str, entries: list[Planned]) -> None:
    for i, a in enumerate(entries):
        for b in entries[i + 1 :]:
            both = [(t, s) for t in a.tasks if t in b.tasks for s in a.seeds if s in b.seeds]
            if both:
                task, seed = both[0]
                raise UserError(
                    f"campaign.cells: {name} on {task}, seed {seed} is planned by both "
                    f"{a.stage} and {b.stage}: plan each run once"
                )
