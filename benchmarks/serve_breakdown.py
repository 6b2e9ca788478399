"""Where a /predict request's time goes in `aclpipe serve`, stage by stage.

One real ``aclpipe serve`` process on an ephemeral 127.0.0.1 port, started through a small
launcher that wraps the server's own functions with timers (nothing in the package is
changed); two loads, each against a fresh server: one connection sending one request at a
time (``light``), and ``--connections`` connections closed-loop (``loaded``, each sends its
next request as soon as its answer is in). Per answered request, the mean milliseconds of:

- ``parse``: the body read into records and checked (the event loop);
- ``tokenize``: the records' tokenization, as the request waits for it (the event loop, or
  inside the worker's batch where tokenizing happens there);
- ``queue``: from admission to the worker taking the request into a batch;
- ``batch``: the worker's whole engine call for the request's batch (every request of a
  batch waits for all of it), split into ``inference`` (the engine), ``format`` (the output
  records), ``pad`` and ``handover`` (the rest: the records written as JSON lines and read
  back, when the server does that);
- ``wakeup``: from the worker finishing the batch to the event loop resuming the request;
- ``respond``: the answer shaped (where the event loop does it) and rendered as JSON;
- ``http``: the rest of the time the client saw (reading the request, routing, writing the
  answer, the event loop's turns between requests).

The sum of the stages is the mean latency the client saw. Batch-level timers are counted
once per request of the batch (latency); beside them, ``per_record_ms`` is the worker's batch
time per record it answered (its cost). Traffic goes to 127.0.0.1 only, bounded in time.

Usage (from the repository root, a minute)::

    python benchmarks/serve_breakdown.py --export models/sst2/acl-cl/export [--precision int8]
        [--out benchmarks/results/serve_breakdown.json]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import re
import select
import signal
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve_load import Client, add_engine_options, closed_loop, sst2_dev, stack  # noqa: E402
from threads import machine, recorded_path  # noqa: E402

from aclpipe.atomic import write_text  # noqa: E402

# Wraps the server's functions with timers, then runs the CLI; prints the totals as one JSON
# line on stdout at exit. Every hook is applied only where its target exists, so the same
# launcher times the server before and after a change of its internals.
LAUNCHER = r"""
import asyncio, atexit, collections, json, sys, threading, time
totals, counts, lock, local = collections.Counter(), collections.Counter(), threading.Lock(), threading.local()
def add(stage, seconds, n=1, per=None):
    with lock:
        totals[stage] += seconds * n if per is None else seconds
        counts[stage] += n if per is None else per
def timed(owner, name, stage, per_batch=False):
    inner = getattr(owner, name, None)
    if inner is None:
        return
    def wrapper(*args, **kwargs):
        began = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            took = time.perf_counter() - began
            if per_batch:
                add(stage, took, getattr(local, "jobs", 1))
                add(stage + ":record", took, per=getattr(local, "records", 1))
            else:
                add(stage, took)
    setattr(owner, name, wrapper)
import aclpipe.early_exit.serve as serve, aclpipe.early_exit.scheduler as scheduler
import aclpipe.early_exit.predict as predict, aclpipe.early_exit.onnx_runtime as onnx_runtime
import starlette.responses
try:  # the endpoints' module, where read_body and tokenize are looked up (serve.py before it)
    import aclpipe.early_exit.routes as routes
except ImportError:
    routes = serve
timed(routes, "parse_records", "parse")
timed(routes, "read_body", "parse")
timed(routes, "tokenize", "tokenize")
timed(starlette.responses.JSONResponse, "render", "respond")
if hasattr(routes, "Answers"):
    timed(routes.Answers, "__call__", "respond")
take = scheduler.MicroBatcher._take
def taking(self):
    batch = take(self)
    if batch:
        now = time.perf_counter()
        for job in batch:
            add("queue", now - job.arrived)
        local.jobs, local.records = len(batch), sum(len(getattr(job, "items", None) or job.pairs) for job in batch)
        add("batches", 0.0)
    return batch
scheduler.MicroBatcher._take = taking
timed(scheduler.PredictorAdapter, "answer", "batch", per_batch=True)
timed(predict, "encode", "tokenize_in_batch", per_batch=True)
timed(predict, "pad", "pad", per_batch=True)
timed(predict.Predictor, "answers", "format", per_batch=True)
if hasattr(predict.Predictor, "run_rows"):  # answers is not on the server's path there
    timed(predict.Predictor, "outputs", "format", per_batch=True)
timed(onnx_runtime.OnnxEarlyExit, "__call__", "inference", per_batch=True)
wrap = asyncio.wrap_future
def wrap_future(future, *, loop=None):
    done = {}
    future.add_done_callback(lambda f: done.__setitem__("at", time.perf_counter()))
    waited = wrap(future, loop=loop)
    waited.add_done_callback(lambda f: add("wakeup", time.perf_counter() - done.get("at", time.perf_counter())))
    return waited
asyncio.wrap_future = wrap_future
atexit.register(lambda: print(json.dumps({"totals": dict(totals), "counts": dict(counts)}), flush=True))
from aclpipe.cli import app
sys.argv = ["aclpipe", *sys.argv[1:]]
app()
"""

STAGES = ("parse", "tokenize", "queue", "batch", "wakeup", "respond")
IN_BATCH = ("inference", "format", "pad", "tokenize_in_batch")


def start(export: Path, options: list[str]) -> tuple[subprocess.Popen, int]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = ["serve", "--model", str(export), "--port", "0", *options]
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    ready, _, _ = select.select([proc.stderr], [], [], 300)
    line = proc.stderr.readline().decode() if ready else ""
    found = re.search(r"http://127\.0\.0\.1:(\d+)", line)
    if not found:
        proc.kill()
        sys.exit(f"the server did not start: {line.strip()}")
    return proc, int(found.group(1))


def stop(proc: subprocess.Popen) -> dict:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    return json.loads(out.decode().strip().splitlines()[-1])


async def one_at_a_time(port: int, sentences: list[str], count: int) -> dict:
    client, loop, latencies = Client(port), asyncio.get_running_loop(), []
    for i in range(count):
        body = json.dumps({"text": sentences[i % len(sentences)]}).encode()
        began = loop.time()
        assert await client.post(body) == 200
        latencies.append(loop.time() - began)
    client.close()
    return {"answered": count, "mean_s": sum(latencies) / count}


def breakdown(timers: dict, answered: int, mean_latency: float) -> dict:
    """Mean ms per answered request of each stage, and the rest as ``http``."""
    totals, counts = timers["totals"], timers["counts"]
    ms = {s: 1000 * totals.get(s, 0.0) / answered for s in (*STAGES, *IN_BATCH)}
    ms["tokenize"] += ms.pop("tokenize_in_batch")
    inside = sum(ms[s] for s in ("inference", "format", "pad"))
    inside += 1000 * totals.get("tokenize_in_batch", 0.0) / answered
    ms["handover"] = max(0.0, ms["batch"] - inside)
    ms["http"] = 1000 * mean_latency - sum(ms[s] for s in STAGES) - (
        ms["tokenize"] if "tokenize_in_batch" not in totals else 0.0)  # fmt: skip
    per_record = {"batch": 1000 * totals["batch:record"] / counts["batch:record"]}
    rounded = {k: round(v, 3) for k, v in ms.items()}
    return {"mean_latency_ms": round(1000 * mean_latency, 3), "stages_ms": rounded,
            "per_record_ms": {k: round(v, 3) for k, v in per_record.items()},
            "batches": counts.get("batches", 0), "answered": answered}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_engine_options(parser)
    parser.add_argument("--light", type=int, default=300, help="requests sent one at a time")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0, help="the loaded run's length")
    parser.add_argument("--label", default="current", help="the key this run's figures go under")
    parser.add_argument(
        "--commit", help="the commit of the aclpipe on PYTHONPATH (default: this checkout's HEAD)"
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/serve_breakdown.json"))
    args = parser.parse_args()
    sentences = sst2_dev(args.glue_dir)
    options = ["--precision", args.precision, "--threads", str(args.threads)]
    here = Path(__file__).resolve().parent
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here,
                                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    result = {"commit": commit}
    for load in ("light", "loaded"):
        proc, port = start(args.export, options)
        asyncio.run(closed_loop(port, 4, 1.0, sentences))  # warm-up, then the timers restart
        stop(proc)
        proc, port = start(args.export, options)
        if load == "light":
            run = asyncio.run(one_at_a_time(port, sentences, args.light))
            answered, mean = run["answered"], run["mean_s"]
        else:
            run = asyncio.run(closed_loop(port, args.connections, args.seconds, sentences))
            answered = run["answered"]
            mean = run["seconds"] * args.connections / max(1, answered)  # Little's law
            result["loaded_throughput_per_s"] = run["throughput_per_s"]
            result["loaded_p99_s"] = run["p99_s"]
        timers = stop(proc)
        result[load] = breakdown(timers, answered, mean)
        print(f"{load}: {json.dumps(result[load])}", file=sys.stderr, flush=True)
    previous = json.loads(args.out.read_text(encoding="utf-8")) if args.out.is_file() else {}
    runs = {**previous.get("runs", {}), args.label: {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "export": recorded_path(args.export), "precision": args.precision,
        "default_setting": json.loads((args.export / "export.json").read_text(encoding="utf-8"))
        .get("default_setting"),  # what the server runs: no --policy or --threshold given
        "threads": args.threads, "connections": args.connections, "machine": machine(),
        "stack": stack(), "load_average_at_end": os.getloadavg(), **result,
    }}  # fmt: skip
    write_text(args.out, json.dumps({"runs": runs}, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
