"""Length grouping on the default pipeline: what it does to dev scores and to training time.

For each seed, for `ce` and `acl-cl`, one run with random batches (``train.group_by_length:
false``) and one with batches of similar length (``true``), side by side (plain then grouped,
seed by seed, so that a load change hits both), each an ordinary

    aclpipe finetune --task sst2 --method M --set train.seed=S --set train.group_by_length=G
    aclpipe evaluate --task sst2 --method M   (every exit on the full dev set, no sweep)

in a scratch folder that holds a copy of the repository's params.yaml with ``--rows`` SST-2
training rows (one prepare, shared by every run) and the pipeline's other settings as they are
(padding-free where the encoder allows, 64 tokens, one epoch).

    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/length_grouping.py [--seeds 42 43 44]
        [--rows 2000] [--out benchmarks/results/length_grouping.json]

Prints, and writes to ``--out`` with the machine, the load and the stack: per run the dev score
of every exit and the finetune process's wall clock; per method and setting the mean over seeds;
per method the mean change of each exit (grouped - plain) and the ratio of the mean times.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from threads import machine

from aclpipe.study.campaign.runs import environment

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("ce", "acl-cl")


def aclpipe(work: Path, *args: str) -> float:
    """Run one aclpipe command in ``work``; its wall clock in seconds (the whole process)."""
    # the child runs in the scratch folder: this checkout's src, not whichever is installed
    src = str(ROOT / "src")
    path = os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "aclpipe.cli", *args], cwd=work, env=env,
                          capture_output=True, text=True)  # fmt: skip
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(
            f"`aclpipe {' '.join(args)}` failed in {work}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    return seconds


def scratch_params(work: Path, rows: int) -> None:
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    params["data"]["max_train_samples"] = rows
    glue = Path(params["data"]["glue_dir"])
    params["data"]["glue_dir"] = str(glue if glue.is_absolute() else (ROOT / glue).resolve())
    params["evaluate"]["sweep"] = False
    params["evaluate"]["timing_examples"] = 0
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")


def dev_scores(work: Path, method: str) -> list[float]:
    metrics = json.loads(
        (work / "reports/sst2" / method / "metrics.json").read_text(encoding="utf-8")
    )
    return [round(100 * e["score"], 2) for e in metrics["splits"]["dev"]["per_exit"]]


def summarise(runs: list[dict]) -> dict:
    out: dict = {}
    for method in METHODS:
        by = {
            g: [r for r in runs if r["method"] == method and r["grouped"] is g]
            for g in (False, True)
        }
        if not by[False] or not by[True]:
            continue
        exits = len(by[False][0]["dev"])
        mean = {g: [statistics.fmean(r["dev"][k] for r in by[g]) for k in range(exits)] for g in by}
        seconds = {g: statistics.fmean(r["finetune_seconds"] for r in by[g]) for g in by}
        out[method] = {
            "seeds": [r["seed"] for r in by[False]],
            "dev_mean_plain": [round(x, 2) for x in mean[False]],
            "dev_mean_grouped": [round(x, 2) for x in mean[True]],
            "change_per_exit": [round(b - a, 2) for a, b in zip(mean[False], mean[True])],
            "finetune_seconds_plain": round(seconds[False], 1),
            "finetune_seconds_grouped": round(seconds[True], 1),
            "speedup": round(seconds[False] / seconds[True], 2),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    parser.add_argument(
        "--rows", type=int, default=2000, help="SST-2 training rows (data.max_train_samples)"
    )
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks/results/length_grouping.json"
    )
    args = parser.parse_args()
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    load = os.getloadavg()[0]
    runs = []
    with tempfile.TemporaryDirectory(prefix="aclpipe-grouping-") as tmp:
        work = Path(tmp)
        scratch_params(work, args.rows)
        aclpipe(work, "prepare", "--task", "sst2")
        for seed in args.seeds:
            for method in args.methods:
                for grouped in (False, True):
                    sets = [
                        "--set",
                        f"train.seed={seed}",
                        "--set",
                        f"train.group_by_length={str(grouped).lower()}",
                    ]
                    seconds = aclpipe(work, "finetune", "--task", "sst2", "--method", method, *sets)
                    aclpipe(work, "evaluate", "--task", "sst2", "--method", method, *sets)
                    run = {"method": method, "seed": seed, "grouped": grouped,
                           "finetune_seconds": round(seconds, 1), "dev": dev_scores(work, method)}  # fmt: skip
                    runs.append(run)
                    print(json.dumps(run), flush=True)
                    shutil.rmtree(work / "models", ignore_errors=True)
    result = {
        "command": "python benchmarks/length_grouping.py " + " ".join(sys.argv[1:]),
        "date": started,
        "rows": args.rows,
        "threads": os.environ.get("OMP_NUM_THREADS", "default"),
        "machine": machine(),
        "load_start": round(load, 2),
        "load_end": round(os.getloadavg()[0], 2),
        "stack": environment("cpu"),  # the fields a campaign run records
        "runs": runs,
        "summary": summarise(runs),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result["summary"], indent=2))


if __name__ == "__main__":
    main()
