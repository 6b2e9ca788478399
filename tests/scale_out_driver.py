"""Several finetune runs in one torchrun launch (``test_distributed.py``, the scale-out tests).

    torchrun --nproc_per_node P tests/scale_out_driver.py plan.json

``plan.json`` holds ``{"runs": [{"name", "method", "params", "data", "out"}, ...], "float64"}``:
each run is the finetune stage on SST-2 with raw params (a params.yaml mapping), in float64
when ``float64`` is true. Starting the processes
and their group costs more than a tiny run, so one launch trains every configuration in turn.
Each process writes ``shards-<rank>.json`` next to the plan: per run, the length of every
shard it trained on.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from rich.console import Console

from aclpipe.config import params_from_dict
from aclpipe.data.tasks import get_task
from aclpipe.stages.finetune import finetune
from aclpipe.training import loop


def main(plan_path: Path) -> None:
    plan = json.loads(plan_path.read_text(encoding="utf-8"))
    lengths: list[int] = []
    shard = loop.shard

    def recorded(global_batch: list[int], rank: int, size: int) -> list[int]:
        part = shard(global_batch, rank, size)
        lengths.append(len(part))
        return part

    loop.shard = recorded  # the loop's own call, observed
    if plan.get("float64"):
        in_float64()
    shards = {}
    for run in plan["runs"]:
        lengths.clear()
        params = params_from_dict(run["params"])
        out = Path(run["out"])
        finetune(get_task("sst2"), run["method"], params, Path(run["data"]), out, Console())
        shards[run["name"]] = list(lengths)
    rank = os.environ.get("RANK", "0")
    (plan_path.parent / f"shards-{rank}.json").write_text(json.dumps(shards), encoding="utf-8")


def in_float64() -> None:
    """Train in float64 from here on: heads are built in the default dtype, the encoder is cast.

    In float32, shards padded to their own lengths round differently from the global batch;
    Adam divides each gradient element by its own scale, so on elements whose gradient nearly
    cancels over the batch (a tiny random encoder's shallow [CLS] barely varies) that rounding
    grows to a few percent of a step. In float64 the comparison with one process is sharp."""
    torch.set_default_dtype(torch.float64)
    load = loop.load_encoder
    loop.load_encoder = lambda *args, **kwargs: load(*args, **kwargs).double()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
