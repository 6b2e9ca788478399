"""The methods and their knobs: one typed record per method, each default written once.

This is the method table that everything else asks: the config
(``params.yaml``'s ``methods.<name>`` sections fill these records, strictly: a knob a method
does not read is an error), the campaign, and ``aclpipe.training.methods``, which builds
each method's stages from its record. It imports nothing heavy (no torch), so that listing or
checking a method name costs nothing. The registry (each method's name, in order, with its
record's and its builder's names) and the name check are in ``aclpipe.method_names``, which
the command line reads so that ``aclpipe predict`` loads nothing of training. Definitions and defaults: docs/methods.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from aclpipe.checks import Check, non_negative, positive, unit
from aclpipe.errors import UserError
from aclpipe.method_names import METHOD_NAMES, REGISTRY, check_method

__all__ = ["KNOBS", "METHOD_NAMES", "check_method"]  # the names and their check, as before

# Parameters a gradient rule looks at: every encoder parameter | the transformer layers' weight
# matrices (RomeBERT's GR) | every trained parameter (docs/methods.md, "Scopes").
Scope = Literal["encoder", "encoder-weights", "all"]

# Per-exit CE weights of the multi-exit methods: uniform 1/|E| | linear l_k / sum l (PABEE).
ExitWeights = Literal["uniform", "linear"]
KlReduction = Literal["batchmean", "mean"]


# Knobs: one record per method (docs/methods.md gives every default), each with its range checks
# (``RANGES``: knob -> a check of aclpipe.checks; a record inherits its parents') ------------


def _degrees(key: str, value: Any) -> None:
    if not 0 <= value <= 180:
        raise UserError(f"{key} must be in [0, 180] degrees, got {value!r}")


@dataclass(frozen=True)
class NoKnobs:
    """ce and deebert take no knobs."""


@dataclass(frozen=True)
class SclKnobs:
    """scl: ``(1 - lam) CE + lam SupCon`` (Gunel et al. 2020, whose defaults these are)."""

    tau: float = 0.3  # SupCon temperature
    lam: float = 0.3  # weight of the SupCon term (CE gets 1 - lam)
    # ACL-Grad's drop rule on scl (a variant: where the rule fires, docs/claims.md A3); off in scl
    acl_grad: bool = False  # drop the SupCon term at a step whose gradients conflict
    max_angle: float = 90.0  # the gradients conflict above this angle (degrees)
    grad_scope: Scope = "encoder"  # parameters the cosine is taken over

    RANGES: ClassVar[dict[str, Check]] = {"tau": positive, "lam": non_negative}


@dataclass(frozen=True)
class AclKnobs:
    """acl: ``CE + lam L_acl`` (ACL-Embed), combined by ACL-Grad."""

    tau: float = 0.1  # SupCon temperature of L_acl
    lam: float = 0.5  # weight of L_acl
    acl_grad: bool = True  # ACL-Grad: drop L_acl at a step whose gradients conflict (False: sum)
    max_angle: float = 90.0  # ACL-Grad: the gradients conflict above this angle (degrees)
    grad_scope: Scope = "encoder"  # parameters ACL-Grad's cosine is taken over

    RANGES: ClassVar[dict[str, Check]] = {
        "tau": positive,
        "lam": non_negative,
        "max_angle": _degrees,
    }


@dataclass(frozen=True)
class JointKnobs:
    """joint: ``sum_k w_k CE(logits_k, y)``."""

    weights: ExitWeights = "uniform"  # w_k: uniform 1/|E| | linear l_k / sum l (PABEE)


@dataclass(frozen=True)
class DeebertSdKnobs:
    """deebert-sd: stage 2 minimises ``sum_{k<L} SD_k`` (RomeBERT's self-distillation term)."""

    gamma: float = 0.9  # weight of the KL part of SD_k (CE gets 1 - gamma)
    T: float = 3.0  # distillation temperature
    # the KL's average: over examples (batchmean, the KL itself, docs/methods.md), or over examples
    # and classes (mean: RomeBERT's released code, nn.KLDivLoss()'s default, i.e. KL / C)
    kl_reduction: KlReduction = "batchmean"

    RANGES: ClassVar[dict[str, Check]] = {"gamma": unit, "T": positive}


@dataclass(frozen=True)
class RomebertKnobs(DeebertSdKnobs):
    """romebert: deebert-sd's ``SD_k`` knobs, and Gradient Regularization against the final CE."""

    gr: bool = True  # Gradient Regularization on conflict (False: plain sum)
    grad_scope: Scope = "encoder-weights"  # GR's parameters: layer weight matrices, as its code


@dataclass(frozen=True)
class AclClKnobs(AclKnobs, JointKnobs, DeebertSdKnobs):
    """acl-cl: acl's knobs at the deepest exit, joint's exit weights for the main term,
    deebert-sd's ``gamma`` and ``T`` for the KL term (with ``sd``), and these."""

    lam_cl: float = 0.5  # weight of the cross-layer ACL term (a mean over student exits)
    sd: bool = False  # add the KL self-distillation term (an ablation)

    RANGES: ClassVar[dict[str, Check]] = {"lam_cl": non_negative}  # and its parents'


@dataclass(frozen=True)
class SimcseUnsupKnobs:
    """simcse-unsup: InfoNCE between two dropout encodings of each sentence (Gao et al. 2021)."""

    tau: float = 0.05  # temperature of the cosine similarities (SimCSE's and Oh et al.'s)

    RANGES: ClassVar[dict[str, Check]] = {"tau": positive}


@dataclass(frozen=True)
class SimcseSupKnobs:
    """simcse-sup: InfoNCE over labelled positive pairs, in-batch and hard negatives."""

    tau: float = 0.05  # temperature of the cosine similarities (SimCSE's and Oh et al.'s)

    RANGES: ClassVar[dict[str, Check]] = {"tau": positive}


@dataclass(frozen=True)
class CosinePairsKnobs:
    """cosine-pairs: SetFit's cosine-similarity pairs, then logistic-regression heads."""

    C: float = 1.0  # the heads' inverse L2 strength (scikit-learn's default, SetFit's head)
    max_iter: int = 1000  # lbfgs iterations at most per head

    RANGES: ClassVar[dict[str, Check]] = {"C": positive, "max_iter": positive}


# The method table: name -> its knobs record, in the registry's order (aclpipe.method_names,
# which names each method's record; a name missing here fails at import)
KNOBS: dict[str, type] = {name: globals()[record] for name, (record, _) in REGISTRY.items()}
