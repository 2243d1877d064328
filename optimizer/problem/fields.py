"""What a field of an input document is: one declarative definition each, read by every door.

A :class:`FieldSpec` gives a field's name, JSON kind, unit and range (:class:`~optimizer.problem.checks.Range`),
default, what it means (``help``) and how to fix a refused value (``hint``); a :class:`Document` lists the
fields of one JSON object. The document reader (:mod:`optimizer.problem.documents`) takes from them which
keys an object allows, what each must be and what it is when left out, and checks every value with
:meth:`FieldSpec.read`; the service builds its request models and their JSON Schemas from them, and the
command line the help of the flags that set the same fields. The documents themselves are defined in
:mod:`optimizer.problem.definitions` (batch, cluster, model, profile) and
:mod:`optimizer.problem.options` (the planner options).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from optimizer.errors import ProblemError
from optimizer.problem.checks import Range, shown

MAX_COUNT = 10**9
"""Largest magnitude any integer field accepts (tokens, frames, sizes, counts): far above real batches and
clusters, far below what would overflow the cost arithmetic."""
KINDS = ("int", "number", "bool", "str", "list", "table", "document")
"""``int``: a whole number (a float such as ``2.0`` is read as ``2``); ``number``: any finite number;
``list``: a JSON array of ``item``; ``table``: a JSON object of ``item`` values under any keys;
``document``: a JSON object with the fields of ``document``."""


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()
"""The default of a field that must be given."""


def _of_kind(kind: str, value: Any) -> bool:
    """Whether ``value`` is of the JSON type of ``kind`` (whatever its range or choices)."""
    if kind in ("int", "number"):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind in ("document", "table"):
        return isinstance(value, Mapping)
    return isinstance(value, {"bool": bool, "str": str, "list": list}[kind])


@dataclass(frozen=True)
class FieldSpec:
    """One field of a document. A value of ``None`` (JSON null) reads as left out when ``nullable``."""

    name: str
    kind: str
    help: str
    hint: str = ""
    """How to fix a value outside ``range`` or ``choices`` (type errors have the kind's own hint)."""
    range: Range | None = None
    """``int`` and ``number``: the values accepted (with their unit). An ``int`` with a range is a count: also within
    :data:`MAX_COUNT`; one without (an id) is any integer."""
    default: Any = REQUIRED
    derived: str | None = None
    """What the value is when left out, for a field whose default is not one constant (the reader works it out)."""
    nullable: bool = True
    choices: tuple[Any, ...] | None = None
    min_length: int = 0
    """``str``: fewest characters; ``list``: fewest items."""
    item: FieldSpec | None = None
    """``list`` and ``table``: what each element is."""
    document: Document | None = None
    """``document``: its fields."""
    either: FieldSpec | None = None
    """Another form the value may take (``nodes``: a count or a list of node groups; ``time_budget_ms``: a number
    or ``"auto"``). :meth:`check` and :meth:`read` take a value of that form's JSON kind by that form's definition;
    the readers of nodes, sample ids, capacities and bandwidth tables check their other forms themselves."""
    flag: str | None = None
    """The ``dhp plan`` flag that sets the field, if any."""
    _counts: Range | None = field(default=None, init=False, repr=False, compare=False)
    """An ``int`` field's range as :meth:`check` applies it (to integers only)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown kind {self.kind!r} of field {self.name!r}")
        if self.kind == "int" and self.range is not None:
            counts = Range(self.range.low, self.range.high, self.range.unit, integer=True)
            object.__setattr__(self, "_counts", counts)

    @property
    def required(self) -> bool:
        return self.default is REQUIRED and self.derived is None

    @property
    def unit(self) -> str | None:
        return self.range.unit if self.range is not None else None

    @property
    def bounds(self) -> tuple[float | None, float | None]:
        """The lowest and highest value accepted (None: no bound), :data:`MAX_COUNT` included for a count."""
        if self.range is None:
            return None, None
        low, high = self.range.low, self.range.high
        if self.kind == "int":
            low = -MAX_COUNT if low is None else max(low, -MAX_COUNT)
            high = MAX_COUNT if high is None else min(high, MAX_COUNT)
        return low, high

    @property
    def count_bounds(self) -> tuple[int, int]:
        """The lowest and highest value an ``int`` field accepts."""
        low, high = self.bounds
        if self.kind != "int" or low is None or high is None:
            raise TypeError(f"{self.name} is not an int field")
        return int(low), int(high)

    @property
    def what(self) -> str:
        """The field's kind as a required-field hint names it: its unit for a number, else its JSON kind."""
        if self.kind == "number" and self.unit:
            return self.unit
        return {"document": "object", "table": "object"}.get(self.kind, self.kind)

    @property
    def description(self) -> str:
        """``help``, with the unit and, for a default the reader works out, what it is."""
        text = self.help
        if self.unit and self.unit not in text:
            text += f" (in {self.unit})"
        if self.derived:
            text += f"; default: {self.derived}"
        return text

    def check(self, value: Any, where: str) -> None:
        """Raise a ProblemError naming ``where`` when ``value`` is not of this field's kind, range and choices
        (None is allowed: it means left out)."""
        if value is None:
            return
        if self.either is not None and _of_kind(self.either.kind, value) and not _of_kind(self.kind, value):
            self.either.check(value, where)
            return
        kind = self.kind
        if kind == "int":
            if not isinstance(value, int) or isinstance(value, bool):
                raise ProblemError(f"must be an integer, got {shown(value)}", field=where, hint="use a whole number.")
            if self._counts is not None:
                if abs(value) > MAX_COUNT:
                    raise ProblemError(
                        f"{shown(value)} is too large", field=where, hint=f"use a value of at most {MAX_COUNT:,}."
                    )
                self._counts.check(value, where, self.hint)
        elif kind == "number":
            (self.range or Range()).check(value, where, self.hint or "use a JSON number.")
        elif kind == "str":
            if not isinstance(value, str):
                raise ProblemError(f"must be a string, got {shown(value)}", field=where, hint="use a JSON string.")
            if self.choices is not None and value not in self.choices:
                raise ProblemError(f"must be one of {self.choices}, got {shown(value)}", field=where, hint=self.hint)
        elif kind == "bool":
            if not isinstance(value, bool):
                raise ProblemError(
                    f"must be true or false, got {shown(value)}", field=where, hint=self.hint or "use a JSON boolean."
                )
        elif kind == "list":
            if not isinstance(value, list):
                raise ProblemError(f"must be a list, got {type(value).__name__}", field=where, hint="use a JSON array.")
        elif not isinstance(value, Mapping):
            raise ProblemError(
                f"must be a JSON object, got {type(value).__name__}",
                field=where,
                hint="see examples/ for the document shapes.",
            )

    def read(self, value: Any, where: str) -> Any:
        """``value`` once checked (:meth:`check`), as the domain types take it: an ``int`` given as a whole
        float becomes an int, a ``number`` a float; a value of the other form (``either``) is read by that form."""
        if self.either is not None and _of_kind(self.either.kind, value) and not _of_kind(self.kind, value):
            return self.either.read(value, where)
        if self.kind == "int" and isinstance(value, float) and value.is_integer():
            value = int(value)
        self.check(value, where)
        return float(value) if self.kind == "number" and value is not None else value


@dataclass(frozen=True)
class Document:
    """The fields of one JSON object of the input documents."""

    name: str
    """The object's name in the request schema (``Sample``, ``Cluster``)."""
    help: str
    fields: tuple[FieldSpec, ...]
    by_name: Mapping[str, FieldSpec] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_name", {f.name: f for f in self.fields})

    def __getitem__(self, name: str) -> FieldSpec:
        return self.by_name[name]

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.by_name)
