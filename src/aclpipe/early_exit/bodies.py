"""What a ``POST /predict`` body may hold, read and checked before any record joins a batch.

Two bodies are read:

- predict's records: one ``{"text": "..."}`` or ``{"text_a": "...", "text_b": "..."}``
  (answered by one object), or a JSON list of them (answered by a list in the same order);
- the TEI body of text-embeddings-inference's ``/predict``: ``{"inputs": ...}`` where
  ``inputs`` is a string (one text), a list of two strings (one pair, as TEI reads it), or a
  list whose items are strings or two-string lists (a batch); ``raw_scores`` (logits instead
  of probabilities) and ``truncate`` are read, other keys ignored as TEI ignores them.
  Answered TEI's way: per input, every label with its score, highest first; a list of those
  for a batch.

Every record is checked here, so a bad one is refused with its request alone (422
``bad_text``) and never reaches the engine: a lone surrogate (``"\\ud800"`` in the JSON: not
Unicode text, and the tokenizer cannot take it), a control character other than tab, line
feed and carriage return (Unicode category Cc: C0, DEL and C1), and whatever else the
tokenizer refuses (``tokenize``). A body nested deeper than ``MAX_DEPTH`` brackets is refused
(400 ``too_deep``) before it is parsed, so no body can exhaust the parser's recursion.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from aclpipe.early_exit.inputs import texts_mismatch
from aclpipe.early_exit.tokens import encode

Pair = tuple[str, "str | None"]  # (text, second text or None)
# Deepest bracket nesting a body may have: a TEI batch of pairs needs 3.
MAX_DEPTH = 16
_BRACKET = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')  # a JSON string (skipped), or a bracket
_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")  # Cc less \t \n \r
_JSON_TYPES = {"int": "number", "float": "number", "bool": "boolean", "NoneType": "null",
               "dict": "object", "list": "list", "str": "string"}  # fmt: skip


@dataclass(frozen=True)
class Limits:
    max_body: int  # bytes of one request body
    max_records: int  # records in one request (the queue's bound: a longer list never fits)
    texts: int | None = None  # texts per record the model reads (1, 2 for pairs; None: unknown)
    task: str | None = None  # the model's task, named in the error for a record of the wrong kind


@dataclass(frozen=True)
class Body:
    pairs: list[Pair]
    single: bool  # one record, answered by one object (TEI: one input, one list of labels)
    tei: bool = False  # the TEI body: answered TEI's way
    raw_scores: bool = False  # TEI: logits instead of probabilities


class BadRequest(Exception):
    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, " ".join(message.split())


def check_depth(body: bytes, limit: int = MAX_DEPTH) -> None:
    """``BadRequest`` (400 ``too_deep``) when brackets outside strings nest past ``limit``."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return  # too few brackets to nest that deep: the common case, no scan
    depth = 0
    for found in _BRACKET.finditer(body):
        char = found.group()[0]
        if char in b"[{":
            depth += 1
            if depth > limit:
                raise BadRequest(
                    400, "too_deep",
                    f"body nests brackets deeper than {limit}: send {{\"text\": \"...\"}}, a "
                    'list of them, or {"inputs": ...}',
                )  # fmt: skip
        elif char in b"]}":
            depth -= 1


def read_body(body: bytes, limits: Limits) -> Body:
    """The records of a request body (module docstring), each checked, or ``BadRequest``."""
    check_depth(body)
    try:
        data = json.loads(body)
    except ValueError as err:  # JSONDecodeError, or bytes that are not UTF-8
        reason = getattr(err, "msg", type(err).__name__)
        raise BadRequest(
            400, "bad_json",
            f'body is not JSON ({reason}): send {{"text": "..."}} or a list of them',
        ) from None  # fmt: skip
    if isinstance(data, dict) and "inputs" in data:
        parsed = _tei(data, limits.max_records)
    else:
        single = not isinstance(data, list)
        items = [data] if single else data
        _count(len(items), limits.max_records)
        parsed = Body([_pair(item, i) for i, item in enumerate(items)], single)
    for i, pair in enumerate(parsed.pairs):
        where = f"{'input' if parsed.tei else 'record'} {i}" if i else f"the {'input' if parsed.tei else 'record'}"
        check_texts(pair, where)
        if not limits.texts:
            continue
        wrong = texts_mismatch(pair, limits.texts, limits.task, where)
        if wrong is not None:  # predict refuses the same records (inputs.check_pair)
            raise BadRequest(422, "wrong_texts", f"{wrong}: {_send(limits.texts, parsed.tei)}")
    return parsed


def _count(count: int, max_records: int) -> None:
    if not count:
        raise BadRequest(422, "missing_field", "the list holds no records: send at least one")
    if count > max_records:
        raise BadRequest(
            413, "too_many_records",
            f"{count} records in one request, at most {max_records}: split the list",
        )  # fmt: skip


def _send(texts: int, tei: bool) -> str:
    if tei:
        return (
            'send {"inputs": "..."} or a list of strings (a list of exactly two strings is one '
            "pair, as TEI reads it)"
            if texts == 1
            else 'send {"inputs": ["text a", "text b"]} or a list of such pairs'
        )
    return 'send {"text": "..."}' if texts == 1 else 'send {"text_a": "...", "text_b": "..."}'


def _pair(item, index: int) -> Pair:
    where = f"record {index}" if index else "the record"
    if not isinstance(item, dict) or not ({"text", "text_a"} & item.keys()):
        raise BadRequest(
            422, "missing_field",
            f'{where} has no "text" (or "text_a"): send {{"text": "..."}} or '
            '{"text_a": "...", "text_b": "..."}',
        )  # fmt: skip
    first = "text" if "text" in item else "text_a"
    a, b = item[first], item.get("text_b") if first == "text_a" else None
    for name, value in ((first, a), ("text_b", b)):
        if value is not None and not isinstance(value, str):
            raise BadRequest(
                422, "wrong_type", f'{where}: "{name}" is a {_kind(value)}, not a string'
            )
    if a is None or not a.strip() or (b is not None and not b.strip()):
        raise BadRequest(422, "empty_text", f"{where} has an empty text: send words to classify")
    return a, b


def _tei(data: dict, max_records: int) -> Body:
    """TEI's ``{"inputs": ...}`` (module docstring)."""
    inputs, raw, truncate = data["inputs"], data.get("raw_scores", False), data.get("truncate")
    if not isinstance(raw, bool) or truncate not in (None, True, False):
        raise BadRequest(422, "wrong_type", '"raw_scores" and "truncate" take true or false')
    if isinstance(inputs, str):
        items, single = [inputs], True
    elif _is_pair(inputs):  # TEI reads a list of two strings as one pair
        items, single = [inputs], True
    elif isinstance(inputs, list):
        items, single = inputs, False
        _count(len(items), max_records)
    else:
        raise BadRequest(
            422, "wrong_type",
            f'"inputs" is a {_kind(inputs)}: send a string, a pair of strings or a list '
            "of them",
        )  # fmt: skip
    pairs: list[Pair] = []
    for i, item in enumerate(items):
        where = f"input {i}" if not single else "the input"
        if isinstance(item, str):
            pairs.append((item, None))
        elif _is_pair(item):
            pairs.append((item[0], item[1]))
        else:
            raise BadRequest(
                422, "wrong_type",
                f"{where} is a {_kind(item)}: send a string or a list of two strings",
            )  # fmt: skip
        if not pairs[-1][0].strip() or (pairs[-1][1] is not None and not pairs[-1][1].strip()):
            raise BadRequest(422, "empty_text", f"{where} has an empty text: send words to classify")
    return Body(pairs, single, tei=True, raw_scores=raw)


def _kind(value) -> str:
    """The JSON type of a parsed value, as the client wrote it."""
    return _JSON_TYPES.get(type(value).__name__, type(value).__name__)


def _is_pair(value) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value)


def check_texts(pair: Pair, where: str) -> None:
    """``BadRequest`` (422 ``bad_text``) for a lone surrogate or a control character (module
    docstring), naming the character and where it is."""
    for name, text in zip(("text", "text_b"), pair):
        if text is None:
            continue
        found = _SURROGATE.search(text) or _CONTROL.search(text)
        if found is None:
            continue
        code, at = ord(found.group()), found.start() + 1
        if 0xD800 <= code <= 0xDFFF:
            raise BadRequest(
                422, "bad_text",
                f"{where}: {name} holds a lone surrogate U+{code:04X} at character {at}, which is "
                "not Unicode text: send UTF-8 text (an emoji escaped as \\ud83d\\ude00 is one "
                "character, a half of it is not)",
            )  # fmt: skip
        raise BadRequest(
            422, "bad_text",
            f"{where}: {name} holds the control character U+{code:04X} at character {at}: "
            "remove it (tabs and line breaks are fine)",
        )  # fmt: skip


def tokenize(tokenizer, pairs: list[Pair]) -> list[dict]:
    """The records' token rows (``tokens.encode``), or ``BadRequest`` (422 ``bad_text``)
    naming the first record the tokenizer refuses."""
    try:
        return encode(tokenizer, pairs)
    except Exception:  # noqa: BLE001 - tokenizers raises its own kinds; find the record
        for i, pair in enumerate(pairs):
            try:
                encode(tokenizer, [pair])
            except Exception as err:  # noqa: BLE001
                where = f"record {i}" if i else "the record"
                reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
                raise BadRequest(
                    422, "bad_text", f"{where}: the tokenizer cannot take it ({reason}): send "
                    "plain UTF-8 text",
                ) from None  # fmt: skip
        raise
