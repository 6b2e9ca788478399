"""The method names, in the CLI's and the reports' order, and the one check of a name.

Apart from the method table (``aclpipe.training.knobs``, which holds each method's knobs
record under these names, in this order; tests/test_layering.py checks they agree) so that
the command line can list and check methods without loading anything of training: the
serving path (``aclpipe predict``) does not know training exists.
"""

from __future__ import annotations

from aclpipe.errors import UserError

METHOD_NAMES: tuple[str, ...] = (
    "ce",
    "scl",
    "acl",
    "joint",
    "deebert",
    "deebert-sd",
    "romebert",
    "acl-cl",
    "simcse-unsup",
    "simcse-sup",
)


def check_method(name: str, problem: str | None = None) -> str:
    """``name`` if it is a method; else a one-line ``UserError``: ``problem`` (default
    ``unknown method 'name'``) followed by the valid names. Every method check goes here."""
    if not isinstance(name, str) or name not in METHOD_NAMES:
        what = problem or f"unknown method {name!r}"
        raise UserError(f"{what}: use one of {', '.join(METHOD_NAMES)}")
    return name
