"""Shadow observations: which records also run to the last exit, and what each one tells.

A server that exits early knows its early answers, not whether they are the full model's.
A shadow sample finds out: after a picked record's answer is sent, the layers it skipped run
too, and the record's answers and scores at every exit become an ``Observation`` that the
recalibrating controller (``early_exit.recalibrate``) reads.

**Which records** (``ShadowSampler.pick``): each record is drawn with probability
``fraction`` (a seeded ``random.Random``, so a run is repeatable), *before* its exit is known.
A drawn record that ran to the last exit is observed at no extra cost (its exits were all
computed anyway); a drawn record that left early costs the layers it skipped. Drawing before
the exit keeps the sample uniform over the traffic, so the window's agreement estimates the
traffic's; drawing only among early leavers would need weights to say anything about the
threshold's effect on the records that run to the end.

**How much** (a token bucket on compute): every served record credits ``share`` times its
served cost (seconds, or layers in an offline replay) to the bucket, which holds at most
``burst``; every shadow run debits its cost. A drawn record is refused while the bucket is
empty, so over any stretch the shadow work stays within ``share`` of the served work plus
``burst`` plus one record's cost (the last debit may overdraw). The refusal depends on
earlier records only, never on the record's own exit, so the sample stays uniform, thinned.

Pure: no clock, no threads, no model. The caller measures costs and runs the layers.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np

from aclpipe.errors import UserError


@dataclass(frozen=True)
class Observation:
    """One record seen at every exit: the exit it was served from, and per exit ``k`` its
    answer (argmax, first of ties), ``max p_k`` and ``H(p_k)`` (natural log), computed as
    ``policies.leaves`` computes them."""

    exit: int  # 0-based exit the record was served from
    labels: tuple[int, ...]  # [E]
    confidence: tuple[float, ...]  # [E]
    entropy: tuple[float, ...]  # [E]

    @property
    def agreed(self) -> bool:
        """Whether the served answer was the full model's (the last exit's)."""
        return self.labels[self.exit] == self.labels[-1]

    def agrees(self) -> list[bool]:
        """Per exit, whether its answer is the full model's ``[E]``."""
        return [label == self.labels[-1] for label in self.labels]

    def runs(self) -> list[int]:
        """Per exit ``k``, how many exits just before it in a row gave its answer ``[E]``:
        patience ``t`` leaves at ``k`` when this is at least ``t``."""
        out = [0]
        for before, label in zip(self.labels, self.labels[1:]):
            out.append(out[-1] + 1 if label == before else 0)
        return out

    def scores(self, policy: str) -> tuple[float, ...]:
        """The policy's score per exit (patience reads ``runs`` instead: its answers)."""
        return self.entropy if policy == "entropy" else self.confidence


def observe(logits, exit_taken: int) -> Observation:
    """The observation of a record run to the last exit: ``logits`` ``[E, C]`` (a list of
    rows or an array), and the exit it was served from."""
    rows = np.asarray(logits, dtype=np.float64).tolist()
    if not 0 <= exit_taken < len(rows):
        raise UserError(f"exit {exit_taken} is outside the record's {len(rows)} exits")
    labels, confidence, entropy = [], [], []
    for row in rows:  # the arithmetic of policies.leaves, so the scores compare alike
        top = max(row)
        shifted = [z - top for z in row]
        exp = [math.exp(d) for d in shifted]
        total = sum(exp)
        labels.append(row.index(top))
        confidence.append(1.0 / total)
        entropy.append(math.log(total) - sum(e * d for e, d in zip(exp, shifted)) / total)
    return Observation(exit_taken, tuple(labels), tuple(confidence), tuple(entropy))


class ShadowSampler:
    """Draws the shadow sample under a compute share (module docstring)."""

    def __init__(self, fraction: float, share: float, burst: float, seed: int = 0) -> None:
        if not 0 <= fraction <= 1:
            raise UserError(f"shadow fraction {fraction} is outside [0, 1]")
        if share < 0 or burst < 0:
            raise UserError(f"shadow share ({share}) and burst ({burst}) must be >= 0")
        self.fraction, self.share, self.burst = fraction, share, burst
        self._rng = random.Random(seed)
        self.balance = burst  # starts full: the first picks need no served work first
        self.drawn = self.refused = 0
        self.served_cost = self.shadow_cost = 0.0

    def pick(self) -> bool:
        """Whether the next record joins the sample (one draw per record, always made)."""
        if self._rng.random() >= self.fraction:
            return False
        self.drawn += 1
        if self.balance <= 0:
            self.refused += 1
            return False
        return True

    def served(self, cost: float) -> None:
        """A record was served at ``cost``: credit ``share`` of it."""
        self.served_cost += cost
        self.balance = min(self.burst, self.balance + self.share * cost)

    def charge(self, cost: float) -> None:
        """A picked record's shadow run took ``cost``."""
        self.shadow_cost += cost
        self.balance -= cost
