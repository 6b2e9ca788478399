"""Shared fixtures: a tiny random BERT written offline, tiny GLUE files, and typed Params.

As in transformers' ``BertModelTester`` (hidden 32, few layers) and its tokenizer tests (a
vocab file written in a temp dir), nothing here touches the network: ``HF_HUB_OFFLINE=1`` is
set before any Hugging Face library is imported.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"

from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from aclpipe.config import Params, params_from_dict  # noqa: E402
from aclpipe.layout import PARAMS, Layout  # noqa: E402

# Tiny models gain nothing from intra-op threads, and on a loaded machine OpenMP's thread
# hand-offs make a 32-wide matmul a thousand times slower than one thread doing it.
torch.set_num_threads(1)

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = [
    "good", "bad", "movie", "film", "the", "a", "was", "is", "very", "not", "fun", "plot",
    "great", "awful", "story", "acting", "and", "it", "this", "so", "man", "woman", "plays",
    "guitar", "dog", "cat", "runs", "sits", "on", "mat", "said", "he", "she", "today",
    ".",
]  # fmt: skip
NUM_LAYERS = 3
HIDDEN = 32

# SST-2: the label is carried by the word "good" (1) or "bad" (0); the rest is filler.
_FILLERS = ["the movie was", "this film is", "the plot was very", "the acting is so",
            "it was a", "the story is not", "this is a very", "a movie and it was"]  # fmt: skip
SST2_TRAIN_ROWS = 48
SST2_DEV_ROWS = 16


def sst2_sentences(n: int, offset: int = 0) -> list[tuple[str, int]]:
    """``n`` balanced (sentence, label) pairs, alternating labels."""
    rows = []
    for i in range(n):
        label = i % 2
        filler = _FILLERS[(i // 2 + offset) % len(_FILLERS)]
        word = "good" if label else "bad"
        rows.append((f"{filler} {word} {'fun' if i % 3 else 'great'} .", label))
    return rows


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode("utf-8"))


def write_sst2(folder: Path, train: int = SST2_TRAIN_ROWS, dev: int = SST2_DEV_ROWS) -> None:
    for stem, rows in (("train", sst2_sentences(train)), ("dev", sst2_sentences(dev, 3))):
        body = "".join(f"{s} \t{y}\n" for s, y in rows)
        _write(folder / "SST-2" / f"{stem}.tsv", "sentence\tlabel\n" + body)


def write_mrpc(folder: Path) -> None:
    """MRPC as GLUE ships it: UTF-8 with a byte-order mark, header Quality/#1 ID/..."""
    pairs = [
        ("the man plays the guitar .", "a man plays a guitar .", 1),
        ("the dog runs .", "the cat sits on the mat .", 0),
        ("she said the film was good .", "she said the movie was good .", 1),
        ("he is very fun .", "the plot is awful .", 0),
    ]
    for stem, n in (("train", 12), ("dev", 8)):
        lines = ["\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"]
        for i in range(n):
            a, b, y = pairs[i % len(pairs)]
            lines.append(f"{y}\t{1000 + i}\t{2000 + i}\t{a}\t{b}\n")
        _write(folder / "MRPC" / f"{stem}.tsv", "".join(lines))


STSB_HEADER = (
    "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
)


def write_stsb(folder: Path) -> None:
    pairs = [
        ("a man plays a guitar .", "the man plays the guitar .", 4.8),
        ("a dog runs .", "a cat sits on the mat .", 0.4),
        ("the woman said it was good .", "she said it was good .", 3.6),
        ("the movie is fun .", "the dog runs today .", 1.2),
    ]
    for stem, n in (("train", 16), ("dev", 8)):
        lines = [STSB_HEADER]
        for i in range(n):
            a, b, score = pairs[i % len(pairs)]
            lines.append(
                f"{i}\tmain-captions\tMSRvid\t2012test\t{i:04d}\tnone\tnone\t{a}\t{b}"
                f"\t{score:.3f}\n"
            )
        _write(folder / "STS-B" / f"{stem}.tsv", "".join(lines))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 3-layer BERT (hidden 32, 4 heads) and its WordPiece tokenizer in one folder."""
    from transformers import BertConfig, BertModel, BertTokenizer

    folder = tmp_path_factory.mktemp("tiny-bert")
    tokens = SPECIAL + WORDS
    (folder / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    # transformers 5: BertTokenizer takes the vocabulary as ``vocab=`` (vocab_file= is ignored).
    tokenizer = BertTokenizer(vocab={t: i for i, t in enumerate(tokens)})
    tokenizer.save_pretrained(str(folder))
    config = BertConfig(
        vocab_size=len(tokens), hidden_size=HIDDEN, num_hidden_layers=NUM_LAYERS,
        num_attention_heads=4, intermediate_size=37, max_position_embeddings=64,
        pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    BertModel(config).save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="session")
def glue_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny SST-2, MRPC (with BOM) and STS-B files in the classic glue_data layout."""
    folder = tmp_path_factory.mktemp("glue_data")
    write_sst2(folder)
    write_mrpc(folder)
    write_stsb(folder)
    return folder


def tiny_params_dict(model_dir: Path, glue: Path | None = None,
                     **sections: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """A params.yaml mapping for the tiny model: small batches, one epoch, 32 tokens; each
    keyword updates one section."""
    raw: dict[str, Any] = {
        "pipeline": {"tasks": ["sst2", "mrpc"], "methods": ["ce", "joint"]},
        "data": {"glue_dir": str(glue) if glue else None, "max_length": 32, "seed": 42},
        "model": {"name": str(model_dir)},
        "train": {"epochs": 1, "batch_size": 16, "lr": 1e-3, "head_lr": 1e-2,
                  "device": "cpu", "log_every": 1, "seed": 0},
        # No speed measurement: it times repeated runs, seconds that test nothing here.
        "evaluate": {"batch_size": 16, "timing_examples": 0},
    }  # fmt: skip
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    return raw


@pytest.fixture(scope="session")
def params_dict(tiny_model_dir: Path) -> Callable[..., dict[str, Any]]:
    """``params_dict(glue_dir, train={...})``: a raw params.yaml mapping for the tiny model."""

    def build(glue: Path | None = None, **sections: dict[str, Any]) -> dict[str, Any]:
        return tiny_params_dict(tiny_model_dir, glue, **sections)

    return build


@pytest.fixture
def make_params(params_dict: Callable[..., dict[str, Any]]) -> Callable[..., Params]:
    """``make_params(train={"lr": 1e-2}, ...)``: typed Params for the tiny model."""

    def build(**sections: dict[str, Any]) -> Params:
        return params_from_dict(params_dict(None, **sections))

    return build


# Shared by the reliability tests (resume, atomic stages, bad inputs, determinism, distributed).


@pytest.fixture(scope="session")
def tiny_model_dir_no_dropout(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """``tiny_model_dir`` with every backbone dropout at 0 (same weights and tokenizer).

    Runs that split a batch differently draw different dropout masks; without dropout they
    compute the same function, so only float rounding separates them.
    """
    import json
    import shutil

    folder = tmp_path_factory.mktemp("tiny-bert-no-dropout")
    shutil.copytree(tiny_model_dir, folder, dirs_exist_ok=True)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (folder / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return folder


@pytest.fixture(scope="session")
def make_project(params_dict: Callable[..., dict[str, Any]], glue_dir: Path) -> Callable[..., Path]:
    """``make_project(folder, train={...})``: a project folder holding params.yaml for the tiny
    model (each keyword updates one section, as in ``params_dict``) and SST-2 prepared into
    data/sst2. Commands then run with the folder as their working directory."""
    import yaml

    from aclpipe.data.tasks import get_task
    from aclpipe.stages.prepare import prepare

    def build(folder: Path, **sections: dict[str, Any]) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        raw = params_dict(glue_dir, **sections)
        (folder / PARAMS).write_text(yaml.safe_dump(raw), encoding="utf-8")
        params = params_from_dict(raw)
        prepare(
            get_task("sst2"), params.data, params.model.name, Layout(folder).data("sst2"), glue_dir
        )
        return folder

    return build


@pytest.fixture(scope="session")
def run_in_child() -> Callable[[Callable[[], object]], int]:
    """``run_in_child(body)``: run ``body()`` in a forked copy of this process; its wait status.

    The child has everything imported already, so a stage starts in milliseconds rather than
    the seconds a fresh interpreter takes, and a patch made in ``body`` (say, one that sends
    the process SIGKILL half-way through writing a file) lives and dies with the child.
    """
    import sys

    def run(body: Callable[[], object]) -> int:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child never returns into pytest
            code = 0
            try:
                body()
            except BaseException:  # a child must never unwind into pytest's own frames
                code = 3
            finally:
                os._exit(code)
        return os.waitpid(pid, 0)[1]

    return run
