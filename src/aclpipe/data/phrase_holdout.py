"""A validation split held out by phrase family, for training sets whose rows are phrases.

SST-2's training set is every phrase of the parse trees of ~6.9k movie-review sentences, so
a validation split drawn phrase by phrase (``prepare.carve_validation``) leaves each held-out
phrase's parent, children and siblings in train: validation then scores text the model was
trained on and overstates dev. Here a *phrase family* goes to one side whole: a phrase and
every phrase that contains it or that it contains, found through shared word spans.

- Phrases of at least ``SPAN`` words are joined when they share an ``SPAN``-word span (nested
  phrases of one sentence share their inner phrase's spans; so do two sentences that quote
  the same 8 words, which is rare and kept together too).
- A shorter phrase joins the family of a longer phrase that contains it as a contiguous run
  of words (the longest such phrase first seen, longest phrases processed first). Common short
  phrases ("the film") occur inside many sentences; they go with one of them, so a short
  phrase may still appear inside another family's text. :func:`span_overlap` measures what
  is left: the share of validation rows of ``SPAN`` or more words that share a ``SPAN``-word
  span with train.

Words are the lower-cased whitespace tokens of ``text_a`` (SST-2's phrases are tokenized).
Families are drawn at random (``seed``) until the held-out rows reach ``fraction`` of all
rows; the label shares are not stratified (a family mixes labels), so the split records them.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from aclpipe.data.glue_sources import Example

SPAN = 8  # words: the leak measure's span, and the length from which phrases join by spans


def words(text: str) -> tuple[str, ...]:
    return tuple(text.lower().split())


def spans(tokens: Sequence[str], n: int = SPAN) -> set[tuple[str, ...]]:
    """Every run of ``n`` consecutive words (none for a shorter text)."""
    return {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


class _Families:
    """Union-find over row indices."""

    def __init__(self, size: int) -> None:
        self.parent = list(range(size))

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, i: int, j: int) -> None:
        a, b = self.find(i), self.find(j)
        if a != b:
            self.parent[max(a, b)] = min(a, b)


def phrase_families(texts: Sequence[str], n: int = SPAN) -> list[int]:
    """A family id per text (the smallest row index of its family), see the module docstring."""
    tokens = [words(t) for t in texts]
    families = _Families(len(texts))
    by_span: dict[tuple[str, ...], int] = {}  # an n-word span -> the first row that has it
    # a run of k < n words -> the first (longest) row containing it
    by_run: list[dict[tuple[str, ...], int]] = [{} for _ in range(n)]
    order = sorted(range(len(texts)), key=lambda i: (-len(tokens[i]), i))
    for i in order:
        w = tokens[i]
        if len(w) >= n:
            for span in spans(w, n):
                first = by_span.setdefault(span, i)
                if first != i:
                    families.union(first, i)
        elif w:
            container = by_run[len(w)].get(w)
            if container is not None:
                families.union(container, i)
        for k in range(1, min(len(w), n)):  # the shorter runs this row contains
            index = by_run[k]
            for start in range(len(w) - k + 1):
                index.setdefault(w[start : start + k], i)
    return [families.find(i) for i in range(len(texts))]


def carve_by_family(
    examples: list[Example], fraction: float, seed: int, n: int = SPAN
) -> tuple[list[Example], list[Example]]:
    """``(train, validation)``: whole phrase families held out, drawn by ``seed`` until the
    validation rows reach ``fraction`` of all rows; both keep the original order."""
    if fraction <= 0:
        return examples, []
    family = phrase_families([e.text_a for e in examples], n)
    members: dict[int, list[int]] = {}
    for i, f in enumerate(family):
        members.setdefault(f, []).append(i)
    ids = sorted(members)
    random.Random(seed).shuffle(ids)
    target, held = round(fraction * len(examples)), set[int]()  # row indices
    for f in ids:
        if len(held) >= target:
            break
        held.update(members[f])
    train = [e for i, e in enumerate(examples) if i not in held]
    validation = [e for i, e in enumerate(examples) if i in held]
    return train, validation


def span_overlap(validation: Sequence[str], train: Sequence[str], n: int = SPAN) -> dict:
    """The leak measure: of the validation texts of at least ``n`` words, how many share an
    ``n``-word span with some train text. ``{"long": count, "shared": count, "share": shared
    / long (0 when none is long)}``."""
    seen: set[tuple[str, ...]] = set()
    for text in train:
        seen |= spans(words(text), n)
    long = [spans(words(t), n) for t in validation if len(words(t)) >= n]
    shared = sum(1 for s in long if s & seen)
    return {"long": len(long), "shared": shared, "share": shared / len(long) if long else 0.0}
