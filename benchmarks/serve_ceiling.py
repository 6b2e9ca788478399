"""What the server's batches can reach: random arrivals against predict's sorted batches.

``aclpipe serve`` runs whatever requests wait when its worker frees up, up to ``--max-batch``
records, cut into groups of similar length (``aclpipe.early_exit.scheduler.length_groups``),
one engine call each; ``aclpipe predict`` sorts 2,048 sentences by length before it cuts
batches of 32. Under a closed-loop load the worker finds fewer requests waiting than there are
connections: at 16 connections about 8 (docs/serving.md, where a request's time goes: two
batches alternate, one running while the other's clients send their next requests). This
measures, in process and without HTTP, the engine path (padding, engine,
outputs) on the SST-2 dev sentences, tokenized once and shuffled (one seed), run in batches of
``k`` arrivals each cut by ``length_groups``, against ``Predictor.run_rows`` on all of them at
once (sorted, batches of ``--max-batch``): the share of predict's throughput that a server
seeing batches of k random arrivals cannot exceed, whatever its HTTP costs. Side by side in
one run, ``--rounds`` rounds, every k in each; a ratio is that round's against sorted.

Usage (from the repository root, after `dvc repro`)::

    python benchmarks/serve_ceiling.py [--export models/sst2/acl-cl/export] [--precision int8]
        [--arrivals 1,4,8,16,32] [--rounds 3] [--out benchmarks/results/serve_ceiling.json]
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve_load import add_engine_options, sst2_dev, stack  # noqa: E402
from threads import machine, recorded_path  # noqa: E402

from aclpipe.atomic import write_text  # noqa: E402
from aclpipe.early_exit.predict import Predictor  # noqa: E402
from aclpipe.early_exit.scheduler import CALL_TOKENS, PredictorAdapter  # noqa: E402
from aclpipe.early_exit.tokens import encode  # noqa: E402


def per_second(run, count: int) -> float:
    began = time.perf_counter()
    run()
    return round(count / (time.perf_counter() - began), 1)


def run_arrivals(adapter: PredictorAdapter, arrivals: list[dict], k: int) -> list:
    """The server's engine path over ``arrivals`` (token rows): each k in turn one batch through
    ``PredictorAdapter.answer`` (cut by ``length_groups``, one engine call per group), as the
    worker runs what waits; the outputs in arrival order."""
    out: list = []
    for start in range(0, len(arrivals), k):
        out += adapter.answer(arrivals[start : start + k])
    return out


def medians(rounds: list[dict], sizes: list[int]) -> dict:
    """Per k, the median over ``rounds`` of its ratio to sorted batches."""
    return {f"median_ratio_arrivals_{k}": statistics.median(r[f"ratio_arrivals_{k}"] for r in rounds)
            for k in sizes}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_engine_options(parser)
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--arrivals", default="1,4,8,16,32", help="batch sizes k, <= --max-batch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/serve_ceiling.json"))
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    sizes = [int(k) for k in args.arrivals.split(",")]
    if max(sizes) > args.max_batch:
        sys.exit(f"--arrivals {args.arrivals}: a batch holds at most --max-batch {args.max_batch}")
    predictor = Predictor(args.export, batch_size=args.max_batch, threads=args.threads,
                          precision=args.precision)  # fmt: skip
    rows = encode(predictor.tokenizer, [(s, None) for s in sst2_dev(args.glue_dir)])
    arrivals = rows[:]
    random.Random(args.seed).shuffle(arrivals)
    adapter = PredictorAdapter(predictor)  # what the server's worker calls

    predictor.run_rows(rows)  # warm-up
    rounds = []
    for r in range(args.rounds):
        row = {"sorted": per_second(lambda: predictor.run_rows(rows), len(rows))}
        for k in sizes:
            run = functools.partial(run_arrivals, adapter, arrivals, k)
            row[f"arrivals_{k}"] = per_second(run, len(rows))
            row[f"ratio_arrivals_{k}"] = round(row[f"arrivals_{k}"] / row["sorted"], 3)
        rounds.append(row)
        print(f"round {r}: {json.dumps(row)}", file=sys.stderr, flush=True)
    shares = medians(rounds, sizes)
    out = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "export": recorded_path(args.export),
        "precision": args.precision,
        "threads": args.threads,
        "max_batch": args.max_batch,
        "call_tokens": CALL_TOKENS,
        "sentences": len(rows),
        "seed": args.seed,
        "machine": machine(),
        "stack": stack(),
        "load_average_at_end": os.getloadavg(),
        "rounds": rounds,
        **shares,
        "median_sorted_per_s": statistics.median(r["sorted"] for r in rounds),
    }
    write_text(args.out, json.dumps(out, indent=2) + "\n")
    print(json.dumps(shares, indent=2))


if __name__ == "__main__":
    main()
