"""The early-exit runtime on ONNX Runtime: the exported segments chained, stopping per sample.

The same loop as the PyTorch runtime (``aclpipe.early_exit.core.run_exits``, written once for
both) over the graphs ``export-exits`` writes (``aclpipe.exits.segments``):
``embeddings.onnx`` gives ``states``; segment ``j`` runs the layers up to exit ``j`` and that
exit's head. After each exit the SAME pure policy (``aclpipe.early_exit.policies.leaves``)
decides, sample by sample, who leaves; those rows leave ``states`` and the mask, and padding
columns only finished rows needed are trimmed (batches are right-padded). ``policy="none"``
runs every segment for every row and answers with the last exit (the baseline; the inner
heads, a pooling and a linear map each, still run inside their segments).

NumPy and onnxruntime only: a serving box needs no torch and no transformers.

Threads: ONNX Runtime's intra-op threads spin after each run by default; with one session per
segment a spinning pool steals the CPU from the next session (measured on MiniLM-L6: six
chained sessions took 31 ms per SST-2 sentence against 5 ms for one full graph). Sessions here
are built with ``session.intra_op.allow_spinning = 0``, which made the chain cost the same as
the full graph (5.4 vs 5.1 ms). No IO binding or preallocated outputs: the batch shrinks, so
shapes change from segment to segment, and the copies they would save are a few hundred KB.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np

from aclpipe.early_exit.core import NUMPY_OPS, EarlyExitResult, run_exits
from aclpipe.early_exit.policies import NO_EXIT, check_policy, check_threshold, window_size
from aclpipe.errors import UserError
from aclpipe.layout import EXPORT_JSON


def read_export(folder: Path) -> dict:
    """``export.json`` of an export folder, checked to hold the segments this runtime needs."""
    path = folder / EXPORT_JSON
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UserError(
            f"{path} is missing or damaged ({type(err).__name__}): run `aclpipe export-exits` again"
        ) from err
    return check_export(record, folder)


def check_export(record: dict, folder: Path) -> dict:
    """``record`` (an ``export.json`` already read), unless it holds no segments."""
    if not record.get("segments"):
        raise UserError(
            f"{folder} holds no ONNX segments (an export from an older aclpipe): run "
            "`aclpipe export-exits` again, or use --engine torch"
        )
    return record


# Fusions whose CPU kernels measured slower than the plain ops they replace (onnxruntime 1.32,
# MiniLM-L6 segments, 1 thread, 2026-12-02): SkipLayerNormalization took 70 us for a
# 25 x 384 input where Add + LayerNormalization took 15 us; with both fusions off a segment ran
# 1.12-1.15x faster at batch 1 (12-40 tokens) and the same at batch 32 (docs/benchmarks.md).
SLOW_FUSIONS = ("SkipLayerNormFusion", "BiasGeluFusion")


def open_session(path: Path, threads: int | None = None):
    """An ONNX Runtime CPU session as this runtime runs it (``session_options``, no
    ``SLOW_FUSIONS``); export checks its graphs through the same sessions."""
    import onnxruntime as ort

    return ort.InferenceSession(
        str(path),
        session_options(threads),
        providers=["CPUExecutionProvider"],
        disabled_optimizers=list(SLOW_FUSIONS),
    )


def session_options(threads: int | None = None):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # see docstring
    if threads:
        options.intra_op_num_threads = threads
    return options


PRECISIONS = ("fp32", "int8")


def check_precision(precision: str, record: dict | None, folder: Path) -> None:
    """A one-line ``UserError`` unless ``precision`` names segments the export in ``folder``
    (its ``export.json`` ``record``, None for a folder without one) holds."""
    if precision not in PRECISIONS:
        raise UserError(f"unknown precision {precision!r}: use fp32 or int8")
    if precision != "fp32" and not ((record or {}).get("int8") or {}).get("segments"):
        raise UserError(
            f"--precision {precision} needs an export folder with int8 segments (`aclpipe "
            f"export-exits --int8` writes models/<task>/<method>/export); {folder} has none: "
            "export with --int8 and give that folder, or use --precision fp32"
        )


def segment_files(record: dict, precision: str, folder: Path) -> list[str]:
    """The segments to chain: the exported ones (fp32), or their int8 copies
    (``export-exits --int8``, ``aclpipe.exits.quantize``)."""
    check_precision(precision, record, folder)
    if precision == "fp32":
        return [s["file"] for s in record["segments"]]
    return list(record["int8"]["segments"])


def check_files(folder: Path, files: list[str], precision: str, record: dict) -> None:
    """A one-line ``UserError`` for the first graph ``export.json`` lists that is not in
    ``folder`` (ONNX Runtime would say NO_SUCHFILE)."""
    missing = next((f for f in files if not (folder / f).is_file()), None)
    if missing is None:
        return
    if precision == "int8" and missing in record["int8"]["segments"]:
        raise UserError(
            f"the export in {folder} has no int8 segments ({missing} is missing, though "
            f"export.json lists it): make them with `aclpipe export-exits --task "
            f"{record.get('task', '<task>')} --method <method> --int8`, or use --precision fp32"
        )
    raise UserError(
        f"{folder / missing} is missing, though export.json lists it: run `aclpipe export-exits` "
        "again"
    )


class OnnxEarlyExit:
    """Batched early exit over the exported segments with a per-sample policy."""

    def __init__(
        self,
        folder: Path,
        policy: str,
        threshold: float | None,
        eps: float = 0.1,
        threads: int | None = None,
        precision: str = "fp32",
        record: dict | None = None,
    ) -> None:
        record = read_export(folder) if record is None else check_export(record, folder)
        self.exits: list[int] = list(record["exits"])
        self.num_labels = int(record["num_labels"])
        self.regression = bool(record.get("regression", self.num_labels == 1))
        self.eps = eps
        self._use(policy, threshold)
        files = [record["embeddings"]["file"], *segment_files(record, precision, folder)]
        check_files(folder, files, precision, record)
        try:
            sessions = [open_session(folder / f, threads) for f in files]
        except Exception as err:  # onnxruntime's errors carry C++ detail over many lines
            reason = (str(err).strip().splitlines() or [""])[0][:200]
            raise UserError(f"onnxruntime cannot load the graphs in {folder}: {reason}") from err
        self.embeddings, self.segments = sessions[0], sessions[1:]
        self.inputs = [i.name for i in self.embeddings.get_inputs()]  # what h_0 reads
        self.exit_layers = np.array(self.exits, dtype=np.int64)

    def _use(self, policy: str, threshold: float | None) -> None:
        if policy != NO_EXIT:
            check_threshold(policy, threshold, self.num_labels, len(self.exits))
            check_policy(policy, self.regression)
        self.policy, self.threshold = policy, threshold
        # how many exits' logits the policy reads: patience t looks at exits k-t..k
        self.window = window_size(policy, threshold)

    def set_threshold(self, threshold: float) -> None:
        """Serve on under another threshold of the same policy (``serve --recalibrate``
        swaps it between batches)."""
        self._use(self.policy, threshold)

    def with_setting(self, policy: str, threshold: float | None) -> OnnxEarlyExit:
        """The same sessions under another policy (evaluate's sweep times every setting on
        one load of the graphs)."""
        other = copy.copy(self)
        other._use(policy, threshold)
        return other

    def embed(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        """``h_0`` ``[S, B, T, H]`` of a padded batch (``tokens.pad``'s ``input_ids``,
        ``attention_mask`` and, when the graph reads it, ``token_type_ids``, ``[B, T]`` int64)."""
        (states,) = self.embeddings.run(None, {name: arrays[name] for name in self.inputs})
        return states

    def segment(
        self, k: int, states: np.ndarray, mask: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Segment ``k``: the layers up to exit ``k`` (0-based) and its head over ``states``
        ``[S, b, T, H]`` and ``mask`` ``[b, T]``; the new states ``[S, b, T, H]`` and the
        logits ``[b, C]``."""
        return self.segments[k].run(None, {"states": states, "attention_mask": mask})

    def start(self, arrays: dict[str, np.ndarray]) -> SegmentPass:
        """A padded batch (as ``embed`` reads it), embedded and ready for segment 0."""
        return SegmentPass(self, self.embed(arrays), arrays["attention_mask"])

    def __call__(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        token_type_ids: np.ndarray | None = None,
    ) -> EarlyExitResult:
        arrays = {"input_ids": input_ids, "attention_mask": attention_mask}  # [B, T] int64 each
        if token_type_ids is not None:
            arrays["token_type_ids"] = token_type_ids
        return run_exits(self.start(arrays), NUMPY_OPS, self.exit_layers, self.policy,
                         self.threshold, self.window, self.regression, self.eps)  # fmt: skip


class SegmentPass:
    """One batch through the chained segments (``core.ExitPass``); the iteration scheduler
    keeps one per cohort."""

    def __init__(self, runtime: OnnxEarlyExit, states: np.ndarray, mask: np.ndarray) -> None:
        self.runtime = runtime
        self.states, self.mask = states, mask  # [S, b, T, H], [b, T]

    def logits(self, k: int) -> np.ndarray:
        self.states, logits = self.runtime.segment(k, self.states, self.mask)
        return logits  # [b, C]

    def keep(self, stay: np.ndarray, mask: np.ndarray) -> None:
        self.mask = np.ascontiguousarray(mask)
        self.states = np.ascontiguousarray(self.states[:, stay, : mask.shape[1]])
