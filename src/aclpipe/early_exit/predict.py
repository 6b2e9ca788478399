"""Prediction with early exit: text in (``aclpipe.early_exit.inputs``), one JSON record per
input record out (``aclpipe.early_exit.outputs``), in input order.

``--model`` is the folder ``export-exits`` writes (``models/<task>/<method>/export``), or a
model folder (an export's ``model/``, or a training folder ``models/<task>/<method>``). Two
engines run the same per-sample policy (``aclpipe.early_exit.policies.leaves``):

- ``onnx`` (the default for an export folder): the exported segments on ONNX Runtime
  (``early_exit.onnx_runtime``), tokenized by the ``tokenizers`` library from
  ``tokenizer.json``. It imports neither torch nor transformers;
- ``torch``: the PyTorch runtime (``early_exit.runtime``) on the saved model.

The policy and threshold default to the export's ``default_setting`` (``early_exit.settings``:
the 1-point budget's pick from the trade-off sweep), or ``settings.FALLBACK`` without one;
``--policy`` alone takes that policy's ``POLICY_DEFAULTS`` threshold. ``none`` runs the full
model to its last exit, the baseline.

Records are read in chunks of ``CHUNK_BATCHES`` batches, sorted by token length inside a chunk
(batches of similar lengths carry little padding) and written back in input order::

    {"label": 1, "label_name": "1", "probability": 0.93, "exit_layer": 2, "text": "..."}

``label`` is a float and ``probability`` null for a regression model (STS-B); ``label_name``
appears when label names are known. Output line n always answers input record n: a blank (or
whitespace-only) line gets a record in its place with ``label``, ``probability`` and
``exit_layer`` null and ``"error": "blank line"``, and one note on stderr counts them.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from aclpipe.data.tasks import TASKS
from aclpipe.early_exit.inputs import input_format, read_lines, records
from aclpipe.early_exit.onnx_runtime import check_precision
from aclpipe.early_exit.outputs import check_output, write_jsonl, write_records
from aclpipe.early_exit.policies import NO_EXIT, POLICIES
from aclpipe.early_exit.settings import FALLBACK, POLICY_DEFAULTS
from aclpipe.early_exit.tokens import encode, load_fast_tokenizer, pad
from aclpipe.errors import UserError
from aclpipe.layout import (
    EXPORT_JSON,
    EXPORT_MODEL,
    EXPORT_TOKENIZER,
    MODEL_CONFIG,
    TASK_FILE,
    TOKENIZER,
)

ENGINES = ("onnx", "torch")
CHUNK_BATCHES = 64  # batches read, sorted by length and answered together
Output = tuple[list[float], list[float], int]  # a row's logits [C], probabilities [C], exit layer

__all__ = [
    "Predictor",
    "predict_file",
    "predict_lines",
    "probabilities",
    "read_lines",
    "write_jsonl",
]


def saved_task(model_dir: Path) -> dict | None:
    """The task name and label names written next to an exported model (``aclpipe_task.json``),
    if any (a training folder has none)."""
    path = model_dir / TASK_FILE
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        return {"task": record.get("task"), "labels": [str(name) for name in record["labels"]]}
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
        raise UserError(
            f"{path} is damaged ({type(err).__name__}): export the model again"
        ) from err


def texts_read(task: str | None) -> int | None:
    """How many texts a model of ``task`` reads per input (1, or 2 for a pair task); None when
    the task is not known."""
    return len(TASKS[task].text_columns) if task in TASKS else None


def _export_record(folder: Path) -> dict | None:
    path = folder / EXPORT_JSON
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise UserError(f"{path} is damaged: run `aclpipe export-exits` again") from err


def choose_setting(policy: str | None, threshold: float | None, record: dict | None):
    """``(policy, threshold, where from)``: the user's, else the export's default, else the
    fallback; a policy named alone takes the export's threshold when it is the same policy."""
    stored = (record or {}).get("default_setting") or {**FALLBACK, "source": "fallback"}
    if policy is None:
        if threshold is not None:
            raise UserError("--threshold needs --policy: name the policy it belongs to")
        return stored["policy"], stored["threshold"], f"default ({stored['source']})"
    if policy != NO_EXIT and policy not in POLICIES:
        raise UserError(
            f"unknown policy {policy!r}: use one of {', '.join(POLICIES)} (or none for the full "
            "model)"
        )
    if threshold is None and policy != NO_EXIT:
        same = stored["policy"] == policy
        threshold = stored["threshold"] if same else POLICY_DEFAULTS[policy]
    return policy, threshold, "given"


class Predictor:
    """A loaded model, tokenizer and policy: ``records(lines)`` yields the output records and
    fills ``count``, ``seconds`` and ``layers`` (the exit layers of answered records).
    ``runtime`` is the onnx engine's ``OnnxEarlyExit`` (its sessions, which the server's
    iteration scheduler runs segment by segment), None for the torch engine."""

    def __init__(
        self,
        model: Path,
        policy: str | None = None,
        threshold: float | None = None,
        engine: str | None = None,
        batch_size: int = 32,
        max_length: int = 128,
        task_labels: list[str] | None = None,
        threads: int | None = None,  # intra-op threads of the engine (None: its default)
        precision: str = "fp32",  # onnx: fp32, or int8 (export-exits --int8; exits.quantize)
    ) -> None:
        if batch_size < 1 or max_length < 2:
            raise UserError(
                f"batch size {batch_size} and max length {max_length} must be >= 1 and 2"
            )
        record = _export_record(model)  # export.json, read once; None for a model folder
        if engine is None:
            engine = "onnx" if record and record.get("segments") else "torch"
        if engine not in ENGINES:
            raise UserError(f"unknown engine {engine!r}: use onnx or torch")
        self.policy, self.threshold, self.setting_source = choose_setting(policy, threshold, record)
        if engine == "torch":  # the onnx engine checks the precision as it picks its segments
            check_precision(precision, record, model)
            if precision != "fp32":
                raise UserError(
                    f"--precision {precision} runs on the onnx engine only: drop --engine "
                    "torch, or use --precision fp32"
                )
        self.engine_name, self.batch_size = engine, batch_size
        if precision != "fp32":
            self.engine_name = f"{engine} {precision}"
        model_dir = model / EXPORT_MODEL if record else model
        if engine == "onnx":
            if record is None:
                raise UserError(
                    f"--engine onnx needs the folder `aclpipe export-exits` writes "
                    f"(models/<task>/<method>/export), with export.json; {model} has none: "
                    "give that folder, or use --engine torch"
                )
            from aclpipe.early_exit.onnx_runtime import OnnxEarlyExit

            runtime = OnnxEarlyExit(model, self.policy, self.threshold, threads=threads,
                                    precision=precision, record=record)  # fmt: skip

            def run(arrays: dict) -> tuple[np.ndarray, np.ndarray]:
                result = runtime(**arrays)
                return result.logits, result.exit_layer

            self.run, self.exits, self.runtime = run, runtime.exits, runtime
            self.num_labels, self.regression = record["num_labels"], runtime.regression
            self.pad_id = int(record.get("pad_id", 0))
            tokenizer_file = model / record.get("tokenizer", EXPORT_TOKENIZER)
            names, self.task = record.get("labels"), record.get("task")
        else:
            if not (model_dir / MODEL_CONFIG).is_file():
                raise UserError(
                    f"no trained model in {model} (missing {MODEL_CONFIG}): give the folder "
                    "`aclpipe export-exits` writes (models/<task>/<method>/export) or run "
                    "`aclpipe finetune` for this task and method first"
                )
            from aclpipe.early_exit.torch_engine import TorchEngine

            engine_ = TorchEngine(model_dir, self.policy, self.threshold, threads)
            self.run, self.exits, self.runtime = engine_, engine_.exits, None
            self.num_labels, self.regression = engine_.num_labels, engine_.regression
            self.pad_id = engine_.pad_id
            folder = model_dir / TOKENIZER if (model_dir / TOKENIZER).is_dir() else model_dir
            tokenizer_file = folder / EXPORT_TOKENIZER
            saved = saved_task(model_dir) or {}
            names, self.task = saved.get("labels") or None, saved.get("task")
        names = task_labels if task_labels is not None else names
        if names and len(names) != self.num_labels:
            raise UserError(
                f"{len(names)} label names given for a model with {self.num_labels} outputs: "
                "pass the labels of the task the model was trained on"
            )
        self.names = [str(n) for n in names] if names else None
        self.tokenizer = load_fast_tokenizer(tokenizer_file, max_length)
        self.count, self.seconds, self.layers = 0, 0.0, []

    def records(self, lines: Iterable[str], fmt: str = "text") -> Iterator[dict]:
        """One output record per input record, in input order (module docstring)."""
        chunk: list = []
        blank: list[int] = []
        texts = texts_read(self.task)
        for number, (text, pair) in enumerate(records(lines, fmt, texts, self.task), start=1):
            if pair is None or not any((p or "").strip() for p in pair):
                blank.append(number)
                pair = None
            chunk.append((text, pair))
            if len(chunk) == self.batch_size * CHUNK_BATCHES:
                yield from self._answer(chunk)
                chunk = []
        if chunk:
            yield from self._answer(chunk)
        if blank:
            print(blank_note(blank), file=sys.stderr)

    def _answer(self, chunk: list) -> Iterator[dict]:
        todo = [i for i, (_, pair) in enumerate(chunk) if pair is not None]
        outputs = self.run_rows(encode(self.tokenizer, [chunk[i][1] for i in todo]))
        answers = {i: self.record(*output) for i, output in zip(todo, outputs)}
        for i, (text, pair) in enumerate(chunk):
            if pair is None:
                yield _blank_record(text, self.names)
            else:
                self.count += 1
                self.layers.append(answers[i]["exit_layer"])
                yield {**answers[i], "text": text}

    def run_rows(self, rows: list[dict]) -> list[Output]:
        """The ``outputs`` of token rows (``tokens.encode``), in their order: sorted by
        length (batches of similar lengths carry little padding), cut into batches of
        ``batch_size``, each padded and run. ``predict`` and ``serve`` both run through it."""
        order = sorted(range(len(rows)), key=lambda j: len(rows[j]["input_ids"]))
        out: list = [None] * len(rows)
        for start in range(0, len(order), self.batch_size):
            picked = order[start : start + self.batch_size]
            arrays = pad([rows[j] for j in picked], self.pad_id)  # [b, T] each
            began = time.perf_counter()
            logits, layers = self.run(arrays)  # [b, C], [b]
            self.seconds += time.perf_counter() - began
            for j, output in zip(picked, self.outputs(logits, layers.tolist())):
                out[j] = output
        return out

    def outputs(self, logits: np.ndarray, layers: list[int]) -> list[Output]:
        """``(logits [C], probabilities [C], exit layer)`` per row of ``logits`` ``[b, C]``
        taken at exit layers ``layers`` (``[b]``): what ``record`` (and the server's other
        answer shapes) are made from."""
        probs = probabilities(logits.astype(np.float32))  # [b, C]; unused for regression
        return list(zip(logits.tolist(), probs.tolist(), [int(layer) for layer in layers]))

    def answers(self, logits: np.ndarray, layers: list[int]) -> list[dict]:
        """The output records, without ``text``, of rows whose logits ``[b, C]`` were taken at
        exit layers ``layers`` (``[b]``)."""
        return [self.record(*output) for output in self.outputs(logits, layers)]

    def record(self, logits: list[float], probs: list[float], layer: int) -> dict:
        """One row's output record, without ``text`` (module docstring): its logits ``[C]``,
        their ``probabilities`` ``[C]`` and its exit layer."""
        if self.regression:
            return {"label": float(logits[0]), "probability": None, "exit_layer": layer}
        label = probs.index(max(probs))
        record: dict = {"label": label}
        if self.names:
            record["label_name"] = self.names[label]
        record.update(probability=probs[label], exit_layer=layer)
        return record

    def summary(self) -> str:
        """The final stderr line: throughput and mean exit layer."""
        setting = self.policy if self.policy == NO_EXIT else f"{self.policy} {self.threshold:g}"
        if not self.count:
            return f"0 sentences: the input held no records; engine {self.engine_name}, policy {setting}"
        rate = self.count / self.seconds if self.seconds > 0 else float("nan")
        mean = sum(self.layers) / len(self.layers)
        return (
            f"{self.count} sentences, {rate:.1f} sentences/s (model time {self.seconds:.2f} s), "
            f"mean exit layer {mean:.2f} of {self.exits[-1]}; engine {self.engine_name}, "
            f"policy {setting} ({self.setting_source})"
        )


def predict_file(
    model: Path,
    source: str = "-",
    output: str = "-",
    *,
    policy: str | None = None,
    threshold: float | None = None,
    engine: str | None = None,
    fmt: str = "auto",
    batch_size: int = 32,
    max_length: int = 128,
    threads: int | None = None,
    precision: str = "fp32",
    console=None,  # a rich Console for stderr: the progress bar (on a terminal) and summary
) -> Predictor:
    """``aclpipe predict``: read ``source`` (a file, or ``-`` for stdin) once, write one JSON
    line per record to ``output`` (a file, written atomically, or ``-`` for stdout). On a
    terminal a progress bar follows the bytes read, so the input is not counted beforehand;
    the summary line goes to ``console`` at the end. Returns the ``Predictor``."""
    if batch_size < 1 or max_length < 2 or (threads is not None and threads < 1):
        raise UserError("--batch-size and --threads must be >= 1 and --max-length >= 2")
    fmt = input_format(source, fmt)
    lines = read_lines(source)  # a missing input fails before the model loads
    if output != "-":
        check_output(Path(output))
    predictor = Predictor(model, policy, threshold, engine, batch_size, max_length,
                          threads=threads, precision=precision)  # fmt: skip
    rows = predictor.records(lines, fmt)
    out = sys.stdout if output == "-" else Path(output)
    if console is not None and console.is_terminal and lines.size:
        from rich.progress import Progress

        with Progress(console=console, transient=True) as progress:
            bar = progress.add_task("predict", total=lines.size)

            def advancing(rows: Iterable[dict]) -> Iterator[dict]:
                for row in rows:
                    progress.update(bar, completed=lines.position())
                    yield row

            write_records(advancing(rows), out)
    else:
        write_records(rows, out)
    if console is not None:
        console.print(predictor.summary(), highlight=False, soft_wrap=True)
    return predictor


def predict_lines(
    model_dir: Path,
    lines: Iterable[str],
    policy: str | None = None,
    threshold: float | None = None,
    batch_size: int = 32,
    max_length: int = 128,
    task_labels: list[str] | None = None,
    engine: str | None = None,
    fmt: str = "text",
) -> Iterator[dict]:
    """``Predictor(...).records(lines, fmt)``: the model, tokenizer and policy are checked at
    once (a bad threshold or folder raises ``UserError`` here), the lines read lazily."""
    predictor = Predictor(model_dir, policy, threshold, engine, batch_size, max_length, task_labels)
    return predictor.records(lines, fmt)


def probabilities(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float32 (as torch's on the model's float32 logits)."""
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


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
