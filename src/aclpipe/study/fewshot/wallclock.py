"""A study's wall clock, run by run: ``<study>/wallclock.tsv``.

``aclpipe campaign run-pending`` writes each run's log (``<study>/models/<task>/<run>-s<seed>.log``)
from the run's start to its end, so the log's birth and last-modification times are the run's
start and end. ``record`` reads them for every finished run (its folder holds run.json) of a
checkout, which may be another worktree than the one that records (long studies run in
worktrees at a fixed commit), and merges them into the ledger: rows already there are kept, as
the logs of an earlier worktree may be gone. A row corrected by hand says why in its ``note``
(the report prints it), and a log read later never overwrites it. ``summarise`` gives what the report prints: the
wall clock the study took (the union of the runs' intervals, so neither the time between runs in
idle stretches nor two runs side by side count twice) and the run time per (task, N).
"""

from __future__ import annotations

import collections
import csv
import datetime
import io
import subprocess
from pathlib import Path

from aclpipe import atomic
from aclpipe.layout import RUN_RECORD, Layout
from aclpipe.study.campaign.plan import Campaign

LEDGER = "wallclock.tsv"  # in the study's folder, beside its params
FIELDS = ["task", "run", "n", "seed", "start_utc", "end_utc", "seconds", "note"]
_STAMP = "%Y-%m-%dT%H:%M:%S"


def ledger_path(campaign: Campaign) -> Path:
    return campaign.root / LEDGER


def born_and_modified(path: Path) -> tuple[int, int] | None:
    """A file's birth and last-modification times (whole seconds since the epoch); None where
    the file system keeps no birth time."""
    out = subprocess.run(["stat", "-c", "%W %Y", str(path)], capture_output=True, text=True)
    fields = out.stdout.split()
    if out.returncode != 0 or len(fields) != 2 or not fields[0].isdigit() or fields[0] == "0":
        return None
    return int(fields[0]), int(fields[1])


def from_logs(campaign: Campaign, root: Path) -> list[dict]:
    """A row per finished run whose log lies in the study folder ``root`` (this checkout's or
    another worktree's)."""
    layout, rows = Layout(root), []
    for run in campaign.runs:
        base, n = campaign.fewshot_runs.get(run, (run, None))
        for task in campaign.tasks_for(run):
            for seed in campaign.seeds_for(run):
                log = layout.run_log(task, run, seed)
                if not (layout.run(task, run, seed) / RUN_RECORD).exists() or not log.exists():
                    continue  # not run there, or not finished
                times = born_and_modified(log)
                if times is None:
                    continue
                rows.append({
                    "task": task, "run": base, "n": "" if n is None else str(n), "seed": str(seed),
                    "start_utc": _stamp(times[0]), "end_utc": _stamp(times[1]),
                    "seconds": str(times[1] - times[0]), "note": "",
                })  # fmt: skip
    return rows


def _stamp(seconds: int) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime(_STAMP)


def _key(row: dict) -> tuple:
    return row["task"], row["run"], row["n"], row["seed"]


def read(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return [{**row, "note": row.get("note") or ""} for row in csv.DictReader(f, delimiter="\t")]


def finished_here(campaign: Campaign, rows: list[dict]) -> list[dict]:
    """The rows whose run has finished in this checkout (the ledger may run ahead of it)."""
    return [
        r for r in rows
        if (campaign.layout.run(r["task"], _run_name(r), int(r["seed"])) / RUN_RECORD).exists()
    ]  # fmt: skip


def _run_name(row: dict) -> str:
    return f"{row['run']}-n{row['n']}" if row["n"] else row["run"]


def record(campaign: Campaign, root: Path) -> tuple[Path, list[dict]]:
    """Merge the timed runs of the study folder ``root`` into the ledger; returns its path and
    its rows."""
    rows = {_key(r): r for r in read(ledger_path(campaign))}
    rows.update({
        _key(r): r for r in from_logs(campaign, root) if not rows.get(_key(r), {}).get("note")
    })  # fmt: skip
    ordered = sorted(
        rows.values(),
        key=lambda r: (int(r["n"] or 0), r["task"], int(r["seed"]), r["run"]),
    )
    text = io.StringIO()
    writer = csv.DictWriter(text, FIELDS, delimiter="\t", lineterminator="\n")
    writer.writeheader()
    writer.writerows(ordered)
    atomic.write_text(ledger_path(campaign), text.getvalue())
    return ledger_path(campaign), ordered


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of ``[start, end]`` intervals."""
    total, reach = 0.0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total, reach = total + end - start, end
        elif end > reach:
            total, reach = total + end - reach, end
    return total


def summarise(rows: list[dict]) -> dict:
    """``{"runs", "run_seconds", "wall_seconds", "first", "last", "cells": [{"n", "task",
    "runs", "mean_seconds", "min_seconds", "max_seconds", "run_seconds"}], "notes": [the
    rows corrected by hand]}`` of the ledger's rows."""

    def parse(stamp: str) -> float:
        return datetime.datetime.strptime(stamp, _STAMP).replace(tzinfo=datetime.UTC).timestamp()

    intervals = [(parse(r["start_utc"]), parse(r["end_utc"])) for r in rows]
    cells: dict[tuple[int, str], list[int]] = collections.defaultdict(list)
    for r in rows:
        cells[(int(r["n"] or 0), r["task"])].append(int(r["seconds"]))
    return {
        "runs": len(rows),
        "run_seconds": sum(int(r["seconds"]) for r in rows),
        "wall_seconds": union_seconds(intervals),
        "first": min((r["start_utc"] for r in rows), default=None),
        "last": max((r["end_utc"] for r in rows), default=None),
        "cells": [
            {"n": n, "task": task, "runs": len(s), "mean_seconds": sum(s) / len(s),
             "min_seconds": min(s), "max_seconds": max(s), "run_seconds": sum(s)}  # fmt: skip
            for (n, task), s in sorted(cells.items())
        ],
        "notes": [r for r in rows if r.get("note")],
    }
