"""Online recalibration of an exit threshold from shadow observations: a pure controller.

An exit threshold is chosen offline on a validation split; when the traffic drifts, the
shallow exits' confidence drifts with it and the offline promise ("within the budget of the
full model") silently breaks. The server can watch: a shadow sample of its records also runs
to the last exit (``early_exit.shadow``), which gives, per record, every exit's answer and
score (an ``Observation``). This module turns a stream of them into threshold moves, and
reads no clock, no model and no server: the same calls give the same moves.

**Target.** Write ``a`` for the share of records whose early answer equals the full model's
(the agreement). Early and full answers differ on ``1 - a`` of the records, and only there can
the early one be wrong where the full one is right, so

    accuracy(early) >= accuracy(full) - (1 - a) * harm,

where ``harm`` (in ``[0, 1]``) is P(full right | disagree) - P(early right | disagree), the net
share of the disagreements that cost a correct answer. A budget of ``b`` points below the full
model then holds when ``a >= 1 - (b / 100) / harm`` (``target_agreement``). ``harm = 1`` (every
disagreement costs one) makes it a sufficient rule with no assumption: ``a >= 1 - b / 100``.
A smaller ``harm``, estimated on the export's dev logits (``harm_bound``: a one-sided upper
bound, never below ``MIN_HARM``), is the approximation: it assumes the share of disagreements
the full model wins stays what it was on dev. Under a shift that makes the full model less
accurate that share tends to fall (the rule stays safe); a shift that confuses the shallow
exits alone can raise it. The mapping holds for accuracy; a score that is not linear in the
errors (MCC, F1) has no such bound.

**Estimate.** Each observation holds every exit's answer and score, so the agreement that any
candidate threshold WOULD give is counted on the window directly: for each record, the exit
the policy would take under the candidate (``candidate_exits``, the same comparisons as
``policies.leaves``), and whether that exit's answer is the last exit's. This does not depend
on the threshold in force when the record was served, so a window collected under one
threshold judges them all. The shadow sample is uniform over the traffic (``shadow``: picked
before the exit is known), so the window's share is an unbiased estimate of the traffic's.

**Window rule** (``Controller.update``, every ``every`` new observations):

1. No move while the window holds fewer than ``ready`` observations: ``min_window``, or more
   when that is too few for a flawless window to show ``target + hysteresis`` (the bound of
   ``n`` agreeing observations out of ``n`` is ``n / (n + z^2)``), at most the window. On
   fewer, every candidate fails whatever the traffic, so the rule would tighten on the
   sample's size alone, and could not loosen back until the window had grown.
2. For each candidate ``c`` between the offline threshold and the strictest one (the grid of
   ``candidates``: never looser than offline), ``L(c)`` = the Wilson lower bound, one-sided at
   ``confidence``, of the window's agreement under ``c`` (``wilson_lower``). Few observations
   give a wide interval: ``L`` falls below the observed share by ~``z * sqrt(a (1 - a) / n)``.
3. The goal ``g`` is the cheapest candidate (least mean exit layer over the window; ties: the
   one nearer the offline threshold) with ``L(g) >= target``; none meets it: the strictest.
   Hysteresis: a candidate looser than the current threshold must meet ``target +
   hysteresis`` to count, so the threshold does not flap on a bound that hovers at the target.
4. The threshold moves toward ``g`` by at most ``max_step`` (in the threshold's own units);
   every move is an ``Event`` with its reason, kept in ``Controller.events``.

**Fast rule** (tighten on evidence of failure, checked first at every update, from
``recent_min`` observations on, before ``ready`` too): on the newest ``recent`` observations
(fewer while the window holds fewer), ``U(c)`` = the Wilson upper bound, one-sided at
``confidence``, of the agreement under ``c`` (``wilson_upper``). When ``U`` of the current
threshold is below the target, that threshold is shown to fail, and the rule moves straight
to its goal: the cheapest candidate stricter than the current one whose share on that recent
sample meets the target (the strictest if none). A failure can be shown on few observations
(a few disagreements put ``U`` below the target), success cannot (step 1), and a flawless
sample never moves this rule (its ``U`` is 1); a tightening costs layers, not the budget, so
this move is not bounded by ``max_step``. The window rule's looser candidates must
also meet the target on the recent sample: the fast rule's goal is the cheapest that does, so
the window rule cannot undo a fast tightening while the recent sample stays as it was.

The window is the last ``window`` observations; the window rule judges it, so when the
traffic returns, the drifted records leave the window and the goal comes back to the offline
threshold, one bounded step per update. Patience moves in whole steps; confidence and entropy
on their grid (``GRID_POINTS`` values between the offline threshold and the strictest).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass, field
from statistics import NormalDist

import numpy as np

from aclpipe.early_exit.shadow import Observation
from aclpipe.errors import UserError

MIN_HARM = 0.25  # never trust dev to say that fewer than a quarter of disagreements cost one
GRID_POINTS = 51  # candidate thresholds between the offline one and the strictest
EVENTS_KEPT = 256  # the newest moves a controller keeps (a server runs for months)


def target_agreement(budget_points: float, harm: float = 1.0) -> float:
    """The agreement that keeps accuracy within ``budget_points`` of the full model's when a
    share ``harm`` of the disagreements (net) costs a correct answer (module docstring)."""
    if not 0 < harm <= 1:
        raise UserError(f"harm must be in (0, 1], got {harm}")
    return max(0.0, 1.0 - (budget_points / 100) / harm)


def wilson_lower(successes: np.ndarray | int, n: int, confidence: float) -> np.ndarray:
    """Wilson score lower bound of a proportion, one-sided at ``confidence`` (Wilson 1927, eq.
    for the score interval without continuity correction); 0 when ``n`` is 0."""
    z = NormalDist().inv_cdf(confidence)
    k = np.asarray(successes, dtype=np.float64)
    if n == 0:
        return np.zeros_like(k)
    p = k / n
    centre = p + z * z / (2 * n)
    spread = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return np.maximum(0.0, (centre - spread) / (1 + z * z / n))


def wilson_upper(successes: np.ndarray | int, n: int, confidence: float) -> np.ndarray:
    """Wilson score upper bound, one-sided at ``confidence``: one minus the lower bound of the
    failures' share (the interval is symmetric in successes and failures); 1 when ``n`` is 0."""
    if n == 0:
        return np.ones_like(np.asarray(successes, dtype=np.float64))
    return 1.0 - wilson_lower(n - np.asarray(successes, dtype=np.float64), n, confidence)


def harm_bound(
    early: np.ndarray, full: np.ndarray, labels: np.ndarray, confidence: float = 0.95
) -> float:
    """A one-sided upper bound on ``harm`` from labelled records (the export's dev logits):
    ``early`` and ``full`` the answers ``[N]``, ``labels`` the gold ``[N]``. Of the
    disagreements where exactly one side is right, ``p`` is the share the full model wins;
    ``harm <= 2 p - 1`` (records where both are wrong count 0), bounded above through
    Wilson's lower bound of ``1 - p``; at least ``MIN_HARM``, 1 with no such disagreement."""
    differ = early != full
    full_wins = int((differ & (full == labels)).sum())
    early_wins = int((differ & (early == labels)).sum())
    decided = full_wins + early_wins
    if decided == 0:
        return 1.0
    p_upper = 1.0 - float(wilson_lower(early_wins, decided, confidence))
    return min(1.0, max(MIN_HARM, 2 * p_upper - 1))


def observations_needed(target: float, confidence: float) -> float:
    """The fewest observations ``n`` whose Wilson lower bound, all ``n`` agreeing, reaches
    ``target``: ``n / (n + z^2) >= target``, so ``n >= z^2 target / (1 - target)``; infinite
    for a target of 1 or more."""
    if target >= 1:
        return math.inf
    z = NormalDist().inv_cdf(confidence)
    return math.ceil(z * z * target / (1 - target) - 1e-9)


def candidates(policy: str, offline: float, num_exits: int) -> np.ndarray:
    """Thresholds from the offline one (first) to the strictest (last): confidence up to 1,
    entropy down to 0, patience up to ``E - 1`` (all of them the full model or nearly)."""
    if policy == "confidence":
        return np.unique(np.r_[np.linspace(offline, 1.0, GRID_POINTS), offline])
    if policy == "entropy":
        return np.unique(np.r_[np.linspace(0.0, offline, GRID_POINTS), offline])[::-1]
    if policy == "patience":
        return np.arange(int(offline), max(int(offline), num_exits - 1) + 1, dtype=np.float64)
    raise UserError(
        f"policy {policy!r} cannot be recalibrated: use confidence, entropy or patience"
    )


def candidate_exits(
    policy: str, thresholds: np.ndarray, scores: np.ndarray, runs: np.ndarray
) -> np.ndarray:
    """Exit index ``[G, N]`` each of ``N`` records takes under each of ``G`` thresholds:
    the first exit ``k < E - 1`` whose score passes (confidence ``>= t``, entropy ``< t``,
    patience: the answer unchanged for ``t`` exits), else the last. ``scores`` ``[N, E]`` is
    the policy's score per exit (confidence or entropy), ``runs`` ``[N, E]`` how many exits
    before ``k`` in a row gave exit ``k``'s answer (patience)."""
    # A record leaves at the first exit whose score passes, so at the first k where the best
    # score so far passes: the running best is monotone, and the exit is how many of the
    # first E - 1 running bests fail (one comparison and one sum, no search).
    t = thresholds[:, None, None]  # [G, 1, 1]
    if policy == "entropy":
        fails = np.minimum.accumulate(scores[:, :-1], axis=1)[None] >= t  # [G, N, E-1]
    else:
        best = scores if policy == "confidence" else runs
        fails = np.maximum.accumulate(best[:, :-1], axis=1)[None] < t
    return fails.sum(-1)  # [G, N]


@dataclass(frozen=True)
class Event:
    """One threshold move, as logged: when (observations seen), from, to, which rule, why."""

    seen: int
    old: float
    new: float
    goal: float
    reason: str
    window: int  # observations in the window
    agreement: float  # the window's agreement under the new threshold
    lower_bound: float  # its Wilson lower bound
    target: float
    rule: str = "window"  # "fast" (the recent sample shows a failure) or "window"

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Controller:
    """Threshold moves from shadow observations (module docstring). ``observe`` each one;
    ``threshold`` is the one to serve with; ``events`` the newest moves, each also returned
    by the ``observe`` call that made it (a server logs it there)."""

    policy: str
    offline: float  # the export's threshold: the loosest this controller ever serves
    exit_layers: list[int]  # 1-based layer of each exit (the cost of leaving there)
    target: float  # the agreement to keep (target_agreement)
    window: int = 1000  # observations judged (the newest)
    min_window: int = 200  # no move on fewer (nor on fewer than ``ready``)
    every: int = 25  # observations between updates
    confidence: float = 0.95  # of the one-sided Wilson bound
    hysteresis: float = 0.005  # a looser goal must meet target + this
    max_step: float = 0.05  # per window-rule update, threshold units (patience: 1)
    recent: int = 150  # newest observations the fast rule judges (at most the window); 0: off
    recent_min: int = 50  # no fast move on fewer
    adjust: bool = True  # False: keep the window and its status, never move (watch only)
    threshold: float = field(init=False)
    events: deque[Event] = field(init=False)  # the newest EVENTS_KEPT moves
    moves: int = field(init=False, default=0)  # all of them
    seen: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if self.min_window < 1 or self.window < self.min_window:
            raise UserError(
                f"the window ({self.window}) must hold at least min_window ({self.min_window}) "
                "observations, and min_window at least 1"
            )
        if self.recent and not 1 <= self.recent_min <= min(self.recent, self.window):
            raise UserError(
                f"the fast rule needs 1 <= recent_min ({self.recent_min}) <= recent "
                f"({self.recent}) and the window ({self.window}); recent 0 turns it off"
            )
        self.threshold = float(self.offline)
        flawless = observations_needed(self.target + self.hysteresis, self.confidence)
        self.ready = int(min(self.window, max(self.min_window, flawless)))  # rule, step 1
        self.events = deque(maxlen=EVENTS_KEPT)
        self.grid = candidates(self.policy, self.offline, len(self.exit_layers))
        num_exits = len(self.exit_layers)
        self._scores = np.zeros((self.window, num_exits))  # ring buffers, [W, E]
        self._runs = np.zeros((self.window, num_exits))
        self._agree = np.zeros((self.window, num_exits), dtype=bool)  # exit k's answer = last's
        self._served = np.zeros(self.window, dtype=np.int64)  # the exit each was served from
        self._filled = 0

    def observe(self, observation: Observation) -> Event | None:
        """Add one observation; the move it triggered, if any."""
        slot = self.seen % self.window
        self._scores[slot] = observation.scores(self.policy)
        self._runs[slot] = observation.runs()
        self._agree[slot] = observation.agrees()
        self._served[slot] = observation.exit
        self.seen += 1
        self._filled = min(self._filled + 1, self.window)
        first = min(self.ready, self.recent_min) if self.recent else self.ready
        if not self.adjust or self._filled < first or self.seen % self.every:
            return None
        return self.update()

    def _counts(
        self, thresholds: np.ndarray, newest: int | None
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """Per threshold: agreeing observations and mean exit layer over the window, or over
        its ``newest`` observations; and how many were counted."""
        n = self._filled if newest is None else min(newest, self._filled)
        rows = np.arange(self.seen - n, self.seen) % self.window  # the ring's newest n
        exits = candidate_exits(self.policy, np.asarray(thresholds, dtype=np.float64),
                                self._scores[rows], self._runs[rows])  # fmt: skip  # [G, n]
        agreed = np.take_along_axis(self._agree[rows][None], exits[..., None], -1)[..., 0]
        layers = np.asarray(self.exit_layers)[exits].mean(1) if n else np.zeros(len(exits))
        return agreed.sum(1), layers, n

    def estimate(self, thresholds: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per threshold: the window's agreement, its Wilson lower bound and mean exit layer."""
        agreed, layers, n = self._counts(thresholds, None)
        return agreed / max(n, 1), wilson_lower(agreed, n, self.confidence), layers

    def estimate_recent(
        self, thresholds: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """Per threshold, on the fast rule's sample (the newest ``recent`` observations): the
        agreement, its Wilson upper bound, the mean exit layer; and the sample's size."""
        agreed, layers, n = self._counts(thresholds, self.recent)
        return agreed / max(n, 1), wilson_upper(agreed, n, self.confidence), layers, n

    def status(self) -> dict:
        """What a server shows (``/info``, ``/metrics``): the threshold, the window's agreement
        under it with its lower bound, and per exit the records served there and the share of
        them whose answer was the full model's (the answers as served, whatever threshold was
        in force then)."""
        n = self._filled
        share = lower = None
        if n:
            (share,), (lower,), _ = self.estimate(np.array([self.threshold]))
        served, agree = self._served[:n], self._agree[:n]
        per_exit = []
        for k, layer in enumerate(self.exit_layers):
            mine = served == k
            count = int(mine.sum())
            per_exit.append({"exit_layer": layer, "served": count,
                             "agreement": float(agree[mine, k].mean()) if count else None})  # fmt: skip
        return {
            "policy": self.policy,
            "threshold": self.threshold,
            "offline": self.offline,
            "target": self.target,
            "window": n,
            "ready": self.ready,
            "agreement": None if share is None else float(share),
            "lower_bound": None if lower is None else float(lower),
            "moves": self.moves,
            "per_exit": per_exit,
        }

    def _stricter(self, a: float, b: float) -> bool:
        """Whether threshold ``a`` is stricter than ``b`` under this policy."""
        return a < b if self.policy == "entropy" else a > b

    def update(self) -> Event | None:
        """One step of the rules (module docstring) on the window as it is: the fast rule
        first; the window rule when the fast one does not move and ``ready`` is reached."""
        fast = bool(self.recent) and min(self._filled, self.recent) >= self.recent_min
        if fast:
            event = self._fast()
            if event is not None:
                return event
        if self._filled < self.ready:
            return None
        share, lower, layers = self.estimate(self.grid)
        looser = np.array([self._stricter(self.threshold, c) for c in self.grid])  # [G]
        eligible = lower >= self.target + np.where(looser, self.hysteresis, 0.0)
        if fast and (eligible & looser).any():  # a looser candidate must also meet the target
            recent, *_ = self.estimate_recent(self.grid)  # on the recent sample, so that this
            eligible &= ~looser | (recent >= self.target)  # rule cannot undo the fast one
        order = np.lexsort((np.arange(len(self.grid)), layers))  # cheapest, then nearest offline
        chosen = [i for i in order if eligible[i]]
        goal_index = chosen[0] if chosen else len(self.grid) - 1
        if not chosen:
            why = "no candidate meets the target: the strictest"
        elif looser[goal_index]:
            why = f"cheapest candidate meeting target + hysteresis {self.hysteresis:g}"
        else:
            why = "cheapest candidate meeting the target"
        goal = float(self.grid[goal_index])
        step = 1.0 if self.policy == "patience" else self.max_step
        new = min(max(goal, self.threshold - step), self.threshold + step)
        if new == self.threshold:
            return None
        old = self.threshold
        (old_share,), (old_lower,), _ = self.estimate(np.array([old]))
        reason = (
            f"agreement under {old:g} is {old_share:.4f} (lower bound {old_lower:.4f}, "
            f"n={self._filled}) against target {self.target:.4f}; goal {goal:g} ({why}, bound "
            f"{lower[goal_index]:.4f}); step {abs(new - old):g}"
        )
        return self._move(new, goal, "window", reason)

    def _fast(self) -> Event | None:
        """The fast rule (module docstring) on the newest ``recent`` observations."""
        (now_share,), (now_upper,), _, _ = self.estimate_recent(np.array([self.threshold]))
        if now_upper >= self.target:
            return None  # the current threshold is not shown to fail
        stricter = np.array([self._stricter(c, self.threshold) for c in self.grid])  # [G]
        if not stricter.any():
            return None  # already the strictest
        share, _, layers, n = self.estimate_recent(self.grid)
        meets = stricter & (share >= self.target)
        order = np.lexsort((np.arange(len(self.grid)), layers))  # cheapest, then nearest offline
        chosen = [i for i in order if meets[i]]
        goal_index = chosen[0] if chosen else len(self.grid) - 1
        why = "cheapest stricter candidate meeting the target there"
        if not chosen:
            why = "no stricter candidate meets the target there: the strictest"
        goal = float(self.grid[goal_index])
        reason = (
            f"agreement under {self.threshold:g} on the newest {n} observations is "
            f"{now_share:.4f} (upper bound {now_upper:.4f}) against target "
            f"{self.target:.4f}; goal {goal:g} ({why}, {share[goal_index]:.4f}); step "
            f"{abs(goal - self.threshold):g}"
        )
        return self._move(goal, goal, "fast", reason)

    def _move(self, new: float, goal: float, rule: str, why: str) -> Event:
        """Serve ``new`` from now on; the move's ``Event``, kept and counted."""
        old, self.threshold = self.threshold, new
        (now_share,), (now_lower,), _ = self.estimate(np.array([new]))
        direction = "tighten" if self._stricter(new, old) else "loosen"
        event = Event(self.seen, old, new, goal, f"{direction} ({rule} rule): {why}",
                      self._filled, float(now_share), float(now_lower), self.target, rule)  # fmt: skip
        self.events.append(event)
        self.moves += 1
        return event
