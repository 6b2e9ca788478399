"""The recalibrating controller on synthetic streams whose agreement is known, its estimates
against plain loops over ``policies.exit_indices``, and its Wilson bounds against scipy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from aclpipe.early_exit.policies import exit_indices
from aclpipe.early_exit.recalibrate import (
    MIN_HARM,
    Controller,
    candidate_exits,
    candidates,
    harm_bound,
    target_agreement,
    wilson_lower,
    wilson_upper,
)
from aclpipe.early_exit.shadow import observe
from aclpipe.errors import UserError

EXITS = [1, 2, 3, 4]  # 1-based layers of the synthetic model's exits
OFFLINE = 0.7  # confidence threshold chosen "offline": agreement ~0.985 on the clean stream
TARGET = 0.96


def synthetic(rng: np.random.Generator, n: int, flip: float) -> np.ndarray:
    """Logits ``[E, N, 2]`` of a model whose exits grow surer with depth. Each record has a
    clarity ``c ~ U(0, 4)``; exit ``k`` puts a margin ``c (k + 1) / E`` plus noise on the
    last exit's answer. Under drift (``flip > 0``) each shallow exit is, with probability
    ``flip``, as confident in the other answer: the shift a threshold must answer."""
    num_exits = len(EXITS)
    final = rng.integers(0, 2, n)
    clarity = rng.uniform(0, 4, n)
    depth = (np.arange(num_exits) + 1) / num_exits
    margin = clarity[:, None] * depth[None, :] + rng.normal(0, 0.5, (n, num_exits))  # [N, E]
    margin = np.where(rng.random((n, num_exits)) < flip, -np.abs(margin), margin)
    margin[:, -1] = np.abs(margin[:, -1])  # the last exit's answer is `final`
    sign = np.where(final == 1, 1.0, -1.0)[:, None]
    logits = np.stack([-margin * sign / 2, margin * sign / 2], -1)  # [N, E, 2]
    return logits.transpose(1, 0, 2)  # [E, N, 2]


def served_exit(policy: str, threshold: float, logits: np.ndarray) -> int:
    """Where one record ``[E, C]`` leaves (the slow reference: ``policies``'s own loop)."""
    return int(exit_indices(policy, threshold, logits[:, None, :])[0])


def feed(controller: Controller, logits: np.ndarray) -> list:
    """Serve each record ``[E, N, C]`` at the controller's threshold and observe it."""
    events = []
    for i in range(logits.shape[1]):
        taken = served_exit(controller.policy, controller.threshold, logits[:, i])
        event = controller.observe(observe(logits[:, i], taken))
        if event is not None:
            events.append(event)
    return events


def true_agreement(policy: str, threshold: float, logits: np.ndarray) -> float:
    """The agreement ``threshold`` gives on a large sample of a stream (its known value)."""
    chosen = exit_indices(policy, threshold, logits)  # [N]
    answers = logits.argmax(-1)  # [E, N]
    return float((answers[chosen, np.arange(logits.shape[1])] == answers[-1]).mean())


@pytest.fixture(scope="module")
def reference() -> dict[float, np.ndarray]:
    """A large sample per drift level, for the known agreement of a threshold."""
    rng = np.random.default_rng(7)
    return {flip: synthetic(rng, 4000, flip) for flip in (0.0, 0.1)}


def controller(**overrides) -> Controller:
    knobs = dict(policy="confidence", offline=OFFLINE, exit_layers=EXITS, target=TARGET)
    return Controller(**{**knobs, **overrides})


@pytest.mark.parametrize("confidence", [0.8, 0.9, 0.95, 0.99])
@pytest.mark.parametrize("n", [1, 7, 50, 1000])
def test_wilson_lower_matches_scipy(n: int, confidence: float) -> None:
    for k in sorted({0, 1, n // 3, n // 2, n - 1, n}):
        # scipy's two-sided interval at 2c - 1 has the one-sided bound at c as its low end
        ci = stats.binomtest(k, n).proportion_ci(
            confidence_level=2 * confidence - 1, method="wilson"
        )
        assert float(wilson_lower(k, n, confidence)) == pytest.approx(ci.low, abs=1e-12)
        assert float(wilson_upper(k, n, confidence)) == pytest.approx(ci.high, abs=1e-12)


def test_wilson_lower_shrinks_with_fewer_records() -> None:
    # the same observed share, 98%: fewer records, a lower bound
    bounds = [float(wilson_lower(round(0.98 * n), n, 0.95)) for n in (50, 200, 1000, 5000)]
    assert bounds == sorted(bounds) and bounds[-1] < 0.98


@pytest.mark.parametrize("budget", [0.5, 1, 2, 5])
@pytest.mark.parametrize("harm", [MIN_HARM, 0.5, 1.0])
def test_target_agreement(budget: float, harm: float) -> None:
    target = target_agreement(budget, harm)
    # at the target, the worst accuracy loss (1 - a) * harm is the budget exactly
    assert (1 - target) * harm == pytest.approx(budget / 100)
    with pytest.raises(UserError):
        target_agreement(budget, 0.0)


def test_harm_bound_counts_wins() -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        n = int(rng.integers(30, 300))
        labels, early, full = (rng.integers(0, 3, n) for _ in range(3))
        full_wins = sum(e != f and f == y for e, f, y in zip(early, full, labels))
        early_wins = sum(e != f and e == y for e, f, y in zip(early, full, labels))
        z = stats.norm.ppf(0.95)
        p, m = early_wins / (full_wins + early_wins), full_wins + early_wins
        low = (p + z * z / (2 * m) - z * math.sqrt(p * (1 - p) / m + z * z / (4 * m * m))) / (
            1 + z * z / m
        )
        expected = min(1.0, max(MIN_HARM, 2 * (1 - low) - 1))
        assert harm_bound(early, full, labels) == pytest.approx(expected)
    same = np.zeros(10, dtype=int)
    assert harm_bound(same, same, same) == 1.0  # no disagreement: the worst case stands


@pytest.mark.parametrize("policy", ["confidence", "entropy", "patience"])
def test_candidate_exits_match_policies(policy: str) -> None:
    rng = np.random.default_rng(11)
    logits = rng.normal(0, 2, (len(EXITS), 120, 3))  # [E, N, C], three classes
    observations = [observe(logits[:, i], 0) for i in range(logits.shape[1])]
    scores = np.array([o.scores(policy) for o in observations])  # [N, E]
    runs = np.array([o.runs() for o in observations])
    grid = {
        "confidence": [0.0, 0.34, 0.5, 0.7, 0.9, 1.0, float(scores[5, 1])],  # one tie, exact
        "entropy": [0.0, 0.2, 0.6, 1.0, math.log(3), float(scores[8, 2])],
        "patience": [1.0, 2.0, 3.0, 4.0],
    }[policy]
    got = candidate_exits(policy, np.array(grid), scores, runs)  # [G, N]
    for row, threshold in zip(got, grid):
        assert row.tolist() == exit_indices(policy, threshold, logits).tolist()


@pytest.mark.parametrize(
    ("policy", "offline", "grid"),
    [
        ("confidence", 0.6, [0.6, 0.66, 0.8, 0.95, 1.0]),
        ("entropy", 0.5, [0.5, 0.4, 0.2, 0.05, 0.0]),
        ("patience", 1.0, [1.0, 2.0, 3.0]),
    ],
)
def test_estimate_matches_a_plain_loop(policy: str, offline: float, grid: list[float]) -> None:
    rng = np.random.default_rng(5)
    logits = synthetic(rng, 300, 0.1)  # [E, N, 2]
    control = controller(policy=policy, offline=offline, window=250, min_window=250)
    feed(control, logits)
    kept = logits[:, -250:]  # the window: the newest 250
    share, lower, layers = control.estimate(np.array(grid))
    for i, threshold in enumerate(grid):
        answers = kept.argmax(-1)  # [E, N]
        agreed = exit_taken = 0
        for j in range(kept.shape[1]):
            k = served_exit(policy, threshold, kept[:, j])
            agreed += answers[k, j] == answers[-1, j]
            exit_taken += EXITS[k]
        assert share[i] == pytest.approx(agreed / 250)
        assert layers[i] == pytest.approx(exit_taken / 250)
        assert lower[i] == pytest.approx(float(wilson_lower(agreed, 250, 0.95)))


@pytest.mark.parametrize(
    ("window", "min_window", "every"), [(400, 50, 1), (400, 150, 25), (300, 300, 10)]
)
def test_never_moves_on_a_window_smaller_than_its_minimum(window, min_window, every) -> None:
    logits = synthetic(np.random.default_rng(1), min_window + 200, 0.3)  # far below target
    control = controller(window=window, min_window=min_window, every=every, recent=0)
    events = feed(control, logits)
    assert events, "a stream this far below the target must move the threshold"
    assert min(e.seen for e in events) >= min_window
    assert all(e.window >= min_window and e.rule == "window" for e in events)
    with_fast = controller(window=window, min_window=min_window, every=every)
    for event in feed(with_fast, logits):  # the fast rule may come first; the window rule not
        assert event.window >= (min_window if event.rule == "window" else with_fast.recent_min)


@pytest.mark.parametrize("target", [0.5, 0.9, 0.96, 0.985, 0.99, 0.999])
@pytest.mark.parametrize("confidence", [0.9, 0.95])
@pytest.mark.parametrize(("window", "min_window"), [(1000, 200), (500, 150), (300, 10)])
def test_ready_is_the_fewest_observations_a_flawless_window_could_pass_on(
    target: float, confidence: float, window: int, min_window: int
) -> None:
    """``ready``: min_window, or the smallest n whose bound with n agreeing of n reaches
    target + hysteresis (counted up one at a time here), at most the window."""
    control = controller(target=target, confidence=confidence, window=window,
                         min_window=min_window)  # fmt: skip
    n = 1
    while n < window and wilson_lower(n, n, confidence) < target + control.hysteresis:
        n += 1
    assert control.ready == min(window, max(min_window, n))
    assert control.status()["ready"] == control.ready


def test_a_flawless_stream_never_moves_the_threshold() -> None:
    """Every exit gives the last exit's answer at every confidence: nothing to tighten for.
    With a target of 0.99 a window of 100 could not show it even so (bound 0.974); the
    controller waits for 539 observations (0.995 with the hysteresis) and then stays."""
    rng = np.random.default_rng(3)
    n = 1500
    final = rng.integers(0, 2, n)
    margin = rng.uniform(0.1, 4, (len(EXITS), n))  # [E, N] each exit's margin, same answer
    sign = np.where(final == 1, 1.0, -1.0)[None]
    logits = np.stack([-margin * sign / 2, margin * sign / 2], -1)  # [E, N, 2]
    control = controller(target=0.99, window=1000, min_window=100, every=1)
    assert control.ready == 539
    assert not feed(control, logits)
    assert control.threshold == OFFLINE and control.status()["agreement"] == 1.0


@pytest.mark.parametrize("max_step", [0.01, 0.05, 0.2])
def test_steps_are_bounded_and_never_looser_than_offline(max_step: float) -> None:
    rng = np.random.default_rng(2)
    stream = np.concatenate([synthetic(rng, 600, 0.3), synthetic(rng, 1400, 0.0)], axis=1)
    control = controller(window=400, min_window=100, max_step=max_step)
    events = feed(control, stream)
    assert events
    assert {e.rule for e in events} == {"fast", "window"}
    for event in events:
        if event.rule == "window":
            assert abs(event.new - event.old) <= max_step + 1e-12
        else:  # the fast rule goes to its goal at once, and only ever tightens
            assert event.new == event.goal > event.old
        assert event.new >= OFFLINE - 1e-12
        assert event.reason.startswith((f"tighten ({event.rule} rule)", "loosen (window rule)"))
        assert set(event.as_dict()) >= {"seen", "old", "new", "goal", "reason", "target"}


def test_patience_moves_one_whole_exit_at_a_time() -> None:
    rng = np.random.default_rng(4)
    stream = np.concatenate([synthetic(rng, 500, 0.3), synthetic(rng, 1200, 0.0)], axis=1)
    control = controller(policy="patience", offline=1.0, window=400, min_window=100)
    events = feed(control, stream)
    assert events
    assert all(e.new == int(e.new) for e in events)
    assert all(abs(e.new - e.old) == 1 for e in events if e.rule == "window")
    assert max(e.new for e in events) <= len(EXITS) - 1


# two classes: max p >= 0.7 is H(p) <= H(0.7), so both policies start from the same setting
BINARY_ENTROPY_AT_OFFLINE = -(OFFLINE * math.log(OFFLINE) + (1 - OFFLINE) * math.log(1 - OFFLINE))


@pytest.mark.parametrize(
    ("policy", "offline"), [("confidence", OFFLINE), ("entropy", BINARY_ENTROPY_AT_OFFLINE)]
)
def test_holds_the_target_under_drift(reference, policy: str, offline: float) -> None:
    """A stream drifted from the start: the fixed threshold misses the target, and from the
    moment the controller has settled, the threshold it serves meets the target's known
    agreement."""
    drifted = reference[0.1]
    assert true_agreement(policy, offline, drifted) < TARGET - 0.03  # fixed breaks
    control = controller(policy=policy, offline=offline, window=500, min_window=200)
    feed(control, synthetic(np.random.default_rng(8), 1800, 0.1))
    assert control.events
    served = [e.new for e in control.events if e.seen >= 1000]  # settled: a full window since
    for threshold in [control.threshold, *served]:
        assert true_agreement(policy, threshold, drifted) >= TARGET - 0.005
    strictest = candidates(policy, offline, len(EXITS))[-1]
    assert control.threshold != strictest  # not the full model: the cheapest that meets it


@pytest.mark.parametrize(
    ("policy", "offline"), [("confidence", OFFLINE), ("entropy", BINARY_ENTROPY_AT_OFFLINE)]
)
def test_returns_to_the_offline_threshold_when_the_drift_ends(policy: str, offline: float) -> None:
    rng = np.random.default_rng(9)
    clean, drift, back = (
        synthetic(rng, 800, 0.0),
        synthetic(rng, 1500, 0.1),
        synthetic(rng, 1200, 0.0),
    )
    control = controller(policy=policy, offline=offline, window=500, min_window=200)
    assert not feed(control, clean)  # clean traffic meets the target at the offline threshold
    assert control.threshold == offline
    feed(control, drift)
    assert control._stricter(control.threshold, offline)
    assert abs(control.threshold - offline) > 0.1
    feed(control, back)
    assert control.threshold == offline
    assert [e.reason.split(":")[0] for e in control.events][-1] == "loosen (window rule)"


def test_bad_knobs_are_one_line_errors() -> None:
    with pytest.raises(UserError, match="min_window"):
        controller(window=10, min_window=20)
    with pytest.raises(UserError, match="cannot be recalibrated"):
        candidates("none", 0.5, 4)
    for recent, recent_min, window in [(50, 0, 500), (50, 60, 500), (200, 150, 100)]:
        with pytest.raises(UserError, match="recent_min"):
            controller(window=window, min_window=10, recent=recent, recent_min=recent_min)
    assert controller(recent=0, recent_min=0).recent == 0  # the fast rule off


def test_status_counts_agreement_per_served_exit() -> None:
    logits = synthetic(np.random.default_rng(6), 120, 0.2)  # [E, N, 2]
    control = controller(window=100, min_window=100)
    empty = control.status()
    assert empty["window"] == 0 and empty["agreement"] is None
    taken = [int(k) for k in np.random.default_rng(0).integers(0, len(EXITS), 120)]
    for i, k in enumerate(taken):  # served from arbitrary exits: status reports them as served
        control.observe(observe(logits[:, i], k))
    status = control.status()
    answers = logits.argmax(-1)[:, -100:]  # the window: the newest 100
    for k, entry in enumerate(status["per_exit"]):
        mine = [j for j, e in enumerate(taken[-100:]) if e == k]
        assert entry["served"] == len(mine) and entry["exit_layer"] == EXITS[k]
        agreed = [answers[k, j] == answers[-1, j] for j in mine]
        assert entry["agreement"] == (pytest.approx(sum(agreed) / len(mine)) if mine else None)
    share, lower, _ = control.estimate(np.array([control.threshold]))
    assert status["agreement"] == pytest.approx(share[0]) and status["window"] == 100
    assert status["lower_bound"] == pytest.approx(lower[0])


# -- the fast rule: tighten on evidence of failure (the newest ``recent`` observations)

Z95 = stats.norm.ppf(0.95)


def flawless(rng: np.random.Generator, n: int) -> np.ndarray:
    """Logits ``[E, N, 2]`` whose every exit gives the last exit's answer."""
    final = rng.integers(0, 2, n)
    margin = rng.uniform(0.1, 4, (len(EXITS), n))  # [E, N]
    sign = np.where(final == 1, 1.0, -1.0)[None]
    return np.stack([-margin * sign / 2, margin * sign / 2], -1)


def upper_bound(k: int, n: int) -> float:
    """Wilson's one-sided 95% upper bound of k successes in n, written out."""
    p = k / n
    spread = Z95 * math.sqrt(p * (1 - p) / n + Z95 * Z95 / (4 * n * n))
    return (p + Z95 * Z95 / (2 * n) + spread) / (1 + Z95 * Z95 / n)


def recent_agreements(logits: np.ndarray, seen: int, threshold: float, recent: int) -> tuple:
    """Of the newest ``min(seen, recent)`` records of a stream ``[E, N, C]`` before ``seen``,
    how many agree with the last exit under ``threshold``, and how many there are (a loop)."""
    rows = range(max(0, seen - recent), seen)
    agreed = sum(
        int(logits[served_exit("confidence", threshold, logits[:, i]), i].argmax()
            == logits[-1, i].argmax())
        for i in rows
    )  # fmt: skip
    return agreed, len(rows)


@pytest.mark.parametrize("start", [0, 200, 700])  # the drop: before ready (539) or after
@pytest.mark.parametrize("flip", [0.3, 0.6])
def test_fast_rule_tightens_soon_after_a_sharp_drop(start: int, flip: float) -> None:
    """Flawless traffic, then a drop far below the target (agreement ~0.85 or less): the
    first move is the fast rule's, at the first update whose recent sample's upper bound
    under the offline threshold falls below the target (the plain reference), within 75
    observations of the drop, and before ``ready`` when the drop comes early."""
    rng = np.random.default_rng(start + int(10 * flip))
    stream = np.concatenate([flawless(rng, start), synthetic(rng, 300, flip)], axis=1)
    control = controller(target=0.99, window=1000, min_window=200, every=25)
    events = feed(control, stream)
    expected = next(
        seen for seen in range(control.every, stream.shape[1] + 1, control.every)
        if seen >= control.recent_min
        and upper_bound(*recent_agreements(stream, seen, OFFLINE, control.recent)) < 0.99
    )  # fmt: skip
    first = events[0]
    assert (first.rule, first.seen, first.old) == ("fast", expected, OFFLINE)
    assert first.new > OFFLINE and first.seen - start <= 75
    if start + 75 < control.ready:
        assert first.seen < control.ready
    assert true_agreement("confidence", first.new, synthetic(rng, 4000, flip)) > (
        true_agreement("confidence", OFFLINE, synthetic(rng, 4000, flip))
    )


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("recent", "every"), [(60, 5), (150, 25)])
def test_every_fast_move_is_a_shown_failure(seed: int, recent: int, every: int) -> None:
    """On streams that drift in and out: each fast move is justified by the plain reference
    (the newest ``recent`` records under the old threshold have an upper bound below the
    target, so at least one disagreement), goes to a candidate whose share there meets the
    target (or the strictest), and none comes once the recent sample is flawless."""
    rng = np.random.default_rng(seed)
    parts = [synthetic(rng, 300, 0.2), flawless(rng, 400), synthetic(rng, 200, 0.4),
             flawless(rng, 500)]  # fmt: skip
    stream = np.concatenate(parts, axis=1)
    control = controller(target=0.98, window=500, min_window=100, every=every, recent=recent,
                         recent_min=40)  # fmt: skip
    events = [e for e in feed(control, stream) if e.rule == "fast"]
    assert events
    clean = [(300, 700), (900, 1400)]  # [from, to): flawless records only
    for event in events:
        agreed, n = recent_agreements(stream, event.seen, event.old, recent)
        assert n >= control.recent_min and agreed < n
        assert upper_bound(agreed, n) < 0.98
        kept, _ = recent_agreements(stream, event.seen, event.new, recent)
        assert kept / n >= 0.98 or event.new == candidates("confidence", OFFLINE, 4)[-1]
        assert not any(a + recent <= event.seen <= b for a, b in clean)


@pytest.mark.parametrize("recent_min", [1, 10, 50, 120])
@pytest.mark.parametrize("every", [1, 7, 25])
def test_fast_rule_never_moves_on_fewer_than_its_minimum(recent_min: int, every: int) -> None:
    """Every shallow exit disagrees with the last, surely: the first update that has
    ``recent_min`` observations moves (the upper bound is far below the target), none before."""
    stream = synthetic(np.random.default_rng(recent_min), 200, 1.0)
    control = controller(target=0.99, window=500, min_window=200, every=every, recent=150,
                         recent_min=recent_min)  # fmt: skip
    events = feed(control, stream)
    assert events[0].rule == "fast"
    assert events[0].seen == every * math.ceil(recent_min / every)
    assert all(e.window >= recent_min for e in events)


@pytest.mark.parametrize("recent", [0, 60, 150])
def test_returns_after_the_drift_ends_with_or_without_the_fast_rule(recent: int) -> None:
    rng = np.random.default_rng(12)
    stream = np.concatenate([flawless(rng, 700), synthetic(rng, 600, 0.3), flawless(rng, 1300)],
                            axis=1)  # fmt: skip
    control = controller(target=0.98, window=500, min_window=100, every=10, recent=recent,
                         recent_min=min(recent, 50) or 50)  # fmt: skip
    feed(control, stream[:, :1300])
    assert control.threshold > OFFLINE + 0.1
    assert (recent > 0) == any(e.rule == "fast" for e in control.events)
    feed(control, stream[:, 1300:])
    assert control.threshold == OFFLINE
    assert control.events[-1].rule == "window" and control.events[-1].new < control.events[-1].old


def turns(events: list) -> int:
    """How often the threshold changes direction."""
    return sum((a.new < a.old) != (b.new < b.old) for a, b in zip(events, events[1:]))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(("block", "target", "window"), [(50, 0.97, 500), (150, 0.99, 1000)])
def test_no_flapping_on_a_stream_alternating_around_the_target(seed, block, target, window):
    """Blocks of flawless and drifted records in turn, the mixture's agreement under the
    offline threshold near the target. The window rule cannot undo a fast tightening while
    the recent sample would fail the looser threshold: every loosening meets the target on
    the recent sample (the plain reference); and the fast rule adds no turns of direction to
    the window rule's own (the same stream without it)."""
    rng = np.random.default_rng(seed)
    flip = 0.05 if target == 0.97 else 0.02
    blocks = [flawless(rng, block) if i % 2 == 0 else synthetic(rng, block, flip)
              for i in range(3000 // block)]  # fmt: skip
    stream = np.concatenate(blocks, axis=1)  # [E, 3000, 2]
    assert abs(true_agreement("confidence", OFFLINE, stream) - target) < 0.01
    knobs = dict(target=target, window=window, min_window=100, every=10)
    control = controller(**knobs, recent=150)
    events = feed(control, stream)
    for event in events:
        if event.new < event.old:
            agreed, n = recent_agreements(stream, event.seen, event.new, control.recent)
            assert agreed / n >= target
    assert turns(events) <= turns(feed(controller(**knobs, recent=0), stream))
