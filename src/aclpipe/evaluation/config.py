"""The evaluate stage's knobs (params.yaml's ``evaluate:`` section): batch size, the policy
sweep's grid and the timing of the speed-ups."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from aclpipe.checks import Check, all_of, non_negative, positive
from aclpipe.errors import UserError


def _two_ends(key: str, value: Any) -> None:
    if value < 2:
        raise UserError(f"{key} must be >= 2 (a grid has two ends), got {value!r}")


def _each_engine_once(key: str, value: Any) -> None:
    if not value or len(set(value)) < len(value):
        raise UserError(
            f"{key} is {value!r}: list torch, onnx or both, each once (evaluate.timing_examples: "
            "0 turns timing off)"
        )


@dataclass
class EvaluateConfig:
    batch_size: int = 64  # all-exit forward passes over the dev split
    sweep: bool = True  # multi-exit models: sweep every exit policy over a threshold grid
    grid_points: int = 11  # thresholds per policy for entropy and confidence (patience: 1..E-1)
    patience_eps: float = 0.1  # patience on regression (STS-B): outputs agree when |diff| < eps
    timing_examples: int = 128  # dev examples the speed-ups are measured on (0: no timing)
    timing_repeats: int = 3  # timed repeats after a warm-up; the median is reported
    # engines the speed-ups are timed on: torch (PyTorch eager) and onnx (ONNX Runtime on the
    # segments, exported for the sweep into a temporary folder; needs onnxruntime)
    engines: list[Literal["torch", "onnx"]] = field(default_factory=lambda: ["torch", "onnx"])

    # range checks, beside the defaults (aclpipe.checks; config.py calls them per key)
    RANGES: ClassVar[dict[str, Check]] = {
        "batch_size": positive,
        "grid_points": all_of(positive, _two_ends),
        "timing_repeats": positive,
        "patience_eps": positive,
        "timing_examples": non_negative,
        "engines": _each_engine_once,
    }
