"""Exit thresholds under drift, served live: three `aclpipe serve` processes side by side.

The drifting stream of ``benchmarks/drift.py`` (``build_stream``: SST-2 dev, SST-2 sentences
of opposite labels joined by "but", SST-2 sentences joined, SST-2 with typos, CoLA, MRPC,
SST-2 again; ``--phase-records`` per phase) goes through
three real ``aclpipe serve`` processes on 127.0.0.1 at once, each with one intra-op thread
(``--threads 1``, ``OMP_NUM_THREADS=1``):

- ``fixed``: the offline setting (``drift.offline_setting``: the export's default, the sweep of
  ``--curves`` against the model's own last exit, or ``--policy``/``--threshold``) throughout;
- ``recalibrated``: the same setting with ``--shadow F --shadow-share S --recalibrate`` (the
  server's own controller: its defaults, and the export budget's assumption-free target);
- ``full``: ``--policy none``, every record to the last exit.

The open-loop generator of ``benchmarks/serve_load.py`` (``arrivals``: Poisson at ``--rate``
records/s, seeded; ``Client``: keep-alive HTTP/1.1) sends each record to the three servers at
the same scheduled moment, whatever their replies. A record's latency runs from that moment
to the last byte of its answer; one not answered within ``--timeout`` seconds, or answered
with a status but 200, is an error (counted, and neither right nor in agreement).

Per ``--window`` records, each server's accuracy against gold (the phases that have it),
agreement with the full server's answer, layer speed-up (the last exit's layer over the mean
exit layer), CPU speed-up (the full server's process CPU seconds over this server's in the
same window: ``/proc/<pid>/stat``, sampled when the window's first and next window's first
record are sent), latency p50/p99; for the recalibrating server, the threshold at the
window's end and its shadow work (``/info``: the CPU seconds of served batches and of shadow
runs, thread time). The targets are ``drift.summarize``'s: with recalibration, accuracy within
the budget of the full server's in >= 95% of the gold windows, at >= 90% of the fixed server's
layer speed-up on the first phase; for the fixed server, how far it breaks.

The three processes share the machine's cores with the generator, so a server's latency
includes the others' work; what the ratios compare is the same load on each.

Usage (from the repository root, after ``dvc repro`` exports sst2/acl-cl; the run lasts
about 7 x ``--phase-records`` / ``--rate`` seconds)::

    python benchmarks/drift_live.py [--export models/sst2/acl-cl/export] [--rate 25]
        [--phase-records 4000] [--fraction 0.1] [--share 0.15] [--curves ...]
        [--out benchmarks/results/drift_live.json] [--figure reports/serve/drift_live.png]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import http.client
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from drift import PHASES, build_stream, offline_setting, phases_table, plot, summarize  # noqa: E402
from serve_load import Client, Server, arrivals, shadow_counts, stack  # noqa: E402

from aclpipe.atomic import write_text  # noqa: E402
from aclpipe.early_exit.recalibrate import target_agreement  # noqa: E402
from aclpipe.early_exit.settings import BUDGET_POINTS  # noqa: E402
from aclpipe.host import machine  # noqa: E402

SERVERS = ("fixed", "recalibrated", "full")
SAMPLES_PER_WINDOW = 10  # /info and CPU samples per window (the figure's threshold line)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``), all threads."""
    text = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    fields = text[text.rindex(")") + 2 :].split()  # after the command name, from field 3
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def shadow_info(port: int, timeout: float) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", "/info")
        return json.loads(conn.getresponse().read())["shadow"]
    finally:
        conn.close()


def options(setting: dict, args) -> dict[str, list[str]]:
    """Each server's ``aclpipe serve`` options."""
    common = ["--threads", "1", "--max-wait-ms", "0"]
    exits = ["--policy", setting["policy"], "--threshold", repr(float(setting["threshold"]))]
    watch = ["--shadow", repr(args.fraction), "--shadow-share", repr(args.share), "--recalibrate"]
    return {
        "fixed": [*common, *exits],
        "recalibrated": [*common, *exits, *watch],
        "full": [*common, "--policy", "none"],
    }


async def replay(servers: dict[str, Server], stream: list[dict], times: list[float],
                 every: int, timeout: float) -> tuple[dict, list[dict]]:  # fmt: skip
    """Send record ``i`` to every server at ``times[i]`` (open loop). Per server and record:
    ``(label or None, exit layer or None, latency s or None)``; and, every ``every`` records
    (and once after the last answer), a sample of each server's CPU seconds and the
    recalibrating server's ``/info`` shadow section."""
    loop = asyncio.get_running_loop()
    clients = {name: Client(server.port) for name, server in servers.items()}
    answers: dict[str, list] = {name: [None] * len(stream) for name in servers}
    samples: list[dict] = []
    start = loop.time() + 0.1

    async def one(name: str, i: int) -> None:
        body = json.dumps({"text": stream[i]["text"]}).encode()
        try:
            status, raw = await asyncio.wait_for(clients[name].exchange(body), timeout)
        except (TimeoutError, OSError, asyncio.IncompleteReadError) as err:
            answers[name][i] = (None, None, None, type(err).__name__)
            return
        if status != 200:
            answers[name][i] = (None, None, None, str(status))
            return
        got = json.loads(raw)
        answers[name][i] = (got["label"], got["exit_layer"], loop.time() - start - times[i], None)

    async def sample(i: int) -> None:
        row = {"record": i, "cpu": {n: cpu_seconds(s.proc.pid) for n, s in servers.items()},
               "load": os.getloadavg()[0]}  # fmt: skip
        if "recalibrated" in servers:
            port = servers["recalibrated"].port
            try:  # a busy server may not answer in time: the sample goes without it
                row["shadow"] = await loop.run_in_executor(None, shadow_info, port, timeout)
            except (TimeoutError, OSError):
                row["shadow"] = None
        samples.append(row)

    pending = []
    for i, at in enumerate(times):
        await asyncio.sleep(max(0.0, start + at - loop.time()))
        if i % every == 0:
            pending.append(asyncio.ensure_future(sample(i)))
        pending += [asyncio.ensure_future(one(name, i)) for name in servers]
    await asyncio.gather(*pending)
    if "recalibrated" in servers:  # the shadow thread's queue drained (10 s at most)
        await loop.run_in_executor(None, shadow_counts, servers["recalibrated"].port)
    await sample(len(stream))
    for client in clients.values():
        client.close()
    return answers, samples


def percentile(values: list[float], q: float) -> float | None:
    ranked = sorted(values)
    return round(ranked[min(len(ranked) - 1, int(q * len(ranked)))], 5) if ranked else None


def live_windows(stream: list[dict], answers: dict[str, list], samples: list[dict],
                 last_layer: int, window: int, budget: float) -> list[dict]:  # fmt: skip
    """Per ``window`` records, ``drift.windows``' row for each server (``agreement``,
    ``layer_speedup``, ``accuracy`` and ``within_budget`` where the window has gold,
    ``layer_speedup_with_shadow`` for the recalibrating one), with the live figures beside
    them: errors, latency p50/p99, CPU seconds and the CPU speed-up over the full server."""
    at = {s["record"]: s for s in samples}
    rows = []
    for begin in range(0, len(stream) - window + 1, window):
        end = begin + window
        part = range(begin, end)
        gold = [stream[i]["gold"] for i in part]
        row: dict = {"start": begin, "phase": stream[begin]["phase"]}
        cpu = {name: at[end]["cpu"][name] - at[begin]["cpu"][name] for name in answers}
        for name, given in answers.items():
            answered = [given[i] for i in part if given[i][0] is not None]
            layers = [a[1] for a in answered]
            agree = sum(
                given[i][0] is not None and given[i][0] == answers["full"][i][0] for i in part
            )
            latency = [a[2] for a in answered]
            entry = {
                "agreement": agree / window,
                "layer_speedup": last_layer / statistics.fmean(layers) if layers else None,
                "errors": window - len(answered),
                "p50_s": percentile(latency, 0.50),
                "p99_s": percentile(latency, 0.99),
                "cpu_seconds": round(cpu[name], 3),
                "cpu_speedup": cpu["full"] / cpu[name] if cpu[name] > 0 else None,
            }
            if None not in gold:
                entry["accuracy"] = sum(given[i][0] == gold[k] for k, i in enumerate(part)) / window
            row[name] = entry
        if "recalibrated" in answers and at[end].get("shadow") and at[begin].get("shadow"):
            before, after = at[begin]["shadow"], at[end]["shadow"]
            served = after["served_seconds"] - before["served_seconds"]
            shadow = after["shadow_seconds"] - before["shadow_seconds"]
            recal = row["recalibrated"]
            recal["layer_speedup_with_shadow"] = (
                recal["layer_speedup"] * served / (served + shadow)
                if served > 0 and recal["layer_speedup"] is not None
                else None
            )
            recal["shadow_over_served_seconds"] = shadow / served if served > 0 else None
            recal["shadow_drawn"] = after["drawn"] - before["drawn"]
            recal["shadow_observed"] = after["observed"] - before["observed"]
            row["threshold_at_end"] = after["threshold"]
        if None not in gold:
            floor = row["full"]["accuracy"] - budget / 100 - 1e-12
            for name in answers:
                if name != "full":
                    row[name]["within_budget"] = bool(row[name]["accuracy"] >= floor)
        rows.append(row)
    return rows


def latency_summary(answers: dict[str, list], first: int) -> dict:
    """Per server: p50/p99 over the whole stream and over its first ``first`` records."""
    out = {}
    for name, given in answers.items():
        every = [a[2] for a in given if a[2] is not None]
        unshifted = [a[2] for a in given[:first] if a[2] is not None]
        errors: dict[str, int] = {}
        for a in given:
            if a[3] is not None:
                errors[a[3]] = errors.get(a[3], 0) + 1
        out[name] = {
            "p50_s": percentile(every, 0.5), "p99_s": percentile(every, 0.99),
            "unshifted_p50_s": percentile(unshifted, 0.5),
            "unshifted_p99_s": percentile(unshifted, 0.99), "errors": errors,
        }  # fmt: skip
    return out


def run(args) -> dict:
    """Start the three servers, replay the stream, stop them (whatever happens); the JSON."""
    began = time.perf_counter()
    record = json.loads((args.export / "export.json").read_text(encoding="utf-8"))
    setting = offline_setting(record, args.curves, args.policy, args.threshold)
    budget = float(setting.get("budget_points", BUDGET_POINTS))
    phases = [(name, args.phase_records) for name, _ in PHASES]
    stream = build_stream(args.glue_dir, phases, args.seed)
    horizon = 2 * len(stream) / args.rate + 60  # long enough to draw them all
    times = arrivals(args.rate, horizon, args.seed)[: len(stream)]
    assert len(times) == len(stream), "too few arrivals drawn"
    servers: dict[str, Server] = {}
    stopped: dict[str, int | None] = {}
    try:
        for name, opts in options(setting, args).items():
            servers[name] = Server(args.export, opts)
        warm = build_stream(args.glue_dir, [("sst2", 50)], args.seed + 7)  # one per server
        asyncio.run(replay(servers, warm, arrivals(50, 60, 99)[:50], 10**9, args.timeout))
        every = max(1, args.window // SAMPLES_PER_WINDOW)
        answers, samples = asyncio.run(replay(servers, stream, times, every, args.timeout))
        status = shadow_info(servers["recalibrated"].port, args.timeout)
        events = [json.loads(line) for _, line in servers["recalibrated"].lines
                  if line.startswith('{"event": "recalibrate"')]  # fmt: skip
    finally:
        for name, server in servers.items():
            try:
                stopped[name] = server.stop()
            except Exception:  # noqa: BLE001 - still stop the others; a hung one is killed
                server.proc.kill()
                stopped[name] = None
    last_layer = int(record["exits"][-1])
    rows = live_windows(stream, answers, samples, last_layer, args.window, budget)
    summary = summarize(rows, budget, args.phase_records)
    unshifted = [r for r in rows if r["start"] < args.phase_records]
    cost = {
        "served_seconds": status["served_seconds"],
        "shadow_seconds": status["shadow_seconds"],
        "shadow_over_served_seconds": round(status["shadow_seconds"] / status["served_seconds"], 4),
        "drawn": status["drawn"], "refused": status["refused"], "observed": status["observed"],
        "dropped": status["dropped"],
        "process_cpu_seconds": {n: round(samples[-1]["cpu"][n] - samples[0]["cpu"][n], 2)
                                for n in SERVERS},
        "unshifted_process_cpu_recalibrated_over_fixed": round(
            sum(r["recalibrated"]["cpu_seconds"] for r in unshifted)
            / sum(r["fixed"]["cpu_seconds"] for r in unshifted), 4),
    }  # fmt: skip
    latency = latency_summary(answers, args.phase_records)
    latency["unshifted_p99_recalibrated_over_fixed"] = round(
        latency["recalibrated"]["unshifted_p99_s"] / latency["fixed"]["unshifted_p99_s"], 3
    )
    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "export": {
            "task": record.get("task"),
            "exits": record["exits"],
            "default_setting": setting,
            "note": args.note,
        },  # fmt: skip
        "machine": machine(),
        "stack": stack(),
        "load_average_at_end": os.getloadavg(),
        "load_average_1min_during": {  # the machine's, sampled with the CPU seconds
            "min": min(s["load"] for s in samples),
            "max": max(s["load"] for s in samples),
            "mean": round(statistics.fmean(s["load"] for s in samples), 2),
        },
        "servers": {name: ["aclpipe", "serve", *o] for name, o in options(setting, args).items()},
        "threads_per_server": 1,
        "exit_codes_after_sigterm": stopped,
        "rate_per_s": args.rate,
        "phases": [list(p) for p in phases],
        "window": args.window,
        "timeout_s": args.timeout,
        "budget_points": budget,
        "target_agreement": target_agreement(budget),  # the server's: harm 1
        "controller": {k: status["controller"].get(k) for k in ("target", "offline", "policy")},
        "summary": summary,
        "latency": latency,
        "shadow_cost": cost,
        "phases_table": phases_table(rows, args.window),
        "windows": rows,
        "events": events,
        "threshold_samples": [
            [s["record"], s["shadow"]["threshold"]] for s in samples if s.get("shadow")
        ],  # fmt: skip
        "wall_seconds": round(time.perf_counter() - began, 1),
    }


def threshold_per_record(out: dict) -> list[float]:
    """The recalibrating server's threshold at each record, from the samples (a step line)."""
    samples, n = out["threshold_samples"], sum(count for _, count in out["phases"])
    line, k = [], 0
    for i in range(n):
        while k + 1 < len(samples) and samples[k + 1][0] <= i:
            k += 1
        line.append(samples[k][1])
    return line


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--export", type=Path, default=Path("models/sst2/acl-cl/export"))
    parser.add_argument("--glue-dir", type=Path, default=Path("../shared/glue"))
    parser.add_argument("--curves", type=Path, help="as drift.py: the sweep to pick from")
    parser.add_argument("--policy", help="the offline setting (default: the export's)")
    parser.add_argument("--threshold", type=float, help="and its threshold")
    parser.add_argument("--rate", type=float, default=25.0, help="records per second, Poisson")
    parser.add_argument("--phase-records", type=int, default=4000, help="records per phase")
    parser.add_argument("--window", type=int, default=1000, help="records per reported window")
    parser.add_argument("--fraction", type=float, default=0.1, help="--shadow F")
    parser.add_argument("--share", type=float, default=0.15, help="--shadow-share S")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per request")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--note", default="", help="how the export was made, recorded")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/drift_live.json"))
    parser.add_argument("--figure", type=Path, default=Path("reports/serve/drift_live.png"))
    args = parser.parse_args(argv)
    out = run(args)
    write_text(args.out, json.dumps(out, indent=2) + "\n")
    plot(out["windows"], {"threshold": threshold_per_record(out)}, out["target_agreement"],
         out["budget_points"], args.figure, args.window)  # fmt: skip
    print(json.dumps({"summary": out["summary"], "latency": out["latency"],
                      "shadow_cost": out["shadow_cost"]}, indent=2))  # fmt: skip
    return out


if __name__ == "__main__":
    main()
