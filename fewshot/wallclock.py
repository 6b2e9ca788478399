"""The few-shot study's wall clock, run by run: `python fewshot/wallclock.py [ROOT]`.

Each run of `aclpipe campaign run-pending` writes its log
(fewshot/models/<task>/<run>-n<N>-s<seed>.log) from its start to its end: the log's birth
and last-modification times (`stat -c '%W %Y'`) are the run's start and end (a run counts
once its folder has run.json). Merges
them into fewshot/wallclock.tsv (rows already there are kept: logs of earlier sessions'
worktrees may be gone) and prints the totals per (task, N). ROOT defaults to the repository
root; the study ran from worktrees, so pass theirs.
"""

from __future__ import annotations

import collections
import csv
import subprocess
import sys
from pathlib import Path

from aclpipe.layout import RUN_RECORD

HERE = Path(__file__).resolve().parent
LEDGER = HERE / "wallclock.tsv"
FIELDS = ["task", "run", "n", "seed", "start_utc", "end_utc", "seconds"]


def from_logs(root: Path) -> dict[tuple[str, str], dict]:
    from aclpipe.study.campaign import load_campaign

    study = load_campaign(root / "fewshot" / "params.yaml")  # its layout names every path
    found = {}
    for task in study.tasks:
        for name, (run, n) in study.fewshot_runs.items():
            for seed in study.seeds:
                log = study.layout.run_log(task, name, seed)
                if not log.exists() or not (study.layout.run(task, name, seed) / RUN_RECORD).exists():
                    continue  # not run here, or not finished
                born, modified = map(int, subprocess.run(
                    ["stat", "-c", "%W %Y", str(log)], check=True, capture_output=True, text=True
                ).stdout.split())  # fmt: skip
                if born <= 0:  # the file system keeps no birth times
                    continue
                found[(task, f"{name}-s{seed}")] = {
                    "task": task, "run": run, "n": n, "seed": seed, "start_utc": stamp(born),
                    "end_utc": stamp(modified), "seconds": modified - born,
                }  # fmt: skip
    return found


def stamp(seconds: int) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S")


def main(root: Path) -> None:
    rows = {}
    if LEDGER.exists():
        with LEDGER.open() as f:
            for row in csv.DictReader(f, delimiter="\t"):
                rows[(row["task"], f"{row['run']}-n{row['n']}-s{row['seed']}")] = row
    rows.update(from_logs(root))
    ordered = sorted(rows.values(), key=lambda r: (int(r["n"]), r["task"], int(r["seed"]), r["run"]))
    with LEDGER.open("w", newline="") as f:
        out = csv.DictWriter(f, FIELDS, delimiter="\t", lineterminator="\n")
        out.writeheader()
        out.writerows(ordered)
    cells: dict[tuple[int, str], list[int]] = collections.defaultdict(list)
    for row in ordered:
        cells[(int(row["n"]), row["task"])].append(int(row["seconds"]))
    print("N\ttask\truns\tmean s a run\tsum s")
    for (n, task), seconds in sorted(cells.items()):
        print(f"{n}\t{task}\t{len(seconds)}\t{sum(seconds) / len(seconds):.0f}\t{sum(seconds)}")
    total = sum(int(r["seconds"]) for r in ordered)
    print(f"{len(ordered)} runs, {total} s of run wall clock ({total / 3600:.1f} h; two at a time)")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parent)
