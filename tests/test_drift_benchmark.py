"""benchmarks/drift.py's stream and window arithmetic, on tiny GLUE files and a small replay,
against plain loops."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import write_mrpc, write_sst2

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import drift  # noqa: E402  (benchmarks/drift.py)

PHASES = (
    ("sst2", 40),
    ("sst2-contrast", 20),
    ("sst2-joined", 20),
    ("sst2-typos", 20),
    ("cola", 20),
    ("mrpc", 20),
)


@pytest.fixture
def glue(tmp_path: Path) -> Path:
    write_sst2(tmp_path)
    write_mrpc(tmp_path)
    for stem in ("train", "dev"):  # CoLA as GLUE ships it: no header, the sentence 4th
        rows = [f"src\t{i % 2}\t\tthe {stem} sentence number {i} .\n" for i in range(7)]
        (tmp_path / "CoLA").mkdir(exist_ok=True)
        (tmp_path / "CoLA" / f"{stem}.tsv").write_text("".join(rows), encoding="utf-8")
    return tmp_path


def test_typo_edits_one_letter_per_chosen_word() -> None:
    text = "an extraordinarily beautiful and moving picture , full of quiet grace ."
    first = drift.typo(text, random.Random(3))
    assert first == drift.typo(text, random.Random(3))  # seeded
    pairs = list(zip(text.split(" "), first.split(" ")))
    assert len(pairs) == len(text.split(" "))
    for before, after in pairs:
        if before != after:  # a swap keeps the letters, a drop or a double changes one
            assert before.isalpha() and len(before) >= 3
            assert abs(len(before) - len(after)) <= 1 and after[0] == before[0]
            if len(before) == len(after):
                assert sorted(before) == sorted(after)


@pytest.mark.parametrize(
    ("first", "then", "joined"),
    [
        ("a tedious mess .", "the cast is great . ", "a tedious mess , but the cast is great . "),
        ("good fun !", "it drags", "good fun , but it drags"),
        ("slow", "sweet .", "slow , but sweet ."),
        ("is it dull ? ", "no .", "is it dull , but no ."),
    ],
)
def test_contrast_drops_the_first_clauses_closing_punctuation(first, then, joined) -> None:
    assert drift.contrast(first, then) == joined


def test_stream_phases_and_gold(glue: Path) -> None:
    stream = drift.build_stream(glue, PHASES, seed=1)
    assert [r["phase"] for r in stream] == [p for p, n in PHASES for _ in range(n)]
    dev = {
        s.strip(): y
        for s, y in (
            line.split("\t") for line in (glue / "SST-2" / "dev.tsv").read_text().splitlines()[1:]
        )
    }
    dev = {s: int(y) for s, y in dev.items()}
    for record in stream:
        if record["phase"] == "sst2":
            assert dev[record["text"]] == record["gold"]
        elif record["phase"] == "sst2-joined":  # two or three dev sentences of its label
            parts = [p + " ." for p in record["text"].split(" . ") if p]
            parts[-1] = parts[-1].removesuffix(" .")
            assert 2 <= len(parts) <= 3
            assert all(dev[p] == record["gold"] for p in parts)
        elif record["phase"] == "sst2-contrast":  # "<A> , but <B>": opposite labels, B's gold
            pairs = [(a, b) for a in dev for b in dev if drift.contrast(a, b) == record["text"]]
            assert pairs and all(
                dev[b] == record["gold"] and dev[a] == 1 - record["gold"] for a, b in pairs
            )
        elif record["phase"] == "sst2-typos":
            assert record["gold"] in (0, 1)
        else:
            assert record["gold"] is None
    assert stream == drift.build_stream(glue, PHASES, seed=1)


def test_windows_against_a_plain_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drift, "WINDOW", 10)
    rng = np.random.default_rng(0)
    n, exits = 30, [2, 4, 6]
    logits = rng.normal(0, 1, (3, n, 2))  # [E, N, C]
    stream = [
        {"phase": "a" if i < 20 else "b", "gold": int(rng.integers(0, 2)) if i < 20 else None}
        for i in range(n)
    ]
    result = {
        "fixed": rng.integers(0, 3, n),
        "recalibrated": rng.integers(0, 3, n),
        "shadow": rng.integers(0, 5, n).astype(float),
        "threshold": np.zeros(n),
    }
    rows = drift.windows(logits, stream, result, exits, budget=1.0)
    answers = logits.argmax(-1)
    assert len(rows) == 3
    for w, row in enumerate(rows):
        span = range(10 * w, 10 * w + 10)
        full_acc = sum(answers[-1, i] == stream[i]["gold"] for i in span) / 10 if w < 2 else None
        for name in ("fixed", "recalibrated"):
            chosen = result[name]
            agree = sum(answers[chosen[i], i] == answers[-1, i] for i in span) / 10
            cost = sum(exits[chosen[i]] for i in span) / 10
            assert row[name]["agreement"] == pytest.approx(agree)
            assert row[name]["layer_speedup"] == pytest.approx(6 / cost)
            if full_acc is None:
                assert "accuracy" not in row[name] and "within_budget" not in row[name]
                continue
            acc = sum(answers[chosen[i], i] == stream[i]["gold"] for i in span) / 10
            assert row[name]["accuracy"] == pytest.approx(acc)
            assert row[name]["within_budget"] == (acc >= full_acc - 0.01 - 1e-12)
        shadowed = sum(exits[result["recalibrated"][i]] + result["shadow"][i] for i in span)
        assert row["recalibrated"]["layer_speedup_with_shadow"] == pytest.approx(
            6 / (shadowed / 10)
        )
