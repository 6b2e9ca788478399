"""The server's HTTP API in process: its Starlette app called as ASGI, over a real batcher and
a real tokenizer, with a small deterministic engine written here (so the tests need no
exported model and run in milliseconds). The real model behind a real server is
``test_serve.py``'s.

Covered: the API key (Bearer, 401 with one line of JSON, the probes open), TEI's body and
answers, /info, the body depth limit, records refused before they join a batch (surrogates,
control characters), and an engine failure answered to its own request only.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from tokenizers.processors import TemplateProcessing

from aclpipe.early_exit.bodies import MAX_DEPTH, BadRequest, Limits, check_depth, read_body
from aclpipe.early_exit.predict import Predictor
from aclpipe.early_exit.routes import Metrics, build_app
from aclpipe.early_exit.scheduler import MicroBatcher, length_groups
from aclpipe.early_exit.serve import ServeSettings
from aclpipe.errors import UserError

WORDS = ["good", "bad", "film", "plot", "very", "not", "poison"]
KEY = "k3y-for-tests"


def word_tokenizer() -> Tokenizer:
    vocab = {w: i for i, w in enumerate(["[UNK]", "[CLS]", "[SEP]", *WORDS])}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.post_processor = TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 1), ("[SEP]", 2)],
    )  # fmt: skip
    return tokenizer


POISON = WORDS.index("poison") + 3


def engine_output(ids: list[int]) -> tuple[list[float], list[float], int]:
    """The engine's answer for one row, written plainly: two logits and an exit layer from
    the ids; probabilities by the softmax's definition."""
    logits = [float(sum(ids) % 7), float(len(ids)) / 2]
    total = sum(math.exp(z) for z in logits)
    return logits, [math.exp(z) / total for z in logits], 1 + len(ids) % 3


class Engine:
    """Answers a batch row by row with ``engine_output``; fails a whole batch holding the
    poison word (with a two-line message, as onnxruntime's are), and counts its calls."""

    def __init__(self) -> None:
        self.batches: list[int] = []
        self.failed = 0

    def __call__(self, rows: list[dict]) -> list[tuple]:
        self.batches.append(len(rows))
        if any(POISON in row["input_ids"] for row in rows):
            self.failed += 1
            raise RuntimeError("the engine fell over\nC++ detail on a second line")
        return [engine_output(row["input_ids"]) for row in rows]


class Model:
    """What the app reads of predict's ``Predictor``: the tokenizer, label names, ``record``."""

    regression, num_labels, names = False, 2, ["negative", "positive"]
    record = Predictor.record

    def __init__(self) -> None:
        self.tokenizer = word_tokenizer()


def make_app(api_key: str | None = None, max_wait: float = 0.0, max_batch: int = 32,
             tokenizer=None):  # fmt: skip
    engine, model = Engine(), Model()
    if tokenizer is not None:
        model.tokenizer = tokenizer
    settings = ServeSettings(model=Path("served"), api_key=api_key, max_batch=max_batch)
    metrics = Metrics([1, 2, 3])
    batcher = MicroBatcher(engine, max_batch, max_wait, settings.max_queue,
                           on_batch=metrics.batch_size.observe)  # fmt: skip
    info = {"model": "served", "limits": settings.limits()}
    limits = Limits(settings.max_body, settings.max_queue)
    app = build_app(batcher, model, metrics, limits, settings, {}, info)
    return app, engine, batcher


async def call(app, method: str, path: str, body: bytes = b"", headers: dict | None = None):
    """One HTTP request through the ASGI app: ``(status, headers, body)``."""
    raw = [(b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "headers": raw,
             "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000)}  # fmt: skip
    pending = [{"type": "http.request", "body": body, "more_body": False}]
    out: dict = {"body": b""}

    async def receive():
        if pending:
            return pending.pop()
        await asyncio.sleep(60)
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.start":
            out["status"] = message["status"]
            out["headers"] = {k.decode(): v.decode() for k, v in message["headers"]}
        else:
            out["body"] += message.get("body", b"")

    await app(scope, receive, send)
    return out["status"], out["headers"], out["body"]


def one_line_error(body: bytes, kind: str) -> str:
    assert b"\n" not in body.strip(), body
    answer = json.loads(body)
    assert answer["kind"] == kind and answer["error"], answer
    return answer["error"]


def expected_record(text: str, pair: str | None = None) -> dict:
    ids = word_tokenizer().encode(text, pair).ids if pair else word_tokenizer().encode(text).ids
    logits, probs, layer = engine_output(ids)
    label = probs.index(max(probs))
    name = Model.names[label]
    shown = text if pair is None else f"{text}\t{pair}"
    return {"label": label, "label_name": name, "probability": probs[label],
            "exit_layer": layer, "text": shown}  # fmt: skip


def post(app, body, headers: dict | None = None):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return call(app, "POST", "/predict", data, headers)


# The API key ---------------------------------------------------------------------------------

AUTH_CASES = [  # (Authorization header or None, admitted)
    (None, False),
    ("", False),
    (f"Bearer {KEY}", True),
    (f"bearer {KEY}", True),  # the scheme is case-insensitive (RFC 7235)
    (f"Bearer  {KEY} ", True),
    (f"Bearer {KEY}x", False),
    (f"Bearer {KEY[:-1]}", False),
    (f"Basic {KEY}", False),
    (KEY, False),
    ("Bearer", False),
    (f"Token {KEY}", False),
]


@pytest.mark.parametrize("header, admitted", AUTH_CASES)
def test_api_key_guards_every_route_but_the_probes(header: str | None, admitted: bool) -> None:
    app, _, batcher = make_app(api_key=KEY)
    headers = {} if header is None else {"Authorization": header}

    async def run():
        return {
            "predict": await post(app, {"text": "good film"}, headers),
            "info": await call(app, "GET", "/info", headers=headers),
            "metrics": await call(app, "GET", "/metrics", headers=headers),
            "healthz": await call(app, "GET", "/healthz", headers=headers),
            "readyz": await call(app, "GET", "/readyz", headers=headers),
        }

    got = asyncio.run(run())
    batcher.close(5)
    assert got["healthz"][0] == 200 and got["readyz"][0] == 200  # probes need no key
    for route in ("predict", "info", "metrics"):
        status, response_headers, body = got[route]
        if admitted:
            assert status == 200, (route, body)
            continue
        assert status == 401 and response_headers["www-authenticate"] == "Bearer", route
        message = one_line_error(body, "unauthorized")
        assert "Authorization: Bearer <key>" in message and KEY not in message
    if admitted:
        assert json.loads(got["predict"][2]) == expected_record("good film")


def test_no_api_key_means_no_check_and_a_bad_key_is_refused_at_start() -> None:
    app, _, batcher = make_app()
    status, _, body = asyncio.run(post(app, {"text": "good film"}))
    batcher.close(5)
    assert status == 200 and json.loads(body) == expected_record("good film")
    for bad in ("short", "has a space in it", "tab\tin-the-key"):
        with pytest.raises(UserError, match="--api-key must be at least 8 printable"):
            ServeSettings(model=Path("m"), api_key=bad)


# TEI's body ----------------------------------------------------------------------------------

TEI_CASES = [  # (inputs, the records they mean, single)
    ("good film", [("good film", None)], True),
    (["good film", "bad plot"], [("good film", "bad plot")], True),  # two strings: one pair
    (["good film"], [("good film", None)], False),
    (["good film", "bad plot", "very good"], [("good film", None), ("bad plot", None),
                                               ("very good", None)], False),  # fmt: skip
    ([["good film", "bad plot"]], [("good film", "bad plot")], False),
    ([["good", "bad"], "not good", ["film", "plot"]],
     [("good", "bad"), ("not good", None), ("film", "plot")], False),  # fmt: skip
]


def tei_answer(text: str, pair: str | None, raw: bool) -> list[dict]:
    ids = word_tokenizer().encode(text, pair).ids if pair else word_tokenizer().encode(text).ids
    logits, probs, _ = engine_output(ids)
    scores = logits if raw else probs
    ranked = sorted(zip(scores, Model.names), reverse=True)
    return [{"score": s, "label": name} for s, name in ranked]


@pytest.mark.parametrize("raw", [False, True])
@pytest.mark.parametrize("inputs, records, single", TEI_CASES)
def test_tei_body_is_answered_tei_s_way(inputs, records, single: bool, raw: bool) -> None:
    app, _, batcher = make_app()
    body = {"inputs": inputs, "truncate": True, **({"raw_scores": True} if raw else {})}
    status, _, answer = asyncio.run(post(app, body))
    batcher.close(5)
    assert status == 200, answer
    want = [tei_answer(a, b, raw) for a, b in records]
    assert json.loads(answer) == (want[0] if single else want)
    assert read_body(json.dumps(body).encode(), Limits(65536, 256)).pairs == records


@pytest.mark.parametrize(
    "body, status, kind",
    [({"inputs": 5}, 422, "wrong_type"), ({"inputs": []}, 422, "missing_field"),
     ({"inputs": [["a", "b", "c"]]}, 422, "wrong_type"), ({"inputs": "  "}, 422, "empty_text"),
     ({"inputs": "good", "raw_scores": "yes"}, 422, "wrong_type"),
     ({"inputs": ["good"] * 300}, 413, "too_many_records"),
     ({"inputs": "bad \ud800 film"}, 422, "bad_text")],
)  # fmt: skip
def test_a_bad_tei_body_is_one_line(body, status: int, kind: str) -> None:
    app, _, batcher = make_app()
    got, _, answer = asyncio.run(post(app, body))
    batcher.close(5)
    assert got == status
    one_line_error(answer, kind)


def test_info_names_the_model_and_its_limits() -> None:
    app, _, batcher = make_app()
    status, _, body = asyncio.run(call(app, "GET", "/info"))
    batcher.close(5)
    info = json.loads(body)
    assert status == 200 and info["model"] == "served"
    assert info["limits"] == {"max_batch": 32, "max_wait_ms": 0.0, "max_queue": 256,
                              "max_records": 256, "max_body": 65536, "max_length": 128,
                              "max_depth": MAX_DEPTH}  # fmt: skip


# Records checked before they join a batch ----------------------------------------------------


def depth_reference(body: str) -> int:
    """The deepest bracket nesting outside JSON strings, one character at a time."""
    depth = deepest = 0
    in_string = escaped = False
    for char in body:
        if in_string:
            escaped, in_string = (False, True) if escaped else (char == "\\", char != '"')
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def nested(depth: int, kind: str) -> str:
    inner = '{"text": "good [[ {{ \\" ]] film"}'
    for level in range(depth - 1):
        inner = f"[{inner}]" if (kind == "lists" or level % 2) else f'{{"x": {inner}}}'
    return inner


@pytest.mark.parametrize("kind", ["lists", "mixed"])
@pytest.mark.parametrize("depth", [1, 2, 3, 8, 15, 16, 17, 40, 5000])
def test_depth_limit_against_a_plain_scan(depth: int, kind: str) -> None:
    """Brackets inside strings do not count; past ``MAX_DEPTH`` the body is 400 ``too_deep``,
    however deep (no RecursionError), and the app answers it so."""
    body = nested(depth, kind)
    assert depth_reference(body) == depth
    if depth <= MAX_DEPTH:
        check_depth(body.encode())
    else:
        with pytest.raises(BadRequest) as refused:
            check_depth(body.encode())
        assert refused.value.status == 400 and refused.value.kind == "too_deep"
    if depth > MAX_DEPTH:
        app, _, batcher = make_app()
        status, _, answer = asyncio.run(post(app, body.encode()))
        batcher.close(5)
        assert status == 400 and "deeper than 16" in one_line_error(answer, "too_deep")


CONTROL = [c for c in range(0xA0) if c < 0x20 or c >= 0x7F]


@pytest.mark.parametrize("code", CONTROL + [0xD800, 0xDBFF, 0xDC00, 0xDFFF])
def test_a_bad_character_is_refused_naming_it_and_its_neighbours_are_answered(code: int) -> None:
    """Every control character but tab, LF and CR, and lone surrogates: 422 ``bad_text``
    naming the character and its position, for the record alone; the good records sent at
    the same moment get the engine's answers."""
    text = "good " + chr(code) + " film"
    app, engine, batcher = make_app(max_wait=0.05)
    good = ["good film", "bad plot", "very good film", "not good"]

    async def run():
        bad = post(app, json.dumps({"text": text}).encode())
        return await asyncio.gather(bad, *(post(app, {"text": g}) for g in good))

    (status, _, body), *answers = asyncio.run(run())
    batcher.close(5)
    if chr(code) in "\t\n\r":
        assert status == 200, body
    else:
        assert status == 422
        message = one_line_error(body, "bad_text")
        assert f"U+{code:04X} at character 6" in message
    for (got, _, answer), sent in zip(answers, good):
        assert got == 200 and json.loads(answer) == expected_record(sent)
    assert engine.failed == 0


class Refusing:
    """The word tokenizer, but ``encode_batch`` refuses any batch holding "film plot" (as
    tokenizers raises on input it cannot take, with a two-line message)."""

    def __init__(self) -> None:
        self.inner = word_tokenizer()

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def encode_batch(self, texts):
        if any("film plot" in (t if isinstance(t, str) else " ".join(t)) for t in texts):
            raise ValueError("cannot encode\nsecond line")
        return self.inner.encode_batch(texts)


@pytest.mark.parametrize("at, size", [(0, 1), (0, 3), (1, 3), (2, 3)])
def test_a_text_the_tokenizer_refuses_is_422_for_its_request_alone(at: int, size: int) -> None:
    """A record the tokenizer raises on: 422 ``bad_text`` naming the record (its index in a
    list) and the tokenizer's first line; good requests sent at the same moment answered."""
    app, engine, batcher = make_app(max_wait=0.05, tokenizer=Refusing())
    records = [{"text": "good film"} for _ in range(size)]
    records[at] = {"text": "a film plot"}
    good = ["good film", "bad plot", "very good film"]

    async def run():
        bad = post(app, records if size > 1 else records[0])
        return await asyncio.gather(bad, *(post(app, {"text": g}) for g in good))

    (status, _, body), *answers = asyncio.run(run())
    batcher.close(5)
    assert status == 422
    message = one_line_error(body, "bad_text")
    where = f"record {at}" if at else "the record"
    assert message.startswith(f"{where}: the tokenizer cannot take it (cannot encode)")
    for (got, _, answer), sent in zip(answers, good):
        assert got == 200 and json.loads(answer) == expected_record(sent)
    assert engine.failed == 0


def test_an_engine_failure_answers_its_own_request_only() -> None:
    """A batch that fails in the engine is run again job by job: the request holding the
    poisonous record gets 500 ``engine`` (one line), the others sent with it their answers;
    the worker lives on."""
    app, engine, batcher = make_app(max_wait=0.05)
    good = [{"text": t} for t in ("good film", "bad plot", "very good", "not bad")]
    good.append([{"text": "film"}, {"text_a": "good", "text_b": "plot"}])

    async def run():
        poisoned = post(app, {"text": "a poison film"})
        return await asyncio.gather(poisoned, *(post(app, body) for body in good))

    (status, _, body), *answers = asyncio.run(run())
    assert status == 500
    message = one_line_error(body, "engine")
    assert "RuntimeError: the engine fell over" in message and "second line" not in message
    assert engine.batches[0] == 7 and engine.failed == 2  # together, then the poison alone
    for (got, _, answer), sent in zip(answers, good):
        assert got == 200
        if isinstance(sent, list):
            want = [expected_record("film"), expected_record("good", "plot")]
        else:
            want = expected_record(sent["text"])
        assert json.loads(answer) == want
    status, _, answer = asyncio.run(post(app, {"text": "good film"}))
    assert status == 200 and json.loads(answer) == expected_record("good film")
    status, _, metrics = asyncio.run(call(app, "GET", "/metrics"))
    batcher.close(5)
    text = metrics.decode()
    assert re.search(r'^aclpipe_errors_total\{kind="engine"\} 1\.0$', text, re.M)
    for part in ("tokenization", "queue", "inference"):
        count = re.search(rf'aclpipe_request_part_seconds_count\{{part="{part}"\}} (\S+)', text)
        assert float(count.group(1)) == 6.0  # the answered requests


# The server's rows of docs/bad_inputs.md -----------------------------------------------------

DOCS = Path(__file__).resolve().parents[1] / "docs" / "bad_inputs.md"
HTTP_CASES = [  # (name, body, the app's API key, status)
    ("serve-lone-surrogate", b'{"text": "\\ud800 film"}', None, 422),
    ("serve-control-character", b'[{"text": "good"}, {"text": "bell \\u0007 film"}]', None, 422),
    ("serve-nested-too-deep", b"[" * 5000 + b"]" * 5000, None, 400),
    ("serve-not-json", b'{"text": "good', None, 400),
    ("serve-tei-not-text", b'{"inputs": 5}', None, 422),
    ("serve-pair-in-tei-list", b'{"inputs": [["good", "bad", "plot"]]}', None, 422),
    ("serve-no-api-key", b'{"text": "good film"}', KEY, 401),
    ("serve-engine-failure", b'{"text": "a poison film"}', None, 500),
]


def doc_rows(section: str) -> list[list[str]]:
    text = DOCS.read_text(encoding="utf-8").split(section, 1)[1].split("\n## ", 1)[0]
    return [
        [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        for line in text.splitlines()
        if line.startswith("| `")
    ]


def test_docs_show_every_server_case_as_the_server_answers_it() -> None:
    """docs/bad_inputs.md's server table: one row per case, in order, with the status and the
    exact one-line answer the app gives."""
    rows = doc_rows("## The server")
    assert [row[0].strip("`") for row in rows] == [name for name, *_ in HTTP_CASES]
    for row, (name, body, api_key, status) in zip(rows, HTTP_CASES):
        app, _, batcher = make_app(api_key=api_key)
        got, _, answer = asyncio.run(post(app, body))
        batcher.close(5)
        assert got == status and b"\n" not in answer.strip(), (name, got, answer)
        assert row[2] == f"{status} `{answer.decode()}`", (name, row[2])
        assert len(row) == 4 and all(row), row


def test_serving_doc_lists_every_route_and_every_error_kind() -> None:
    """docs/serving.md shows each route of the app and each error kind the code can answer
    (read from the source: every ``BadRequest(status, "kind"`` and ``error(status, "kind"``)."""
    app, _, batcher = make_app()
    batcher.close(5)
    doc = (DOCS.parent / "serving.md").read_text(encoding="utf-8")
    for route in app.routes:
        for method in route.methods - {"HEAD"}:
            assert f"`{method} {route.path}`" in doc, (method, route.path)
    source = Path(__file__).resolve().parents[1] / "src" / "aclpipe" / "early_exit"
    text = "".join((source / name).read_text(encoding="utf-8") for name in ("routes.py", "bodies.py"))
    kinds = set(re.findall(r'(?:BadRequest|error)\(\s*\d+,\s*"(\w+)"', text))
    kinds |= set(re.findall(r'\d{3}: "(\w+)"', text))  # the 404/405 kinds
    assert {"bad_text", "too_deep", "unauthorized", "engine", "not_found"} <= kinds
    for kind in kinds:
        assert f"`{kind}`" in doc, kind


def brute_force_cost(lengths: list[int], call_tokens: float) -> float:
    """The cheapest split of the sorted lengths into runs, trying every set of cut points."""
    ranked, best = sorted(lengths), math.inf
    for mask in range(1 << (len(ranked) - 1)):
        cuts = [0, *(i + 1 for i in range(len(ranked) - 1) if mask >> i & 1), len(ranked)]
        runs = [ranked[a:b] for a, b in zip(cuts, cuts[1:])]
        best = min(best, sum(call_tokens + len(run) * run[-1] for run in runs))
    return best


@pytest.mark.parametrize("call_tokens", [0.5, 8, 40])
@pytest.mark.parametrize("seed", range(12))
def test_length_groups_finds_the_cheapest_split(seed: int, call_tokens: float) -> None:
    rng = random.Random(seed)
    lengths = [rng.choice([3, 5, 9, 12, 20, 31, 55]) for _ in range(rng.randint(1, 9))]
    groups = length_groups(lengths, call_tokens)
    assert sorted(i for group in groups for i in group) == list(range(len(lengths)))
    cost = sum(call_tokens + len(g) * max(lengths[i] for i in g) for g in groups)
    assert cost == pytest.approx(brute_force_cost(lengths, call_tokens))
