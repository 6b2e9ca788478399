"""predict_lines on a tiny random BERT saved as `aclpipe export-exits` saves its model folder.

The folder is written by ``export.save_model_folder`` (what ``export_exits`` writes as
``export/model/``) without the slow ONNX graphs, which predict does not read.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

from aclpipe.data.tasks import TASKS
from aclpipe.early_exit.predict import predict_lines, read_lines, write_jsonl
from aclpipe.errors import UserError
from aclpipe.exits.export import save_model_folder
from aclpipe.modeling.backbone import load_encoder, load_tokenizer, load_tokenizer_from
from aclpipe.modeling.model import ExitSpec, MultiExitModel, load_multi_exit

LINES = [
    "the movie was good .\n",
    "\n",
    "bad plot\n",
    "   \n",
    "this film is very very fun and great , the acting too .\r\n",
    "it was not awful .\n",
    "a dog sits on the mat",  # a last line without a newline
]  # fmt: skip
TEXTS = [line.rstrip("\r\n") for line in LINES if line.strip()]
ALL_TEXTS = [line.rstrip("\r\n") for line in LINES]  # blank lines keep their place


def answered(rows: list[dict]) -> list[dict]:
    """The records of non-blank lines (blank ones carry ``"error": "blank line"``)."""
    return [r for r in rows if "error" not in r]


def save_folder(folder: Path, tiny_model_dir: Path, task: str, num_labels: int) -> Path:
    torch.manual_seed(0)
    spec = ExitSpec(num_labels=num_labels, exits=[1, 2, 3], pooling="mean", dropout=0.1)
    model = MultiExitModel(load_encoder(str(tiny_model_dir)), spec)
    save_model_folder(model, load_tokenizer(str(tiny_model_dir)), folder, TASKS[task])
    return folder


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    return save_folder(tmp_path_factory.mktemp("exported") / "model", tiny_model_dir, "sst2", 2)


def reference(folder: Path, text: str) -> torch.Tensor:
    """All-exit logits of one line on its own (no batch, no padding): ``[E, C]``."""
    model = load_multi_exit(folder).eval()
    inputs = dict(load_tokenizer_from(folder)(*text.split("\t"), return_tensors="pt"))
    with torch.no_grad():
        return model(**inputs).logits[:, 0]


def test_one_record_per_line_in_order(model_folder: Path) -> None:
    rows = list(predict_lines(model_folder, LINES, "entropy", 0.5, batch_size=2))
    assert [r["text"] for r in rows] == ALL_TEXTS
    assert [r["text"] for r in answered(rows)] == TEXTS
    for row in answered(rows):
        assert list(row) == ["label", "label_name", "probability", "exit_layer", "text"]
        assert row["label"] in (0, 1) and row["label_name"] == str(row["label"])
        assert 0.5 <= row["probability"] <= 1 and row["exit_layer"] in (1, 2, 3)


@pytest.mark.parametrize(
    ("policy", "threshold", "layer"), [("entropy", 0.0, 3), ("confidence", 0.0, 1)]
)
def test_thresholds_at_the_ends(model_folder: Path, policy: str, threshold: float, layer: int):
    """Entropy 0 lets no sample out early; confidence 0 lets every sample out at once."""
    rows = answered(predict_lines(model_folder, LINES, policy, threshold, batch_size=3))
    assert len(rows) == len(TEXTS) and all(r["exit_layer"] == layer for r in rows)
    for row in rows:  # batched and padded, the answer is that of the line on its own
        probs = reference(model_folder, row["text"])[[1, 2, 3].index(layer)].softmax(-1)
        assert row["label"] == int(probs.argmax())
        assert row["probability"] == pytest.approx(float(probs.max()), abs=1e-5)


@pytest.fixture(scope="module")
def pair_model_folder(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """The tiny model saved as a model of a sentence-pair task (MRPC)."""
    return save_folder(tmp_path_factory.mktemp("pairs") / "model", tiny_model_dir, "mrpc", 2)


def test_pairs_with_a_tab(pair_model_folder: Path, model_folder: Path) -> None:
    pairs = ["the man plays the guitar .\ta man plays a guitar .", "the dog runs .\tthe cat sits"]
    rows = list(predict_lines(pair_model_folder, pairs, "entropy", 0.0))
    assert [r["text"] for r in rows] == pairs
    for row in rows:
        probs = reference(pair_model_folder, row["text"])[-1].softmax(-1)  # tokenized as a pair
        assert row["probability"] == pytest.approx(float(probs.max()), abs=1e-5)
    with pytest.raises(UserError, match=r"^input line 1 holds one text, but this model \(mrpc\)"):
        list(predict_lines(pair_model_folder, ["the man plays ."], "entropy", 0.0))
    with pytest.raises(UserError, match=r"^input line 2 holds two texts, but this model \(sst2\)"):
        list(predict_lines(model_folder, ["good .", pairs[0]], "entropy", 0.0))


@pytest.mark.parametrize(
    ("policy", "threshold"),
    [("entropy", 5.0), ("entropy", -0.1), ("confidence", 1.5), ("patience", 0.5), ("maxprob", 0.9)],
)
def test_bad_policy_or_threshold(model_folder: Path, policy: str, threshold: float) -> None:
    with pytest.raises(UserError):
        predict_lines(model_folder, LINES, policy, threshold)  # raised before reading any line


def test_bad_inputs(model_folder: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="2 tabs"):
        list(predict_lines(model_folder, ["a\tb\tc"], "entropy", 0.3))
    with pytest.raises(UserError, match="3 label names"):
        predict_lines(model_folder, LINES, "entropy", 0.3, task_labels=["a", "b", "c"])
    with pytest.raises(UserError, match="no trained model"):
        predict_lines(tmp_path / "absent", LINES, "entropy", 0.3)
    with pytest.raises(UserError, match="not found"):
        read_lines(tmp_path / "absent.txt")


def test_given_label_names(model_folder: Path) -> None:
    rows = predict_lines(model_folder, TEXTS, "patience", 1, task_labels=["neg", "pos"])
    assert all(r["label_name"] == ["neg", "pos"][r["label"]] for r in rows)


def test_regression_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    folder = save_folder(tmp_path / "model", tiny_model_dir, "stsb", 1)
    rows = list(predict_lines(folder, ["a man plays\tthe man plays"], "patience", 1))
    assert isinstance(rows[0]["label"], float) and rows[0]["probability"] is None
    assert "label_name" not in rows[0]
    with pytest.raises(UserError, match="patience"):
        predict_lines(folder, ["a\tb"], "entropy", 0.3)


def test_write_jsonl_to_stream_and_file(model_folder: Path, tmp_path: Path) -> None:
    rows = list(predict_lines(model_folder, LINES, "confidence", 0.9))
    stream = io.StringIO()
    assert write_jsonl(rows, stream) == len(LINES)
    assert [json.loads(line) for line in stream.getvalue().splitlines()] == rows
    source = tmp_path / "in.txt"
    source.write_text("".join(LINES), encoding="utf-8")
    out = tmp_path / "out" / "predictions.jsonl"
    lines = read_lines(source)
    assert write_jsonl(predict_lines(model_folder, lines, "confidence", 0.9), out) == len(LINES)
    assert [json.loads(line) for line in out.read_text().splitlines()] == rows
    assert [p.name for p in out.parent.iterdir()] == ["predictions.jsonl"]


def test_predict_file_reads_the_input_once(model_folder: Path, tmp_path: Path, monkeypatch):
    """``aclpipe predict``'s body: one pass over the input, even with the progress bar shown
    (on a terminal), output written in order and the summary on the console."""
    import builtins

    from rich.console import Console

    from aclpipe.early_exit.predict import predict_file

    source, out = tmp_path / "in.txt", tmp_path / "out.jsonl"
    source.write_text("".join(LINES), encoding="utf-8")
    opened: list[str] = []
    real_open = builtins.open

    def counting_open(file, *args, **kwargs):
        opened.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    stderr = io.StringIO()
    console = Console(file=stderr, force_terminal=True, width=80)
    predictor = predict_file(model_folder, str(source), str(out), policy="confidence",
                             threshold=0.9, console=console)  # fmt: skip
    monkeypatch.setattr(builtins, "open", real_open)
    assert opened.count(str(source)) == 1
    expected = list(predict_lines(model_folder, LINES, "confidence", 0.9))
    assert [json.loads(line) for line in out.read_text().splitlines()] == expected
    assert predictor.summary() in stderr.getvalue().replace("\n", "")
    assert predictor.count == len(TEXTS)


def test_predict_file_checks_options_and_input_first(model_folder: Path, tmp_path: Path):
    from aclpipe.early_exit.predict import predict_file

    with pytest.raises(UserError, match="--threads must be >= 1"):
        predict_file(model_folder, "-", threads=0)
    with pytest.raises(UserError, match="not found"):  # before the model folder is read
        predict_file(tmp_path / "no-model", str(tmp_path / "absent.txt"))


def test_bytes_that_are_not_utf8_text_are_named_by_line(tmp_path: Path, monkeypatch) -> None:
    """A Latin-1 byte or a NUL (a binary file): one error naming the file (or stdin), the line
    and the fix, from a file and from stdin; UTF-8 with a byte-order mark reads as before."""
    source = tmp_path / "in.txt"
    source.write_bytes(b"good\ncaf\xe9\n")
    with pytest.raises(
        UserError, match=r"in\.txt line 2 is not UTF-8 text \(byte 0xe9 at column 4\)"
    ):
        list(read_lines(source))
    source.write_bytes(b"good\nbad\n\x00\x01\x02")
    with pytest.raises(UserError, match=r"in\.txt line 3 holds a NUL byte, so it is a binary file"):
        list(read_lines(source))
    source.write_bytes("\ufeffcafé\n".encode())
    assert list(read_lines(source)) == ["café\n"]
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"ok\n\xff\n"), encoding="utf-8"))
    with pytest.raises(
        UserError, match=r"stdin line 2 is not UTF-8 text \(byte 0xff at column 1\)"
    ):
        list(read_lines("-"))


def test_tsv_texts_must_match_the_model(model_folder: Path, tmp_path: Path) -> None:
    """A TSV naming two texts for a one-text model (and one for a pair model) is refused at its
    header; a model that does not carry its task (a training folder) is not checked."""
    from aclpipe.early_exit.inputs import records

    pairs = ["sentence1\tsentence2\n", "a man\ta person\n"]
    single = ["sentence\tlabel\n", "good\t1\n"]
    assert list(records(pairs, "tsv", 2, "mrpc")) == [("a man\ta person", ("a man", "a person"))]
    assert list(records(single, "tsv", 1, "sst2")) == [("good", ("good", None))]
    assert len(list(records(pairs, "tsv", None, None))) == 1
    with pytest.raises(UserError, match=r"\(sentence1 \| sentence2\) names two texts, but this "
                       r"model \(sst2\) reads one"):  # fmt: skip
        list(records(pairs, "tsv", 1, "sst2"))
    with pytest.raises(UserError, match=r"names one text, but this model \(rte\) reads sentence"):
        list(records(single, "tsv", 2, "rte"))
    source = tmp_path / "in.tsv"
    source.write_text("".join(pairs), encoding="utf-8")
    with pytest.raises(UserError, match=r"this model \(sst2\) reads one"):  # the saved task
        list(predict_lines(model_folder, read_lines(source), "entropy", 0.3, fmt="tsv"))
