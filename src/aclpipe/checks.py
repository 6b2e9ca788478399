"""Range checks of params.yaml values, for each component to list beside its own defaults.

A config dataclass (``TrainConfig``, a method's knobs record, ...) names its checked fields
in a ``RANGES`` class attribute: field -> a check from here. ``aclpipe.config`` calls the
check right after reading the value (its type already checked) with the dotted key, so the
one-line ``UserError`` names the key and the fix. ``None`` (an optional value left unset) is
never checked. Subclasses inherit their parents' ``RANGES`` (``range_check``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aclpipe.errors import UserError

Check = Callable[[str, Any], None]  # (dotted key, value) -> None, or a UserError
FIX = "fix it in params.yaml or --set"


def positive(key: str, value: Any) -> None:
    if value <= 0:
        raise UserError(f"{key} must be > 0, got {value!r}: {FIX}")


def non_negative(key: str, value: Any) -> None:
    if value < 0:
        raise UserError(f"{key} must be >= 0, got {value!r}: {FIX}")


def unit(key: str, value: Any) -> None:
    """A share or a probability: in [0, 1]."""
    if not 0 <= value <= 1:
        raise UserError(f"{key} must be in [0, 1], got {value!r}: {FIX}")


def one_of(*choices: str) -> Check:
    """A string knob with a fixed set of values (a ``Literal`` type checks itself)."""

    def check(key: str, value: Any) -> None:
        if value not in choices:
            raise UserError(f"{key} is {value!r}: use one of {', '.join(choices)}")

    return check


def all_of(*checks: Check) -> Check:
    """Each of ``checks`` in turn: the first that fails speaks."""

    def check(key: str, value: Any) -> None:
        for each in checks:
            each(key, value)

    return check


def range_check(cls: type, name: str) -> Check | None:
    """The check of field ``name`` of ``cls``: its own ``RANGES`` entry, else a parent's."""
    for klass in cls.__mro__:
        found = vars(klass).get("RANGES", {}).get(name)
        if found is not None:
            return found
    return None
