"""``aclpipe serve``: a real server process on an ephemeral 127.0.0.1 port, a real HTTP client.

The server runs the tiny exported test model with torch and transformers blocked (the onnx
engine's server imports neither; ``test_serving.BLOCKER`` reports what was imported). The
iteration scheduler's policy grid runs in process on the same model, the micro-batcher's test
with no model at all. All traffic goes to 127.0.0.1, bounded in count and seconds.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import random
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from test_export import SENTENCES, trained_folders
from test_serving import BLOCKER

from aclpipe.data.tasks import TASKS
from aclpipe.early_exit.iteration import IterationScheduler, SegmentAdapter
from aclpipe.early_exit.policies import NO_EXIT
from aclpipe.early_exit.predict import Predictor
from aclpipe.early_exit.scheduler import Job, MicroBatcher
from aclpipe.early_exit.tokens import encode, load_fast_tokenizer, pad
from aclpipe.exits.export import export_exits
from aclpipe.layout import EXPORT_JSON
from aclpipe.modeling.model import load_multi_exit

MIX_REQUESTS = 2000  # 5% of them malformed
MAX_BODY = 2048
WORDS = ["good", "bad", "fun", "great", "awful", "the plot", "very", "not"]


def records_to_send() -> list[tuple[str, str | None]]:
    """Distinct sentences and pairs: the export tests' sentences, and variations of them."""
    texts = list(SENTENCES)
    rng = random.Random(1)
    for sentence in SENTENCES:
        for _ in range(3):
            texts.append(f"{sentence} {rng.choice(WORDS)} {rng.choice(WORDS)}")
    pairs = [(a, None) for a in texts]
    pairs += [(a, b) for a, b in zip(texts[:12], texts[12:24])]
    return pairs


@pytest.fixture(scope="module")
def task_export(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """The tiny model exported as an SST-2 model: export.json names its task."""
    root = tmp_path_factory.mktemp("serve-http")
    model_dir, data_dir = trained_folders(root, tiny_model_dir, "mean")
    export_exits(TASKS["sst2"], model_dir, data_dir, root / "export", batch_size=4)
    return root / "export"


@pytest.fixture(scope="module")
def export_dir(task_export: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same export with its task forgotten, so that it reads one text or a pair, as a
    model of unknown task does: the mixes below send both through one server."""
    folder = tmp_path_factory.mktemp("serve-any") / "forgot-task"
    shutil.copytree(task_export, folder)
    record = json.loads((folder / EXPORT_JSON).read_text(encoding="utf-8"))
    del record["task"]
    (folder / EXPORT_JSON).write_text(json.dumps(record), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def every_exit(export_dir: Path) -> list[list[list[float]]]:
    """Each record's logits at every exit (the PyTorch model, one record at a time): ``[C]``
    per exit per record."""
    model = load_multi_exit(export_dir / "model").eval()
    tokenizer = load_fast_tokenizer(export_dir / "tokenizer.json", 128)
    out = []
    for pair in records_to_send():
        batch = pad(encode(tokenizer, [pair]), 0)  # [1, T]
        with torch.no_grad():
            logits = model(**{k: torch.from_numpy(v) for k, v in batch.items()}).logits
        out.append(logits[:, 0].tolist())  # [E][C]
    return out


def entropy(row: list[float]) -> float:
    top = max(row)
    exp = [math.exp(z - top) for z in row]
    total = sum(exp)
    return math.log(total) - sum(e * (z - top) for e, z in zip(exp, row)) / total


def confidence(row: list[float]) -> float:
    top = max(row)
    return 1.0 / sum(math.exp(z - top) for z in row)


def far_threshold(values: list[float], low: int, high: int) -> float:
    """The middle of the widest gap between ``values`` from their ``low``-th to their
    ``high``-th tenth: a threshold that splits them, far from every one of them."""
    values = sorted(values)
    middle = values[len(values) * low // 10 : len(values) * high // 10]
    gap, at = max((b - a, (a + b) / 2) for a, b in zip(middle, middle[1:]))
    assert gap > 1e-5, gap
    return at


@pytest.fixture(scope="module")
def threshold(every_exit: list[list[list[float]]]) -> float:
    """An entropy threshold that splits the records between exits, far (in policy value) from
    every record's entropy at the inner exits, so batching cannot flip an exit."""
    return far_threshold([entropy(row) for rows in every_exit for row in rows[:-1]], 2, 8)


def expected_answers(export_dir: Path, threshold: float) -> dict:
    """What `predict` answers for each record, one at a time."""
    predictor = Predictor(export_dir, "entropy", threshold, "onnx", batch_size=1)
    pairs = records_to_send()
    lines = [json.dumps({"text": a} if b is None else {"text_a": a, "text_b": b}) for a, b in pairs]
    return dict(zip(pairs, predictor.records(lines, "jsonl")))


class Server:
    """``aclpipe serve`` in a child process with torch and transformers blocked."""

    def __init__(self, export_dir: Path, *options: str, script: str = BLOCKER) -> None:
        args = ["serve", "--model", str(export_dir), "--port", "0", *options]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([sys.executable, "-c", script, *args], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        line = self._stderr_line(timeout=120)
        found = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert found, line
        self.port = int(found.group(1))

    def _stderr_line(self, timeout: float) -> str:
        ready, _, _ = select.select([self.proc.stderr], [], [], timeout)
        assert ready, "the server printed nothing"
        return self.proc.stderr.readline().decode()

    def connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)

    def stop(self) -> tuple[int, list[str]]:
        """SIGTERM; the exit code and the torch/transformers modules it had imported."""
        self.proc.send_signal(signal.SIGTERM)
        out, err = self.proc.communicate(timeout=60)
        modules = json.loads(out.decode().strip().splitlines()[-1]) if out.strip() else None
        assert self.proc.returncode == 0, err.decode()
        return self.proc.returncode, modules

    def rss_kb(self) -> int:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+)", status).group(1))


def post(conn: http.client.HTTPConnection, body: bytes) -> tuple[int, dict, bytes]:
    conn.request("POST", "/predict", body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, dict(response.getheaders()), response.read()


def check_answer(got: dict, want: dict) -> None:
    assert got["label"] == want["label"] and got["exit_layer"] == want["exit_layer"]
    assert got["label_name"] == want["label_name"] and got["text"] == want["text"]
    assert got["probability"] == pytest.approx(want["probability"], abs=1e-4)


MALFORMED = {  # kind: (status, body)
    "bad_json": (400, b'{"text": "good'),
    "missing_field": (422, b'{"txt": "good"}'),
    "wrong_type": (422, b'{"text": 5}'),
    "empty_text": (422, b'{"text": "   "}'),
    "body_too_large": (413, json.dumps({"text": "good " * MAX_BODY}).encode()),
    "bad_text": (422, b'[{"text": "good"}, {"text": "\\ud800 film"}]'),  # a lone surrogate
    "too_deep": (400, b"[" * 1000 + b"]" * 1000),  # past the depth limit, under MAX_BODY
}


def request_mix(n: int) -> list[tuple[str, bytes, object]]:
    """``(kind, body, records or None)``: every 20th malformed, cycling through the kinds;
    the rest one record, one pair, or a list of 2-3."""
    pairs, rng, kinds = records_to_send(), random.Random(0), list(MALFORMED)
    out = []
    for i in range(n):
        if i % 20 == 19:
            kind = kinds[(i // 20) % len(kinds)]
            out.append((kind, MALFORMED[kind][1], None))
            continue
        chosen = rng.sample(pairs, rng.choice([1, 1, 1, 1, 2, 3]))
        items = [{"text": a} if b is None else {"text_a": a, "text_b": b} for a, b in chosen]
        single = len(items) == 1 and rng.random() < 0.8
        out.append(("valid", json.dumps(items[0] if single else items).encode(), (chosen, single)))
    return out


def errors_by_kind(conn: http.client.HTTPConnection) -> dict[str, float]:
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    found = re.findall(r'^aclpipe_errors_total\{kind="(\w+)"\} (\S+)$', text, re.M)
    return {kind: float(v) for kind, v in found}


@pytest.mark.slow
@pytest.mark.parametrize("scheduler", ["batch", "iteration"])
def test_a_malformed_mix_every_answer_as_predict(
    export_dir: Path, threshold: float, scheduler: str
) -> None:
    """2,000 requests, 5% malformed (a lone surrogate and a body nested 1,000 deep among them),
    from 8 client threads: each malformed one a 4xx with a one-line JSON error of its kind, each valid one predict's label and exit layer (probability
    within 1e-4), none dropped; the error counter in /metrics agrees. Under both schedulers."""
    expected = expected_answers(export_dir, threshold)
    assert len({r["exit_layer"] for r in expected.values()}) > 1  # the policy exits early
    server = Server(export_dir, "--policy", "entropy", "--threshold", repr(threshold),
                    "--max-body", str(MAX_BODY), "--max-batch", "16", "--max-wait-ms", "2",
                    "--scheduler", scheduler)  # fmt: skip
    mix = request_mix(MIX_REQUESTS)
    lanes = [mix[i::8] for i in range(8)]

    def run(lane) -> list[tuple]:
        conn = server.connection()
        return [(kind, records, *post(conn, body)) for kind, body, records in lane]

    began = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        answered = [row for rows in pool.map(run, lanes) for row in rows]
    seconds = time.perf_counter() - began
    assert len(answered) == MIX_REQUESTS
    for kind, records, status, _headers, body in answered:
        if kind != "valid":
            assert status == MALFORMED[kind][0], (kind, status, body)
            assert b"\n" not in body.strip() and json.loads(body)["kind"] == kind
            assert json.loads(body)["error"]
            continue
        assert status == 200, body
        chosen, single = records
        got = json.loads(body)
        for one, pair in zip([got] if single else got, chosen, strict=True):
            check_answer(one, expected[tuple(pair)])
    counted = errors_by_kind(server.connection())
    sent = {kind: sum(k == kind for k, *_ in mix) for kind in MALFORMED}
    assert counted == sent
    _, modules = server.stop()
    assert modules == []
    print(f"\n{MIX_REQUESTS} requests in {seconds:.1f} s ({scheduler})")


def burst(port: int, bodies: list[bytes]) -> list[tuple[int, dict, bytes]]:
    """Send every request on its own socket before reading any answer."""
    conns = [http.client.HTTPConnection("127.0.0.1", port, timeout=30) for _ in bodies]
    for conn, body in zip(conns, bodies):
        conn.request("POST", "/predict", body=body, headers={"Content-Type": "application/json"})
    out = []
    for conn in conns:
        response = conn.getresponse()
        out.append((response.status, dict(response.getheaders()), response.read()))
        conn.close()
    return out


@pytest.mark.slow
@pytest.mark.parametrize("scheduler", ["batch", "iteration"])
def test_overload_gets_503_with_retry_after_then_normal_service(
    export_dir: Path, threshold: float, scheduler: str
) -> None:
    """Bursts of 150 requests at once against a queue of 8 records: the rest get 503 with
    Retry-After, the admitted ones predict's answers, memory stays flat over three bursts, and
    afterwards every request is served."""
    expected = expected_answers(export_dir, threshold)
    pairs = [p for p in expected if p[1] is None]
    server = Server(export_dir, "--policy", "entropy", "--threshold", repr(threshold),
                    "--max-queue", "8", "--max-batch", "8", "--max-wait-ms", "20",
                    "--scheduler", scheduler)  # fmt: skip
    rss = []
    for round_ in range(3):
        chosen = [pairs[(round_ + i) % len(pairs)] for i in range(150)]
        answers = burst(server.port, [json.dumps({"text": a}).encode() for a, _ in chosen])
        refused = [a for a in answers if a[0] == 503]
        assert refused and len(refused) < len(answers), [a[0] for a in answers]
        for (status, headers, body), pair in zip(answers, chosen):
            if status == 503:
                assert headers["retry-after"] == "1" and json.loads(body)["kind"] == "overloaded"
            else:
                assert status == 200, body
                check_answer(json.loads(body), expected[pair])
        rss.append(server.rss_kb())
    assert rss[2] - rss[0] < 20_000, rss  # kB: bounded queue, nothing kept per request
    conn = server.connection()
    for pair in pairs[:20]:
        status, _, body = post(conn, json.dumps({"text": pair[0]}).encode())
        assert status == 200
        check_answer(json.loads(body), expected[pair])
    server.stop()


# The iteration scheduler waits for nothing: to have requests in flight when SIGTERM comes, the
# server's worker spends 1.5 s more on its first segment (the warm-up, in the main thread, not).
HOLD_FIRST_SEGMENT = """
import threading, time
from aclpipe.early_exit.iteration import SegmentAdapter
step, held = SegmentAdapter.step, []
def holding(self, cohort):
    if threading.current_thread() is not threading.main_thread() and not held:
        held.append(True)
        time.sleep(1.5)
    return step(self, cohort)
SegmentAdapter.step = holding
"""
ENTRY = "from aclpipe.cli import app"
HELD_BLOCKER = BLOCKER.replace(ENTRY, HOLD_FIRST_SEGMENT + ENTRY, 1)


@pytest.mark.slow
@pytest.mark.parametrize("scheduler", ["batch", "iteration"])
def test_sigterm_answers_what_is_in_flight_and_exits_0(
    export_dir: Path, threshold: float, scheduler: str
) -> None:
    """Requests in flight when SIGTERM arrives are answered (batch: waiting for their batch,
    max wait 1.5 s; iteration: in or behind a first segment held 1.5 s); the port stops
    accepting at once; the process exits 0."""
    assert HELD_BLOCKER != BLOCKER
    expected = expected_answers(export_dir, threshold)
    pairs = [p for p in expected if p[1] is None][:6]
    options = ["--policy", "entropy", "--threshold", repr(threshold), "--max-batch", "64"]
    if scheduler == "batch":
        server = Server(export_dir, *options, "--max-wait-ms", "1500")
    else:
        server = Server(export_dir, *options, "--scheduler", "iteration", script=HELD_BLOCKER)
    conns = [server.connection() for _ in pairs]
    for conn, (a, _) in zip(conns, pairs):
        conn.request("POST", "/predict", body=json.dumps({"text": a}).encode())
    time.sleep(0.5)  # admitted, waiting for the batch to fill or the held segment to end
    answered, _, _ = select.select([conn.sock for conn in conns], [], [], 0)
    assert answered == []  # every request is still in flight
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.port), timeout=5)
    for conn, pair in zip(conns, pairs):
        response = conn.getresponse()
        assert response.status == 200
        check_answer(json.loads(response.read()), expected[pair])
    out, err = server.proc.communicate(timeout=60)
    assert server.proc.returncode == 0, err.decode()
    assert json.loads(out.decode().strip().splitlines()[-1]) == []


def policy_grid(every_exit: list[list[list[float]]]) -> list[tuple[str, float | None]]:
    """Every policy at two thresholds, each far from every record's policy value at the inner
    exits (patience: 1 and 2 agreements), and none."""
    inner = [row for rows in every_exit for row in rows[:-1]]
    grid: list[tuple[str, float | None]] = [(NO_EXIT, None), ("patience", 1), ("patience", 2)]
    for policy, value in (("entropy", entropy), ("confidence", confidence)):
        values = [value(row) for row in inner]
        grid += [(policy, far_threshold(values, 2, 5)), (policy, far_threshold(values, 5, 8))]
    return grid


@pytest.mark.slow
def test_iteration_answers_as_predict_under_every_policy(
    export_dir: Path, every_exit: list[list[list[float]]]
) -> None:
    """Under every policy and two thresholds each: the iteration scheduler's answers, for the
    records in one padded cohort of mixed lengths and for them sent as jobs of 1-3 records
    (cohorts at several depths at once), are predict's (labels, exit layers, texts;
    probabilities within 1e-4)."""
    pairs = records_to_send()
    assert len({len(a.split()) for a, _ in pairs}) > 5  # mixed lengths: the cohorts are padded
    tops = [sorted(row)[-2:] for rows in every_exit for row in rows[:-1]]
    assert min(b - a for a, b in tops) > 1e-5  # no argmax may flip between batches (patience)
    lines = [json.dumps({"text": a} if b is None else {"text_a": a, "text_b": b}) for a, b in pairs]
    rng, split = random.Random(0), 0
    for policy, threshold in policy_grid(every_exit):
        predictor = Predictor(export_dir, policy, threshold, "onnx", batch_size=16)
        expected = list(predictor.records(lines, "jsonl"))
        adapter = SegmentAdapter(predictor)
        assert adapter.runtime is predictor.runtime  # the predictor's sessions, loaded once
        rows = encode(predictor.tokenizer, pairs)
        job = Job(rows)

        def record(output, pair, predictor=predictor) -> dict:
            text = "\t".join(t for t in pair if t is not None)
            return {**predictor.record(*output), "text": text}

        cohort, got = adapter.start([(job, i) for i in range(len(pairs))], rows), {}
        while cohort.owners:
            got.update({i: record(out, pairs[i]) for (_, i), out in adapter.step(cohort)})
        sizes = []
        while sum(sizes) < len(pairs):
            sizes.append(min(rng.choice([1, 2, 3]), len(pairs) - sum(sizes)))
        scheduler = IterationScheduler(adapter, max_batch=8, max_queue=len(pairs))
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        jobs = [scheduler.submit(rows[a : a + n]) for a, n in zip(starts, sizes)]
        outputs = [output for job in jobs for output in job.future.result(30)]
        scheduled = [record(output, pair) for output, pair in zip(outputs, pairs, strict=True)]
        scheduler.close(30)
        setting = (policy, threshold)
        assert sorted(got) == list(range(len(pairs))), setting
        for want, one, other in zip(expected, [got[i] for i in range(len(pairs))], scheduled):
            check_answer(one, want)
            check_answer(other, want)
        split += len({r["exit_layer"] for r in expected}) > 1
    assert split >= 4  # the grid is informative: most settings split the records between exits


def _break(folder: Path, how: str) -> None:
    if how == "segment":
        (folder / "segment_2.onnx").write_bytes(b"not a graph")
    elif how == "tokenizer":
        (folder / "tokenizer.json").unlink()
    else:
        (folder / EXPORT_JSON).write_text("{", encoding="utf-8")


@pytest.mark.slow
@pytest.mark.parametrize(
    "how, message",
    [("segment", "onnxruntime cannot load"), ("tokenizer", "no tokenizer.json"),
     ("record", "export.json is damaged")],
)  # fmt: skip
def test_a_broken_export_is_one_line_and_exit_2(export_dir, tmp_path, how, message) -> None:
    folder = tmp_path / "export"
    shutil.copytree(export_dir, folder)
    _break(folder, how)
    with socket.socket() as probe:  # a free port, then nothing must ever listen on it
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = subprocess.run(
        [sys.executable, "-m", "aclpipe.cli", "serve", "--model", str(folder), "--port", str(port)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    assert "Traceback" not in done.stderr and "aclpipe serve: http" not in done.stderr
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)


def test_micro_batcher_bounds_batches_and_the_queue() -> None:
    """Against a plain reference: every job answered with its own records in order, no batch
    over max_batch, a job never split, admission refused beyond max_queue records."""
    sizes: list[int] = []
    gate = threading.Event()

    def answer(pairs):
        gate.wait(5)  # hold the first batch so the queue fills behind it
        return [{"text": a, "n": len(pairs)} for a, _ in pairs]

    batcher = MicroBatcher(answer, max_batch=4, max_wait=0.05, max_queue=6, on_batch=sizes.append)
    first = batcher.submit([("a", None)])
    time.sleep(0.2)  # the worker has taken it (max wait passed) and is held in answer()
    jobs = [[(f"{i}-{j}", None) for j in range(1 + i % 3)] for i in range(4)]  # 1, 2, 3, 1 records
    admitted = [batcher.submit(job) for job in jobs]
    assert [j is not None for j in admitted] == [True, True, True, False]  # 1+2+3 = 6 waiting
    gate.set()
    assert first.future.result(5)[0]["text"] == "a"
    for job, sent in zip(jobs[:3], admitted[:3]):
        assert [r["text"] for r in sent.future.result(5)] == [a for a, _ in job]
        assert sent.arrived <= sent.started <= sent.finished  # the parts /metrics splits
    assert sizes[0] == 1 and max(sizes) <= 4 and sum(sizes) == 7
    gone = batcher.submit([("gone", None)])  # its client left: cancelled before it runs
    assert gone.future.cancel()
    after = batcher.submit([("after", None)])
    assert after.future.result(5)[0]["text"] == "after"  # worker lives on
    batcher.close(5)
    assert batcher.submit([("late", None)]) is None


@pytest.mark.slow
def test_a_record_of_the_wrong_kind_is_refused_as_predict_refuses_it(task_export: Path) -> None:
    """An export that names its task (SST-2: one text) answers a pair with a one-line 422
    ``wrong_texts``, in a list too, and goes on answering single texts."""
    server = Server(task_export)
    try:
        conn = server.connection()
        pair = {"text_a": "a man plays .", "text_b": "he plays ."}
        for body, where in ((pair, "the record"), ([{"text": "good ."}, pair], "record 1")):
            status, _, raw = post(conn, json.dumps(body).encode())
            answer = json.loads(raw)
            assert status == 422 and answer["kind"] == "wrong_texts", raw
            assert answer["error"] == (
                f'{where} holds two texts, but this model (sst2) reads one: send {{"text": "..."}}'
            )
            assert b"\n" not in raw.strip()
        status, _, raw = post(conn, json.dumps({"text": "good ."}).encode())
        assert status == 200 and json.loads(raw)["exit_layer"] is not None
        assert errors_by_kind(conn).get("wrong_texts") == 2.0
    finally:
        server.stop()


def get_json(conn: http.client.HTTPConnection, path: str) -> dict:
    conn.request("GET", path)
    return json.loads(conn.getresponse().read())


@pytest.mark.slow
@pytest.mark.parametrize("scheduler", ["batch", "iteration"])
def test_shadow_every_record_answers_as_predict_and_observes_them_all(
    export_dir: Path, threshold: float, scheduler: str
) -> None:
    """``--shadow 1`` on the real export with torch blocked: every answer is predict's, every
    record is observed (the early ones resumed from their states after their answer), /info
    and /metrics show it, and nothing imports torch."""
    expected = expected_answers(export_dir, threshold)
    server = Server(export_dir, "--policy", "entropy", "--threshold", f"{threshold!r}",
                    "--shadow", "1", "--shadow-share", "1000", "--scheduler", scheduler)  # fmt: skip
    try:
        conn = server.connection()
        pairs = records_to_send()
        for a, b in pairs:
            body = {"text": a} if b is None else {"text_a": a, "text_b": b}
            status, _, answer = post(conn, json.dumps(body).encode())
            assert status == 200, answer
            check_answer(json.loads(answer), expected[(a, b)])
        deadline = time.monotonic() + 30
        while (shadow := get_json(conn, "/info")["shadow"])["observed"] < len(pairs):
            assert time.monotonic() < deadline, shadow
            time.sleep(0.05)
        assert shadow["drawn"] == len(pairs) and shadow["refused"] == shadow["dropped"] == 0
        controller = shadow["controller"]
        assert controller["window"] == len(pairs) and controller["threshold"] == threshold
        last = controller["per_exit"][-1]["exit_layer"]
        early = sum(expected[pair]["exit_layer"] != last for pair in pairs)
        assert sum(row["served"] for row in controller["per_exit"][:-1]) == early > 0
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        assert re.search(rf"^aclpipe_shadow_observed_total {len(pairs)}\.0$", text, re.M)
        assert re.search(r"^aclpipe_window_agreement \S+$", text, re.M)
    finally:
        _, modules = server.stop()
    assert modules == []


@pytest.mark.slow
@pytest.mark.parametrize(
    "options, words",
    [(["--policy", "none", "--shadow", "0.5", "--recalibrate"], "policy none"),
     (["--engine", "torch", "--shadow", "0.5"], "onnx engine only"),
     (["--recalibrate"], "add --shadow")],
)  # fmt: skip
def test_shadow_refusals_are_one_line_and_exit_2(task_export: Path, options, words) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "aclpipe.cli", "serve", "--model", str(task_export), "--port", "0",
         *options], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and words in lines[0], result.stderr
