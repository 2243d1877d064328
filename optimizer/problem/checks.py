"""Validation helpers shared by the problem-model classes: each failure names the field and the fix."""

from __future__ import annotations

from optimizer.errors import ProblemError


def require_int(value: object, field: str, hint: str, minimum: int = 1) -> None:
    """``value`` must be an integer (not a bool) of at least ``minimum``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ProblemError(f"must be an integer >= {minimum}, got {value!r}", field=field, hint=hint)


def require_number(value: object, field: str, hint: str, *, positive: bool = True) -> None:
    """``value`` must be a number (not a bool), > 0 when ``positive`` else >= 0."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (value > 0 if positive else value >= 0)
    if not ok:
        raise ProblemError(f"must be a number {'> 0' if positive else '>= 0'}, got {value!r}", field=field, hint=hint)
