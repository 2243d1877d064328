"""Typed reads of the fields of a JSON document, each problem one line naming the field's path.

A document read from a file may hold anything where a number is meant: a string, a boolean (which
Python counts as an integer), ``null``, NaN or an infinity (Python's JSON reader accepts the tokens
``NaN`` and ``Infinity``, and turns ``1e400`` into an infinity), or an integer too large for a float.
:class:`Fields` reads one field at a time, returns its value when it is of the kind asked for and
in range, and otherwise records why not (``lower_bound_s: is NaN``) and returns None, so that the
caller compares only the figures that passed and reports each problem once.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def describe(value: Any) -> str:
    """How a problem line names a JSON value: ``the string 'fast'``, ``true``, ``null``, ``a list`` ..."""
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    if isinstance(value, (bool, type(None))):
        return json.dumps(value)
    if isinstance(value, list):
        return "a list"
    if isinstance(value, Mapping):
        return "an object"
    return repr(value)


def same_json(a: Any, b: Any) -> bool:
    """Whether two JSON values are written alike (``true`` is not ``1``, ``1.0`` is not ``1``)."""
    return json.dumps(a) == json.dumps(b)


class Fields:
    """Reads fields of objects of one document; ``problems`` holds a line for each field that failed."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def fail(self, path: str, why: str) -> None:
        self.problems.append(f"{path}: {why}")

    def _value(self, obj: Mapping[str, Any], key: str, path: str, required: bool, nullable: bool) -> tuple[bool, Any]:
        """(found and not null, the value)."""
        if key not in obj:
            if required:
                self.fail(path, "is missing")
            return False, None
        value = obj[key]
        if value is None and nullable:
            return False, None
        return True, value

    def number(
        self,
        obj: Mapping[str, Any],
        key: str,
        path: str,
        *,
        required: bool = True,
        nullable: bool = False,
        low: float | None = 0.0,
    ) -> float | None:
        """A finite JSON number (an integer or a float, not a boolean) of at least ``low``, as a float."""
        found, value = self._value(obj, key, path, required, nullable)
        if not found:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(path, f"is {describe(value)}, not a number")
            return None
        try:
            x = float(value)
        except OverflowError:
            self.fail(path, "is too large")
            return None
        if math.isnan(x):
            self.fail(path, "is NaN")
        elif math.isinf(x):
            self.fail(path, "is infinite")
        elif low is not None and x < low:
            self.fail(path, "is negative" if low == 0 else f"is {x:.6g}, less than {low:g}")
        else:
            return x
        return None

    def integer(
        self,
        obj: Mapping[str, Any],
        key: str,
        path: str,
        *,
        required: bool = True,
        low: int | None = None,
        high: int | None = None,
        what: str = "",
    ) -> int | None:
        """A JSON integer (not a float such as ``8.0``, not a boolean) in ``low..high`` (``what`` names ``high``)."""
        found, value = self._value(obj, key, path, required, False)
        if not found:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path, f"is {describe(value)}, not an integer")
        elif low is not None and value < low:
            self.fail(path, f"is {value}, less than {low}")
        elif high is not None and value > high:
            self.fail(path, f"is {value}, more than {what or high}")
        else:
            return value
        return None

    def _typed(self, obj: Mapping[str, Any], key: str, path: str, required: bool, kind: type[T], what: str) -> T | None:
        found, value = self._value(obj, key, path, required, False)
        if not found:
            return None
        if not isinstance(value, kind):
            self.fail(path, f"is {describe(value)}, not {what}")
            return None
        return value

    def flag(self, obj: Mapping[str, Any], key: str, path: str, *, required: bool = True) -> bool | None:
        return self._typed(obj, key, path, required, bool, "true or false")

    def text(self, obj: Mapping[str, Any], key: str, path: str, *, required: bool = True) -> str | None:
        return self._typed(obj, key, path, required, str, "a string")

    def array(self, obj: Mapping[str, Any], key: str, path: str, *, required: bool = True) -> list[Any] | None:
        return self._typed(obj, key, path, required, list, "a list")

    def mapping(self, obj: Mapping[str, Any], key: str, path: str, *, required: bool = True) -> dict[str, Any] | None:
        return self._typed(obj, key, path, required, dict, "an object")

    def rank_lists(
        self, obj: Mapping[str, Any], key: str, path: str, *, required: bool = True
    ) -> list[list[int]] | None:
        """A list of lists of integers (rank groups)."""
        groups = self.array(obj, key, path, required=required)
        if groups is None:
            return None
        for i, g in enumerate(groups):
            if not isinstance(g, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in g):
                self.fail(
                    f"{path}[{i}]",
                    f"is {describe(g)}, not a list of ranks"
                    if not isinstance(g, list)
                    else "holds a rank that is not an integer",
                )
                return None
        return groups
