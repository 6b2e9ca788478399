"""Exit policies on hand-built logits: per sample, thresholds at both ends, patience, fallback."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from aclpipe.early_exit.policies import NO_EXIT, check_threshold, default_grid, exit_indices
from aclpipe.errors import UserError

# Three exits, two samples, two classes. Sample 0 is confident from exit 0 on
# (p = softmax([4, 0]) = 0.982, entropy 0.090); sample 1 is unsure until the last exit.
LOGITS = np.array(
    [
        [[4.0, 0.0], [0.1, 0.0]],  # exit 0
        [[4.0, 0.0], [0.0, 0.2]],  # exit 1
        [[4.0, 0.0], [0.0, 3.0]],  # exit 2
    ]
)


def entropy(row: list[float]) -> float:
    z = [math.exp(v) for v in row]
    p = [v / sum(z) for v in z]
    return -sum(q * math.log(q) for q in p)


def test_entropy_is_per_sample() -> None:
    # sample 0: H = 0.090 < 0.3 at exit 0; sample 1: H = 0.692, 0.688, 0.186 -> exit 2
    assert entropy([4.0, 0.0]) == pytest.approx(0.0899, abs=1e-3)
    assert exit_indices("entropy", 0.3, LOGITS).tolist() == [0, 2]


def test_entropy_extremes() -> None:
    assert exit_indices("entropy", 0.0, LOGITS).tolist() == [2, 2]  # nothing is below 0
    assert exit_indices("entropy", math.log(2), LOGITS).tolist() == [0, 0]  # everything is


def test_confidence_extremes_and_middle() -> None:
    assert exit_indices("confidence", 0.0, LOGITS).tolist() == [0, 0]
    assert exit_indices("confidence", 1.0, LOGITS).tolist() == [2, 2]  # never reached: fallback
    # sample 1: max p = 0.525, 0.550, 0.953 -> leaves at exit 2 with delta 0.9
    assert exit_indices("confidence", 0.9, LOGITS).tolist() == [0, 2]


def test_patience_counts_consecutive_agreements() -> None:
    # argmax per exit: sample 0: 0, 0, 0; sample 1: 0, 1, 1
    assert exit_indices("patience", 1, LOGITS).tolist() == [1, 2]  # exit 1 agrees with exit 0
    assert exit_indices("patience", 2, LOGITS).tolist() == [2, 2]  # needs exits 0, 1, 2
    # too much patience: the last exit is the fallback
    assert exit_indices("patience", 5, LOGITS).tolist() == [2, 2]


def test_patience_resets_on_disagreement() -> None:
    # argmax 0, 1, 1, 1: patience 2 is met at exit 3 (exits 1..3 agree), not before
    logits = np.array([[[1.0, 0.0]], [[0.0, 1.0]], [[0.0, 1.0]], [[0.0, 1.0]]])
    assert exit_indices("patience", 2, logits).tolist() == [3]
    logits = np.array([[[1.0, 0.0]], [[0.0, 1.0]], [[1.0, 0.0]], [[1.0, 0.0]], [[1.0, 0.0]]])
    assert exit_indices("patience", 2, logits).tolist() == [4]


def test_regression_patience_uses_eps() -> None:
    # outputs 1.0, 1.05, 1.08 (steps 0.05, 0.03) and 1.0, 2.0, 2.01 (steps 1.0, 0.01)
    logits = np.array([[[1.0], [1.0]], [[1.05], [2.0]], [[1.08], [2.01]], [[1.1], [3.0]]])
    assert exit_indices("patience", 1, logits, regression=True, eps=0.1).tolist() == [1, 2]
    assert exit_indices("patience", 2, logits, regression=True, eps=0.1).tolist() == [2, 3]
    with pytest.raises(UserError, match="patience"):
        exit_indices("entropy", 0.1, torch.tensor(logits[:1]), regression=True)


def test_no_exit_sends_every_sample_to_the_last_exit() -> None:
    # sample 0 would leave at exit 0 under any policy; without early exit both reach exit 2
    assert exit_indices(NO_EXIT, None, LOGITS).tolist() == [2, 2]
    assert exit_indices(NO_EXIT, None, torch.tensor(LOGITS)).dtype == np.int64
    regression = np.array([[[1.0]], [[1.0]], [[1.0]], [[1.0]]])  # patience would leave at 1
    assert exit_indices(NO_EXIT, None, regression, regression=True).tolist() == [3]
    with pytest.raises(UserError, match="unknown policy"):
        exit_indices("None", None, LOGITS)


def test_decisions_do_not_depend_on_batch_mates() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, 9, 3)) * 2
    for policy, threshold in [("entropy", 0.5), ("confidence", 0.7), ("patience", 2)]:
        together = exit_indices(policy, threshold, logits)
        alone = [exit_indices(policy, threshold, logits[:, i : i + 1])[0] for i in range(9)]
        assert together.tolist() == alone


def test_threshold_ranges_and_grids() -> None:
    check_threshold("entropy", math.log(3), 3, 6)
    for policy, threshold in [("entropy", 1.2), ("confidence", 1.5), ("patience", 0),
                              ("patience", 1.5), ("nope", 1)]:  # fmt: skip
        with pytest.raises(UserError):
            check_threshold(policy, threshold, 3 if policy != "entropy" else 2, 6)
    assert default_grid("entropy", 2, 6, 3) == [
        0.0,
        pytest.approx(math.log(2) / 2, abs=1e-6),
        pytest.approx(math.log(2), abs=1e-6),
    ]
    assert (
        default_grid("confidence", 2, 6, 6)[0] == 0.5
        and default_grid("confidence", 2, 6, 6)[-1] == 1.0
    )
    assert default_grid("patience", 2, 6) == [1.0, 2.0, 3.0, 4.0, 5.0]


@pytest.mark.parametrize("t", [1, 2, 3, 4, 5])
def test_step_keeps_the_newest_t_plus_one_exits(t: int) -> None:
    """The runtimes' window: after exit j a sample holds its last min(j, t + 1) exits' logits,
    newest last, and leaves exactly when the offline policy says so on its whole history."""
    from aclpipe.early_exit.policies import leaves, step, window_size

    size = window_size("patience", t)
    assert size == t + 1 and window_size("entropy", 0.3) == window_size("confidence", 0.9) == 1
    history = [[float(j % 2), 0.5] for j in range(3)] + [[0.0, 1.0]] * 8  # argmax 0,1,0,1,1,...
    windows: list = [[]]
    for j, row in enumerate(history, start=1):
        windows, decided = step("patience", t, windows, [row], size, False, 0.1)
        assert windows[0] == history[max(0, j - size) : j]
        assert decided == [leaves("patience", t, history[:j], False, 0.1)]
