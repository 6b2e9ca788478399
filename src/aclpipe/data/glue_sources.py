"""Reading GLUE examples: from the classic ``glue_data`` TSV files, or from the hub.

The local reader knows each task's file layout (which columns hold the texts and the label)
and turns every problem with a file into a one-line ``UserError`` naming the file, the line
and the fix. The hub reader goes through ``datasets.load_dataset`` and fails fast offline.
"""

from __future__ import annotations

import csv
import math
import os
import socket
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from aclpipe.data.tasks import Task
from aclpipe.errors import UserError

# How a user points us at local GLUE files; every "data not found" message ends with it.
LOCAL_OPTIONS = "--glue-dir, the GLUE_DIR environment variable, or data.glue_dir in params.yaml"
_REFETCH = "supply the complete file from the original GLUE download"
# STS-B similarity scores run from 0 (unrelated) to 5 (equivalent) (Cer et al. 2017).
_SCORE_RANGE = (0.0, 5.0)
# A reachability probe of the hub: without it, load_dataset retries for ~25 s before failing.
_PROBE_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Example:
    """One labelled GLUE example.

    Attributes:
        text_a: the sentence, or the first sentence of a pair.
        text_b: the second sentence of a pair; None for single-sentence tasks.
        label: the class index into ``task.labels``, or the float score for STS-B.
    """

    text_a: str
    text_b: str | None
    label: int | float


@dataclass(frozen=True)
class _Layout:
    """Where a task's TSV keeps its fields: header names, or indices when there is no header."""

    text_a: str | int
    text_b: str | int | None
    label: str | int
    has_header: bool = True
    num_columns: int | None = None  # only for header-less files


# Keyed by the task's folder in the classic glue_data layout.
_LAYOUTS: dict[str, _Layout] = {
    # CoLA: no header; source, label, original label (or "*"), sentence.
    "CoLA": _Layout(text_a=3, text_b=None, label=1, has_header=False, num_columns=4),
    "SST-2": _Layout("sentence", None, "label"),
    "MRPC": _Layout("#1 String", "#2 String", "Quality"),
    "QQP": _Layout("question1", "question2", "is_duplicate"),
    "STS-B": _Layout("sentence1", "sentence2", "score"),
    # MNLI: dev files carry label1..label5, train only label1; gold_label is the one we want.
    "MNLI": _Layout("sentence1", "sentence2", "gold_label"),
    "QNLI": _Layout("question", "sentence", "label"),
    "RTE": _Layout("sentence1", "sentence2", "label"),
    "WNLI": _Layout("sentence1", "sentence2", "label"),
}


def _split_names(task: Task) -> list[str]:
    return ["train", *(name for name, _, _ in task.dev_splits)]


def _check_split(task: Task, split: str) -> int | None:
    """Index into ``task.dev_splits`` for a dev split, None for train; else a UserError."""
    if split == "train":
        return None
    for i, (name, _, _) in enumerate(task.dev_splits):
        if name == split:
            return i
    raise UserError(
        f"unknown split {split!r} for task {task.name}: use one of {', '.join(_split_names(task))}"
    )


def local_path(task: Task, glue_dir: Path, split: str) -> Path:
    """The TSV file that holds ``split`` of ``task`` under ``glue_dir``."""
    i = _check_split(task, split)
    stem = "train" if i is None else task.dev_splits[i][1]
    return Path(glue_dir) / task.folder / f"{stem}.tsv"


def local_available(task: Task, glue_dir: Path | None) -> bool:
    """Whether ``glue_dir`` holds the task's train file and every dev file."""
    if glue_dir is None:
        return False
    return all(local_path(task, glue_dir, s).is_file() for s in _split_names(task))


def _decode(path: Path) -> str:
    """The file's text (UTF-8, optional BOM); binary or non-UTF-8 content is a UserError."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise UserError(
            f"GLUE file not found: {path} (looked in {path.parent}); put the classic "
            f"glue_data folders there, or point to them with {LOCAL_OPTIONS}"
        ) from None
    except OSError as e:
        raise UserError(f"cannot read GLUE file {path}: {e.strerror}; check the path") from None
    fix = "re-save it as UTF-8 or replace it with the original GLUE file"
    nul = data.find(b"\x00")
    if nul >= 0:
        line = data.count(b"\n", 0, nul) + 1
        raise UserError(f"{path}, line {line}: binary content (NUL byte); {fix}")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        # utf-8-sig only strips a leading BOM, so e.start is an offset into ``data`` (+3 if BOM).
        line = data.count(b"\n", 0, e.start) + 1
        raise UserError(f"{path}, line {line}: not valid UTF-8 ({e.reason}); {fix}") from None


def _rows(text: str) -> list[tuple[int, list[str]]]:
    """(line number, fields) for each non-blank line, split on tabs with quotes kept literal."""
    # Split lines ourselves so that line numbers are exact; quotes are plain characters
    # (QUOTE_NONE), as GLUE sentences contain unbalanced quotes.
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    reader = csv.reader(lines, delimiter="\t", quoting=csv.QUOTE_NONE)
    return [(n, row) for n, row in enumerate(reader, start=1) if row]


def _column(path: Path, header: list[str], name: str | int | None) -> int | None:
    if name is None or isinstance(name, int):
        return name
    try:
        return header.index(name)
    except ValueError:
        raise UserError(
            f"{path}, line 1: missing column {name!r} in the header "
            f"({' | '.join(header)}); use the classic GLUE file with its original header"
        ) from None


def _parse_label(task: Task, path: Path, line: int, value: str) -> int | float:
    value = value.strip()
    if task.is_regression:
        try:
            score = float(value)
        except ValueError:
            score = math.nan
        if not math.isfinite(score):
            raise UserError(
                f"{path}, line {line}: score {value!r} is not a number; "
                "fix the score column (a float such as 3.8)"
            )
        low, high = _SCORE_RANGE
        if not low <= score <= high:
            raise UserError(
                f"{path}, line {line}: score {value!r} is outside {task.folder}'s range "
                f"{low:g} to {high:g}; fix the score column (a float from {low:g} to {high:g})"
            )
        return score
    try:
        return task.labels.index(value)
    except ValueError:
        raise UserError(
            f"{path}, line {line}: unknown label {value!r}; "
            f"valid labels for {task.name}: {', '.join(task.labels)}"
        ) from None


def read_local(task: Task, glue_dir: Path, split: str) -> list[Example]:
    """Read ``split`` ("train" or a dev split name) of ``task`` from the classic TSV files."""
    path = local_path(task, glue_dir, split)
    layout = _LAYOUTS[task.folder]
    rows = _rows(_decode(path))
    if layout.has_header:
        if not rows:
            raise UserError(f"{path}, line 1: empty file, no header and no data rows; {_REFETCH}")
        _, header = rows[0]
        rows = rows[1:]
        width = len(header)
        cols = [_column(path, header, c) for c in (layout.text_a, layout.text_b, layout.label)]
    else:
        width = layout.num_columns
        cols = [layout.text_a, layout.text_b, layout.label]
    if not rows:
        where = "line 2" if layout.has_header else "line 1"
        raise UserError(f"{path}, {where}: no data rows in the {split} split; {_REFETCH}")
    col_a, col_b, col_label = cols
    examples = []
    for line, row in rows:
        if len(row) != width:
            raise UserError(
                f"{path}, line {line}: {len(row)} tab-separated fields, expected {width}; "
                "repair or remove that row (fields must not contain tabs or line breaks)"
            )
        examples.append(
            Example(
                text_a=row[col_a],
                text_b=None if col_b is None else row[col_b],
                label=_parse_label(task, path, line, row[col_label]),
            )
        )
    return examples


def _offline_vars() -> list[str]:
    truthy = {"1", "true", "yes", "on"}
    names = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    return [n for n in names if os.environ.get(n, "").strip().lower() in truthy]


def _probe_hub() -> str | None:
    """A short TCP connect to the hub (or to the HTTPS proxy); the reason it failed, or None."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    target = urllib.request.getproxies().get("https") or endpoint
    parsed = urllib.parse.urlsplit(target if "://" in target else f"http://{target}")
    host = parsed.hostname or ""
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=_PROBE_TIMEOUT_S):
            return None
    except OSError as e:
        return f"cannot connect to {host}:{port} ({e.strerror or e})"


def read_hub(
    task: Task, split: str, hub_id: str = "nyu-mll/glue", *, glue_dir: Path | None = None
) -> list[Example]:
    """Read ``split`` of ``task`` from the hub dataset ``hub_id`` (config ``task.hub_config``).

    ``glue_dir`` is only named in the error message: the local folder that was looked in.
    """
    i = _check_split(task, split)
    hub_split = "train" if i is None else task.dev_splits[i][2]
    if glue_dir is None:
        local = f"no local {task.folder} folder given"
    else:
        missing = [
            str(local_path(task, glue_dir, s))
            for s in _split_names(task)
            if not local_path(task, glue_dir, s).is_file()
        ]
        local = f"{' and '.join(missing) or Path(glue_dir) / task.folder} not found"
    where = f"{local}, and the hub dataset {hub_id} ({task.hub_config}, {hub_split})"
    offline = _offline_vars()
    if offline:
        raise UserError(
            f"{where} is not reachable: {'/'.join(offline)} is set (offline); "
            f"supply the classic glue_data files with {LOCAL_OPTIONS}"
        )
    reason = _probe_hub()
    if reason:
        raise UserError(
            f"{where} is not reachable: {reason}; "
            f"supply the classic glue_data files with {LOCAL_OPTIONS}"
        )
    import datasets  # lazily: slow to import, and only the hub path needs it

    try:
        data = datasets.load_dataset(hub_id, task.hub_config, split=hub_split)
    except Exception as e:  # any hub failure becomes one line for the user
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserError(
            f"could not load {hub_id} ({task.hub_config}, {hub_split}): {first}; "
            "check the hub id and network, or supply the classic glue_data files with "
            f"{LOCAL_OPTIONS}"
        ) from e
    return [_hub_example(task, hub_id, hub_split, n, row) for n, row in enumerate(data)]


def _hub_example(task: Task, hub_id: str, hub_split: str, n: int, row: dict) -> Example:
    """Convert one hub row; hub labels are already indices in ``task.labels`` order."""
    text_b = row[task.text_columns[1]] if task.is_pair else None
    label = row["label"]
    if task.is_regression:
        low, high = _SCORE_RANGE
        if not low <= float(label) <= high:  # also catches the unlabelled test split's -1
            raise UserError(
                f"{hub_id} ({task.hub_config}, {hub_split}), row {n}: score {label} is outside "
                f"{low:g} to {high:g} (test splits are unlabelled); use a labelled split"
            )
        return Example(row[task.text_columns[0]], text_b, float(label))
    if not 0 <= int(label) < len(task.labels):
        raise UserError(
            f"{hub_id} ({task.hub_config}, {hub_split}), row {n}: label {label} is not one of "
            f"0..{len(task.labels) - 1} (test splits are unlabelled); use a labelled split"
        )
    return Example(row[task.text_columns[0]], text_b, int(label))
