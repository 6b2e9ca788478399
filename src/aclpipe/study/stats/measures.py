"""What a campaign run is scored by, on dev, under bootstrap weights (docs/methods.md,
"How a claim is judged"); pure NumPy. ``paired`` resamples these.

**Scores under bootstrap weights.** Every GLUE classification metric (accuracy, F1 of class
1, Matthews correlation) is a function of the confusion matrix. A resample of ``N`` examples
drawn with replacement is a count vector ``w [N]`` (multinomial), and each cell of the
resample's confusion matrix is ``indicator(label = t, prediction = p) @ w``, so R resamples of
S prediction sets cost one ``[R, N] @ [N, S * C * C]`` product (``weighted_scores``). At
``w = 1`` the scores are exactly those of ``metrics.compute_metrics`` / ``task_score``.
Regression (STS-B) has correlations, not counts: it is refused with a one-line error.

**Measures**, per run (one seed), on the dev split:

- ``final``: the score of the last exit;
- ``shallow``: the mean score over the shallower half of the exits, ``exits[: E // 2]``
  (at least one);
- ``average``: the mean score over all exits;
- ``auc`` (multi-exit runs with a validation split only): the area under the dev score
  against expected-time curve, chosen without looking at dev. The settings are ``full`` (every
  sample at the last exit) and every (policy, threshold) of ``policies.default_grid`` with
  the run's ``evaluate.grid_points`` (``evaluate.patience_eps`` for patience on regression).
  Of these, the settings on the VALIDATION Pareto frontier are kept: those that no other
  setting matches or beats on both validation score and validation expected time while
  beating it on one (of exact duplicates, the first in grid order stays). Each kept setting is
  scored on dev: its dev score and dev expected time ratio (mean exit layer / num_layers).
  The curve goes through those dev points sorted by cost (ties: by score), extended flat to
  the cheapest possible cost ``exits[0] / num_layers`` and to the dearest ``exits[-1] /
  num_layers`` where it does not reach them; its trapezoid area divided by that cost range
  reads as a mean score over the cost range. Under a resample both the dev scores and the dev
  costs are recomputed (the settings, picked on validation, stay fixed).

**Budgets** (``budget_pick``): per seed, the reference is a full model's final exit: ``ce``'s
of the same seed in the campaign (the baseline a faster model must stay near, as the
trade-off report's), else the run's own. A budget of b points admits the settings whose
VALIDATION score is at least the reference's validation score minus b/100; among them the
lowest validation expected time wins (ties: the higher validation score, then grid order):
the one budget rule, ``aclpipe.early_exit.budget``.
Where none is admitted (the run's own full model is already below the floor), the pick is
the run's full model, flagged ``admitted: False``: no early exit, speed-up 1. That setting's
DEV score and dev layer speed-up are reported, and whether its dev score met the
reference's dev final-exit score minus b/100.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from aclpipe.data.tasks import Task
from aclpipe.early_exit.budget import admits, cheapest_within
from aclpipe.early_exit.policies import NO_EXIT, POLICIES, default_grid, exit_indices
from aclpipe.errors import UserError

MEASURES = ("final", "shallow", "average", "auc")
ROUNDING = 1e-12  # float rounding: a difference this small is no difference
FULL = "full"  # the setting that runs every sample to the last exit


# --- scores under weights --------------------------------------------------------------------


def weighted_scores(
    task: Task, predictions: np.ndarray, labels: np.ndarray, weights: np.ndarray
) -> np.ndarray:
    """The task score of each prediction set under each example weighting.

    Args:
        task: a classification task (its ``metrics``: accuracy, f1 and/or mcc).
        predictions: ``[S, N]`` (or ``[N]``) class indices.
        labels: ``[N]`` gold class indices.
        weights: ``[R, N]`` (or ``[N]``) example counts; ones give the plain scores.

    Returns:
        ``[R, S]`` scores (the mean of the task's metrics), float64.
    """
    if task.is_regression:
        raise UserError(
            f"{task.name} is a regression task: the paired bootstrap covers classification "
            "tasks only (its correlations are not confusion-matrix counts)"
        )
    predictions = np.atleast_2d(np.asarray(predictions, dtype=np.int64))  # [S, N]
    weights = np.atleast_2d(np.asarray(weights, dtype=np.float64))  # [R, N]
    labels = np.asarray(labels, dtype=np.int64)  # [N]
    k = task.num_labels
    num_sets, n = predictions.shape
    cells = labels[None, :] * k + predictions  # [S, N]: the confusion cell (true, predicted)
    onehot = (cells[:, :, None] == np.arange(k * k)).astype(np.float64)  # [S, N, K*K]
    flat = onehot.transpose(1, 0, 2).reshape(n, num_sets * k * k)  # [N, S*K*K]
    cm = (weights @ flat).reshape(len(weights), num_sets, k, k)  # [R, S, K(true), K(pred)]
    total = cm.sum(axis=(-2, -1))  # [R, S]
    correct = np.trace(cm, axis1=-2, axis2=-1)  # [R, S]
    scores = []
    for name in task.metrics:
        if name == "accuracy":
            scores.append(correct / total)
        elif name == "f1":  # of class 1; 0 when undefined (no predicted and no true positives)
            tp = cm[..., 1, 1]
            denominator = cm[..., :, 1].sum(-1) + cm[..., 1, :].sum(-1)  # 2tp + fp + fn
            scores.append(np.where(denominator > 0, 2 * tp / np.maximum(denominator, 1e-300), 0.0))
        elif name == "mcc":  # Gorodkin's multiclass form, as metrics._mcc; 0 when undefined
            true_counts, pred_counts = cm.sum(-1), cm.sum(-2)  # [R, S, K]
            covariance = correct * total - (true_counts * pred_counts).sum(-1)
            denominator = np.sqrt(
                (total**2 - (true_counts**2).sum(-1)) * (total**2 - (pred_counts**2).sum(-1))
            )
            safe = np.maximum(denominator, 1e-300)
            scores.append(np.where(denominator > 0, covariance / safe, 0.0))
        else:
            raise UserError(f"metric {name!r} of {task.name} has no weighted form here")
    return np.mean(scores, axis=0)  # [R, S]


# --- exit settings: validation frontier, dev points, budgets ---------------------------------


def settings_grid(num_labels: int, num_exits: int, grid_points: int) -> list[tuple[str, float]]:
    """``full`` first, then every policy over its default threshold grid."""
    grid = [(FULL, float("nan"))]
    for policy in POLICIES:
        grid += [(policy, t) for t in default_grid(policy, num_labels, num_exits, grid_points)]
    return grid


def setting_exits(logits: np.ndarray, setting: tuple[str, float], eps: float) -> np.ndarray:
    """Exit index (0-based) of every sample under one setting, from ``[E, N, C]`` logits."""
    policy, threshold = setting
    return exit_indices(NO_EXIT if policy == FULL else policy, threshold, logits, False, eps)


def pareto_frontier(costs: Sequence[float], scores: Sequence[float]) -> list[int]:
    """Indices of the points that no other point matches or beats on both cost (lower) and
    score (higher) while beating on one; of exact duplicates the first stays. Grid order."""
    kept = []
    for i, (ci, si) in enumerate(zip(costs, scores)):
        dominated = any(
            (cj <= ci and sj >= si and (cj < ci or sj > si)) or (cj == ci and sj == si and j < i)
            for j, (cj, sj) in enumerate(zip(costs, scores))
            if j != i
        )
        if not dominated:
            kept.append(i)
    return kept


def curve_area(costs: np.ndarray, scores: np.ndarray, low: float, high: float) -> np.ndarray:
    """Trapezoid area under score against cost, per row, divided by ``high - low``.

    ``costs``, ``scores``: ``[R, S]`` (or ``[S]``). Points are sorted by cost (ties: score);
    the curve is extended flat to ``low`` and ``high`` from its end points. Returns ``[R]``.
    """
    costs, scores = np.atleast_2d(costs), np.atleast_2d(scores)
    order = np.lexsort((scores, costs), axis=-1)  # [R, S]: by cost, then score
    c = np.take_along_axis(costs, order, axis=-1)
    s = np.take_along_axis(scores, order, axis=-1)
    rows = len(c)
    c = np.concatenate([np.full((rows, 1), low), c, np.full((rows, 1), high)], axis=-1)
    s = np.concatenate([s[:, :1], s, s[:, -1:]], axis=-1)
    area = ((c[:, 1:] - c[:, :-1]) * (s[:, 1:] + s[:, :-1]) / 2).sum(-1)
    return area / (high - low)


@dataclasses.dataclass
class RunOutputs:
    """One run's per-example outputs (a campaign run's ``predictions.npz``) and its grid."""

    task: Task
    exits: np.ndarray  # [E] 1-based layers with an exit
    num_layers: int
    dev_logits: np.ndarray  # [E, N, C]
    dev_labels: np.ndarray  # [N]
    validation_logits: np.ndarray | None  # [E, M, C], None without a validation split
    validation_labels: np.ndarray | None  # [M]
    grid_points: int = 11
    eps: float = 0.1
    _validation: dict | None = dataclasses.field(default=None, repr=False)
    _dev_exits: dict = dataclasses.field(default_factory=dict, repr=False)

    @property
    def multi_exit(self) -> bool:
        return len(self.exits) > 1

    def exit_predictions(self) -> np.ndarray:
        """``[E, N]`` dev class predictions at every exit."""
        return self.dev_logits.argmax(axis=-1)

    def validation_sweep(self) -> dict:
        """Every setting's validation score and expected time ratio (computed once)."""
        if self.validation_logits is None:
            raise UserError(
                "no validation split in this run: rerun it with data.validation_fraction"
            )
        if self._validation is None:
            grid = settings_grid(self.dev_logits.shape[-1], len(self.exits), self.grid_points)
            logits = self.validation_logits
            chosen = np.stack([setting_exits(logits, s, self.eps) for s in grid])  # [S, M]
            picked = np.take_along_axis(logits.argmax(-1), chosen, axis=0)  # [S, M]
            ones = np.ones((1, logits.shape[1]))
            self._validation = {
                "settings": grid,
                "scores": weighted_scores(self.task, picked, self.validation_labels, ones)[0],
                "costs": self.exits[chosen].mean(axis=1) / self.num_layers,  # [S]
            }
        return self._validation

    def dev_setting(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Dev predictions ``[N]`` and exit layers ``[N]`` of one setting of the grid."""
        if index not in self._dev_exits:
            setting = self.validation_sweep()["settings"][index]
            chosen = setting_exits(self.dev_logits, setting, self.eps)  # [N]
            predictions = self.dev_logits[chosen, np.arange(self.dev_logits.shape[1])].argmax(-1)
            self._dev_exits[index] = (predictions, self.exits[chosen])
        return self._dev_exits[index]

    def frontier(self) -> list[int]:
        sweep = self.validation_sweep()
        return pareto_frontier(sweep["costs"].tolist(), sweep["scores"].tolist())


def final_scores(outputs: RunOutputs) -> tuple[float, float]:
    """The last exit's (validation, dev) scores of a run with a validation split."""
    if outputs.validation_logits is None:
        raise UserError("no validation split in this run: rerun it with data.validation_fraction")
    scores = []
    for logits, labels in (
        (outputs.validation_logits, outputs.validation_labels),
        (outputs.dev_logits, outputs.dev_labels),
    ):
        last = logits[-1].argmax(-1)
        scores.append(float(weighted_scores(outputs.task, last, labels, np.ones(len(last)))[0, 0]))
    return scores[0], scores[1]


def budget_pick(
    outputs: RunOutputs, budget: float, reference: tuple[float, float] | None = None
) -> dict:
    """The setting a budget of ``budget`` points admits (see the module docstring), with its
    validation and dev figures. ``reference``: the (validation, dev) final-exit scores the
    budget is counted from (``final_scores`` of ce's run of the same seed); None: the run's
    own."""
    sweep = outputs.validation_sweep()
    own = reference is None
    validation_reference, dev_reference = final_scores(outputs) if own else reference
    floor = validation_reference - budget / 100
    picked = cheapest_within(sweep["scores"], sweep["costs"], validation_reference, budget)
    best = 0 if picked is None else picked  # none admitted: the full model (setting 0)
    predictions, layers = outputs.dev_setting(best)
    ones = np.ones(len(predictions))
    dev_score = float(weighted_scores(outputs.task, predictions, outputs.dev_labels, ones)[0, 0])
    dev_cost = float(layers.mean() / outputs.num_layers)
    dev_floor = dev_reference - budget / 100
    policy, threshold = sweep["settings"][best]
    return {
        "reference": "own" if own else "given",
        "admitted": picked is not None,
        "policy": policy,
        "threshold": None if policy == FULL else threshold,
        "validation_reference": validation_reference,
        "validation_floor": floor,
        "validation_score": float(sweep["scores"][best]),
        "validation_time_ratio": float(sweep["costs"][best]),
        "dev_score": dev_score,
        "dev_time_ratio": dev_cost,
        "dev_speedup": 1.0 / dev_cost,
        "dev_reference": dev_reference,
        "dev_floor": dev_floor,
        "met": admits(dev_score, dev_reference, budget),
    }


# --- measures -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Measure:
    """What one measure of one run needs under resampling: prediction sets over dev and how
    their scores combine. ``layers`` (AUC only) holds each set's exit layers, for its cost."""

    name: str
    predictions: np.ndarray  # [S, N]
    layers: np.ndarray | None = None  # [S, N] exit layer of each example (auc)
    num_layers: int = 1
    cost_range: tuple[float, float] = (0.0, 1.0)  # auc: exits[0] / L .. exits[-1] / L

    def values(self, task: Task, labels: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """``[R]``: the measure under each weighting ``[R, N]``."""
        scores = weighted_scores(task, self.predictions, labels, weights)  # [R, S]
        if self.name != "auc":
            return scores.mean(axis=1)
        weights = np.atleast_2d(weights)
        costs = weights @ self.layers.T.astype(np.float64)  # [R, S]
        costs /= weights.sum(axis=1, keepdims=True) * self.num_layers
        return curve_area(costs, scores, *self.cost_range)


def measure(outputs: RunOutputs, name: str) -> Measure | None:
    """A run's measure (``MEASURES``); None where it has none: AUC of a single-exit run or of
    a run without a validation split."""
    per_exit = outputs.exit_predictions()  # [E, N]
    if name == "final":
        return Measure(name, per_exit[-1:])
    if name == "shallow":
        return Measure(name, per_exit[: max(1, len(per_exit) // 2)])
    if name == "average":
        return Measure(name, per_exit)
    if name != "auc":
        raise ValueError(f"unknown measure {name!r}: use one of {', '.join(MEASURES)}")
    if not outputs.multi_exit or outputs.validation_logits is None:
        return None
    points = [outputs.dev_setting(i) for i in outputs.frontier()]
    exits = outputs.exits
    return Measure(
        name,
        np.stack([p for p, _ in points]),
        np.stack([layers for _, layers in points]),
        outputs.num_layers,
        (float(exits[0]) / outputs.num_layers, float(exits[-1]) / outputs.num_layers),
    )
