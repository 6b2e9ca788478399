"""``predict``'s input formats: what one input record is, read as a stream.

| format | records | pairs |
| --- | --- | --- |
| ``text`` | one per line | ``premise<TAB>hypothesis`` (exactly one tab) |
| ``tsv`` | one per line after a header line | the header names the columns: ``sentence`` / ``text`` / ``text_a`` / ``sentence1`` / ``question`` for the first text, ``text_b`` / ``sentence2`` for the second; a header of one or two other names takes its columns in order |
| ``jsonl`` | one JSON object per line | ``{"text": ...}`` or ``{"text_a": ..., "text_b": ...}`` |

``auto`` (the default) picks by the file name: ``.tsv`` -> tsv, ``.jsonl`` / ``.json`` -> jsonl,
anything else and stdin -> text. A blank (or whitespace-only) line is a record too, with no
text (``None``): ``predict`` answers it in its place. Each record is ``(text, pair)`` where
``text`` is what the output echoes (the line for text; ``a`` or ``a<TAB>b`` otherwise) and
``pair`` is ``(a, b)`` with ``b`` None for one sentence, or None for a blank line.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from aclpipe.errors import UserError

FORMATS = ("auto", "text", "tsv", "jsonl")
FIRST = ("sentence", "text", "text_a", "sentence1", "question", "question1", "premise")
SECOND = ("text_b", "sentence2", "question2", "hypothesis")

Record = tuple[str, "tuple[str, str | None] | None"]


def input_format(source: str, fmt: str) -> str:
    if fmt not in FORMATS:
        raise UserError(f"unknown input format {fmt!r}: use one of {', '.join(FORMATS)}")
    if fmt != "auto":
        return fmt
    suffix = Path(source).suffix.lower() if source != "-" else ""
    return {".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl"}.get(suffix, "text")


class InputLines:
    """The lines of a UTF-8 file (a byte-order mark dropped), or of stdin, read once as a
    stream. ``size`` (the file's bytes; None for stdin) and ``position()`` (bytes read so far)
    let a progress bar follow the one pass that predicts: the input is never read twice."""

    def __init__(self, source: Path | str | None) -> None:
        self.path = None if source is None or str(source) == "-" else Path(source)
        if self.path is not None and not self.path.is_file():
            raise UserError(f"input file {self.path} not found: give a text file, or - for stdin")
        self.size = self.path.stat().st_size if self.path is not None else None
        self._file = None

    def __iter__(self) -> Iterator[str]:
        if self.path is None:
            if hasattr(sys.stdin, "reconfigure"):  # a bad byte is checked below, per line
                sys.stdin.reconfigure(errors="surrogateescape")
            yield from _checked(sys.stdin, "stdin")
            return
        # -sig: drop a byte-order mark; surrogateescape: a byte that is not UTF-8 arrives as a
        # lone surrogate, so the error can name its line (strict decoding fails per 8 KB block)
        with open(self.path, encoding="utf-8-sig", errors="surrogateescape") as f:
            self._file = f
            yield from _checked(f, str(self.path))

    def position(self) -> int:
        """Bytes read so far (the reader's buffer ahead of the lines handed out: up to 8 KB)."""
        if self._file is None:
            return 0
        return self.size or 0 if self._file.closed else self._file.buffer.tell()


_NOT_TEXT = re.compile("[\x00\udc80-\udcff]")  # a NUL byte, or a byte UTF-8 could not decode


def _checked(lines: Iterable[str], name: str) -> Iterator[str]:
    """``lines``, with a one-line error at the first that holds a byte that is not UTF-8 text,
    or a NUL byte (a binary file)."""
    for number, line in enumerate(lines, start=1):
        bad = _NOT_TEXT.search(line)
        if bad is None:
            yield line
            continue
        if bad.group() == "\x00":
            raise UserError(
                f"{name} line {number} holds a NUL byte, so it is a binary file, not text: give "
                "a UTF-8 text, TSV or JSONL file"
            )
        source = name if name != "stdin" else "FILE"
        raise UserError(
            f"{name} line {number} is not UTF-8 text (byte 0x{ord(bad.group()) - 0xDC00:02x} at "
            f"column {bad.start() + 1}): convert it, e.g. `iconv -f latin1 -t utf-8 {source} > "
            "fixed.txt` for a Latin-1 file, and give that; a binary file will not do"
        )


def read_lines(source: Path | str | None) -> InputLines:
    """Lines of a UTF-8 file, or of stdin for ``None`` or ``"-"``; a missing file is an error."""
    return InputLines(source)


def records(
    lines: Iterable[str], fmt: str, texts: int | None = None, task: str | None = None
) -> Iterator[Record]:
    """``(text, pair)`` per input record (module docstring), in input order. ``texts``: how
    many texts the model of ``task`` reads (1, or 2 for pairs; None: not known); a TSV header
    naming another number is refused."""
    lines = iter(lines)
    columns = None
    if fmt == "tsv":
        header = next(lines, "")
        columns = _header(header, fmt)
        if texts is not None:
            _check_texts(header, columns, texts, task)
    first_number = 2 if fmt == "tsv" else 1
    for number, line in enumerate(lines, start=first_number):
        text = line.rstrip("\r\n")
        if not text.strip():
            yield text, None
            continue
        if fmt == "jsonl":
            record = _json_record(text, number)
        elif fmt == "tsv":
            yield _tsv_record(text, number, columns)  # the header was checked once
            continue
        else:
            parts = text.split("\t")
            if len(parts) > 2:
                raise UserError(
                    f"input line {number} has {len(parts) - 1} tabs: give one sentence per line, "
                    "or two sentences separated by one tab"
                )
            record = text, (parts[0], parts[1] if len(parts) == 2 else None)
        if texts is not None:
            check_pair(record[1], texts, task, f"input line {number}")
        yield record


def texts_mismatch(
    pair: tuple[str, str | None], texts: int, task: str | None, where: str
) -> str | None:
    """None when ``pair`` holds as many texts as the model of ``task`` reads (``texts``: 1, or
    2 for sentence pairs), else what is wrong, the start of the error line (predict and serve
    each add the fix their users can make)."""
    given = 1 if pair[1] is None else 2
    if given == texts:
        return None
    held, reads = ("two texts", "one") if given == 2 else ("one text", "sentence pairs")
    return f"{where} holds {held}, but this model ({task}) reads {reads}"


def check_pair(pair: tuple[str, str | None], texts: int, task: str | None, where: str) -> None:
    """A one-line error unless ``pair`` holds as many texts as the model of ``task`` reads."""
    wrong = texts_mismatch(pair, texts, task, where)
    if wrong is None:
        return
    if texts == 1:
        raise UserError(
            f"{wrong}: send one text per record, or give a model of a sentence-pair task"
        )
    raise UserError(
        f'{wrong}: send {{"text_a": ..., "text_b": ...}} (or two tab-separated texts), or give a '
        "model of a one-text task"
    )


def _header(line: str, fmt: str) -> tuple[int, int | None, int]:
    """``(first column, second column or None, number of columns)`` from a TSV header."""
    names = [n.strip().lower() for n in line.rstrip("\r\n").split("\t")]
    a = next((names.index(n) for n in FIRST if n in names), None)
    b = next((names.index(n) for n in SECOND if n in names), None)
    if a is None and len(names) <= 2 and any(names):
        a, b = 0, 1 if len(names) == 2 else None
    if a is None:
        raise UserError(
            f"TSV header {' | '.join(names) or '(empty)'} names no text column: call the "
            f"columns {FIRST[0]} (and {SECOND[1]} for pairs), or text_a and text_b"
        )
    return a, b, len(names)


def _check_texts(header: str, columns: tuple, texts: int, task: str | None) -> None:
    """A one-line error unless the header names as many texts as the model reads."""
    given = 1 if columns[1] is None else 2
    if given == texts:
        return
    shown = " | ".join(n.strip() for n in header.rstrip("\r\n").split("\t"))
    if given == 2:
        raise UserError(
            f"the TSV header ({shown}) names two texts, but this model ({task}) reads one: keep "
            f"one text column ({FIRST[0]}), or give a model of a sentence-pair task"
        )
    raise UserError(
        f"the TSV header ({shown}) names one text, but this model ({task}) reads sentence "
        f"pairs: name the two text columns {FIRST[3]} and {SECOND[1]}, or give a model of a "
        "one-text task"
    )


def _tsv_record(text: str, number: int, columns) -> Record:
    a, b, width = columns
    fields = text.split("\t")
    if len(fields) != width:
        raise UserError(
            f"input line {number} has {len(fields)} tab-separated fields, the header {width}: "
            "repair that row (fields must not contain tabs)"
        )
    pair = (fields[a], fields[b] if b is not None else None)
    return "\t".join(p for p in pair if p is not None), pair


def _json_record(text: str, number: int) -> Record:
    try:
        row = json.loads(text)
    except ValueError as err:
        raise UserError(
            f"input line {number} is not JSON ({err.msg}): write one object per line, "
            'such as {"text": "..."}'
        ) from err
    if isinstance(row, dict) and isinstance(row.get("text"), str):
        return row["text"], (row["text"], None)
    if isinstance(row, dict) and isinstance(row.get("text_a"), str):
        b = row.get("text_b")
        if b is not None and not isinstance(b, str):
            raise UserError(f'input line {number}: "text_b" must be a string')
        return "\t".join(x for x in (row["text_a"], b) if x is not None), (row["text_a"], b)
    raise UserError(
        f'input line {number} has no "text" (or "text_a") string: write {{"text": "..."}} or '
        '{"text_a": "...", "text_b": "..."}'
    )
