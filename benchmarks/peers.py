"""The races published: `aclpipe predict` and `aclpipe serve` against their peers, one run.

The same trained model (a single-exit ce model on SST-2, pooled by [CLS]) runs everywhere:
aclpipe reads its ``export-exits --int8`` folder; the peers read the stock
``BertForSequenceClassification`` folder ``aclpipe export-hf --plain`` writes of it (the
remote-code folder loads in Optimum's transformers 4.55 too, but Optimum's ONNX exporter knows
only the architectures it registers). Beside it races what a user ships with aclpipe
(``aclpipe-early-exit-*``): a multi-exit model trained on the same rows, its ``export-exits
--int8`` folder run at the export's default exit setting (the 1-point budget's pick on the
validation split), as ``predict`` and ``serve`` run it without ``--policy``; the targets are
judged on it, its dev accuracy against Optimum int8's on the same sentences. The judged one is
``--early-exit FOLDER`` (the default pipeline's acl-cl export: mean pooling, as ``dvc repro``
trains it), else the project's ``models/sst2/<--early-exit-method>/export``;
``--also-early-exit LABEL=FOLDER`` races more exports beside, not judged. Each peer runs in its
own virtual environment, built here from the pinned files beside this script
(``benchmarks/peers/<peer>.txt``) under ``--cache`` (never in the repository) and reused while
its requirements are unchanged:

- ``optimum``: optimum-onnx's ONNX export and dynamic int8 quantization, run through
  ``ORTModelForSequenceClassification`` as its documentation shows (peers/optimum_worker.py);
- ``infinity``: infinity-emb's server, ``/classify``, its torch engine;
- ``naive``: FastAPI + ``transformers.pipeline``, one request, one call (peers/naive_server.py).

Races, each on the SST-2 dev sentences, with the dev accuracy of every contender's own
answers beside its speed, every engine on ``--threads`` intra-op threads:

1. in process, batch 1 and 32: aclpipe's ``Predictor`` (fp32 and int8, the whole predict
   path; the single-exit model on every layer, the early-exit one at its default setting)
   against Optimum fp32 and int8 (tokenize, pad, run), interleaved block by block over
   ``--rounds`` rounds (a slow moment of the shared machine falls on all alike); the median
   over rounds of sentences/s, the mean exit layer of aclpipe's answers;
2. whole process, batch 32: ``aclpipe predict`` (both models) against a process that loads
   Optimum's model and labels the same file (``--copies`` copies of dev), wall seconds,
   alternating;
3. servers: ``aclpipe serve --precision int8`` (both models), infinity and the naive server,
   each driven by
   serve_load.py's open-loop Poisson generator at rising rates (``--rates``; a step's length is
   ``--seconds``) until it saturates; the highest rate held (p99 <= 50 ms, no errors, every
   lower rate held too). ``aclpipe serve`` is also driven by ``wrk`` (closed loop,
   ``--wrk-connections``), and the generator, offering wrk's rate open loop, must answer
   within 10% of wrk's requests/s, both counted alike: the answers that came in while the
   requests were being sent, per second (``throughput_in_step_per_s``; wrk counts those
   within its duration). The rate judged is wrk's with one connection, below the server's
   saturation (``rate_over_ladder_saturation`` records where it sits): wrk's rate at 16
   connections is the saturation itself, where an open loop has no steady state (its queue
   wanders and drains after the last arrival: 0.93x wrk in the recorded results, with every
   request answered), so that comparison is recorded beside (``wrk_other_connections``), not
   judged.

Targets, judged on the early-exit contender (the single-exit rows recorded beside, not
judged): aclpipe int8 >= 2x Optimum int8 at batch 1 and >= 3x at batch 32, its dev accuracy at
most 1 point below Optimum int8's (``accuracy_within_1_point``); ``aclpipe serve`` holds >= 5x
infinity's highest rate at p99 <= 50 ms.
Traffic goes to 127.0.0.1 only; every step and wait is bounded, and every server is stopped.

Usage (from a project root holding a trained [CLS] ``models/sst2/ce``, e.g. after ``aclpipe
prepare --task sst2``, ``aclpipe finetune --task sst2 --method ce --set model.pooling=cls``
and ``aclpipe evaluate --task sst2 --method ce --set model.pooling=cls``; the judged export
from another project that ran ``dvc repro``; downloads the peers' packages on the first run)::

    python benchmarks/peers.py [--project .] [--glue-dir ../shared/glue] [--threads 1]
        [--early-exit <pipeline project>/models/sst2/acl-cl/export]
        [--also-early-exit LABEL=FOLDER] [--cache ~/.cache/aclpipe/peers]
        [--out benchmarks/results/peers.json]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import hashlib
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import serve_load  # noqa: E402
from serve_load import Server, held_from_the_bottom  # noqa: E402
from threads import machine  # noqa: E402

from aclpipe.atomic import write_text  # noqa: E402

PEERS = HERE / "peers"
EARLY = "aclpipe-early-exit"  # the multi-exit export at its default exit setting
RATES = "5,10,15,20,30,40,60,80,120,160,240,320,480,640,960"
SERVER_START_S = 300  # longest wait for a server to answer its health check


def sh(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, check=True, text=True, capture_output=True, **kwargs)


def venv(cache: Path, name: str) -> Path:
    """The python of peer ``name``'s virtual environment, built from peers/<name>.txt when its
    stamp (the requirements' hash) differs."""
    requirements = PEERS / f"{name}.txt"
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()
    folder = cache / name
    stamp = folder / "requirements.sha256"
    python = folder / "bin" / "python"
    if not (stamp.exists() and stamp.read_text().strip() == digest and python.exists()):
        print(f"building the {name} environment in {folder} ...", file=sys.stderr, flush=True)
        shutil.rmtree(folder, ignore_errors=True)
        sh([sys.executable, "-m", "venv", str(folder)])
        sh([str(python), "-m", "pip", "install", "-q", "-r", str(requirements)], timeout=3600)
        stamp.write_text(digest + "\n")
    return python


def versions(python: Path, names: tuple[str, ...]) -> dict:
    code = ("import json, sys\nfrom importlib.metadata import version\n"
            "print(json.dumps({n: version(n) for n in sys.argv[1:]}))")  # fmt: skip
    return json.loads(sh([str(python), "-c", code, *names]).stdout)


def sst2_dev(glue_dir: Path) -> tuple[list[str], list[int]]:
    lines = (glue_dir / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    rows = [line.split("\t") for line in lines]
    return [r[0] for r in rows], [int(r[1]) for r in rows]


def train_examples(project: Path) -> int | None:
    """How many SST-2 training examples the project's prepared data holds (its meta.json):
    the rows the model was trained on."""
    from aclpipe.layout import META, Layout

    path = Layout(project).data("sst2") / META
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))["splits"]["train"]["examples"]


def accuracy(labels: list[int], gold: list[int]) -> float:
    return round(sum(a == b for a, b in zip(labels, gold)) / len(gold), 4)


def aclpipe(*args: str, cwd: Path) -> str:
    return sh([sys.executable, "-m", "aclpipe.cli", *args], cwd=cwd).stdout


# -- 1. in process ---------------------------------------------------------------------------


class OptimumWorker:
    """Optimum's models, loaded once in their own environment, labelling on request."""

    def __init__(self, python: Path, onnx: Path, threads: int) -> None:
        command = [str(python), str(PEERS / "optimum_worker.py"), "serve", str(onnx),
                   "--threads", str(threads)]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)  # fmt: skip
        if json.loads(self.proc.stdout.readline()).get("ready") is not True:
            raise SystemExit("Optimum's worker did not start")

    def __call__(self, variant: str, batch: int, texts: list[str]) -> tuple[float, list[int], None]:
        ask = {"variant": variant, "batch": batch, "texts": texts}
        self.proc.stdin.write(json.dumps(ask) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        return answer["seconds"], answer["labels"], None  # the full model: no exit layers

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(60)


def aclpipe_contender(export: Path, precision: str, batch: int, threads: int,
                      policy: str | None):  # fmt: skip
    """aclpipe's whole predict path on ``export``: ``policy`` ``none`` runs every layer (the
    single-exit model), ``None`` the export's default exit setting (the early-exit model)."""
    from aclpipe.early_exit.predict import Predictor

    predictor = Predictor(export, policy=policy, engine="onnx", batch_size=batch,
                          threads=threads, precision=precision)  # fmt: skip

    def run(texts: list[str]) -> tuple[float, list[int], list[int]]:
        began = time.perf_counter()
        records = list(predictor.records(texts))
        took = time.perf_counter() - began
        return took, [r["label"] for r in records], [r["exit_layer"] for r in records]

    return run


def early_exit_exports(
    project: Path, folder: Path | None, method: str | None, also: list[str]
) -> dict[str, Path]:
    """The early-exit exports raced, by contender prefix: the judged one (``EARLY``) from
    ``--early-exit FOLDER``, else the project's ``models/sst2/<method>/export`` (none without
    either), then each ``--also-early-exit LABEL=FOLDER`` as ``EARLY-LABEL``; a malformed or
    repeated label ends the run with one line (``SystemExit``)."""
    early: dict[str, Path] = {}
    if folder is not None:
        early[EARLY] = folder.resolve()
    elif method:
        early[EARLY] = project / "models" / "sst2" / method / "export"
    for extra in also:
        label, _, place = extra.partition("=")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", label) or not place:
            raise SystemExit(
                f"--also-early-exit {extra!r}: give LABEL=FOLDER, the label letters, digits, "
                "'_', '.' or '-', e.g. --also-early-exit cls=../other/models/sst2/acl-cl/export"
            )
        if f"{EARLY}-{label}" in early:
            raise SystemExit(
                f"--also-early-exit: the label {label!r} is given twice: name each once"
            )
        early[f"{EARLY}-{label}"] = Path(place).resolve()
    return early


def early_exit_model(export: Path) -> dict:
    """What the JSON says of a multi-exit export: its pooling, exits, the default exit setting
    predict and serve run it at (the export's ``default_setting``), and its dev scores there."""
    from aclpipe.early_exit.predict import Predictor

    record = json.loads((export / "export.json").read_text()) if export.exists() else {}
    if not (record.get("int8") or {}).get("segments"):
        raise SystemExit(
            f"no int8 early-exit export in {export}: run `aclpipe evaluate` (its exit sweep, "
            "with the ce reference) and `aclpipe export-exits --int8` first"
        )
    chosen = Predictor(export, engine="onnx")  # the setting predict and serve default to
    stored = record.get("default_setting") or {}
    return {
        "task": record.get("task"), "method": export.parent.name,  # models/<task>/<method>/export
        "pooling": record.get("pooling"), "exits": record.get("exits"),
        "train_examples": train_examples(export.parents[3]),
        "setting": {"policy": chosen.policy, "threshold": chosen.threshold,
                    "source": chosen.setting_source,
                    **{k: v for k, v in stored.items() if k not in ("policy", "threshold")}},
        "int8_at_the_setting_on_dev": record["int8"].get("default_setting"),
    }  # fmt: skip


def in_process(export: Path, early: dict[str, Path], worker: OptimumWorker, texts: list[str],
               gold: list[int], threads: int, rounds: int, blocks: int) -> dict:  # fmt: skip
    results: dict = {}
    for batch in (1, 32):
        contenders = {}
        for precision in ("fp32", "int8"):
            contenders[f"aclpipe-{precision}"] = aclpipe_contender(
                export, precision, batch, threads, "none"
            )
            contenders[f"optimum-{precision}"] = (
                lambda t, v=precision, b=batch: worker(v, b, t)
            )  # fmt: skip
        for prefix, folder in early.items():
            for precision in ("fp32", "int8"):
                contenders[f"{prefix}-{precision}"] = aclpipe_contender(
                    folder, precision, batch, threads, None
                )
        for run in contenders.values():  # warm-up
            run(texts[:32])
        size = -(-len(texts) // blocks)
        slices = [texts[i : i + size] for i in range(0, len(texts), size)]
        rates: dict[str, list[float]] = {name: [] for name in contenders}
        labels: dict[str, list[int]] = {}
        layers: dict[str, list[int] | None] = {}
        names = list(contenders)
        for r in range(rounds):
            seconds = dict.fromkeys(names, 0.0)
            got: dict[str, list[int]] = {name: [] for name in names}
            exited: dict[str, list[int] | None] = {name: [] for name in names}
            for piece in slices:
                order = names[r % len(names) :] + names[: r % len(names)]
                for name in order:
                    took, answer, where = contenders[name](piece)
                    seconds[name] += took
                    got[name] += answer
                    exited[name] = None if where is None else exited[name] + where
            for name in names:
                rates[name].append(len(texts) / seconds[name])
                labels.setdefault(name, got[name])
                layers.setdefault(name, exited[name])
            print(f"batch {batch} round {r + 1}: "
                  + ", ".join(f"{n} {rates[n][-1]:.0f}/s" for n in names), file=sys.stderr,
                  flush=True)  # fmt: skip
        results[f"batch_{batch}"] = {
            name: {"sentences_per_s": round(statistics.median(rates[name]), 1),
                   "rounds_per_s": [round(x, 1) for x in rates[name]],
                   "accuracy": accuracy(labels[name], gold),
                   **({"mean_exit_layer": round(statistics.fmean(layers[name]), 2)}
                      if layers[name] else {})}
            for name in names
        }  # fmt: skip
    return results


# -- 2. whole process ------------------------------------------------------------------------


def whole_process(export: Path, early: dict[str, Path], optimum: Path, onnx: Path,
                  texts: list[str],
                  gold: list[int], copies: int, threads: int, repeats: int,
                  work: Path) -> dict:  # fmt: skip
    source = work / "sentences.txt"
    source.write_text("".join(t + "\n" for t in texts * copies), encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    out: dict = {"sentences": len(texts) * copies, "batch": 32}
    for precision in ("fp32", "int8"):
        commands = {
            f"aclpipe-{precision}": [sys.executable, "-m", "aclpipe.cli", "predict", "--model",
                                     str(export), "-i", str(source), "--batch-size", "32",
                                     "--threads", str(threads), "--precision", precision],
            f"optimum-{precision}": [str(optimum), str(PEERS / "optimum_worker.py"), "once",
                                     str(onnx), precision, str(source), "32",
                                     "--threads", str(threads)],
        }  # fmt: skip
        for prefix, folder in early.items():  # the export's default exit setting: no --policy
            commands[f"{prefix}-{precision}"] = [
                sys.executable, "-m", "aclpipe.cli", "predict", "--model", str(folder), "-i",
                str(source), "--batch-size", "32", "--threads", str(threads), "--precision",
                precision]  # fmt: skip
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(repeats):
            for name, command in commands.items():
                began = time.perf_counter()
                done = subprocess.run(command, check=True, capture_output=True, text=True,
                                      env=env, timeout=600)  # fmt: skip
                times[name].append(time.perf_counter() - began)
                answers = [json.loads(line) for line in done.stdout.splitlines()]
                labels = [a["label"] for a in answers]
                out.setdefault(name, {})["accuracy"] = accuracy(labels[: len(gold)], gold)
                if name.startswith(EARLY):
                    layers = [a["exit_layer"] for a in answers]
                    out[name]["mean_exit_layer"] = round(statistics.fmean(layers), 2)
        for name in commands:
            out[name].update(wall_s=round(statistics.median(times[name]), 2),
                             runs_s=[round(t, 2) for t in times[name]])  # fmt: skip
    return out


# -- 3. servers ------------------------------------------------------------------------------


PEER_STEP = ("offered_per_s", "requests", "answered", "errors", "throughput_per_s",
             "throughput_in_step_per_s", "p50_s", "p99_s")  # fmt: skip  (serve_load.offer's)


async def offer(port: int, path: str, body, label, rate: float, seconds: float,
                texts: list[str], gold: list[int], seed: int, timeout: float) -> dict:  # fmt: skip
    """serve_load.offer's open-loop step, to ``path``, scoring each answer's label."""
    right = 0

    def score(i: int, answer: bytes) -> None:
        nonlocal right
        right += label(json.loads(answer)) == gold[i % len(gold)]

    step = await serve_load.offer(port, rate, seconds, texts, seed, timeout, path=path,
                                  body=body, on_answer=score)  # fmt: skip
    answered = step["answered"]
    return {**{k: step[k] for k in PEER_STEP},
            "accuracy": round(right / answered, 4) if answered else None}  # fmt: skip


def ladder(port: int, path: str, body, label, rates: list[float], seconds: float,
           texts: list[str], gold: list[int], name: str) -> list[dict]:  # fmt: skip
    asyncio.run(offer(port, path, body, label, 5.0, 3.0, texts, gold, 1000, 30.0))  # warm-up
    steps = []
    for i, rate in enumerate(rates):
        step = asyncio.run(offer(port, path, body, label, rate, seconds, texts, gold, i, 5.0))
        print(f"{name} {rate:g}/s: {json.dumps(step)}", file=sys.stderr, flush=True)
        steps.append(step)
        if step["errors"] > 0.05 * step["requests"] or (step["p99_s"] or 0) > 1.0:
            break  # past saturation
    return steps


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PeerServer:
    """A peer's server process on 127.0.0.1, up once ``health`` answers 200."""

    def __init__(self, command: list[str], port: int, health: str, threads: int) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1",
               "INFINITY_ANONYMOUS_USAGE_STATS": "0", "DO_NOT_TRACK": "1"}  # fmt: skip
        self.port, self.log = port, tempfile.TemporaryFile()
        self.proc = subprocess.Popen(command, env=env, stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{health}", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(1)
        self.stop()
        self.log.seek(0)
        raise SystemExit(f"{command[0]} did not start: {self.log.read()[-2000:].decode()}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)


def wrk(port: int, texts: list[str], connections: int, seconds: float) -> dict:
    """serve_load.wrk_loop's run, in this page's fields."""
    done = serve_load.wrk_loop(port, connections, seconds, texts)
    return {"connections": connections, "seconds": seconds,
            "requests_per_s": done["throughput_per_s"],
            "non_2xx": done["errors_by_kind"].get("non_2xx", 0), "p99_s": done["p99_s"]}  # fmt: skip


def wrk_version() -> str:
    done = subprocess.run(["wrk", "-v"], capture_output=True, text=True)
    return (done.stdout + done.stderr).split("\n")[0].strip()


def aclpipe_serve(folder: Path, name: str, args, rates: list[float], texts: list[str],
                  gold: list[int], wrk_check: bool) -> tuple[dict, list[dict]]:  # fmt: skip
    """``aclpipe serve --precision int8`` on ``folder`` up the rate ladder; with
    ``wrk_check``, also wrk at each of ``--wrk-connections`` and the generator offering wrk's
    rate open loop (``within_10_percent``; ``rate_over_ladder_saturation`` says where the
    rate sits)."""
    server = Server(folder, ["--threads", str(args.threads), "--precision", "int8"])
    body = lambda t: json.dumps({"text": t}).encode()  # noqa: E731
    checks: list[dict] = []
    try:
        steps = ladder(server.port, "/predict", body, lambda a: a["label"], rates,
                       args.seconds, texts, gold, name)  # fmt: skip
        entry = {"command": f"aclpipe serve --precision int8 --threads {args.threads}",
                 "banner": server.banner, "steps": steps}  # fmt: skip
        saturation = max(s["throughput_per_s"] for s in steps)
        for connections in [int(n) for n in args.wrk_connections.split(",")] if wrk_check else []:
            check = wrk(server.port, texts, connections, args.seconds)
            offered = round(check["requests_per_s"], 1)
            step = asyncio.run(offer(server.port, "/predict", body, lambda a: a["label"],
                                     offered, args.seconds, texts, gold, 99, 5.0))  # fmt: skip
            ratio = step["throughput_in_step_per_s"] / check["requests_per_s"]
            checks.append({"server": name, "wrk": check, "generator_at_wrk_rate": step,
                           "generator_over_wrk": round(ratio, 3),
                           "within_10_percent": abs(ratio - 1) <= 0.10,
                           "rate_over_ladder_saturation": round(offered / saturation, 3)})  # fmt: skip
    finally:
        server.stop()
    return entry, checks


def servers(args, export: Path, early: dict[str, Path], plain: Path, pythons: dict,
            texts: list[str], gold: list[int], work: Path) -> dict:  # fmt: skip
    rates = [float(r) for r in args.rates.split(",")]
    out: dict = {}
    judged = EARLY if EARLY in early else "aclpipe"
    # aclpipe serve on the judged multi-exit export at its default setting, then on the
    # single-exit export; wrk checks the generator on the judged one
    for name, folder in ([(EARLY, early[EARLY])] if EARLY in early else []) + [("aclpipe", export)]:
        out[f"{name}-serve"], checks = aclpipe_serve(folder, f"{name}-serve", args, rates, texts,
                                                      gold, wrk_check=name == judged)  # fmt: skip
        if checks:
            out["wrk_agreement"] = checks[0]  # the judged one: the first connection count
            out["wrk_other_connections"] = checks[1:]
    # infinity: /classify on its torch engine
    port = free_port()
    infinity = pythons["infinity"].parent / "infinity_emb"
    command = [str(infinity), "v2", "--model-id", str(plain), "--served-model-name", "ce",
               "--engine", "torch", "--device", "cpu", "--port", str(port), "--host",
               "127.0.0.1", "--no-model-warmup", "--log-level", "warning"]  # fmt: skip
    server = PeerServer(command, port, "/health", args.threads)
    try:
        body = lambda t: json.dumps({"model": "ce", "input": [t]}).encode()  # noqa: E731
        label = lambda a: int(max(a["data"][0], key=lambda x: x["score"])["label"])  # noqa: E731
        steps = ladder(port, "/classify", body, label, rates, args.seconds, texts, gold,
                       "infinity")  # fmt: skip
        out["infinity"] = {"command": "infinity_emb v2 --engine torch --device cpu",
                           "steps": steps}  # fmt: skip
    finally:
        server.stop()
    # naive: FastAPI + transformers.pipeline
    port = free_port()
    command = [str(pythons["naive"]), str(PEERS / "naive_server.py"), str(plain), str(port),
               str(args.threads)]  # fmt: skip
    server = PeerServer(command, port, "/healthz", args.threads)
    try:
        body = lambda t: json.dumps({"text": t}).encode()  # noqa: E731
        steps = ladder(port, "/predict", body, lambda a: int(a["label"]), rates, args.seconds,
                       texts, gold, "naive")  # fmt: skip
        out["naive-fastapi"] = {"command": "uvicorn + FastAPI + transformers.pipeline",
                                "steps": steps}  # fmt: skip
    finally:
        server.stop()
    return out


def held(steps: list[dict]) -> float:
    """serve_load's figure: the highest rate held (p99 <= 50 ms, no errors) from the bottom."""
    return held_from_the_bottom(steps)


def targets(inproc: dict, serving: dict) -> list[dict]:
    """The targets, judged on the early-exit contender (what a user ships: the multi-exit
    export at its default exit setting) when it ran, else on the single-exit one; the other
    rows are recorded beside, ``judged`` false. The accuracy check is explicit: the contender's
    dev accuracy is at most 1 point below Optimum int8's, on the same sentences."""
    early = f"{EARLY}-int8" in inproc["batch_1"]
    others = [n for n in inproc["batch_1"] if n.startswith(EARLY) and n.endswith("-int8")]
    out = []
    for batch, goal in (("batch_1", 2.0), ("batch_32", 3.0)):
        theirs = inproc[batch]["optimum-int8"]
        for name in sorted(others, key=lambda n: n != f"{EARLY}-int8") + ["aclpipe-int8"]:
            ours = inproc[batch][name]
            ratio = ours["sentences_per_s"] / theirs["sentences_per_s"]
            # accuracies are recorded to 4 places: round the difference, so that exactly one
            # point below reads -1.0, not -1.0000000000000009
            points = round((ours["accuracy"] - theirs["accuracy"]) * 100, 2)
            within = points >= -1.0
            out.append({"target": f"aclpipe int8 / Optimum int8, in process, {batch}",
                        "contender": name, "judged": name == f"{EARLY}-int8" or not early,
                        "goal": goal, "value": round(ratio, 2),
                        "accuracy": ours["accuracy"], "optimum_int8_accuracy": theirs["accuracy"],
                        "accuracy_points": points, "accuracy_within_1_point": within,
                        "met": ratio >= goal and within})  # fmt: skip
    if serving:
        lowest = min(s["offered_per_s"] for s in serving["infinity"]["steps"])
        theirs = held(serving["infinity"]["steps"])
        names = [f"{EARLY}-serve", "aclpipe-serve"] if f"{EARLY}-serve" in serving else [
            "aclpipe-serve"]  # fmt: skip
        for name in names:
            ours = held(serving[name]["steps"])
            ratio = ours / theirs if theirs else None
            # infinity holding none of the ladder's rates, its lowest rate bounds the ratio
            bound = ratio if ratio is not None else ours / lowest
            out.append({"target": "aclpipe serve / infinity, highest rate held at p99 <= 50 ms",
                        "contender": name, "judged": name == names[0], "goal": 5.0,
                        "value": round(ratio, 2) if ratio else None,
                        "at_least": round(bound, 2), "aclpipe_per_s": ours,
                        "infinity_per_s": theirs, "met": bound >= 5.0})  # fmt: skip
    return out


def fmt_rate(entry: dict) -> str:
    return f"{entry['sentences_per_s']:,.0f}/s ({entry['accuracy'] * 100:.1f})"


def render(result: dict) -> str:
    """The Markdown tables docs/benchmarks-peers.md shows between its markers."""
    inproc, process, serving = result["in_process"], result["whole_process"], result["servers"]
    peers = result["peers"]
    lines = [
        f"Run of {result['date']} on {result['machine'].get('cpu', '?')} "
        f"({result['machine'].get('cores')} cores; 1-minute load average "
        f"{result['load_average_1min']['before']} before, {result['load_average_1min']['after']} "
        f"after), {result['threads']} intra-op thread(s) per engine, {result['sentences']} "
        "SST-2 dev sentences; accuracy on dev in brackets.",
    ]
    early = result.get("early_exit_models")
    if early:
        lines.append("")
        for prefix, model in early.items():
            setting = model["setting"]
            lines.append(
                f"{prefix}-fp32/int8: the {model['method']} multi-exit export ({model['pooling']} "
                f"pooling, exits {', '.join(map(str, model['exits']))}{model.get('note', '')}) at "
                f"its default exit setting, {setting['policy']} {setting['threshold']:g} (chosen "
                f"on the validation split within a {setting.get('budget_points', '?')}-point "
                "budget)" + ("; the targets' contender." if prefix == EARLY else "; not judged."))
        lines += [f"aclpipe-fp32/int8: the single-exit {result['model']['method']} export "
                  f"({result['model']['pooling']} pooling), every layer; the peers run this "
                  "single-exit model.",
                  "",
                  "| in process | batch 1 | batch 32 | mean exit layer (batch 1, 32) |",
                  "| --- | --- | --- | --- |"]  # fmt: skip
    else:
        lines += ["", "| in process | batch 1 | batch 32 |", "| --- | --- | --- |"]
    for name in inproc["batch_1"]:
        one, many = inproc["batch_1"][name], inproc["batch_32"][name]
        row = f"| {name} | {fmt_rate(one)} | {fmt_rate(many)} |"
        if early:
            row += (f" {one['mean_exit_layer']:.2f}, {many['mean_exit_layer']:.2f} |"
                    if "mean_exit_layer" in one else " all |")  # fmt: skip
        lines.append(row)
    lines += ["", f"| whole process, {process['sentences']:,} sentences, batch 32 | wall s | "
              "accuracy |", "| --- | --- | --- |"]  # fmt: skip
    for name, entry in process.items():
        if isinstance(entry, dict):
            lines.append(f"| {name} | {entry['wall_s']} | {entry['accuracy'] * 100:.1f} |")
    if serving:
        lines += ["", "| server | highest rate held, p99 <= 50 ms | saturation | accuracy of "
                  "its answers |",
                  "| --- | --- | --- | --- |"]  # fmt: skip
        for name, entry in serving.items():
            if "steps" not in entry:
                continue
            answered = [s for s in entry["steps"] if s["accuracy"] is not None]
            count = sum(s["answered"] for s in answered)
            acc = sum(s["accuracy"] * s["answered"] for s in answered) / max(1, count) * 100
            lines.append(f"| {name} | {entry['held_up_to_p99_50ms']:g}/s | "
                         f"{entry['saturation_per_s']:g}/s | {acc:.1f} |")  # fmt: skip
        agree = serving.get("wrk_agreement")
        for check in ([agree] if agree else []) + serving.get("wrk_other_connections", []):
            judged = "judged" if check is agree else "not judged: at saturation"
            lines += ["", f"wrk on {check.get('server', 'aclpipe-serve')} "
                      f"({check['wrk']['connections']} connections, {judged}): "
                      f"{check['wrk']['requests_per_s']:g} requests/s, p99 "
                      f"{check['wrk']['p99_s'] * 1000:.1f} ms "
                      f"({check['rate_over_ladder_saturation']:g}x the ladder's most answers/s); "
                      "the open-loop generator offering that rate answered "
                      f"{check['generator_over_wrk']:.2f}x it while its arrivals lasted "
                      f"(wrk's measure; within 10%: {check['within_10_percent']})."]  # fmt: skip
    lines += ["", "| target | contender | goal | measured | accuracy against Optimum int8 "
              "(within 1 point) | met |", "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for t in result["targets"]:
        value = f"{t['value']:g}x" if t["value"] is not None else (
            f"> {t['at_least']:g}x (infinity held no rate of the ladder; its lowest bounds it)"
            if t.get("at_least") else "-")  # fmt: skip
        if "accuracy" in t:
            check = (f"{t['accuracy'] * 100:.1f} against {t['optimum_int8_accuracy'] * 100:.1f}, "
                     f"{t['accuracy_points']:+.1f} ({'yes' if t['accuracy_within_1_point'] else 'no'})")  # fmt: skip
        else:
            check = "-"
        met = ("yes" if t["met"] else "no") if t.get("judged", True) else (
            f"not judged ({'yes' if t['met'] else 'no'})")  # fmt: skip
        lines.append(f"| {t['target']} | {t.get('contender', '-')} | >= {t['goal']:g}x | {value} "
                     f"| {check} | {met} |")  # fmt: skip
    lines += ["", "Versions: " + "; ".join(
        f"{name} {', '.join(f'{k} {v}' for k, v in entry.items())}" if isinstance(entry, dict)
        else f"{name} {entry}" for name, entry in peers.items())]  # fmt: skip
    return "\n".join(lines) + "\n"


def write_doc(path: Path, table: str) -> None:
    """Replace the text between the markers of ``path`` with ``table``."""
    text = path.read_text(encoding="utf-8")
    begin, end = "<!-- peers:begin -->\n", "<!-- peers:end -->"
    head, rest = text.split(begin, 1)
    write_text(path, head + begin + table + end + rest.split(end, 1)[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--project", type=Path, default=Path("."))
    parser.add_argument("--method", default="ce", help="the single-exit model every peer runs")
    parser.add_argument(
        "--early-exit-method", default="acl-cl",
        help="the multi-exit model aclpipe races at its export's default exit setting, the "
        "targets' contender ('' for none)",
    )  # fmt: skip
    parser.add_argument("--glue-dir", type=Path, default=Path("../shared/glue"))
    parser.add_argument("--cache", type=Path,
                        default=Path(os.environ.get("ACLPIPE_PEERS_CACHE",
                                                    "~/.cache/aclpipe/peers")).expanduser())  # fmt: skip
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads of every engine")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--copies", type=int, default=5, help="copies of dev, whole process")
    parser.add_argument("--repeats", type=int, default=2, help="whole-process runs of each")
    parser.add_argument("--rates", default=RATES)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument(
        "--wrk-connections", default="1,16",
        help="wrk's connection counts; the first is judged (below saturation: see the docstring)",
    )  # fmt: skip
    parser.add_argument(
        "--early-exit", type=Path, default=None, metavar="FOLDER",
        help="the judged multi-exit export folder (default: the project's "
        "models/sst2/<early-exit-method>/export)",
    )  # fmt: skip
    parser.add_argument(
        "--also-early-exit", action="append", default=[], metavar="LABEL=FOLDER",
        help="another multi-exit export folder raced beside at its default setting, not judged "
        "(aclpipe-early-exit-LABEL-*); repeatable",
    )  # fmt: skip
    parser.add_argument("--skip-servers", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/peers.json"))
    parser.add_argument(
        "--doc",
        type=Path,
        default=Path("docs/benchmarks-peers.md"),
        help="the page whose table (between its markers) is rewritten",
    )
    args = parser.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    project, out = args.project.resolve(), args.out.resolve()
    texts, gold = sst2_dev(args.glue_dir.resolve())
    pythons = {name: venv(args.cache, name) for name in ("optimum", "infinity", "naive")}
    work = args.cache / "work"
    work.mkdir(parents=True, exist_ok=True)
    export = project / "models" / "sst2" / args.method / "export"
    record = json.loads((export / "export.json").read_text()) if export.exists() else {}
    if not (record.get("int8") or {}).get("segments"):
        aclpipe("export-exits", "--task", "sst2", "--method", args.method, "--int8", cwd=project)
    early = early_exit_exports(project, args.early_exit, args.early_exit_method,
                               args.also_early_exit)  # fmt: skip
    described = {prefix: early_exit_model(folder) for prefix, folder in early.items()}
    plain = work / "hf-plain"
    aclpipe("export-hf", "--task", "sst2", "--method", args.method, "--plain", "--out",
            str(plain), cwd=project)  # fmt: skip
    onnx = work / "optimum"
    shutil.rmtree(onnx, ignore_errors=True)
    prepared = sh([str(pythons["optimum"]), str(PEERS / "optimum_worker.py"), "prepare",
                   str(plain), str(onnx)], timeout=1200)  # fmt: skip
    quantization = json.loads(prepared.stdout.strip().splitlines()[-1])["quantization"]
    load_before = os.getloadavg()
    worker = OptimumWorker(pythons["optimum"], onnx, args.threads)
    try:
        inproc = in_process(export, early, worker, texts, gold, args.threads, args.rounds,
                            args.blocks)  # fmt: skip
    finally:
        worker.close()
    process = whole_process(export, early, pythons["optimum"], onnx, texts, gold, args.copies,
                            args.threads, args.repeats, work)  # fmt: skip
    serving = {} if args.skip_servers else servers(args, export, early, plain, pythons, texts,
                                                   gold, work)  # fmt: skip
    import onnxruntime
    import tokenizers
    import torch
    import transformers

    result = {
        "benchmark": "peers",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine(),
        "load_average_1min": {"before": round(load_before[0], 2),
                              "after": round(os.getloadavg()[0], 2)},  # fmt: skip
        "stack": {"python": sys.version.split()[0], "torch": torch.__version__,
                  "onnxruntime": onnxruntime.__version__, "transformers": transformers.__version__,
                  "tokenizers": tokenizers.__version__},  # fmt: skip
        "peers": {
            "optimum": {**versions(pythons["optimum"], ("optimum-onnx", "optimum", "onnxruntime",
                                                        "transformers", "torch")),
                        "quantization": f"dynamic int8, AutoQuantizationConfig.{quantization}"},
            "infinity": versions(pythons["infinity"], ("infinity_emb", "transformers", "torch",
                                                       "sentence-transformers")),
            "naive": versions(pythons["naive"], ("fastapi", "uvicorn", "transformers", "torch")),
            "wrk": wrk_version(),
        },  # fmt: skip
        "model": {"task": "sst2", "method": args.method, "pooling": record.get("pooling"),
                  "exits": record.get("exits"),
                  "train_examples": train_examples(project),
                  "dev_accuracy_of_the_export": (record.get("int8") or {}).get("score")},  # fmt: skip
        "early_exit_models": described,
        "sentences": len(texts),
        "threads": args.threads,
        "in_process": inproc,
        "whole_process": process,
        "servers": {name: {**s, "held_up_to_p99_50ms": held(s["steps"]),
                           "saturation_per_s": max(x["throughput_per_s"] for x in s["steps"])}
                    if "steps" in s else s for name, s in serving.items()},  # fmt: skip
        "targets": targets(inproc, serving),
        "options": {k: v for k, v in vars(args).items()
                    if k not in ("project", "glue_dir", "cache", "out", "doc", "also_early_exit",
                                  "early_exit")},
        "also_early_exit": [e.partition("=")[0] for e in args.also_early_exit],  # labels only
    }  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(out, json.dumps(result, indent=2) + "\n")
    if args.doc:
        write_doc(args.doc, render(result))
    print(json.dumps(result["targets"], indent=2))


if __name__ == "__main__":
    main()
