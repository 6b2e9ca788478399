"""The nine GLUE tasks: where their files are, what their labels are, how they are scored."""

from __future__ import annotations

from dataclasses import dataclass

from aclpipe.errors import UserError


@dataclass(frozen=True)
class Task:
    """One GLUE task.

    Attributes:
        name: our name (``sst2``), used on the command line and in paths.
        folder: the folder in the classic ``glue_data`` layout (``SST-2``).
        hub_config: the config name of ``nyu-mll/glue`` on the Hugging Face hub.
        labels: label strings in index order, as the TSV files spell them; for STS-B (a
            regression task) an empty tuple.
        metrics: GLUE's metrics for the task; the task's score is their mean.
        dev_splits: our dev split names, and for each the TSV file stem and the hub split.
            MNLI has two: matched and mismatched.
        text_columns: the hub dataset's text columns (one for single sentences, two for pairs).
        embeds: a sentence-embedding task (``SENTENCE_TASKS``): rows of sentences to embed,
            built from local GLUE training files, dev scored by the Spearman correlation of
            cosine similarity with STS-B's gold scores (``aclpipe.data.sentences``).
    """

    name: str
    folder: str
    hub_config: str
    labels: tuple[str, ...]
    metrics: tuple[str, ...]
    dev_splits: tuple[tuple[str, str, str], ...]
    text_columns: tuple[str, ...]
    embeds: bool = False

    @property
    def is_regression(self) -> bool:
        return not self.labels

    @property
    def num_labels(self) -> int:
        """Width of an exit's output: the number of classes, or 1 for regression."""
        return len(self.labels) if self.labels else 1

    @property
    def is_pair(self) -> bool:
        return len(self.text_columns) == 2


_DEV = (("dev", "dev", "validation"),)

TASKS: dict[str, Task] = {
    t.name: t
    for t in [
        Task("cola", "CoLA", "cola", ("0", "1"), ("mcc",), _DEV, ("sentence",)),
        Task("sst2", "SST-2", "sst2", ("0", "1"), ("accuracy",), _DEV, ("sentence",)),
        Task(
            "mrpc", "MRPC", "mrpc", ("0", "1"), ("accuracy", "f1"), _DEV, ("sentence1", "sentence2")
        ),
        Task("qqp", "QQP", "qqp", ("0", "1"), ("accuracy", "f1"), _DEV, ("question1", "question2")),
        Task(
            "stsb", "STS-B", "stsb", (), ("pearson", "spearman"), _DEV, ("sentence1", "sentence2")
        ),
        Task(
            "mnli",
            "MNLI",
            "mnli",
            ("entailment", "neutral", "contradiction"),
            ("accuracy",),
            (
                ("dev_matched", "dev_matched", "validation_matched"),
                ("dev_mismatched", "dev_mismatched", "validation_mismatched"),
            ),
            ("premise", "hypothesis"),
        ),
        Task(
            "qnli",
            "QNLI",
            "qnli",
            ("entailment", "not_entailment"),
            ("accuracy",),
            _DEV,
            ("question", "sentence"),
        ),
        Task(
            "rte",
            "RTE",
            "rte",
            ("entailment", "not_entailment"),
            ("accuracy",),
            _DEV,
            ("sentence1", "sentence2"),
        ),
        Task("wnli", "WNLI", "wnli", ("0", "1"), ("accuracy",), _DEV, ("sentence1", "sentence2")),
    ]
}


# Sentence-embedding tasks (simcse-unsup, simcse-sup): train is built from several GLUE tasks'
# training files (aclpipe.data.sentences); dev is STS-B's dev pairs with their gold scores.
_STS = ("sentence1", "sentence2")
SENTENCE_TASKS: dict[str, Task] = {
    t.name: t
    for t in [
        Task("sentences", "STS-B", "stsb", (), ("spearman",), _DEV, _STS, embeds=True),
        Task("sentence-pairs", "STS-B", "stsb", (), ("spearman",), _DEV, _STS, embeds=True),
    ]
}


def get_task(name: str) -> Task:
    """Look a task up by name, with a one-line error listing the valid names."""
    task = TASKS.get(name.lower()) or SENTENCE_TASKS.get(name.lower())
    if task is None:
        names = ", ".join([*TASKS, *SENTENCE_TASKS])
        raise UserError(f"unknown task {name!r}: use one of {names}")
    return task
