"""The exit setting ``predict`` uses when the user names none, chosen at export time.

``export-exits`` reads the method's sweep (``reports/<task>/<method>/curves.json``, written by
``aclpipe evaluate``) and the ce reference (``reports/<task>/ce/metrics.json``). Of the
settings whose dev score is at least the reference's minus ``BUDGET_POINTS`` points (the
trade-off report's 1-point budget), it keeps the one with the highest layer speed-up (ties:
the higher score), by the one budget rule (``aclpipe.early_exit.budget``); the full model
itself is a candidate (``policy: none``), so when no early exit setting keeps the score within
the budget, the default is no early exit (also when not even the full model does). It goes
into export.json as ``default_setting``.

When the data has a validation split (``data.validation_fraction``), the selection reads the
validation sweep (``curves.json``'s ``validation``) against ce's validation score, and dev
is only reported (docs/methods.md: selection never touches dev); the chosen setting's dev score
and layer speed-up are stored beside. Without one, it reads dev, and says so (``split``).

When either file is missing, ``FALLBACK`` (``REGRESSION_FALLBACK`` for STS-B) is stored instead, with the reason; ``predict``
uses it as is. Torch-free: ``predict`` reads it.
"""

from __future__ import annotations

import json
from pathlib import Path

from aclpipe.early_exit.budget import BUDGET_POINTS, cheapest_within
from aclpipe.early_exit.policies import NO_EXIT

__all__ = ["BUDGET_POINTS", "FALLBACK", "POLICY_DEFAULTS", "choose_default", "fallback"]
FALLBACK = {"policy": "entropy", "threshold": 0.3}  # the documented default without a sweep
REGRESSION_FALLBACK = {"policy": "patience", "threshold": 2.0}  # STS-B: patience only
# the threshold ``predict --policy P`` takes when none is given and the export's default is
# for another policy
POLICY_DEFAULTS = {"entropy": 0.3, "confidence": 0.9, "patience": 2.0}


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def fallback(reason: str, regression: bool = False) -> dict:
    chosen = REGRESSION_FALLBACK if regression else FALLBACK
    return {**chosen, "source": "fallback", "reason": reason}


def choose_default(curves_path: Path, reference_path: Path, regression: bool = False) -> dict:
    """``{"policy", "threshold", "source", ...}`` for export.json (module docstring)."""
    curves, reference = _read(curves_path), _read(reference_path)
    if curves is None or not curves.get("points"):
        return fallback(f"no sweep in {curves_path} (run `aclpipe evaluate` first)", regression)
    if reference is None or "final_score" not in reference:
        return fallback(
            f"no ce reference in {reference_path} (train and evaluate ce first)", regression
        )
    split = curves.get("split", "dev")
    reference_score = reference["final_score"]
    chosen_on = curves
    validation = reference.get("splits", {}).get("validation")
    if curves.get("validation") and validation:
        split, reference_score, chosen_on = "validation", validation["final_score"], curves["validation"]
    full = chosen_on.get("full_model", {})
    candidates = [
        {"policy": NO_EXIT, "threshold": None, "score": full.get("score"), "layer_speedup": 1.0},
        *chosen_on["points"],
    ]
    scores = [p.get("score") for p in candidates]
    speed = [-p["layer_speedup"] for p in candidates]  # ordered as the cost: fastest first
    picked = cheapest_within(scores, speed, reference_score, BUDGET_POINTS)
    if picked is None:  # not even the full model: exit early nowhere
        return {
            "policy": NO_EXIT,
            "threshold": None,
            "source": "tradeoff",
            "reason": f"no setting, nor the full model, scores within {BUDGET_POINTS} point of "
            f"ce's {reference_score:.4f} on {split}",
        }
    best = candidates[picked]
    chosen = {
        "policy": best["policy"],
        "threshold": best["threshold"],
        "source": "tradeoff",
        "budget_points": BUDGET_POINTS,
        "reference_score": reference_score,
        "score": best["score"],
        "layer_speedup": best["layer_speedup"],
        "split": split,
    }
    if split == "validation":  # what the choice gives on dev, where it was not made
        on_dev = [
            p for p in curves["points"]
            if (p["policy"], p["threshold"]) == (best["policy"], best["threshold"])
        ]  # fmt: skip
        dev = on_dev[0] if on_dev else {**curves.get("full_model", {}), "layer_speedup": 1.0}
        chosen["dev_score"], chosen["dev_layer_speedup"] = dev.get("score"), dev["layer_speedup"]
    return chosen
