"""The phrase-family holdout (aclpipe.data.phrase_holdout) on a tiny hand-written phrase
tree, its leak measure against a plain reference, prepare's data.holdout, and the leak-free
validation rows of a recorded campaign."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aclpipe.data.glue_sources import Example
from aclpipe.data.phrase_holdout import carve_by_family, phrase_families, span_overlap

# Two parsed sentences, SST-2 style: every phrase of each tree is a row (lower-cased,
# tokenized), and a third sentence that shares no 8-word span with either.
TREE_A = [
    "the film is a gorgeous and deeply moving portrait of a family in crisis",
    "is a gorgeous and deeply moving portrait of a family in crisis",
    "a gorgeous and deeply moving portrait of a family in crisis",
    "gorgeous and deeply moving portrait of a family",
    "deeply moving portrait",
    "of a family in crisis",
    "the film",
]
TREE_B = [
    "a dull , plodding and utterly forgettable sequel that nobody asked for",
    "dull , plodding and utterly forgettable sequel that nobody asked for",
    "utterly forgettable sequel",
    "that nobody asked for",
]
TREE_C = ["an odd little film about grief , music and two brothers who never speak"]
ROWS = TREE_A + TREE_B + TREE_C


def plain_overlap(validation: list[str], train: list[str], n: int = 8) -> float:
    """Share of validation texts of n+ words with some n-word span found in a train text."""

    def grams(text: str) -> list[str]:
        w = text.lower().split()
        return [" ".join(w[i : i + n]) for i in range(len(w) - n + 1)]

    long = [t for t in validation if len(t.split()) >= n]
    hit = [t for t in long if any(g in " ".join(tr.lower().split()) for tr in train for g in grams(t))]
    return len(hit) / len(long) if long else 0.0


def test_families_follow_the_trees() -> None:
    family = phrase_families(ROWS)
    a, b, c = family[: len(TREE_A)], family[len(TREE_A) : len(TREE_A) + len(TREE_B)], family[-1:]
    assert len(set(a)) == 1 and len(set(b)) == 1  # each tree one family, short phrases too
    assert len({a[0], b[0], c[0]}) == 3  # three sentences, three families
    assert family == phrase_families(ROWS)  # deterministic


def test_a_short_phrase_goes_with_a_phrase_that_contains_it() -> None:
    family = phrase_families(["deeply moving", "a deeply moving story", "unrelated words here"])
    assert family[0] == family[1] != family[2]


def test_holdout_by_family_leaves_no_span_in_train_where_a_row_split_does() -> None:
    examples = [Example(t, None, i % 2) for i, t in enumerate(ROWS)]
    for seed in range(6):
        train, validation = carve_by_family(examples, 0.3, seed)
        assert len(train) + len(validation) == len(ROWS) and validation
        assert {e.text_a for e in train}.isdisjoint(e.text_a for e in validation)
        v, t = [e.text_a for e in validation], [e.text_a for e in train]
        measured = span_overlap(v, t)
        assert measured["share"] == pytest.approx(plain_overlap(v, t)) == 0.0
    # a row-level split of the same rows: a held-out phrase's parent stays in train
    v, t = [TREE_A[1], TREE_B[1]], [r for r in ROWS if r not in (TREE_A[1], TREE_B[1])]
    measured = span_overlap(v, t)
    assert measured == {"long": 2, "shared": 2, "share": 1.0}
    assert measured["share"] == plain_overlap(v, t)
    assert carve_by_family(examples, 0.0, 1) == (examples, [])


def test_prepare_reads_data_holdout(tmp_path: Path, params_dict, make_params) -> None:
    """data.holdout: phrase-family makes prepare split by family and say so in meta.json."""
    from aclpipe.data.tasks import get_task
    from aclpipe.stages.prepare import prepare

    glue = tmp_path / "glue" / "SST-2"
    glue.mkdir(parents=True)
    lines = ["sentence\tlabel"] + [f"{t}\t{i % 2}" for i, t in enumerate(ROWS * 2)]
    (glue / "train.tsv").write_text("\n".join(lines) + "\n")
    (glue / "dev.tsv").write_text("sentence\tlabel\n" + "\n".join(f"{t}\t1" for t in TREE_C) + "\n")
    params = make_params(data={"glue_dir": str(tmp_path / "glue"), "validation_fraction": 0.3,
                               "holdout": "phrase-family"})  # fmt: skip
    meta = prepare(get_task("sst2"), params.data, params.model.name, tmp_path / "out",
                   tmp_path / "glue")  # fmt: skip
    assert meta["holdout"] == "phrase-family" and meta["splits"]["validation"]["examples"] > 0
    plain = make_params(data={"glue_dir": str(tmp_path / "glue"), "validation_fraction": 0.3})
    meta = prepare(get_task("sst2"), plain.data, plain.model.name, tmp_path / "out2",
                   tmp_path / "glue")  # fmt: skip
    assert "holdout" not in meta  # the default split's record is unchanged
    assert json.loads((tmp_path / "out2" / "meta.json").read_text()) == meta


def test_phrase_family_leaves_tasks_without_phrase_rows_split_by_example(
    tmp_path: Path, make_params
) -> None:
    """MRPC's rows are sentence pairs, not phrases: data.holdout: phrase-family keeps its
    stratified example split, byte for byte, and its meta.json says nothing of families."""
    from aclpipe.data.tasks import get_task
    from aclpipe.stages.prepare import prepare

    glue = tmp_path / "glue" / "MRPC"
    glue.mkdir(parents=True)
    header = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"
    rows = [f"{i % 2}\t{i}\t{i + 100}\t{t}\t{t} again" for i, t in enumerate(ROWS * 2)]
    (glue / "train.tsv").write_text("\n".join([header, *rows]) + "\n")
    (glue / "dev.tsv").write_text("\n".join([header, *rows[:4]]) + "\n")
    outs = {}
    for holdout in ("examples", "phrase-family"):
        params = make_params(data={"glue_dir": str(tmp_path / "glue"), "validation_fraction": 0.3,
                                   "holdout": holdout})  # fmt: skip
        meta = prepare(get_task("mrpc"), params.data, params.model.name, tmp_path / holdout,
                       tmp_path / "glue")  # fmt: skip
        assert "holdout" not in meta and meta["splits"]["validation"]["examples"] > 0
        outs[holdout] = (tmp_path / holdout / "validation.jsonl").read_bytes()
    assert outs["examples"] == outs["phrase-family"]


def test_leak_free_rows_of_a_recorded_split() -> None:
    from aclpipe.study.campaign.leak_free import leak_free_rows

    train = TREE_A[:3]
    validation = [TREE_A[4], TREE_B[2], TREE_C[0], TREE_A[5]]
    # deeply moving portrait and of a family in crisis sit inside train's phrases: leaked
    assert leak_free_rows(validation, train) == [1, 2]
