"""Methods as data: which objectives, which stages, which parameters, which gradient rule.

The training loop never looks at a method's name. It runs ``method.stages`` in order; in each
it trains the parameter groups ``stage.trains``, computes ``stage.main`` and ``stage.aux`` on
the model's all-exit output, and combines their gradients with ``stage.rule``
(``aclpipe.training.grad_rules``). Definitions: ../shared/METHODS.md. Adding a method means adding a
builder to ``METHODS`` (and, for a new loss, a file in ``aclpipe.training.objectives``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from aclpipe.config import MethodConfig
from aclpipe.errors import UserError
from aclpipe.training.objectives import (
    acl_embed_loss,
    cross_layer_acl_loss,
    distill_kl,
    scl_loss,
    self_distill_loss,
)


@dataclass
class LossInputs:
    """What every objective sees: the model's output at every exit, and the labels.

    With several processes, ``logits`` and ``labels`` are this process's shard while
    ``features`` and ``pool_labels`` are the whole global batch (``aclpipe.training.distributed``);
    per-sample means are weighted by ``local_weight``. With one process they coincide.
    """

    logits: torch.Tensor  # [E, B, C], this process's samples
    features: torch.Tensor  # [E, Bg, D], the global batch (the contrastive pool)
    label_embeddings: torch.Tensor  # [E, C, D]
    labels: torch.Tensor  # [B], long (float for regression)
    regression: bool
    feature_labels: torch.Tensor | None = None  # [Bg]; None: ``labels`` (one process)
    local_weight: float = 1.0  # makes DDP's average of per-sample means the global mean

    @property
    def pool_labels(self) -> torch.Tensor:
        return self.labels if self.feature_labels is None else self.feature_labels

    def ce(self, k: int) -> torch.Tensor:
        """The (weighted) task loss of exit ``k``."""
        return self.local_weight * task_loss(self.logits[k], self.labels, self.regression)


Objective = Callable[[LossInputs], torch.Tensor]


@dataclass(frozen=True)
class Stage:
    """One training stage: what it trains, what it minimises, how gradients combine."""

    trains: tuple[str, ...]  # parameter groups: encoder, final_exit, inner_exits
    main: Objective
    aux: Objective | None = None  # the term a gradient rule may drop or project against
    rule: str = "sum"  # sum | acl-grad | gr (aclpipe.training.grad_rules)
    grad_scope: str = "encoder"  # parameters the rule's cosine and projection look at
    max_angle: float = 90.0  # acl-grad: conflict above this angle (degrees)


@dataclass(frozen=True)
class Method:
    name: str
    multi_exit: bool  # False: one exit at the last layer (E = {L})
    stages: tuple[Stage, ...]


ALL = ("encoder", "final_exit", "inner_exits")


def task_loss(logits: torch.Tensor, labels: torch.Tensor, regression: bool) -> torch.Tensor:
    """CE for classification, MSE for regression (STS-B); ``logits [B, C]``, ``labels [B]``."""
    if regression:
        return F.mse_loss(logits.squeeze(-1), labels)
    return F.cross_entropy(logits, labels)


def exit_weights(num_exits: int, scheme: str) -> list[float]:
    """``uniform``: 1/|E|; ``linear``: k / sum k (PABEE). They sum to 1."""
    raw = [1.0] * num_exits if scheme == "uniform" else [float(k) for k in range(1, num_exits + 1)]
    return [w / sum(raw) for w in raw]


def _final_ce(x: LossInputs) -> torch.Tensor:
    return x.ce(-1)


def _inner(x: LossInputs) -> range:
    if x.logits.shape[0] < 2:
        raise UserError(
            "this method needs at least two exits: set model.exits to null or "
            "list two or more layers"
        )
    return range(x.logits.shape[0] - 1)


def _weighted_ce(scheme: str) -> Objective:
    def loss(x: LossInputs) -> torch.Tensor:
        weights = exit_weights(x.logits.shape[0], scheme)
        return sum(w * x.ce(k) for k, w in enumerate(weights))

    return loss


def _inner_ce(x: LossInputs) -> torch.Tensor:
    return sum(x.ce(k) for k in _inner(x))


def _inner_sd(cfg: MethodConfig) -> Objective:
    def loss(x: LossInputs) -> torch.Tensor:
        return x.local_weight * sum(
            self_distill_loss(
                x.logits[k], x.logits[-1], x.labels, cfg.gamma, cfg.T, regression=x.regression
            )
            for k in _inner(x)
        )

    return loss


def _needs_classes(x: LossInputs) -> None:
    if x.regression:
        raise UserError(
            "contrastive methods need class labels; STS-B is regression: "
            "use ce, joint, deebert, deebert-sd or romebert for stsb"
        )


def _scl_term(cfg: MethodConfig) -> Objective:
    def loss(x: LossInputs) -> torch.Tensor:
        _needs_classes(x)
        return cfg.lam * scl_loss(x.features[-1], x.pool_labels, cfg.tau)

    return loss


def _acl_term(cfg: MethodConfig) -> Objective:
    def loss(x: LossInputs) -> torch.Tensor:
        _needs_classes(x)
        return cfg.lam * acl_embed_loss(
            x.features[-1], x.pool_labels, x.label_embeddings[-1], cfg.tau
        )

    return loss


def _acl_cl_aux(cfg: MethodConfig) -> Objective:
    acl = _acl_term(cfg)

    def loss(x: LossInputs) -> torch.Tensor:
        inner = _inner(x)
        cross = sum(
            cross_layer_acl_loss(
                x.features[k], x.features[-1], x.pool_labels, x.label_embeddings[-1], cfg.tau
            )
            for k in inner
        )
        total = acl(x) + cfg.lam_cl * cross / len(inner)
        if cfg.sd:
            total = total + x.local_weight * sum(
                cfg.gamma * distill_kl(x.logits[k], x.logits[-1], cfg.T, regression=x.regression)
                for k in inner
            )
        return total

    return loss


def _ce(cfg: MethodConfig) -> Method:
    return Method("ce", False, (Stage(ALL, _final_ce),))


def _scl(cfg: MethodConfig) -> Method:
    def main(x: LossInputs) -> torch.Tensor:
        return (1 - cfg.lam) * _final_ce(x)

    return Method("scl", False, (Stage(ALL, main, _scl_term(cfg)),))


def _acl(cfg: MethodConfig) -> Method:
    rule = "acl-grad" if cfg.acl_grad else "sum"
    return Method(
        "acl", False, (Stage(ALL, _final_ce, _acl_term(cfg), rule, cfg.grad_scope, cfg.max_angle),)
    )


def _joint(cfg: MethodConfig) -> Method:
    return Method("joint", True, (Stage(ALL, _weighted_ce(cfg.weights)),))


def _deebert(cfg: MethodConfig) -> Method:
    return Method(
        "deebert",
        True,
        (Stage(("encoder", "final_exit"), _final_ce), Stage(("inner_exits",), _inner_ce)),
    )


def _deebert_sd(cfg: MethodConfig) -> Method:
    return Method(
        "deebert-sd",
        True,
        (Stage(("encoder", "final_exit"), _final_ce), Stage(("inner_exits",), _inner_sd(cfg))),
    )


def _romebert(cfg: MethodConfig) -> Method:
    rule = "gr" if cfg.gr else "sum"
    return Method("romebert", True, (Stage(ALL, _final_ce, _inner_sd(cfg), rule, cfg.grad_scope),))


def _acl_cl(cfg: MethodConfig) -> Method:
    rule = "acl-grad" if cfg.acl_grad else "sum"
    return Method(
        "acl-cl",
        True,
        (
            Stage(
                ALL,
                _weighted_ce(cfg.weights),
                _acl_cl_aux(cfg),
                rule,
                cfg.grad_scope,
                cfg.max_angle,
            ),
        ),
    )


METHODS: dict[str, Callable[[MethodConfig], Method]] = {
    "ce": _ce,
    "scl": _scl,
    "acl": _acl,
    "joint": _joint,
    "deebert": _deebert,
    "deebert-sd": _deebert_sd,
    "romebert": _romebert,
    "acl-cl": _acl_cl,
}


def build_method(name: str, cfg: MethodConfig) -> Method:
    return METHODS[check_method(name)](cfg)


def check_method(name: str, problem: str | None = None) -> str:
    """``name`` if ``METHODS`` has it; else a one-line ``UserError``: ``problem`` (default
    ``unknown method 'name'``) followed by the valid names. Every method check goes here."""
    if not isinstance(name, str) or name not in METHODS:
        raise UserError(f"{problem or f'unknown method {name!r}'}: use one of {', '.join(METHODS)}")
    return name
