"""Scored sentence pairs for STS evaluation: GLUE's STS-B files and the STS Benchmark's own.

Two layouts are read, told apart by the first line:

- GLUE's ``STS-B/{train,dev}.tsv``: a header naming ``sentence1``, ``sentence2`` and ``score``
  (GLUE's ``test.tsv`` has no ``score`` column: it is refused, it has no gold scores);
- the STS Benchmark's ``original/sts-{train,dev,test}.tsv``: no header; genre, file, year, id,
  score, sentence1, sentence2, and on some lines two more source columns (7 or 9 fields).

Every problem is one ``UserError`` naming the file, the line and the fix: a file without
scores, a score that is not a number or lies outside 0 to 5 (Cer et al. 2017), a short row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from aclpipe.data.glue_sources import _decode, _rows
from aclpipe.errors import UserError

SCORE_RANGE = (0.0, 5.0)  # STS similarity: 0 unrelated .. 5 equivalent (Cer et al. 2017)
_ORIGINAL = {"score": 4, "sentence1": 5, "sentence2": 6}  # the STS Benchmark's own columns


@dataclass(frozen=True)
class ScoredPairs:
    """Sentence pairs and their gold similarity, in file order."""

    path: str
    first: list[str]
    second: list[str]
    scores: list[float]

    def __len__(self) -> int:
        return len(self.scores)


def read_scored_pairs(path: Path) -> ScoredPairs:
    """Read a GLUE STS-B file or an STS Benchmark file (module docstring) with gold scores."""
    path = Path(path)
    rows = _rows(_decode(path))
    if not rows:
        raise UserError(f"{path}, line 1: empty file; give a file of scored sentence pairs")
    _, head = rows[0]
    if "sentence1" in head and "sentence2" in head:  # GLUE's layout, with a header
        if "score" not in head:
            raise UserError(
                f"{path}, line 1: no score column (header {' | '.join(head)}): these pairs "
                "have no gold scores (GLUE's STS-B test.tsv has none); use dev.tsv or the STS "
                "Benchmark's original/sts-test.tsv"
            )
        columns = {name: head.index(name) for name in ("score", "sentence1", "sentence2")}
        width, body = len(head), rows[1:]
    else:  # the STS Benchmark's layout, no header
        columns, width, body = _ORIGINAL, None, rows
    if not body:
        raise UserError(f"{path}: no sentence pairs after the header; give a file of pairs")
    first, second, scores = [], [], []
    for line, row in body:
        if (width is not None and len(row) != width) or len(row) <= max(columns.values()):
            expected = width or f"at least {max(columns.values()) + 1}"
            raise UserError(
                f"{path}, line {line}: {len(row)} tab-separated fields, expected {expected}; "
                "repair or remove that row"
            )
        scores.append(_score(path, line, row[columns["score"]]))
        first.append(row[columns["sentence1"]])
        second.append(row[columns["sentence2"]])
    return ScoredPairs(str(path), first, second, scores)


def _score(path: Path, line: int, text: str) -> float:
    try:
        score = float(text.strip())
    except ValueError:
        score = math.nan
    if not math.isfinite(score):
        raise UserError(
            f"{path}, line {line}: score {text!r} is not a number: these pairs have no gold "
            "scores; give a file whose score column holds floats from 0 to 5"
        )
    low, high = SCORE_RANGE
    if not low <= score <= high:
        raise UserError(
            f"{path}, line {line}: score {text!r} is outside STS's range {low:g} to {high:g}; "
            f"fix the score column (a float from {low:g} to {high:g})"
        )
    return score
