"""`aclpipe serve` under load: open-loop Poisson arrivals at rising rates, to 127.0.0.1 only.

Four servers, one after another, each a real ``aclpipe serve`` process on an ephemeral
127.0.0.1 port with one intra-op thread:

- ``ee-fp32``: early exit on ONNX Runtime at the export's default setting (float32 segments);
- ``ee-int8``: the same with the int8 segments (``--precision int8``), when the export has them;
- ``ee-fp32-iteration``, ``ee-int8-iteration``: the same two with ``--scheduler iteration``
  (iteration-level scheduling; the others micro-batch, ``--scheduler batch``);
- ``full-onnx``: the same server with ``--policy none`` (the full model on ONNX Runtime);
- ``naive-torch``: the naive deployment, the full PyTorch model called once per request
  (``--engine torch --policy none --max-batch 1``: one request, one model call, in turn);
- ``ee-fp32-shadow`` (with ``--shadow F``): ``ee-fp32`` with ``aclpipe serve --shadow F``, run
  right after it; the JSON's ``shadow`` holds its /info counts at the end (records drawn and
  observed, seconds served and spent in shadow work).

For each server the generator offers rates in steps (``--rates``, requests/s, each step
``--seconds`` long, or ``--min-requests`` long at a slow rate): arrival times drawn from a
Poisson process (exponential gaps, seeded), each request sent at its time whatever the replies
(open loop: a slow server cannot slow the arrivals, so queueing shows), one SST-2 dev sentence
per request, in order. A request's latency runs from its scheduled time to the last byte of
its answer (``p50_s``...; ``p50_from_send_s`` counts from the moment it was written instead,
leaving out the generator's own lateness on a busy machine); one not answered within
``--timeout`` seconds counts as an error, as does any status but 200 (503 from a full queue
included). Per rate: p50/p95/p99 latency, throughput and errors. Throughput is counted two
ways: ``throughput_per_s``, every answer over the step's whole time, the drain of the last
queued requests included; ``throughput_in_step_per_s``, the answers that came in while the
arrivals lasted, per second of ``--seconds``: a closed-loop client's measure (wrk counts the
answers within its duration), so that the two compare at one rate (peers.py). Near saturation
they part: a queue built at a rate the server only just holds drains after the last arrival,
which the first counts against the server. A server's steps stop at the first rate it cannot
keep up with (errors over 5%, or p99 over 1 s): past saturation.

Targets, each a ratio from this one run: the highest rate held (p99 <= 50 ms and no
errors, at that rate and every lower one) by the early-exit server is >= 5x the naive
deployment's and >= 1.5x the full-model ONNX server's; at the lightest rate its p50 is within
1 ms + 20% of in-process batch-1 `predict` time for the same sentences (timed here, in this
process, with the same engine, setting and one thread), checked against two in-process times:
back to back (caches hot) and at the light step's own arrival times (idle between calls, as
the server is: the like-for-like one; ``in_process_batch1``).

``--saturation`` measures instead what the server delivers of its engine (the targets:
>= 0.85 of in-process ``predict`` throughput at the same engine threads and batch limit, and
p99 <= 30 ms at 16 connections): per round, side by side, in-process ``predict`` (batch size
``--max-batch``, one thread) on the dev sentences, then the server driven closed-loop at each
of ``--connections`` (by ``wrk`` where installed: a C client takes little of the cores it
shares with the server), and with ``--baseline-src`` the same server from another checkout's
``src``; then, at light load (one request at a time, 10 ms apart, each variant in turn), the
p50 of the server with predict's body, with TEI's body and with ``--api-key`` (and of the
baseline). JSON in ``benchmarks/results/serve_saturation.json``.

Usage (from the repository root, after ``dvc repro``; a few minutes)::

    python benchmarks/serve_load.py [--export models/sst2/acl-cl/export]
        [--glue-dir ../shared/glue] [--rates 10,14,20,28,40,57,80,113,160,226,320,453,640]
        [--seconds 6] [--out benchmarks/results/serve_load.json]
        [--figure reports/serve/latency_vs_load.png]
    python benchmarks/serve_load.py --saturation --only ee-int8 [--baseline-src ../old/src]
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import datetime
import json
import os
import random
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from threads import machine, recorded_path  # noqa: E402

from aclpipe.atomic import write_text  # noqa: E402

# The light-load target reads the p50 from the moment each request was written: at a light
# load nothing queues, and the time from the scheduled moment adds the generator's own
# lateness (asyncio's timers wake up to 1 ms late, epoll timeouts being whole milliseconds:
# 1.3 ms at the median in the run of b2193de), which is no part of the server's latency.
# Both p50s are written out.
LIGHT_P50 = "p50_from_send_s"
P99_TARGET = 0.050  # seconds: the latency a rate must keep to count as held
SATURATED_P99 = 1.0  # seconds: past this (or 5% errors) a server's steps stop
SATURATED_ERRORS = 0.05
LIGHT_KEY = "a-benchmark-api-key"  # the light-load comparison's --api-key


def sst2_dev(glue_dir: Path) -> list[str]:
    with open(glue_dir / "SST-2" / "dev.tsv", encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [row[0] for row in rows[1:]]


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    """The options of a benchmark that runs one export's int8 engine on the SST-2 dev sentences
    (serve_breakdown.py, serve_ceiling.py): ``--export``, ``--glue-dir``, ``--precision``,
    ``--threads``."""
    parser.add_argument("--export", type=Path, default=Path("models/sst2/acl-cl/export"))
    parser.add_argument("--glue-dir", type=Path, default=Path("../shared/glue"))
    parser.add_argument("--precision", default="int8")
    parser.add_argument("--threads", type=int, default=1)


def contenders(
    export: Path, record: dict, threads: int, max_wait_ms: float, setting: list[str],
    shadow: float = 0.0,
) -> dict[str, list[str]]:  # fmt: skip
    """Each server's options; ``setting`` is the early-exit servers' ``--policy`` and
    ``--threshold`` (empty: the export's default setting); ``shadow`` > 0 adds
    ``ee-fp32-shadow``."""
    common = ["--threads", str(threads), "--max-wait-ms", str(max_wait_ms)]
    iteration = ["--scheduler", "iteration"]
    out = {"ee-fp32": [*common, *setting]}
    if shadow > 0:
        out["ee-fp32-shadow"] = [*common, *setting, "--shadow", repr(shadow)]
    out["ee-fp32-iteration"] = [*common, *setting, *iteration]
    if (record.get("int8") or {}).get("segments"):
        out["ee-int8"] = [*common, *setting, "--precision", "int8"]
        out["ee-int8-iteration"] = [*common, *setting, "--precision", "int8", *iteration]
    out["full-onnx"] = [*common, "--policy", "none"]
    out["naive-torch"] = [*common, "--engine", "torch", "--policy", "none", "--max-batch", "1"]
    return out


class Server:
    def __init__(self, export: Path, options: list[str], source: Path | None = None) -> None:
        """``source``: a ``src`` folder of another aclpipe checkout to run instead (a baseline)."""
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        if source is not None:
            env["PYTHONPATH"] = str(source)
        command = [sys.executable, "-m", "aclpipe.cli", "serve", "--model", str(export),
                   "--port", "0", *options]  # fmt: skip
        self.proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE)
        ready, _, _ = select.select([self.proc.stderr], [], [], 300)
        line = self.proc.stderr.readline().decode() if ready else ""
        found = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if not found:
            self.proc.kill()
            sys.exit(f"the server did not start: {line.strip()}")
        self.port, self.banner = int(found.group(1)), line.strip()
        # what it prints later (``--recalibrate``'s moves) is read as it comes, with the time
        # it came: a full pipe would block the server
        self.lines: list[tuple[float, str]] = []
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for raw in self.proc.stderr:
            self.lines.append((time.monotonic(), raw.decode(errors="replace").rstrip("\n")))

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        return self.proc.returncode


class Client:
    """HTTP/1.1 POSTs over keep-alive connections to 127.0.0.1: an idle connection is reused,
    else a new one opened, so every request goes out at its time.

    An idle connection the server may have closed is never reused: the server ends a
    connection idle for its keep-alive time (``aclpipe serve``: 5 s), and a request written
    into one that is closing fails with no answer (an ``IncompleteReadError``, when a burst
    takes a connection idle since an earlier burst).
    So one idle past ``REUSE_WITHIN`` seconds, or one whose end the server already sent, is
    closed and a fresh one opened, as HTTP client libraries check a pooled connection."""

    REUSE_WITHIN = 2.0  # seconds; well inside the server's 5 s keep-alive

    def __init__(self, port: int, path: str = "/predict") -> None:
        self.port, self.path, self.idle = port, path, []  # idle: (reader, writer, idle since)
        self.opened = 0

    async def _connection(self):
        now = time.monotonic()
        while self.idle:
            reader, writer, since = self.idle.pop()
            if now - since <= self.REUSE_WITHIN and not reader.at_eof():
                return reader, writer
            writer.close()
        self.opened += 1
        return await asyncio.open_connection("127.0.0.1", self.port)

    async def exchange(self, body: bytes, headers: str = "") -> tuple[int, bytes]:
        """POST ``body`` to the client's path; the status and the answer's body. ``headers``:
        extra header lines, each ending in CRLF."""
        reader, writer = await self._connection()
        head = (f"POST {self.path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                f"application/json\r\n{headers}Content-Length: {len(body)}\r\n\r\n").encode()  # fmt: skip
        writer.write(head + body)
        header = await reader.readuntil(b"\r\n\r\n")
        status = int(header.split(b" ", 2)[1])
        length = int(re.search(rb"(?i)content-length: *(\d+)", header).group(1))
        answer = await reader.readexactly(length)
        if re.search(rb"(?i)connection: *close", header):
            writer.close()
        else:
            self.idle.append((reader, writer, time.monotonic()))
        return status, answer

    async def post(self, body: bytes, headers: str = "") -> int:
        """``exchange``'s status alone."""
        return (await self.exchange(body, headers))[0]

    def close(self) -> None:
        for _, writer, _ in self.idle:
            writer.close()


def arrivals(rate: float, seconds: float, seed: int) -> list[float]:
    """Poisson arrival times (seconds from the step's start) at ``rate`` per second."""
    rng = random.Random(seed)
    times, t = [], rng.expovariate(rate)
    while t < seconds:
        times.append(t)
        t += rng.expovariate(rate)
    return times


def predict_body(text: str) -> bytes:
    """``aclpipe serve``'s /predict body for one sentence."""
    return json.dumps({"text": text}).encode()


async def offer(port: int, rate: float, seconds: float, sentences: list[str], seed: int,
                timeout: float, path: str = "/predict", body=predict_body,
                on_answer=None) -> dict:  # fmt: skip
    """One step: Poisson arrivals at ``rate`` for ``seconds``; latencies and errors. Request
    ``i`` posts ``body(sentences[i % len(sentences)])`` to ``path``; ``on_answer(i, answer)``,
    when given, sees the body of each answer with status 200 (peers.py scores its label)."""
    times = arrivals(rate, seconds, seed)
    client, loop = Client(port, path), asyncio.get_running_loop()
    start = loop.time() + 0.05
    latencies: list[float] = []
    from_send: list[float] = []  # from the moment it was written: without the client's lag
    in_step: list[bool] = []  # answered before the step's arrivals end
    errors: dict[str, int] = {}

    async def one(i: int, at: float) -> None:
        await asyncio.sleep(max(0.0, start + at - loop.time()))
        request = body(sentences[i % len(sentences)])
        sent = loop.time()
        try:
            status, answer = await asyncio.wait_for(client.exchange(request), timeout)
        except (TimeoutError, OSError, asyncio.IncompleteReadError) as err:
            errors[type(err).__name__] = errors.get(type(err).__name__, 0) + 1
            return
        if status != 200:
            errors[str(status)] = errors.get(str(status), 0) + 1
            return
        latencies.append(loop.time() - start - at)  # from its scheduled time: open loop
        from_send.append(loop.time() - sent)
        in_step.append(loop.time() - start <= seconds)
        if on_answer is not None:
            on_answer(i, answer)

    await asyncio.gather(*(one(i, at) for i, at in enumerate(times)))
    took = loop.time() - start
    client.close()

    def pct(q: float, values: list[float] = latencies) -> float | None:
        ranked = sorted(values)
        return round(ranked[min(len(ranked) - 1, int(q * len(ranked)))], 5) if ranked else None

    failed = sum(errors.values())
    return {
        "offered_per_s": rate,
        "requests": len(times),
        "answered": len(latencies),
        "errors": failed,
        "errors_by_kind": errors,
        "error_share": round(failed / max(1, len(times)), 4),
        "throughput_per_s": round(len(latencies) / took, 2),
        "throughput_in_step_per_s": round(sum(in_step) / seconds, 2),
        "p50_s": pct(0.50),
        "p95_s": pct(0.95),
        "p99_s": pct(0.99),
        "p50_from_send_s": pct(0.50, from_send),
        "p99_from_send_s": pct(0.99, from_send),
        "seconds": round(took, 2),
        "connections_opened": client.opened,
    }


def held(step: dict) -> bool:
    return step["errors"] == 0 and step["p99_s"] is not None and step["p99_s"] <= P99_TARGET


def held_from_the_bottom(steps: list[dict]) -> float:
    """The highest rate with every step up to it held (0 when the lowest is not): the figure
    the targets compare, stricter than the highest held step, which noise can leave above a
    failed one."""
    rate = 0.0
    for step in steps:
        if not held(step):
            break
        rate = step["offered_per_s"]
    return rate


def summarize(results: dict[str, list[dict]]) -> dict:
    """Per server the highest rate held, the highest held from the bottom and the most
    answers per second of any step; the targets' ratios (held from the bottom) and, beside
    them, the same ratios of the saturation throughput, which a noisy p99 does not zero."""
    best = {n: max([s["offered_per_s"] for s in steps if held(s)], default=0.0)
            for n, steps in results.items()}  # fmt: skip
    held_up_to = {n: held_from_the_bottom(steps) for n, steps in results.items()}
    most = {n: max(s["throughput_per_s"] for s in steps) for n, steps in results.items()}
    targets, throughput_ratios = [], []
    for name in [n for n in results if n.startswith("ee-")]:
        for other, goal in (("naive-torch", 5.0), ("full-onnx", 1.5)):
            if held_up_to.get(name) and held_up_to.get(other):
                value = held_up_to[name] / held_up_to[other]
                targets.append({"ratio": f"{name}/{other}", "value": round(value, 2),
                                "target": goal, "met": value >= goal})  # fmt: skip
            else:
                targets.append({"ratio": f"{name}/{other}", "value": None, "target": goal,
                                "met": None, "why": "a server held no rate from the lowest"})  # fmt: skip
            if most.get(other):
                throughput_ratios.append({"ratio": f"{name}/{other}",
                                          "value": round(most[name] / most[other], 2)})  # fmt: skip
    return {
        "highest_rate_held_p99_50ms": best,
        "held_up_to_p99_50ms": held_up_to,
        "targets": targets,
        "saturation_throughput_per_s": most,
        "saturation_throughput_ratios": throughput_ratios,
    }


def in_process_batch1(
    export: Path, options: list[str], sentences: list[str], policy: str | None,
    threshold: float | None, schedule: list[float], hot_count: int,
) -> dict[str, float]:  # fmt: skip
    """Median seconds of one `predict` call at batch 1 (whole path: tokenize, run, format),
    same engine, setting and one thread, two ways:

    - ``back_to_back_s``: calls one after another, caches hot;
    - ``at_light_load_s``: one call at each arrival of the light step's ``schedule`` (the
      same Poisson times and sentences the server got), idle between, as the server is. An
      idle gap of ~100 ms costs the call itself ~0.9 ms here (caches and branch predictors
      go cold: 2.23 ms back to back against 3.11 ms with 20 ms gaps, int8, one probe), so this
      is the like-for-like reference for the server's light-load p50."""
    from aclpipe.early_exit.predict import Predictor

    precision = "int8" if "int8" in options else "fp32"
    predictor = Predictor(export, policy, threshold, batch_size=1, threads=1,
                          precision=precision)  # fmt: skip
    for sentence in sentences[:20]:
        list(predictor.records([sentence]))
    hot = []
    for sentence in sentences[:hot_count]:
        began = time.perf_counter()
        list(predictor.records([sentence]))
        hot.append(time.perf_counter() - began)
    light, start = [], time.perf_counter() + 0.05
    for i, at in enumerate(schedule):
        time.sleep(max(0.0, start + at - time.perf_counter()))
        began = time.perf_counter()
        list(predictor.records([sentences[i % len(sentences)]]))
        light.append(time.perf_counter() - began)
    return {"back_to_back_s": statistics.median(hot), "at_light_load_s": statistics.median(light)}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True)
    for name, steps in results.items():
        rates = [s["offered_per_s"] for s in steps]
        for ax, key in zip(axes, ("p50_s", "p99_s")):
            ax.plot(rates, [1000 * (s[key] or float("nan")) for s in steps], "o-", label=name)
    for ax, title in zip(axes, ("p50 latency", "p99 latency")):
        ax.axhline(1000 * P99_TARGET, color="grey", ls=":", lw=1)
        ax.set(xscale="log", yscale="log", xlabel="offered load (requests/s, Poisson)",
               ylabel="ms", title=title)  # fmt: skip
        ax.grid(True, which="both", alpha=0.3)
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
            axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xticks([s["offered_per_s"] for s in max(results.values(), key=len)])
    axes[1].legend(fontsize=8)
    fig.suptitle("aclpipe serve, SST-2 dev sentences, 1 thread, 127.0.0.1 (dotted: 50 ms)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}")
    fig.savefig(tmp, dpi=120, format="png")
    os.replace(tmp, path)


async def closed_loop(port: int, connections: int, seconds: float, sentences: list[str],
                      headers: str = "", seed: int = 0) -> dict:  # fmt: skip
    """``connections`` clients, each on one keep-alive connection, each sending its next
    request as soon as its answer is in (wrk's model), for ``seconds``: answers per second,
    latency percentiles and errors. Requests take the sentences in turn from a seeded start."""
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    errors: dict[str, int] = {}
    stop = loop.time() + seconds
    offset = random.Random(seed).randrange(len(sentences))

    async def client(lane: int) -> None:
        conn, i = Client(port), offset + lane
        while loop.time() < stop:
            body = json.dumps({"text": sentences[i % len(sentences)]}).encode()
            i += connections
            began = loop.time()
            try:
                status = await asyncio.wait_for(conn.post(body, headers), 10)
            except (TimeoutError, OSError, asyncio.IncompleteReadError) as err:
                errors[type(err).__name__] = errors.get(type(err).__name__, 0) + 1
                conn = Client(port)
                continue
            if status != 200:
                errors[str(status)] = errors.get(str(status), 0) + 1
                continue
            latencies.append(loop.time() - began)
        conn.close()

    began = loop.time()
    await asyncio.gather(*(client(lane) for lane in range(connections)))
    took = loop.time() - began
    ranked = sorted(latencies)

    def pct(q: float) -> float | None:
        return round(ranked[min(len(ranked) - 1, int(q * len(ranked)))], 5) if ranked else None

    return {
        "connections": connections,
        "answered": len(latencies),
        "errors_by_kind": errors,
        "throughput_per_s": round(len(latencies) / took, 1),
        "p50_s": pct(0.50),
        "p99_s": pct(0.99),
        "seconds": round(took, 2),
    }


WRK_SCRIPT = """
bodies = {%s}
i = %d
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
request = function()
  i = i + 1
  return wrk.format(nil, nil, nil, bodies[(i %% #bodies) + 1])
end
"""
WRK_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


def wrk_loop(port: int, connections: int, seconds: float, sentences: list[str],
             seed: int = 0) -> dict:  # fmt: skip
    """``closed_loop``'s measurement made by ``wrk`` (one thread, C, so the client takes
    little of the cores the server shares with it): the same fields."""
    bodies = ",".join("[==[" + json.dumps({"text": s}) + "]==]" for s in sentences)
    start = random.Random(seed).randrange(len(sentences))
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(WRK_SCRIPT % (bodies, start))
    try:
        done = subprocess.run(
            ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--timeout", "10s", "--latency",
             "-s", script.name, f"http://127.0.0.1:{port}/predict"],
            capture_output=True, text=True, timeout=seconds + 60,
        )  # fmt: skip
    finally:
        os.unlink(script.name)
    text = done.stdout

    def latency(percent: str) -> float:
        value, unit = re.search(rf"^\s*{percent}%\s+([\d.]+)(us|ms|s|m)\s*$", text, re.M).groups()
        return round(float(value) * WRK_UNITS[unit], 5)

    answered = int(re.search(r"(\d+) requests in", text).group(1))
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    failed = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    errors = {"non_2xx": int(bad.group(1))} if bad else {}
    if failed:
        errors["socket"] = sum(int(n) for n in failed.groups())
    took = float(re.search(r"requests in ([\d.]+)s", text).group(1))
    ok = answered - errors.get("non_2xx", 0)
    return {
        "connections": connections,
        "answered": ok,
        "errors_by_kind": errors,
        "throughput_per_s": round(ok / took, 1),
        "p50_s": latency("50"),
        "p99_s": latency("99"),
        "seconds": took,
        "client": "wrk",
    }


def in_process_throughput(predictor, sentences: list[str]) -> float:
    """Sentences per second of in-process ``predict`` (``Predictor.records``: tokenize, sort
    by length, batch, run, format) over ``sentences``, the whole path timed."""
    began = time.perf_counter()
    count = sum(1 for _ in predictor.records(sentences))
    return count / (time.perf_counter() - began)


async def light_cost(variants: dict[str, tuple[int, str, bool]], sentences: list[str],
                     count: int, gap: float) -> dict:  # fmt: skip
    """Light load: one request at a time, ``gap`` seconds apart, to each variant in turn
    (``name: (port, extra headers, TEI body)``), the same sentence to every variant, the
    order rotated from one sentence to the next (the first request after a pause measured
    slower, whichever server got it: 12.9 against 5.8 ms, then 11.7 against 6.7 ms with the
    order swapped, in a probe); per variant the p50 and mean latency in ms and its p50's
    difference from the first variant's."""
    clients = {name: Client(port) for name, (port, _, _) in variants.items()}
    loop, times = asyncio.get_running_loop(), {name: [] for name in variants}
    names = list(variants)
    for i in range(count):
        sentence = sentences[i % len(sentences)]
        for name in names[i % len(names) :] + names[: i % len(names)]:
            _, headers, tei = variants[name]
            body = json.dumps({"inputs": sentence} if tei else {"text": sentence}).encode()
            await asyncio.sleep(gap)
            began = loop.time()
            assert await clients[name].post(body, headers) == 200
            times[name].append(loop.time() - began)
    for client in clients.values():
        client.close()
    first = statistics.median(next(iter(times.values())))
    return {name: {"p50_ms": round(1000 * statistics.median(t), 3),
                   "mean_ms": round(1000 * statistics.fmean(t), 3),
                   "p50_added_ms": round(1000 * (statistics.median(t) - first), 3)}
            for name, t in times.items()}  # fmt: skip


def saturation(args, servers: dict[str, list[str]], sentences: list[str]) -> dict:
    """Per server, ``--rounds`` rounds side by side: in-process ``predict`` on the same
    engine, setting, threads and batch limit (``--max-batch``: the server's batch limit and
    predict's batch size), then the server closed-loop at each of ``--connections``; the
    ratio of each round's server throughput to that round's in-process throughput."""
    from aclpipe.early_exit.predict import Predictor

    sample = sentences[: args.sample]
    out = {}
    for name, options in servers.items():
        precision = "int8" if "int8" in options else "fp32"
        policy = "none" if "none" in options else args.policy
        server = Server(args.export, [*options, "--max-batch", str(args.max_batch)])
        baseline = None
        if args.baseline_src is not None:
            baseline = Server(args.export, [*options, "--max-batch", str(args.max_batch)],
                              source=args.baseline_src)  # fmt: skip
            asyncio.run(closed_loop(baseline.port, 4, 1.0, sentences))
        predictor = Predictor(args.export, policy, args.threshold, batch_size=args.max_batch,
                              threads=args.threads, precision=precision)  # fmt: skip
        in_process_throughput(predictor, sample[:200])  # warm-up
        asyncio.run(closed_loop(server.port, 4, 1.0, sentences))
        rounds = []
        for r in range(args.rounds):
            row = {"in_process_per_s": round(in_process_throughput(predictor, sample), 1)}
            for label, running in (("", server), ("baseline_", baseline)):
                if running is None:
                    continue
                for n in args.connections:
                    if args.client == "wrk":
                        step = wrk_loop(running.port, n, args.seconds, sentences, seed=r)
                    else:
                        step = asyncio.run(
                            closed_loop(running.port, n, args.seconds, sentences, seed=r)
                        )
                    row[f"{label}c{n}"] = step
                    share = step["throughput_per_s"] / row["in_process_per_s"]
                    row[f"{label}ratio_c{n}"] = round(share, 3)
            rounds.append(row)
            print(f"{name} round {r}: {json.dumps(row)}", file=sys.stderr, flush=True)
        light = None
        if args.light_requests:
            keyed = Server(args.export, [*options, "--max-batch", str(args.max_batch),
                                         "--api-key", LIGHT_KEY])  # fmt: skip
            bearer = f"Authorization: Bearer {LIGHT_KEY}\r\n"
            asyncio.run(closed_loop(keyed.port, 4, 1.0, sentences, bearer))  # warm, as the others
            variants = {"plain": (server.port, "", False)}
            if baseline is not None:
                variants = {"baseline": (baseline.port, "", False), **variants}
            variants["tei_body"] = (server.port, "", True)
            variants["api_key"] = (keyed.port, bearer, False)
            light = asyncio.run(light_cost(variants, sentences, args.light_requests, 0.01))
            keyed.stop()
            print(f"{name} light: {json.dumps(light)}", file=sys.stderr, flush=True)
        code = server.stop()
        baseline_code = baseline.stop() if baseline is not None else None
        medians = {}
        for label in ("", "baseline_") if baseline is not None else ("",):
            for n in args.connections:
                medians[f"median_{label}ratio_c{n}"] = statistics.median(
                    r[f"{label}ratio_c{n}"] for r in rounds)  # fmt: skip
                medians[f"median_{label}p99_c{n}_s"] = statistics.median(
                    r[f"{label}c{n}"]["p99_s"] for r in rounds)  # fmt: skip
                medians[f"median_{label}throughput_c{n}_per_s"] = statistics.median(
                    r[f"{label}c{n}"]["throughput_per_s"] for r in rounds)  # fmt: skip
        out[name] = {
            "banner": server.banner,
            "baseline_banner": baseline.banner if baseline is not None else None,
            "exit_code_after_sigterm": code,
            "baseline_exit_code_after_sigterm": baseline_code,
            "light_load": light,
            "rounds": rounds,
            **medians,
            "median_in_process_per_s": statistics.median(r["in_process_per_s"] for r in rounds),
        }
    return out


def run_saturation(args, record: dict, setting: list[str], sentences: list[str]) -> None:
    args.connections = [int(n) for n in args.connections.split(",")]
    servers = contenders(args.export, record, args.threads, args.max_wait_ms, setting,
                         args.shadow)  # fmt: skip
    servers = {n: o for n, o in servers.items() if n in (args.only or "ee-int8").split(",")}
    began = time.perf_counter()
    results = saturation(args, servers, sentences)
    out = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "export": recorded_path(args.export),  # no machine path in results
        "default_setting": record.get("default_setting"),
        "machine": machine(),
        "stack": stack(),
        "load_average_at_end": os.getloadavg(),
        "threads": args.threads,
        "max_batch": args.max_batch,
        "max_wait_ms": args.max_wait_ms,
        "seconds_per_step": args.seconds,
        "client": args.client,
        "in_process_sentences": min(args.sample, len(sentences)),
        "baseline": baseline_commit(args.baseline_src),
        "targets": {"ratio_at_saturation": 0.85, "p99_s_at_16_connections": 0.030},
        "servers": results,
        "wall_seconds": round(time.perf_counter() - began, 1),
    }
    if args.out == Path("benchmarks/results/serve_load.json"):
        args.out = Path("benchmarks/results/serve_saturation.json")
    write_text(args.out, json.dumps(out, indent=2) + "\n")
    print(json.dumps({n: {k: v for k, v in r.items() if k.startswith("median")}
                      for n, r in results.items()}, indent=2))  # fmt: skip


def baseline_commit(source: Path | None) -> str | None:
    """The commit a baseline ``src`` folder was taken from, when it says (a BASELINE file
    beside it), else that it was given."""
    if source is None:
        return None
    marker = source.parent / "BASELINE"
    return marker.read_text(encoding="utf-8").strip() if marker.is_file() else "given"


def stack() -> dict[str, str]:
    """Versions of what a request passes through."""
    from importlib.metadata import version

    names = ("onnxruntime", "tokenizers", "starlette", "uvicorn", "numpy")
    return {"python": sys.version.split()[0], **{n: version(n) for n in names}}


def shadow_counts(port: int) -> dict:
    """A ``--shadow`` server's /info counts, once its shadow thread has caught up (10 s at
    most): drawn, refused, observed, dropped, the seconds served and spent in shadow work,
    their ratio, and the window's agreement."""
    import http.client

    deadline = time.monotonic() + 10
    while True:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/info")
        info = json.loads(conn.getresponse().read())["shadow"]
        conn.close()
        if info["pending"] == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    keys = ("fraction", "share", "drawn", "refused", "observed", "dropped", "served_seconds",
            "shadow_seconds")  # fmt: skip
    out = {k: info[k] for k in keys}
    out["shadow_over_served_seconds"] = round(info["shadow_seconds"] / info["served_seconds"], 4)
    c = info["controller"]
    out["window"], out["agreement"], out["lower_bound"] = c["window"], c["agreement"], c["lower_bound"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--export", type=Path, default=Path("models/sst2/acl-cl/export"))
    parser.add_argument("--glue-dir", type=Path, default=Path("../shared/glue"))
    parser.add_argument("--rates", default="10,14,20,28,40,57,80,113,160,226,320,453,640")
    parser.add_argument("--seconds", type=float, default=6.0, help="length of each rate's step")
    parser.add_argument(
        "--min-requests", type=int, default=100, help="a slow rate's step lasts this many requests"
    )
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds before a request fails")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads of each server")
    parser.add_argument("--policy", help="early-exit servers' policy (default: the export's)")
    parser.add_argument("--threshold", type=float, help="and its threshold")
    parser.add_argument("--max-wait-ms", type=float, default=0.0, help="the servers' max wait")
    parser.add_argument("--only", help="comma-separated servers to run (default: all)")
    parser.add_argument("--shadow", type=float, default=0.0, help="F of ee-fp32-shadow (0: none)")
    parser.add_argument("--light", type=int, default=200, help="sentences timed in process")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/serve_load.json"))
    parser.add_argument("--figure", type=Path, default=Path("reports/serve/latency_vs_load.png"))
    parser.add_argument(
        "--saturation", action="store_true",
        help="instead of the open-loop steps: closed-loop saturation against in-process predict",
    )  # fmt: skip
    parser.add_argument("--connections", default="16,64", help="saturation: connections per step")
    parser.add_argument("--rounds", type=int, default=3, help="saturation: rounds side by side")
    parser.add_argument("--max-batch", type=int, default=32, help="saturation: the batch limit")
    parser.add_argument("--sample", type=int, default=872, help="saturation: in-process sentences")
    parser.add_argument(
        "--baseline-src", type=Path,
        help="saturation: also run the server from this src folder (another checkout), side by side",
    )  # fmt: skip
    parser.add_argument(
        "--client", choices=("wrk", "python"), default="wrk" if shutil.which("wrk") else "python",
        help="saturation's load generator: wrk (Debian's package; the default where installed) "
        "or this script's asyncio client",
    )  # fmt: skip
    parser.add_argument(
        "--light-requests", type=int, default=300,
        help="saturation: requests per variant at light load (plain, TEI body, API key; 0: none)",
    )  # fmt: skip
    args = parser.parse_args()
    record = json.loads((args.export / "export.json").read_text(encoding="utf-8"))
    setting = ["--policy", args.policy] if args.policy else []
    if args.threshold is not None:
        setting += ["--threshold", repr(args.threshold)]
    sentences = sst2_dev(args.glue_dir)
    if args.saturation:
        run_saturation(args, record, setting, sentences)
        return
    rates = [float(r) for r in args.rates.split(",")]
    began = time.perf_counter()
    results, banners, stopped, shadow = {}, {}, {}, {}
    servers = contenders(args.export, record, args.threads, args.max_wait_ms, setting,
                         args.shadow)  # fmt: skip
    if args.only:
        servers = {n: o for n, o in servers.items() if n in args.only.split(",")}
    for name, options in servers.items():
        server = Server(args.export, options)
        banners[name] = server.banner
        asyncio.run(offer(server.port, 20, 1.0, sentences, 0, args.timeout))  # warm-up
        steps = []
        for i, rate in enumerate(rates):
            seconds = max(args.seconds, args.min_requests / rate)
            step = asyncio.run(offer(server.port, rate, seconds, sentences, i, args.timeout))
            steps.append(step)
            print(f"{name} {rate:g}/s: {json.dumps(step)}", file=sys.stderr, flush=True)
            if step["error_share"] > SATURATED_ERRORS or (step["p99_s"] or 0) > SATURATED_P99:
                break
        if "--shadow" in options:
            shadow[name] = shadow_counts(server.port)
        stopped[name] = server.stop()
        results[name] = steps
    light = {}
    light_seconds = max(args.seconds, args.min_requests / rates[0])
    schedule = arrivals(rates[0], light_seconds, 0)  # the first step's arrivals (seed 0)
    for name in [n for n in results if n.startswith("ee-")]:
        timed = in_process_batch1(
            export=args.export, options=servers[name], sentences=sentences,
            policy=args.policy, threshold=args.threshold, schedule=schedule, hot_count=args.light,
        )  # fmt: skip
        first = results[name][0]
        p50 = first[LIGHT_P50]
        light[name] = {
            "offered_per_s": first["offered_per_s"],
            "server_p50_s": first["p50_s"],
            "server_p50_from_send_s": p50,
            **{f"in_process_{k}": round(v, 5) for k, v in timed.items()},
        }
        for key, seconds in timed.items():  # the bound: 1 ms + 20% of the in-process time
            bound = 0.001 + 1.2 * seconds
            light[name][f"bound_{key}"] = round(bound, 5)
            light[name][f"met_{key}"] = p50 is not None and p50 <= bound
    summary = summarize(results)
    out = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "export": recorded_path(args.export),  # no machine path in results
        "default_setting": record.get("default_setting"),
        "early_exit_setting": {"policy": args.policy, "threshold": args.threshold}
        if args.policy
        else "the export's default_setting",
        "machine": machine(),
        "load_average_at_end": os.getloadavg(),
        "threads": args.threads,
        "max_wait_ms": args.max_wait_ms,
        "seconds_per_rate": args.seconds,
        "servers": banners,
        "exit_codes_after_sigterm": stopped,
        "steps": results,
        **summary,
        "light_load_p50": light,
        **({"shadow": shadow} if shadow else {}),
        "wall_seconds": round(time.perf_counter() - began, 1),
    }
    write_text(args.out, json.dumps(out, indent=2) + "\n")
    plot(results, args.figure)
    print(json.dumps({**summary, "light_load_p50": light}, indent=2))


if __name__ == "__main__":
    main()
