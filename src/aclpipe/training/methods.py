"""Methods as data: which objectives, which stages, which knobs, which gradient rule.

The training loop never looks at a method's name. It runs ``method.stages`` in order; in each
it trains the parameter groups ``stage.trains``, computes ``stage.main`` and ``stage.aux`` on
the model's all-exit output, and combines their gradients with ``stage.rule`` (a value from
``aclpipe.training.grad_rules``). Each method's knobs are one typed record below, with one
default per knob; params.yaml's ``methods.<name>`` section fills it (``aclpipe.config``).
Definitions: docs/methods.md. Adding a method means its loss (a file in
``aclpipe.training.objectives``), its knobs record (``aclpipe.training.knobs``), its builder
here (``build_<name>``), and one line in the registry, ``aclpipe.method_names.REGISTRY``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from aclpipe.errors import UserError
from aclpipe.method_names import REGISTRY
from aclpipe.training.grad_rules import (
    AclGrad,
    GradientRegularization,
    GradientRule,
    PlainSum,
)
from aclpipe.training.head_refit import LogisticRefit
from aclpipe.training.knobs import (
    KNOBS,
    AclClKnobs,
    AclKnobs,
    CosinePairsKnobs,
    DeebertSdKnobs,
    ExitWeights,
    JointKnobs,
    NoKnobs,
    RomebertKnobs,
    SclKnobs,
    SimcseSupKnobs,
    SimcseUnsupKnobs,
    check_method,
)
from aclpipe.training.objectives import (
    acl_embed_loss,
    cosine_pairs_loss,
    cross_layer_acl_loss,
    distill_kl,
    scl_loss,
    self_distill_loss,
    simcse_sup_loss,
    simcse_unsup_loss,
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
    exit_layers: list[int] = field(kw_only=True)  # [E], the 1-based layer of each exit

    def __post_init__(self) -> None:
        if len(self.exit_layers) != self.logits.shape[0]:
            raise ValueError(
                f"{len(self.exit_layers)} exit layers for {self.logits.shape[0]} exits' logits"
            )

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
    rule: GradientRule = PlainSum()  # how the main and aux gradients combine
    # encodings of each row per step: 2 for unsupervised SimCSE, whose positive is the same
    # sentence under another dropout mask (the loop encodes each row's sentences this often)
    views: int = 1
    # rows a batch needs for the objective to mean anything (in-batch negatives: 2); the loop
    # refuses a smaller train.batch_size and drops a smaller last batch
    min_rows: int = 1

    def separate_gradients(self, record_angles: bool) -> bool:
        """Whether a step takes the main and aux gradients apart (two autograd passes) rather
        than backpropagating their sum once: the rule looks at both, or angles are recorded."""
        return self.aux is not None and (self.rule.needs_both_gradients or record_angles)


@dataclass(frozen=True)
class Method:
    name: str
    multi_exit: bool  # False: one exit at the last layer (E = {L})
    stages: tuple[Stage, ...]
    # True: trains sentence embeddings on a sentence task (rows of sentences, dev scored by
    # the Spearman of cosine similarity); False: a classifier on a GLUE task
    embeds: bool = False
    # after the stages: every exit's classifier refit on the frozen encoder's features of the
    # training set (aclpipe.training.head_refit); None: the heads stay as the stages left them
    refit: LogisticRefit | None = None


ALL = ("encoder", "final_exit", "inner_exits")
# Sentence embeddings: the encoder and the final exit (its pooler; the classifier gets no
# gradient, so the optimizer leaves it as initialised)
EMBEDDING = ("encoder", "final_exit")


def task_loss(logits: torch.Tensor, labels: torch.Tensor, regression: bool) -> torch.Tensor:
    """CE for classification, MSE for regression (STS-B); ``logits [B, C]``, ``labels [B]``."""
    if regression:
        return F.mse_loss(logits.squeeze(-1), labels)
    return F.cross_entropy(logits, labels)


def exit_weights(exit_layers: list[int], scheme: ExitWeights) -> list[float]:
    """``uniform``: 1/|E|; ``linear``: l_k / sum l, with l_k exit k's layer (PABEE). They sum
    to 1."""
    raw = [1.0] * len(exit_layers) if scheme == "uniform" else [float(k) for k in exit_layers]
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


def _weighted_ce(scheme: ExitWeights) -> Objective:
    def loss(x: LossInputs) -> torch.Tensor:
        weights = exit_weights(x.exit_layers, scheme)
        return sum(w * x.ce(k) for k, w in enumerate(weights))

    return loss


def _inner_ce(x: LossInputs) -> torch.Tensor:
    return sum(x.ce(k) for k in _inner(x))


def _inner_sd(cfg: DeebertSdKnobs) -> Objective:
    def loss(x: LossInputs) -> torch.Tensor:
        return x.local_weight * sum(
            self_distill_loss(
                x.logits[k],
                x.logits[-1],
                x.labels,
                cfg.gamma,
                cfg.T,
                regression=x.regression,
                kl_reduction=cfg.kl_reduction,
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


def _scl_term(cfg: SclKnobs) -> Objective:
    def loss(x: LossInputs) -> torch.Tensor:
        _needs_classes(x)
        return cfg.lam * scl_loss(x.features[-1], x.pool_labels, cfg.tau)

    return loss


def _acl_term(cfg: AclKnobs) -> Objective:
    def loss(x: LossInputs) -> torch.Tensor:
        _needs_classes(x)
        return cfg.lam * acl_embed_loss(
            x.features[-1], x.pool_labels, x.label_embeddings[-1], cfg.tau
        )

    return loss


def _acl_cl_aux(cfg: AclClKnobs) -> Objective:
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
                cfg.gamma
                * distill_kl(
                    x.logits[k],
                    x.logits[-1],
                    cfg.T,
                    regression=x.regression,
                    reduction=cfg.kl_reduction,
                )
                for k in inner
            )
        return total

    return loss


def build_ce(cfg: NoKnobs) -> Method:
    return Method("ce", False, (Stage(ALL, _final_ce),))


def build_scl(cfg: SclKnobs) -> Method:
    def main(x: LossInputs) -> torch.Tensor:
        return (1 - cfg.lam) * _final_ce(x)

    return Method("scl", False, (Stage(ALL, main, _scl_term(cfg), _acl_grad(cfg)),))


def _acl_grad(cfg: AclKnobs | SclKnobs) -> GradientRule:
    """ACL-Grad's drop rule where ``cfg.acl_grad`` (acl's default; a variant of scl), else the sum."""
    return AclGrad(cfg.max_angle, cfg.grad_scope) if cfg.acl_grad else PlainSum(cfg.grad_scope)


def build_acl(cfg: AclKnobs) -> Method:
    return Method("acl", False, (Stage(ALL, _final_ce, _acl_term(cfg), _acl_grad(cfg)),))


def build_joint(cfg: JointKnobs) -> Method:
    return Method("joint", True, (Stage(ALL, _weighted_ce(cfg.weights)),))


def build_deebert(cfg: NoKnobs) -> Method:
    return Method(
        "deebert",
        True,
        (Stage(("encoder", "final_exit"), _final_ce), Stage(("inner_exits",), _inner_ce)),
    )


def build_deebert_sd(cfg: DeebertSdKnobs) -> Method:
    return Method(
        "deebert-sd",
        True,
        (Stage(("encoder", "final_exit"), _final_ce), Stage(("inner_exits",), _inner_sd(cfg))),
    )


def build_romebert(cfg: RomebertKnobs) -> Method:
    rule = GradientRegularization(cfg.grad_scope) if cfg.gr else PlainSum(cfg.grad_scope)
    return Method("romebert", True, (Stage(ALL, _final_ce, _inner_sd(cfg), rule),))


def build_acl_cl(cfg: AclClKnobs) -> Method:
    stage = Stage(ALL, _weighted_ce(cfg.weights), _acl_cl_aux(cfg), _acl_grad(cfg))
    return Method("acl-cl", True, (stage,))


def build_cosine_pairs(cfg: CosinePairsKnobs) -> Method:
    # SetFit's recipe (Tunstall et al. 2022) as a multi-exit method: the encoder learns from
    # every in-batch pair at the deepest exit; then each exit's head is a logistic regression
    # on its own frozen features, so the shallow exits are as usable for early exit as the last
    def loss(x: LossInputs) -> torch.Tensor:
        _needs_classes(x)
        return cosine_pairs_loss(x.features[-1], x.pool_labels)

    refit = LogisticRefit(cfg.C, cfg.max_iter)
    return Method("cosine-pairs", True, (Stage(("encoder",), loss, min_rows=2),), refit=refit)


def build_simcse_unsup(cfg: SimcseUnsupKnobs) -> Method:
    # features[-1]: [2B, D], each row's two dropout encodings consecutively (views=2)
    def loss(x: LossInputs) -> torch.Tensor:
        return simcse_unsup_loss(x.features[-1], cfg.tau)

    return Method("simcse-unsup", False, (Stage(EMBEDDING, loss, views=2, min_rows=2),), True)


def build_simcse_sup(cfg: SimcseSupKnobs) -> Method:
    # features[-1]: [S, D], each row's anchor, positive and hard negative consecutively; a
    # sentence task's labels are each row's number of sentences (modeling.batching)
    def loss(x: LossInputs) -> torch.Tensor:
        return simcse_sup_loss(x.features[-1], x.pool_labels, cfg.tau)

    return Method("simcse-sup", False, (Stage(EMBEDDING, loss, min_rows=2),), True)


class MethodEntry(NamedTuple):
    knobs: type  # the method's knobs record; params.yaml's methods.<name> fills it
    build: Callable[[Any], Method]  # knobs -> the method


# The catalogue: every method by name, in the table's order.
# (the registry, aclpipe.method_names.REGISTRY, names each method's builder here; a name missing
# fails at import, not at the method's first run)
METHODS: dict[str, MethodEntry] = {
    name: MethodEntry(KNOBS[name], globals()[builder]) for name, (_, builder) in REGISTRY.items()
}


def method_entry(name: str) -> MethodEntry:
    return METHODS[check_method(name)]


def build_method(name: str, knobs: Any) -> Method:
    """The method ``name`` with its knobs (an instance of ``METHODS[name].knobs``)."""
    entry = method_entry(name)
    if type(knobs) is not entry.knobs:
        raise TypeError(f"method {name} takes {entry.knobs.__name__}, got {knobs!r}")
    return entry.build(knobs)
