"""Paired statistics against plain, slow references: explicit index resampling in loops,
metrics.compute_metrics on the resampled arrays, and hand-checkable cases."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from aclpipe.data.tasks import TASKS
from aclpipe.errors import UserError
from aclpipe.evaluation.metrics import compute_metrics, task_score
from aclpipe.study.stats.measures import (
    FULL,
    Measure,
    RunOutputs,
    budget_pick,
    curve_area,
    final_scores,
    measure,
    pareto_frontier,
    setting_exits,
    settings_grid,
    weighted_scores,
)
from aclpipe.study.stats.paired import (
    check_same_examples,
    draw,
    exit_bands,
    holm,
    paired_bootstrap,
    resampled_differences,
    seed_mean_interval,
    two_sided_p,
)

R = 200  # resamples in tests: enough to exercise the code, fast


def plain_score(task, predictions, labels) -> float:
    return task_score(task, compute_metrics(task, predictions, labels))


def random_outputs(task, seed: int, n: int = 40, m: int = 50, exits: int = 6) -> RunOutputs:
    """A run with random all-exit logits whose later exits agree more with the labels."""
    rng = np.random.default_rng(seed)
    c = task.num_labels

    def split(size):
        labels = rng.integers(0, c, size)
        logits = rng.normal(size=(exits, size, c))
        for e in range(exits):
            logits[e, np.arange(size), labels] += 0.5 * e  # deeper exits are better
        return logits.astype(np.float32), labels

    dev_logits, dev_labels = split(n)
    val_logits, val_labels = split(m)
    return RunOutputs(
        task, np.arange(1, exits + 1), exits, dev_logits, dev_labels, val_logits, val_labels,
        grid_points=5,
    )  # fmt: skip


# --- scores under weights --------------------------------------------------------------------


@pytest.mark.parametrize("name", ["rte", "mrpc", "cola", "mnli"])
def test_weighted_scores_equal_the_metrics_at_unit_weights(name: str) -> None:
    task = TASKS[name]
    rng = np.random.default_rng(0)
    c = task.num_labels
    cases = [(rng.integers(0, c, 30), rng.integers(0, c, 30)) for _ in range(20)]
    labels = rng.integers(0, c, 30)
    cases += [
        (np.zeros(30, dtype=int), labels),  # constant predictions
        (np.ones(30, dtype=int), labels),
        (labels, np.zeros(30, dtype=int)),  # no positives among the labels
        (np.zeros(30, dtype=int), np.zeros(30, dtype=int)),  # neither: F1 and MCC undefined
        (labels, labels),  # perfect
        (1 - np.clip(labels, 0, 1), np.clip(labels, 0, 1)),  # always wrong (binary view)
    ]
    for predictions, gold in cases:
        got = weighted_scores(task, predictions, gold, np.ones(30))
        assert got.shape == (1, 1)
        assert got[0, 0] == pytest.approx(plain_score(task, predictions, gold), abs=1e-12)


@pytest.mark.parametrize("name", ["mrpc", "cola", "mnli"])
def test_weighted_scores_equal_the_metrics_of_explicit_resamples(name: str) -> None:
    task = TASKS[name]
    rng = np.random.default_rng(1)
    c = task.num_labels
    predictions, labels = rng.integers(0, c, (3, 25)), rng.integers(0, c, 25)  # [S, N], [N]
    draws = [rng.integers(0, 25, 25) for _ in range(15)]
    weights = np.stack([np.bincount(idx, minlength=25) for idx in draws])  # [R, N]
    got = weighted_scores(task, predictions, labels, weights)  # [R, S]
    for r, idx in enumerate(draws):
        for s in range(3):
            expected = plain_score(task, predictions[s][idx], labels[idx])
            assert got[r, s] == pytest.approx(expected, abs=1e-12)


def test_regression_is_refused_in_one_line() -> None:
    with pytest.raises(UserError, match="stsb is a regression task"):
        weighted_scores(TASKS["stsb"], np.zeros(3), np.zeros(3), np.ones(3))


# --- curves, frontier, budgets ----------------------------------------------------------------


def test_curve_area_by_hand() -> None:
    # Points (0.5, 0.8) and (1.0, 0.9), range 1/6..1: flat 0.8 from 1/6 to 0.5, then a trapezoid.
    area = curve_area(np.array([1.0, 0.5]), np.array([0.9, 0.8]), 1 / 6, 1.0)
    assert area[0] == pytest.approx((0.8 * (0.5 - 1 / 6) + 0.85 * 0.5) / (5 / 6))
    flat = curve_area(np.array([0.5]), np.array([0.7]), 1 / 6, 1.0)  # extended both ways
    assert flat[0] == pytest.approx(0.7)


def test_pareto_frontier_over_random_grids() -> None:
    rng = np.random.default_rng(2)
    for _ in range(200):
        size = int(rng.integers(1, 12))
        costs = rng.choice([0.2, 0.4, 0.6, 1.0], size).tolist()  # ties on purpose
        scores = rng.choice([0.5, 0.6, 0.7], size).tolist()
        kept = pareto_frontier(costs, scores)
        points = list(zip(costs, scores))
        for i, (c, s) in enumerate(points):
            beaten = any(
                c2 <= c and s2 >= s and (c2, s2) != (c, s) for c2, s2 in points
            )  # a strictly better point exists
            first = points.index((c, s)) == i
            assert (i in kept) == (not beaten and first)


def test_settings_grid_starts_with_the_full_model() -> None:
    grid = settings_grid(2, 6, 5)
    assert grid[0][0] == FULL and len(grid) == 1 + 5 + 5 + 5  # entropy, patience 1..5, confidence
    logits = np.zeros((6, 4, 2))
    assert setting_exits(logits, grid[0], 0.1).tolist() == [5, 5, 5, 5]


@pytest.mark.slow
def test_budget_pick_against_a_plain_reference() -> None:
    task = TASKS["mrpc"]
    for seed in range(6):
        outputs = random_outputs(task, seed)
        grid = settings_grid(2, 6, 5)
        val_scores, val_costs = [], []
        for setting in grid:  # the plain reference: one setting at a time
            chosen = setting_exits(outputs.validation_logits, setting, 0.1)
            preds = outputs.validation_logits[chosen, np.arange(50)].argmax(-1)
            val_scores.append(plain_score(task, preds, outputs.validation_labels))
            val_costs.append(float(np.mean(chosen + 1)) / 6)
        previous_cost = 2.0
        for budget in (0, 1, 2, 5, 20):
            pick = budget_pick(outputs, budget)
            floor = val_scores[0] - budget / 100
            admitted = [i for i in range(len(grid)) if val_scores[i] >= floor - 1e-12]
            best = min(admitted, key=lambda i: (val_costs[i], -val_scores[i], i))
            assert pick["validation_time_ratio"] == pytest.approx(val_costs[best])
            assert pick["validation_score"] == pytest.approx(val_scores[best])
            chosen = setting_exits(outputs.dev_logits, grid[best], 0.1)
            preds = outputs.dev_logits[chosen, np.arange(40)].argmax(-1)
            dev = plain_score(task, preds, outputs.dev_labels)
            final = plain_score(task, outputs.dev_logits[-1].argmax(-1), outputs.dev_labels)
            assert pick["dev_score"] == pytest.approx(dev)
            assert pick["dev_speedup"] == pytest.approx(6 / float(np.mean(chosen + 1)))
            assert pick["met"] == (dev >= final - budget / 100 - 1e-12)
            assert pick["validation_time_ratio"] <= previous_cost  # wider budget, never dearer
            previous_cost = pick["validation_time_ratio"]
        assert budget_pick(outputs, 0)["validation_score"] >= val_scores[0] - 1e-12


@pytest.mark.slow
def test_budget_pick_from_another_models_reference() -> None:
    """A reference (ce's scores) sets both floors; none admitted: the full model, flagged."""
    task = TASKS["mrpc"]
    for seed in range(6):
        outputs = random_outputs(task, seed)
        own = final_scores(outputs)
        final = plain_score(task, outputs.dev_logits[-1].argmax(-1), outputs.dev_labels)
        assert own[1] == pytest.approx(final)
        assert budget_pick(outputs, 1, own) == {**budget_pick(outputs, 1), "reference": "given"}
        grid = settings_grid(2, 6, 5)
        val_scores, val_costs = [], []
        for setting in grid:
            chosen = setting_exits(outputs.validation_logits, setting, 0.1)
            preds = outputs.validation_logits[chosen, np.arange(50)].argmax(-1)
            val_scores.append(plain_score(task, preds, outputs.validation_labels))
            val_costs.append(float(np.mean(chosen + 1)) / 6)
        for reference in ((0.5, 0.6), (0.7, 0.75), (max(val_scores) + 0.01, 0.9)):
            for budget in (0, 1, 2, 5):
                pick = budget_pick(outputs, budget, reference)
                floor = reference[0] - budget / 100
                admitted = [i for i in range(len(grid)) if val_scores[i] >= floor - 1e-12]
                best = min(admitted, key=lambda i: (val_costs[i], -val_scores[i], i), default=0)
                assert pick["admitted"] == bool(admitted)
                assert pick["validation_time_ratio"] == pytest.approx(val_costs[best])
                assert pick["met"] == (pick["dev_score"] >= reference[1] - budget / 100 - 1e-12)
                if not admitted:  # the full model: no early exit
                    assert pick["policy"] == FULL and pick["dev_speedup"] == 1.0
                    assert pick["dev_score"] == pytest.approx(final)


# --- the bootstrap against explicit index resampling ------------------------------------------


def reference_differences(task, a, b, labels, example_draws, seed_draws) -> list[float]:
    """Plain loops: per resample, the drawn seeds' mean of measure(A) - measure(B), each
    measure computed from the resampled arrays with compute_metrics."""

    def value(m: Measure, idx) -> float:
        scores = [plain_score(task, p[idx], labels[idx]) for p in m.predictions]
        if m.name != "auc":
            return sum(scores) / len(scores)
        costs = [float(np.mean(layers[idx])) / m.num_layers for layers in m.layers]
        points = sorted(zip(costs, scores))
        low, high = m.cost_range
        points = [(low, points[0][1]), *points, (high, points[-1][1])]
        area = sum((c2 - c1) * (s1 + s2) / 2 for (c1, s1), (c2, s2) in zip(points, points[1:]))
        return area / (high - low)

    out = []
    for idx, seeds in zip(example_draws, seed_draws):
        out.append(sum(value(a[s], idx) - value(b[s], idx) for s in seeds) / len(seeds))
    return out


@pytest.mark.parametrize("name", ["final", "shallow", "average", "auc"])
@pytest.mark.slow
def test_resampled_differences_against_index_resampling(name: str) -> None:
    task = TASKS["mrpc"]
    a = [measure(random_outputs(task, s), name) for s in (1, 2, 3)]
    b = [measure(random_outputs(task, 10 + s), name) for s in (1, 2, 3)]
    dev_labels = random_outputs(task, 1).dev_labels  # one dev split, scored by every run
    rng = np.random.default_rng(3)
    example_draws = [rng.integers(0, 40, 40) for _ in range(12)]
    seed_draws = [rng.integers(0, 3, 3) for _ in range(12)]
    weights = np.stack([np.bincount(i, minlength=40) for i in example_draws])
    seed_counts = np.stack([np.bincount(i, minlength=3) for i in seed_draws])
    got = resampled_differences(task, a, b, dev_labels, weights, seed_counts)
    expected = reference_differences(task, a, b, dev_labels, example_draws, seed_draws)
    assert got == pytest.approx(expected, abs=1e-12)


def test_auc_settings_come_from_validation_only() -> None:
    task = TASKS["rte"]
    outputs = random_outputs(task, 4)
    m = measure(outputs, "auc")
    sweep = outputs.validation_sweep()
    kept = pareto_frontier(sweep["costs"].tolist(), sweep["scores"].tolist())
    assert m.predictions.shape == (len(kept), 40)
    # Scrambling the dev logits changes the dev points, never which settings are kept.
    scrambled = random_outputs(task, 4)
    scrambled.dev_logits = scrambled.dev_logits[:, ::-1].copy()
    assert scrambled.frontier() == outputs.frontier()
    assert measure(random_outputs(task, 4, exits=1), "auc") is None  # single exit: no AUC


def test_identical_runs_give_zero() -> None:
    task = TASKS["mrpc"]
    runs = {s: measure(random_outputs(task, s), "average") for s in (1, 2, 3)}
    labels = random_outputs(task, 1).dev_labels
    result = paired_bootstrap(task, runs, dict(runs), labels, resamples=R)
    assert result["difference"] == 0 and result["low"] == 0 and result["high"] == 0
    assert result["verdict"] == "no detectable difference" and result["p"] == 1.0
    assert result["seeds"] == [1, 2, 3]


def test_always_right_beats_always_wrong() -> None:
    task = TASKS["rte"]
    labels = np.array([0, 1] * 10)
    right = {s: Measure("final", labels[None]) for s in (1, 2)}
    wrong = {s: Measure("final", (1 - labels)[None]) for s in (1, 2, 3)}  # seed 3: B only
    result = paired_bootstrap(task, right, wrong, labels, resamples=R)
    assert result["seeds"] == [1, 2]  # the seeds both have
    assert result["difference"] == 1.0 and result["low"] == 1.0 and result["p"] == 0.0
    assert result["verdict"] == "better"
    assert paired_bootstrap(task, wrong, right, labels, resamples=R)["verdict"] == "worse"
    one = paired_bootstrap(task, {1: right[1]}, wrong, labels, resamples=R)
    assert one["seeds"] == [1] and one["verdict"] == "better"  # examples only
    assert paired_bootstrap(task, {5: right[1]}, wrong, labels)["verdict"] == "no common seed"


def test_bootstrap_is_deterministic_and_its_interval_covers_the_difference() -> None:
    task = TASKS["mrpc"]
    a = {s: measure(random_outputs(task, s), "final") for s in (1, 2, 3)}
    b = {s: measure(random_outputs(task, 20 + s), "final") for s in (1, 2, 3)}
    labels = random_outputs(task, 1).dev_labels
    first = paired_bootstrap(task, a, b, labels, resamples=R)
    assert first == paired_bootstrap(task, a, b, labels, resamples=R)
    assert first["low"] <= first["difference"] <= first["high"]
    weights, counts = draw(40, 3, R)
    assert weights.shape == (R, 40) and (weights.sum(1) == 40).all()
    assert counts.shape == (R, 3) and (counts.sum(1) == 3).all()


def test_seed_mean_interval_and_exit_bands() -> None:
    task = TASKS["rte"]
    outputs = {s: random_outputs(task, s) for s in (1, 2, 3)}
    labels = outputs[1].dev_labels
    finals = {s: measure(o, "final") for s, o in outputs.items()}
    figure = seed_mean_interval(task, finals, labels, resamples=R)
    plain = [plain_score(task, o.dev_logits[-1].argmax(-1), labels) for o in outputs.values()]
    assert figure["mean"] == pytest.approx(statistics.fmean(plain))
    assert figure["sd"] == pytest.approx(statistics.stdev(plain))
    assert figure["low"] <= figure["mean"] <= figure["high"] and figure["n"] == 3
    bands = exit_bands(task, {s: o.exit_predictions() for s, o in outputs.items()}, labels, R)
    assert len(bands) == 6 and bands[-1] == figure  # the last exit is the final measure
    one = seed_mean_interval(task, {1: finals[1]}, labels, resamples=R)
    assert one["sd"] is None and one["n"] == 1


def test_auc_over_different_cost_ranges_is_refused() -> None:
    a = Measure("auc", np.zeros((1, 4), int), np.ones((1, 4), int), 6, (1 / 6, 1.0))
    b = Measure("auc", np.zeros((1, 4), int), np.full((1, 4), 2), 6, (2 / 6, 1.0))
    with pytest.raises(UserError, match="different cost ranges"):
        paired_bootstrap(TASKS["sst2"], {1: a}, {1: b}, np.zeros(4, int), resamples=R)


def test_runs_on_other_examples_are_refused_in_one_line() -> None:
    """The pairing check: the same labels in the same order, then the same data record."""
    labels = np.array([0, 1, 1, 1])  # no palindrome: reversed is another order
    data = {"max_length": 64, "splits": {"dev": {"examples": 4}}}
    check_same_examples([], "dev", "fix")  # nothing to compare
    check_same_examples([("a", labels, data), ("b", labels.copy(), dict(data))], "dev", "fix")
    # records from before the data record existed: both empty, nothing to tell apart
    check_same_examples([("a", labels, None), ("b", labels, {})], "dev", "fix")
    cases = [
        (labels[::-1], data, r"^b scored other dev examples than a: rerun b$"),  # order
        (labels[:3], data, r"^b scored other dev examples than a: rerun b$"),  # count
        (labels, {**data, "max_length": 128},
         r"^b was trained on other data than a \(run.json 'data' differs in max_length\): rerun b$"),
        (labels, {"seed": 1},
         r"differs in max_length, seed, splits\)"),
        (labels, None, r"differs in max_length, splits\)"),
    ]  # fmt: skip
    for odd_labels, odd_data, message in cases:
        with pytest.raises(UserError, match=message):
            check_same_examples(
                [("a", labels, data), ("b", odd_labels, odd_data)], "dev", "rerun b"
            )
        # the odd one is named wherever it stands after the first
        with pytest.raises(UserError, match="^c "):
            check_same_examples(
                [("a", labels, data), ("b", labels, data), ("c", odd_labels, odd_data)],
                "dev",
                "rerun b",
            )


# --- the family-wise view: two-sided p and Holm ------------------------------------------------


def test_two_sided_p_by_hand() -> None:
    """Twice the smaller tail, each (k + 1) / (R + 1); zeros count in both tails."""
    assert two_sided_p(np.full(9, 0.5)) == pytest.approx(2 * 1 / 10)  # no resample at or below 0
    assert two_sided_p(np.full(9, -0.5)) == pytest.approx(2 * 1 / 10)
    mixed = np.array([-1.0, -1.0, 1, 1, 1, 1, 1, 1, 1])
    assert two_sided_p(mixed) == pytest.approx(2 * 3 / 10)
    assert two_sided_p(-mixed) == two_sided_p(mixed)  # symmetric in A and B
    assert two_sided_p(np.zeros(9)) == 1.0  # identical runs
    assert two_sided_p(np.array([-1.0, 0.0, 1.0, 2.0])) == 1.0  # capped: 2 * 3 / 5


def test_two_sided_p_from_the_bootstrap() -> None:
    task = TASKS["rte"]
    labels = np.array([0, 1] * 10)
    right = {s: Measure("final", labels[None]) for s in (1, 2)}
    wrong = {s: Measure("final", (1 - labels)[None]) for s in (1, 2)}
    assert paired_bootstrap(task, right, wrong, labels, resamples=R)["p_two_sided"] == (
        pytest.approx(2 / (R + 1))
    )
    assert paired_bootstrap(task, right, dict(right), labels, resamples=R)["p_two_sided"] == 1.0


def reference_holm_rejections(p_values: list[float], alpha: float) -> set[int]:
    """Holm's procedure itself: walk the p-values upwards, reject the k-th (k from 1) while
    it is at most alpha / (m - k + 1), stop at the first that is not."""
    m = len(p_values)
    rejected = set()
    for k, i in enumerate(sorted(range(m), key=lambda i: p_values[i]), start=1):
        if p_values[i] > alpha / (m - k + 1) + 1e-12:
            break
        rejected.add(i)
    return rejected


def test_holm_by_hand() -> None:
    assert holm([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])
    assert holm([0.02, 0.021]) == pytest.approx([0.04, 0.04])  # 0.021 alone: made non-decreasing
    assert holm([0.9, 0.8]) == [1.0, 1.0]  # capped at 1
    assert holm([0.02]) == [0.02] and holm([]) == []


@pytest.mark.parametrize("seed", range(20))
def test_holm_adjusted_p_is_the_smallest_level_that_rejects(seed: int) -> None:
    """Over random families (ties, zeros and ones included): H_i is rejected by Holm's
    procedure at level alpha exactly when its adjusted p is at most alpha, for every alpha
    below 1 (at 1 the cap makes every adjusted p "at most alpha")."""
    rng = np.random.default_rng(seed)
    m = int(rng.integers(1, 16))
    p_values = rng.choice([0.0, 0.001, 0.004, 0.01, 0.02, 0.05, 0.2, 1.0], m).tolist()
    if seed % 2:
        p_values = rng.uniform(0, 0.2, m).tolist()
    adjusted = holm(p_values)
    assert all(a >= p for a, p in zip(adjusted, p_values)) and max(adjusted) <= 1
    levels = sorted(a for a in {*adjusted, *np.linspace(0, 1, 41).tolist()} if a < 1)
    for alpha in levels:
        expected = reference_holm_rejections(p_values, alpha)
        got = {i for i, a in enumerate(adjusted) if a <= alpha + 1e-12}
        assert got == expected, (p_values, alpha)
