"""Policy sweeps: quality from all-exit logits, speed from the early-exit runtimes.

For each policy and threshold, the score, mean exit layer, expected time ratio and layer
speed-up come from the policy applied to the dev split's all-exit logits (no forward pass).
The measured speed-ups are wall-clock ratios on the same inputs (a fixed subset of the dev
split), at batch size 1 and batched, each time the median of several repeats after a
warm-up, every engine timed in this process, interleaved. Per engine (``ENGINES``):

- ``measured_speedup_batch{b}``: PyTorch's full model over the PyTorch early-exit runtime
  (``early_exit.runtime``);
- ``onnx_speedup_batch{b}``: the ONNX Runtime full model (the exported chain run to the last
  exit, what ``predict --engine onnx --policy none`` runs) over the ONNX Runtime early-exit
  runtime (``early_exit.onnx_runtime``): that engine's own early-exit speed-up;
- ``onnx_vs_torch_full_batch{b}``: PyTorch's full model over the ONNX Runtime early-exit
  runtime: what a user deploying the ONNX engine gets against the plain PyTorch model.

The ONNX engine runs segments the sweep exports into a temporary folder
(``export.write_timing_segments``, checked against PyTorch as ``export-exits`` checks them):
``export-exits`` runs after evaluate, since it reads this sweep. Beside them, each point keeps
the layer speed-up of the timed examples alone (``timed_layer_speedup``): the most that
skipping layers can buy on exactly those inputs, against which the two early-exit-over-full
ratios are judged (``aclpipe.evaluation.caveats``); the ONNX-over-PyTorch ratio has no such
bound.
"""

from __future__ import annotations

import functools
import importlib.util
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from aclpipe.data.tasks import Task
from aclpipe.early_exit.policies import NO_EXIT, POLICIES, default_grid, exit_indices
from aclpipe.early_exit.runtime import EarlyExitRuntime, full_forward
from aclpipe.errors import UserError
from aclpipe.evaluation.metrics import task_score
from aclpipe.evaluation.scoring import setting_outcome
from aclpipe.exits.export import write_timing_segments
from aclpipe.modeling.batching import collate
from aclpipe.modeling.model import MultiExitModel

# evaluate.engines: PyTorch eager, and ONNX Runtime on the exported segments
ENGINES = ("torch", "onnx")
ONNX_PACKAGES = ("onnxruntime", "onnx", "onnxscript")  # run the graphs; export them (dynamo)


def check_engines(engines: Sequence[str]) -> None:
    """A one-line ``UserError`` when the onnx engine is asked for and cannot be run here.

    No fallback to PyTorch alone: curves.json would then silently lack what params.yaml
    asked for."""
    unknown = [e for e in engines if e not in ENGINES]
    if unknown or not engines:
        raise UserError(
            f"evaluate.engines is {list(engines)}: list one or both of {', '.join(ENGINES)}"
        )
    if "onnx" not in engines:
        return
    missing = [name for name in ONNX_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(
            f"evaluate.engines lists onnx, but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed: `pip install "
            f"{' '.join(missing)}`, or time PyTorch alone (evaluate.engines: [torch])"
        )


def policy_point(
    task: Task,
    logits: np.ndarray,
    labels: np.ndarray,
    exits: list[int],
    num_layers: int,
    policy: str,
    threshold: float,
    eps: float,
) -> dict:
    """Quality and expected cost of one setting, from all-exit logits ``[E, N, C]``."""
    metrics, layers = setting_outcome(task, logits, labels, exits, policy, threshold, eps)
    ratio = float(layers.sum() / (len(layers) * num_layers))
    return {
        "policy": policy,
        "threshold": threshold,
        "score": task_score(task, metrics),
        "metrics": metrics,
        "mean_exit_layer": float(layers.mean()),
        "expected_time_ratio": ratio,
        "layer_speedup": 1.0 / ratio,
    }


def settings_grid(task: Task, num_exits: int, grid_points: int) -> list[tuple[str, float]]:
    """Every (policy, threshold) a sweep visits: each policy over its default grid."""
    policies = ["patience"] if task.is_regression else list(POLICIES)
    return [
        (p, t) for p in policies for t in default_grid(p, task.num_labels, num_exits, grid_points)
    ]


def quality_sweep(
    task: Task,
    logits: np.ndarray,
    labels: np.ndarray,
    exits: list[int],
    num_layers: int,
    grid_points: int,
    eps: float,
) -> dict:
    """Scores and expected costs of every setting on one split's all-exit logits (no
    timing): ``{"full_model": {"score"}, "points": [...]}``."""
    points = [
        policy_point(task, logits, labels, exits, num_layers, p, t, eps)
        for p, t in settings_grid(task, len(exits), grid_points)
    ]
    full_model, _ = setting_outcome(task, logits, labels, exits, NO_EXIT, None, eps)
    return {
        "full_model": {"score": task_score(task, full_model)},
        "points": points,
    }


def _batches(rows: list[dict], size: int, pad_id: int, regression: bool) -> list[dict]:
    out = []
    for start in range(0, len(rows), size):
        batch = collate(rows[start : start + size], pad_id, regression)
        batch.pop("labels")
        out.append(batch)
    return out


def _run_all(call, batches: list[dict]) -> None:
    for batch in batches:
        call(**batch)


def time_settings(
    model: MultiExitModel,
    rows: list[dict],
    settings: list[tuple[str, float]],
    pad_id: int,
    regression: bool,
    eps: float,
    repeats: int,
    batch_sizes: tuple[int, ...] = (1, 32),
    engines: Sequence[str] = ("torch",),
    onnx_folder: Path | None = None,
) -> dict:
    """Seconds of each engine's full model and of each setting's runtime, per batch size
    (medians): ``{size: {engine: {"full": seconds, "settings": [seconds per setting]}}}``.

    Each repeat times every engine's full model, then each setting on every engine in turn,
    back to back, so machine noise falls on all of them alike; one untimed warm-up pass
    precedes the repeats. ``onnx_folder``: the graphs ``write_timing_segments`` wrote, for
    the onnx engine; its sessions take as many intra-op threads as PyTorch uses here, and do
    not spin (``onnx_runtime.session_options``).
    """
    model.eval()
    runs: dict[str, list] = {}  # engine -> [full model, setting 0, setting 1, ...]
    if "torch" in engines:
        runs["torch"] = [functools.partial(full_forward, model)] + [
            EarlyExitRuntime(model, p, t, regression, eps) for p, t in settings
        ]
    if "onnx" in engines:
        from aclpipe.early_exit.onnx_runtime import OnnxEarlyExit

        full = OnnxEarlyExit(onnx_folder, NO_EXIT, None, eps, threads=torch.get_num_threads())
        runs["onnx"] = [full] + [full.with_setting(p, t) for p, t in settings]
    order = [(engine, slot) for slot in range(len(settings) + 1) for engine in runs]
    result = {}
    with torch.inference_mode():
        for size in batch_sizes:
            tensors = _batches(rows, size, pad_id, regression)  # [b, T] each
            inputs = {"torch": tensors, "onnx": [_arrays(b) for b in tensors]}
            for engine, slot in order:  # warm-up
                _run_all(runs[engine][slot], inputs[engine])
            samples: dict[tuple[str, int], list[float]] = {key: [] for key in order}
            for _ in range(repeats):
                for engine, slot in order:
                    started = time.perf_counter()
                    _run_all(runs[engine][slot], inputs[engine])
                    samples[engine, slot].append(time.perf_counter() - started)
            medians = {key: statistics.median(s) for key, s in samples.items()}
            result[size] = {
                engine: {
                    "full": medians[engine, 0],
                    "settings": [medians[engine, i + 1] for i in range(len(settings))],
                }
                for engine in runs
            }
    return result


def _arrays(batch: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {name: tensor.numpy() for name, tensor in batch.items()}  # int64 [b, T]


def time_engines(
    model: MultiExitModel,
    rows: list[dict],
    settings: list[tuple[str, float]],
    pad_id: int,
    regression: bool,
    eps: float,
    repeats: int,
    engines: Sequence[str],
) -> dict:
    """``time_settings`` on ``engines``; for onnx, on segments exported into a temporary
    folder first (removed after)."""
    check_engines(engines)
    if "onnx" not in engines:
        return time_settings(model, rows, settings, pad_id, regression, eps, repeats,
                             engines=engines)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="aclpipe-timing-onnx-") as tmp:
        try:
            write_timing_segments(model, rows, pad_id, regression, Path(tmp))
        except UserError as err:
            raise UserError(
                f"timing the onnx engine: {err}; or time PyTorch alone (evaluate.engines: [torch])"
            ) from err
        return time_settings(model, rows, settings, pad_id, regression, eps, repeats,
                             engines=engines, onnx_folder=Path(tmp))  # fmt: skip


def speedups(seconds: dict[str, dict], i: int | None, size: int) -> dict[str, float]:
    """Setting ``i``'s measured speed-ups at batch ``size`` (the module docstring's keys), for
    the engines timed; ``i = None``: the full model's ONNX-over-PyTorch ratio alone."""
    torch_, onnx = seconds.get("torch"), seconds.get("onnx")
    out = {}
    if torch_ and i is not None:
        out[f"measured_speedup_batch{size}"] = torch_["full"] / torch_["settings"][i]
    if onnx and i is not None:
        out[f"onnx_speedup_batch{size}"] = onnx["full"] / onnx["settings"][i]
    if torch_ and onnx:
        deployed = onnx["full"] if i is None else onnx["settings"][i]
        out[f"onnx_vs_torch_full_batch{size}"] = torch_["full"] / deployed
    return out


def full_model_timing(timing: dict) -> dict[str, float]:
    """The full model's seconds per engine and batch size (``seconds_batch{b}``: PyTorch's, the
    key curves.json had before the onnx engine; ``onnx_seconds_batch{b}``), and ONNX Runtime's
    full model over PyTorch's (``onnx_vs_torch_full_batch{b}``)."""
    out = {}
    for size, seconds in timing.items():
        if "torch" in seconds:
            out[f"seconds_batch{size}"] = seconds["torch"]["full"]
        if "onnx" in seconds:
            out[f"onnx_seconds_batch{size}"] = seconds["onnx"]["full"]
        out.update(speedups(seconds, None, size))
    return out


def sweep(
    task: Task,
    model: MultiExitModel,
    logits: np.ndarray,
    labels: np.ndarray,
    timing_rows: list[dict],
    pad_id: int,
    grid_points: int,
    repeats: int,
    eps: float,
    timing_index: list[int] | None = None,
    engines: Sequence[str] = ENGINES,
) -> dict:
    """Every policy over its threshold grid: quality, expected and measured speed-ups.

    ``timing_index``: the positions of ``timing_rows`` in the split (``logits``' second
    axis); when given, each timed point also gets ``timed_layer_speedup``. ``engines``: the
    engines timed (``ENGINES``; evaluate.engines); no timing without ``timing_rows``.
    """
    exits, num_layers = model.spec.exits, model.num_layers
    settings = settings_grid(task, len(exits), grid_points)
    quality = quality_sweep(task, logits, labels, exits, num_layers, grid_points, eps)
    points, full_score = quality["points"], quality["full_model"]["score"]
    timing = (
        time_engines(
            model, timing_rows, settings, pad_id, task.is_regression, eps, repeats, engines
        )
        if timing_rows
        else {}
    )
    for i, point in enumerate(points):
        for size, seconds in timing.items():
            point.update(speedups(seconds, i, size))
        if timing and timing_index is not None:
            policy, threshold = settings[i]
            timed_logits = logits[:, timing_index]  # [E, n, C]: per-sample choices, as for all
            chosen = exit_indices(policy, threshold, timed_logits, task.is_regression, eps)
            layers = np.asarray(exits)[chosen]  # [n]
            point["timed_layer_speedup"] = float(len(layers) * num_layers / layers.sum())
    return {
        "exits": exits,
        "num_layers": num_layers,
        "timing_examples": len(timing_rows),
        "timing_repeats": repeats,
        "timing_batch_sizes": list(timing),
        "timing_engines": [e for e in ENGINES if e in engines] if timing else [],
        "full_model": {
            "score": full_score,
            "expected_time_ratio": exits[-1] / num_layers,
            **full_model_timing(timing),
        },
        "points": points,
    }
