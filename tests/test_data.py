"""The prepare stage's pieces: subsampling, tokenizing, batching, atomic folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from paths import at

from aclpipe.atomic import atomic_dir, write_text
from aclpipe.config import DataConfig
from aclpipe.data.glue_sources import Example
from aclpipe.data.prepared import load_meta, load_split, subsample
from aclpipe.data.tasks import TASKS
from aclpipe.errors import UserError
from aclpipe.layout import META, METRICS, split_file
from aclpipe.modeling.backbone import load_tokenizer
from aclpipe.modeling.batching import collate
from aclpipe.stages.prepare import prepare, tokenize


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    return load_tokenizer(str(tiny_model_dir))


def examples(n: int) -> list[Example]:
    return [Example(f"sentence {i}", None, i % 2) for i in range(n)]


def test_subsample_is_deterministic_and_keeps_order() -> None:
    pool = examples(100)
    first = subsample(pool, 10, seed=42)
    assert first == subsample(pool, 10, seed=42)
    assert len(first) == 10 and len(set(first)) == 10
    positions = [pool.index(e) for e in first]
    assert positions == sorted(positions)  # a subsequence, in the original order
    assert subsample(pool, 10, seed=7) != first
    assert subsample(list(reversed(pool)), 10, seed=42) != first  # picks positions, not items


@pytest.mark.parametrize("limit", [None, 100, 1000])
def test_subsample_without_limit_keeps_everything(limit: int | None) -> None:
    pool = examples(100)
    assert subsample(pool, limit, seed=1) == pool


def test_tokenize_single_sentences(tokenizer) -> None:
    rows = tokenize([Example("the movie was good", None, 1), Example("bad", None, 0)],
                    tokenizer, max_length=32)  # fmt: skip
    assert [r["label"] for r in rows] == [1, 0]
    assert tokenizer.convert_ids_to_tokens(rows[0]["input_ids"]) == [
        "[CLS]", "the", "movie", "was", "good", "[SEP]"]  # fmt: skip
    assert len(rows[1]["input_ids"]) == 3  # unpadded: each row keeps its own length
    assert all(set(r["token_type_ids"]) == {0} for r in rows)


def test_tokenize_pairs_as_pairs(tokenizer) -> None:
    (row,) = tokenize([Example("the dog runs", "a cat sits", 2.5)], tokenizer, max_length=32)
    tokens = tokenizer.convert_ids_to_tokens(row["input_ids"])
    assert tokens == ["[CLS]", "the", "dog", "runs", "[SEP]", "a", "cat", "sits", "[SEP]"]
    assert row["token_type_ids"] == [0] * 5 + [1] * 4
    assert row["label"] == 2.5


def test_tokenize_truncates_to_max_length(tokenizer) -> None:
    long = " ".join(["good"] * 50)
    rows = tokenize([Example(long, None, 1)], tokenizer, max_length=8)
    assert len(rows[0]["input_ids"]) == 8
    assert tokenizer.convert_ids_to_tokens(rows[0]["input_ids"])[-1] == "[SEP]"
    pair = tokenize([Example(long, "bad plot", 0)], tokenizer, max_length=10)[0]
    assert len(pair["input_ids"]) == 10
    # Longest first: the short second sentence survives whole.
    assert tokenizer.convert_ids_to_tokens(pair["input_ids"])[-3:] == ["bad", "plot", "[SEP]"]
    assert 1 in pair["token_type_ids"]


def test_collate_pads_to_the_longest_in_the_batch() -> None:
    rows = [
        {"input_ids": [2, 5, 3], "token_type_ids": [0, 0, 0], "label": 1},
        {"input_ids": [2, 5, 6, 7, 3], "token_type_ids": [0, 0, 0, 1, 1], "label": 0},
    ]
    batch = collate(rows, pad_id=9, regression=False)
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "labels"}
    assert batch["input_ids"].tolist() == [[2, 5, 3, 9, 9], [2, 5, 6, 7, 3]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert batch["token_type_ids"].tolist() == [[0, 0, 0, 0, 0], [0, 0, 0, 1, 1]]
    assert batch["labels"].tolist() == [1, 0] and batch["labels"].dtype == torch.long
    assert batch["input_ids"].dtype == torch.long


def test_collate_regression_and_no_token_types() -> None:
    rows = [{"input_ids": [2, 3], "label": 4.2}, {"input_ids": [2, 5, 3], "label": 0.5}]
    batch = collate(rows, pad_id=0, regression=True)
    assert "token_type_ids" not in batch
    assert batch["input_ids"].shape == (2, 3)
    assert batch["labels"].dtype == torch.float32
    assert batch["labels"].tolist() == pytest.approx([4.2, 0.5])


def test_prepare_writes_splits_and_meta(tiny_model_dir: Path, glue_dir: Path,
                                        tmp_path: Path) -> None:  # fmt: skip
    data = DataConfig(glue_dir=None, max_length=32, max_train_samples=20, seed=3)
    out = at(tmp_path).data("mrpc")
    meta = prepare(TASKS["mrpc"], data, str(tiny_model_dir), out, glue_dir)
    names = [split_file(out, "dev").name, META, split_file(out, "train").name]
    assert sorted(p.name for p in out.iterdir()) == sorted(names)
    assert load_meta(out) == meta == json.loads((out / META).read_text())
    assert meta["source"] == f"local:{glue_dir / 'MRPC'}"
    assert meta["splits"]["train"]["examples"] == 12  # fewer rows than the limit: all kept
    assert meta["splits"]["dev"]["examples"] == 8
    train = load_split(out, "train")
    assert all(1 in r["token_type_ids"] for r in train)  # pairs stay pairs
    assert sum(meta["splits"]["train"]["labels"].values()) == 12
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".tmp-")]


def test_load_split_missing(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="aclpipe prepare --task sst2"):
        load_split(tmp_path / "sst2", "train")
    with pytest.raises(UserError, match="aclpipe prepare --task sst2"):
        load_meta(tmp_path / "sst2")


def test_atomic_dir_keeps_the_old_folder_when_the_body_raises(tmp_path: Path) -> None:
    target = tmp_path / "out"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(RuntimeError), atomic_dir(target) as tmp:
        (tmp / "new.txt").write_text("half")
        raise RuntimeError("killed midway")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temp folder left
    assert [p.name for p in target.iterdir()] == ["old.txt"]
    assert (target / "old.txt").read_text() == "old"


def test_atomic_dir_replaces_the_folder_whole(tmp_path: Path) -> None:
    target = tmp_path / "out"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with atomic_dir(target) as tmp:
        assert tmp != target and tmp.parent == tmp_path and not list(tmp.iterdir())
        (tmp / "new.txt").write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert [p.name for p in target.iterdir()] == ["new.txt"]


def test_atomic_dir_creates_a_new_folder(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b"
    with atomic_dir(target) as tmp:
        (tmp / "x").write_text("1")
    assert (target / "x").read_text() == "1"


def test_atomic_write_text(tmp_path: Path) -> None:
    path = tmp_path / "sub" / METRICS
    write_text(path, "one")
    write_text(path, "two")
    assert path.read_text() == "two"
    assert [p.name for p in path.parent.iterdir()] == [METRICS]
