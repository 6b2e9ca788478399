"""Int8 segments (``export-exits --int8``): an approximate, faster copy of the exported chain.

ONNX Runtime's dynamic quantization rewrites each segment's weight products (every
``MatMul``/``Gemm`` with a constant weight: a layer's six linear maps, the head's classifier,
and a head's own linear maps: cls pooling's dense layer, layer-attention's scorer) as
``MatMulInteger``: weights stored as int8, one scale per output channel; activations
quantized to uint8 per batch at run time. The attention products (two activations), the
layer norms, softmax and the embeddings stay float32. ``segment_<k>.int8.onnx`` sits beside
``segment_<k>.onnx``; ``predict --precision int8`` chains them.

This is not the exported model: its logits move and some labels and exits change. So the
export measures it, on the dev split, against the PyTorch model it came from: every exit's
score with both, how often the labels agree, the largest logit gap, and the default exit
setting's score and mean exit layer with both (``export.json``, key ``int8``). Nothing is
checked against a tolerance; the figures are there to decide with. The measurement holds for
the machine that made it: ONNX Runtime's int8 kernels differ between CPUs (with AVX-512 VNNI
or AMX, as here, and without).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from aclpipe.data.tasks import Task
from aclpipe.early_exit.tokens import pad
from aclpipe.errors import UserError
from aclpipe.evaluation.metrics import task_score
from aclpipe.evaluation.scoring import by_length, exit_scores, setting_outcome
from aclpipe.layout import INT8_SUFFIX

SUFFIX = INT8_SUFFIX
METHOD = (
    "onnxruntime.quantization.quantize_dynamic: MatMul/Gemm weights int8 per output channel, "
    "activations uint8 per batch; attention products, norms, softmax and embeddings float32"
)


def int8_name(file: str) -> str:
    """``segment_3.onnx`` -> ``segment_3.int8.onnx``."""
    return file.removesuffix(".onnx") + SUFFIX


def quantize_segments(folder: Path, files: list[str]) -> list[str]:
    """Write ``int8_name(f)`` beside every segment ``f`` in ``folder``; returns their names."""
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    written = []
    logger = logging.getLogger()
    level = logger.level
    logger.setLevel(logging.ERROR)  # its advice to pre-process the graph first, every call
    try:
        for file in files:
            written.append(int8_name(file))
            quantize_dynamic(
                folder / file,
                folder / written[-1],
                weight_type=QuantType.QInt8,
                per_channel=True,
                op_types_to_quantize=["MatMul", "Gemm"],
            )
    except Exception as err:  # onnxruntime's quantizer raises anything, over many lines
        reason = (str(err).strip().splitlines() or [""])[0][:300]
        raise UserError(
            f"int8 quantization of {written[-1].removesuffix(SUFFIX)}.onnx failed "
            f"({type(err).__name__}: {reason}): export without --int8"
        ) from err
    finally:
        logger.setLevel(level)
    return written


def chain_logits(runtime, rows: list[dict], pad_id: int, batch_size: int) -> np.ndarray:
    """Every exit's logits ``[E, N, C]`` (rows in their given order) through the sessions of
    an ``OnnxEarlyExit``: the embeddings, then every segment for every row, over the batches
    ``all_exit_logits`` scores the PyTorch model with."""

    def forward(group: list[dict]) -> np.ndarray:
        group = [{"token_type_ids": [0] * len(r["input_ids"]), **r} for r in group]
        arrays = pad(group, pad_id)
        states = runtime.embed(arrays)
        per_exit = []
        for k in range(len(runtime.segments)):
            states, logits = runtime.segment(k, states, arrays["attention_mask"])
            per_exit.append(logits)
        return np.stack(per_exit)  # [E, b, C]

    return by_length(rows, batch_size, forward)


def compare(
    task: Task,
    reference: np.ndarray,
    int8: np.ndarray,
    labels: np.ndarray,
    exits: list[int],
    setting: dict,
    eps: float = 0.1,
) -> dict:
    """The int8 chain's logits ``[E, N, C]`` against the model's: per exit and at ``setting``."""
    record: dict = {
        "exits": list(exits),
        "score": [s["score"] for s in exit_scores(task, reference, labels)],
        "score_int8": [s["score"] for s in exit_scores(task, int8, labels)],
        "max_abs_diff_logits": [float(np.abs(a - b).max()) for a, b in zip(int8, reference)],
    }
    if not task.is_regression:
        same = int8.argmax(axis=-1) == reference.argmax(axis=-1)  # [E, N]
        record["label_agreement"] = [float(s) for s in same.mean(axis=1)]
    policy, threshold = setting["policy"], setting["threshold"]
    (score, layer), (score_int8, layer_int8) = (
        _at_setting(task, logits, labels, exits, policy, threshold, eps)
        for logits in (reference, int8)
    )
    record["default_setting"] = {
        "policy": policy,
        "threshold": threshold,
        "score": score,
        "score_int8": score_int8,
        "mean_exit_layer": layer,
        "mean_exit_layer_int8": layer_int8,
    }
    return record


def _at_setting(task: Task, logits: np.ndarray, labels: np.ndarray, exits: list[int],
                policy: str, threshold: float | None, eps: float) -> tuple[float, float]:  # fmt: skip
    """Score and mean exit layer at ``policy``/``threshold`` (``none``: the last exit)."""
    metrics, layers = setting_outcome(task, logits, labels, exits, policy, threshold, eps)
    return task_score(task, metrics), float(layers.mean())
