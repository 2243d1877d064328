"""Validation helpers shared by the problem-model classes: each failure names the field and the fix."""

from __future__ import annotations

import math
from dataclasses import dataclass

from optimizer.errors import ProblemError

FLOAT_BITS = 1000
"""Integers of more bits than this are refused wherever a number is asked for: they are beyond a float."""
SHOWN_CHARACTERS = 40
"""Longest rendering of a refused value in an error message (a value of thousands of digits is cut)."""


def require_int(value: object, field: str, hint: str, minimum: int = 1) -> None:
    """``value`` must be an integer (not a bool) of at least ``minimum``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ProblemError(f"must be an integer >= {minimum}, got {shown(value)}", field=field, hint=hint)


def require_number(value: object, field: str, hint: str, *, positive: bool = True) -> None:
    """``value`` must be a number (not a bool), > 0 when ``positive`` else >= 0."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (value > 0 if positive else value >= 0)
    if not ok:
        raise ProblemError(
            f"must be a number {'> 0' if positive else '>= 0'}, got {shown(value)}", field=field, hint=hint
        )


def shown(value: object) -> str:
    """``repr(value)``, cut to :data:`SHOWN_CHARACTERS` characters."""
    text = (
        repr(value)
        if not isinstance(value, int) or abs(value) < 10**SHOWN_CHARACTERS
        else f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    )
    return text if len(text) <= SHOWN_CHARACTERS else text[: SHOWN_CHARACTERS - 3] + "..."


def plain(x: float) -> str:
    """A bound as people write it: ``600000``, ``1048576``, ``0.01``, ``1e6``, ``1e-6``."""
    short = f"{x:g}"
    if float(x).is_integer() and (abs(x) < 1e6 or float(short) != x):
        return str(int(x))
    mantissa, e, exponent = short.partition("e")
    return f"{mantissa}e{int(exponent)}" if e else mantissa


@dataclass(frozen=True)
class Range:
    """The values one number accepts: from ``low`` to ``high`` inclusive (None: unbounded on that side),
    in ``unit``; an integer only when ``integer``. The one rule every bounded number of the options and
    the input documents is checked by, so that each refusal names the field and the range alike."""

    low: float | None = None
    high: float | None = None
    unit: str | None = None
    integer: bool = False

    @property
    def span(self) -> str:
        if self.low is not None and self.high is not None:
            return f"from {plain(self.low)} to {plain(self.high)}"
        if self.low is not None:
            return f">= {plain(self.low)}"
        return f"<= {plain(self.high)}" if self.high is not None else ""

    def contains(self, value: object) -> bool:
        if (
            not isinstance(value, (int, float))
            or isinstance(value, bool)
            or (self.integer and not isinstance(value, int))
        ):
            return False
        if isinstance(value, int) and value.bit_length() > FLOAT_BITS:  # beyond any float: no number field can use it
            return False
        return (
            math.isfinite(value)
            and (self.low is None or value >= self.low)
            and (self.high is None or value <= self.high)
        )

    def check(self, value: object, field: str, hint: str) -> None:
        """Raise a ProblemError naming ``field`` and the range when ``value`` is outside it (or not a number)."""
        if not self.contains(value):
            what = (
                "an integer" if self.integer else f"a finite number of {self.unit}" if self.unit else "a finite number"
            )
            raise ProblemError(
                f"must be {' '.join(filter(None, (what, self.span)))}, got {shown(value)}", field=field, hint=hint
            )
