"""Prediction with early exit: lines of text in, one JSON record per line out.

Each line is a sentence, or a pair when it holds exactly one tab
(``premise<TAB>hypothesis``). Lines are read as a stream, tokenized (truncated to
``max_length``), batched in input order with right padding, and run through the early-exit
runtime (``aclpipe.early_exit.runtime``) with a per-sample exit policy (METHODS.md, Exit policies).
Records come out in input order::

    {"label": 1, "label_name": "1", "probability": 0.93, "exit_layer": 2, "text": "..."}

``label`` is a float and ``probability`` null for a regression model (STS-B); ``label_name``
appears when label names are known (given, or saved by ``aclpipe export-exits``).

Output line n always answers input line n, so the records can be pasted beside the input. A
blank (or whitespace-only) line has nothing to classify: it gets a record in its place with
``label``, ``probability`` and ``exit_layer`` null and ``"error": "blank line"``, and at the
end one note on stderr counts them. This is the same for a file and for stdin (which is
streamed, so it cannot be checked whole before the first record is written).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TextIO

from aclpipe.early_exit.runtime import EarlyExitRuntime
from aclpipe.errors import UserError
from aclpipe.layout import TASK_FILE
from aclpipe.modeling.backbone import load_tokenizer_from
from aclpipe.modeling.batching import collate
from aclpipe.modeling.model import load_multi_exit


def saved_label_names(model_dir: Path) -> list[str] | None:
    """Label names written next to an exported model (``aclpipe_task.json``), if any."""
    path = model_dir / TASK_FILE
    if not path.exists():
        return None
    try:
        labels = json.loads(path.read_text(encoding="utf-8"))["labels"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise UserError(
            f"{path} is damaged ({type(err).__name__}): export the model again"
        ) from err
    return [str(name) for name in labels] or None


def encode_line(tokenizer, text: str, number: int, max_length: int) -> dict:
    """One line -> an unpadded row ``{"input_ids", ["token_type_ids",] "label"}``."""
    parts = text.split("\t")
    if len(parts) > 2:
        raise UserError(
            f"input line {number} has {len(parts) - 1} tabs: give one sentence per line, "
            "or two sentences separated by one tab"
        )
    encoded = tokenizer(*parts, truncation=True, max_length=max_length)
    row = {"input_ids": encoded["input_ids"], "label": 0}  # label: collate needs one; unused
    if "token_type_ids" in encoded:
        row["token_type_ids"] = encoded["token_type_ids"]
    return row


def predict_lines(
    model_dir: Path,
    lines: Iterable[str],
    policy: str,
    threshold: float,
    batch_size: int = 32,
    max_length: int = 128,
    task_labels: list[str] | None = None,
) -> Iterator[dict]:
    """Early-exit predictions for ``lines``, one record per line, in input order.

    The model, the tokenizer and the policy are checked when this is called (a bad
    threshold or folder raises ``UserError`` at once); the lines are read lazily, one batch
    at a time, so stdin can be streamed.

    Args:
        model_dir: an exported ``model/`` folder, or a training folder (weights + tokenizer).
        lines: text lines (trailing newlines are stripped). A blank line gets a record with a
            null label and ``"error": "blank line"`` (output stays aligned with input), and a
            note on stderr at the end counts them.
        policy: entropy | patience | confidence.
        threshold: the policy's parameter (``S``, ``t`` or ``delta``).
        batch_size: lines per batch.
        max_length: tokens kept per line (or pair), truncating longer inputs.
        task_labels: label names in index order; default: those saved with the export.

    Returns:
        An iterator of ``{"label", ["label_name",] "probability", "exit_layer", "text"}``
        (plus ``"error"`` on the records of blank lines).
    """
    if batch_size < 1 or max_length < 2:
        raise UserError(f"batch size {batch_size} and max length {max_length} must be >= 1 and 2")
    model = load_multi_exit(model_dir)
    num_labels = model.spec.num_labels
    regression = num_labels == 1
    runtime = EarlyExitRuntime(model, policy, threshold, regression=regression)  # checks policy
    if regression and policy != "patience":
        raise UserError(
            f"policy {policy!r} needs class probabilities: use patience for a regression model"
        )
    names = task_labels if task_labels is not None else saved_label_names(model_dir)
    if names and len(names) != num_labels:
        raise UserError(
            f"{len(names)} label names given for a model with {num_labels} outputs: "
            "pass the labels of the task the model was trained on"
        )
    tokenizer = load_tokenizer_from(model_dir)
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        pad_id = model.encoder.config.pad_token_id or 0
    return _predict(runtime, tokenizer, lines, batch_size, max_length, pad_id, names or None)


def _predict(
    runtime: EarlyExitRuntime,
    tokenizer,
    lines: Iterable[str],
    batch_size: int,
    max_length: int,
    pad_id: int,
    names: list[str] | None,
) -> Iterator[dict]:
    # The lines of the batch in input order; a blank line holds None in ``rows``.
    pending: list[str] = []
    rows: list[dict | None] = []
    filled = 0  # non-blank rows in the batch
    blank: list[int] = []
    for number, line in enumerate(lines, start=1):
        text = line.rstrip("\r\n")
        if not text.strip():
            blank.append(number)
            if not filled:  # nothing waits for the model: answer at once
                yield _blank_record(text, names)
                continue
            rows.append(None)
        else:
            rows.append(encode_line(tokenizer, text, number, max_length))
            filled += 1
        pending.append(text)
        if filled == batch_size:
            yield from _run_batch(runtime, rows, pending, pad_id, names)
            pending, rows, filled = [], [], 0
    if rows:
        yield from _run_batch(runtime, rows, pending, pad_id, names)
    if blank:
        print(blank_note(blank), file=sys.stderr)


def blank_note(numbers: list[int]) -> str:
    """The one stderr line that counts the blank input lines (and names the first few)."""
    shown = ", ".join(map(str, numbers[:5])) + (", ..." if len(numbers) > 5 else "")
    plural = "s" if len(numbers) > 1 else ""
    return (
        f"note: {len(numbers)} blank input line{plural} (line{plural} {shown}) got a record "
        'with a null label and "error": "blank line", so output line n still answers input '
        "line n"
    )


def _blank_record(text: str, names: list[str] | None) -> dict:
    record: dict = {"label": None}
    if names:
        record["label_name"] = None
    record.update(probability=None, exit_layer=None, text=text, error="blank line")
    return record


def _run_batch(
    runtime: EarlyExitRuntime,
    rows: list[dict | None],
    texts: list[str],
    pad_id: int,
    names: list[str] | None,
) -> Iterator[dict]:
    """Records for ``texts`` in order: the model's for each row, a blank record for None
    (the first row is never None: a blank line before any row is answered at once)."""
    batch = collate([row for row in rows if row is not None], pad_id, regression=False)  # [b, T]
    batch.pop("labels")
    result = runtime(**batch)
    logits = result.logits.float()  # [b, C]
    probs = logits.softmax(dim=-1)  # [b, C]; unused for regression
    i = -1  # index into the batch of the last non-blank line
    for row, text in zip(rows, texts):
        if row is None:
            yield _blank_record(text, names)
            continue
        i += 1
        record: dict = {}
        if runtime.regression:
            record["label"] = float(logits[i, 0])
            record["probability"] = None
        else:
            label = int(probs[i].argmax())
            record["label"] = label
            if names:
                record["label_name"] = names[label]
            record["probability"] = float(probs[i, label])
        record["exit_layer"] = int(result.exit_layer[i])
        record["text"] = text
        yield record


def read_lines(source: Path | str | None) -> Iterator[str]:
    """Lines of a UTF-8 file, or of stdin for ``None`` or ``"-"``; a missing file is an error."""
    if source is None or str(source) == "-":
        return iter(sys.stdin)
    path = Path(source)
    if not path.is_file():
        raise UserError(f"input file {path} not found: give a text file, or - for stdin")

    def lines() -> Iterator[str]:
        with open(path, encoding="utf-8-sig") as f:  # -sig: drop a byte-order mark
            yield from f

    return lines()


def write_jsonl(rows: Iterable[dict], out: TextIO | Path | str) -> int:
    """Write one JSON object per line; return how many.

    ``out`` is an open text stream (stdout) or a path. A path is written atomically: rows go
    to a temporary file beside it, renamed into place only when every row is written.
    """
    if not isinstance(out, (str, Path)):
        count = 0
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
        out.flush()
        return count
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            count = write_jsonl(rows, f)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return count
