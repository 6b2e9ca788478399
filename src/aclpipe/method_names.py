"""The method registry: every method's name, in the CLI's and the reports' order, with its knobs
record and its builder, and the one check of a name.

The knobs table (``aclpipe.training.knobs.KNOBS``) and the catalogue
(``aclpipe.training.methods.METHODS``) are built from ``REGISTRY`` when they load; this module
imports nothing of training, so that the command line can list and check methods and the
serving path (``aclpipe predict``) does not know training exists.
"""

from __future__ import annotations

from aclpipe.errors import UserError

# The method registry: every method, in the CLI's and the reports' order, with the names of its
# knobs record (a class of aclpipe.training.knobs) and its builder (a function of
# aclpipe.training.methods), named rather than imported so that this table loads nothing of
# training. A new method is its loss file, its knobs record and builder, and one line here.
REGISTRY: dict[str, tuple[str, str]] = {
    "ce": ("NoKnobs", "build_ce"),
    "scl": ("SclKnobs", "build_scl"),
    "acl": ("AclKnobs", "build_acl"),
    "joint": ("JointKnobs", "build_joint"),
    "deebert": ("NoKnobs", "build_deebert"),
    "deebert-sd": ("DeebertSdKnobs", "build_deebert_sd"),
    "romebert": ("RomebertKnobs", "build_romebert"),
    "acl-cl": ("AclClKnobs", "build_acl_cl"),
    "cosine-pairs": ("CosinePairsKnobs", "build_cosine_pairs"),
    "simcse-unsup": ("SimcseUnsupKnobs", "build_simcse_unsup"),
    "simcse-sup": ("SimcseSupKnobs", "build_simcse_sup"),
}
METHOD_NAMES: tuple[str, ...] = tuple(REGISTRY)


def check_method(name: str, problem: str | None = None) -> str:
    """``name`` if it is a method; else a one-line ``UserError``: ``problem`` (default
    ``unknown method 'name'``) followed by the valid names. Every method check goes here."""
    if not isinstance(name, str) or name not in METHOD_NAMES:
        what = problem or f"unknown method {name!r}"
        raise UserError(f"{what}: use one of {', '.join(METHOD_NAMES)}")
    return name
