"""Pydantic models of the input documents, built from their definitions (:mod:`optimizer.problem.definitions`,
:data:`optimizer.problem.options.OPTIONS`): the JSON Schemas of the request members, and :data:`OptionsIn`'s.

Each field becomes a strict pydantic field of the same kind, range (with the counts' bound of an ``int``),
choices and shortest length, JSON null allowed where the reader takes null as left out; its description and
unit (``x-unit``) are the definition's, and so is the default the schema shows. A model refuses what the
document reader refuses field by field; the reader also checks what one field cannot say.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    create_model,
)
from pydantic.json_schema import JsonDict
from pydantic_core import PydanticCustomError

from optimizer.errors import ProblemError
from optimizer.problem.checks import FLOAT_BITS
from optimizer.problem.definitions import REQUEST
from optimizer.problem.fields import Document, FieldSpec

STRICT = ConfigDict(extra="forbid", strict=True)


def _finite_size(value: Any) -> Any:
    """An integer of more bits than a float holds is not a number any field takes (as in :class:`Range`)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > FLOAT_BITS:
        raise PydanticCustomError("finite_number", "Input should be a finite number")
    return value


def _form(spec: FieldSpec) -> Any:
    """The pydantic type of the values of one form of a field (its ``either`` aside)."""
    low, high = spec.bounds
    if spec.kind == "int":
        return Annotated[int, Field(ge=low, le=high)]
    if spec.kind == "number":
        return Annotated[float, Field(ge=low, le=high, allow_inf_nan=False), BeforeValidator(_finite_size)]
    if spec.kind == "bool":
        return bool
    if spec.kind == "str":
        if spec.choices:
            return Literal[spec.choices]  # type: ignore[valid-type]
        return Annotated[str, Field(min_length=spec.min_length or None)]
    if spec.kind == "list":
        assert spec.item is not None
        return Annotated[list[value_type(spec.item)], Field(min_length=spec.min_length or None)]  # type: ignore[misc]
    if spec.kind == "table":
        assert spec.item is not None
        return dict[str, value_type(spec.item)]  # type: ignore[misc]
    assert spec.document is not None
    return document_model(spec.document)


def value_type(spec: FieldSpec) -> Any:
    """The pydantic type of a field's values: its form, or its other form (``either``)."""
    if spec.either is None:
        return _form(spec)
    return Annotated[_form(spec) | _form(spec.either), WrapValidator(_in_the_readers_words(spec))]


def _in_the_readers_words(spec: FieldSpec) -> Callable[[Any, ValidatorFunctionWrapHandler], Any]:
    """A value of a two-form field that the reader refuses is refused at the field, in the reader's words and with
    its hint (``ctx.hint``), not once per form under pydantic's name for it; errors inside a value stay pydantic's."""

    def validate(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError:
            try:
                spec.check(value, spec.name)
            except ProblemError as refused:
                context = {"message": refused.message, "hint": refused.hint or spec.hint}
                raise PydanticCustomError("invalid_value", "{message}", context) from None
            raise

    return validate


def _schema_edit(spec: FieldSpec) -> Callable[[JsonDict], None]:
    """What the JSON Schema of a field adds to pydantic's: its unit, and its default as the reader takes it (none
    where the reader works it out)."""

    def edit(schema: JsonDict) -> None:
        schema.pop("default", None)
        if not spec.required and spec.derived is None:
            schema["default"] = list(spec.default) if isinstance(spec.default, tuple) else spec.default
        if spec.unit:
            schema["x-unit"] = spec.unit

    return edit


def _member(spec: FieldSpec) -> tuple[Any, Any]:
    """The pydantic type and field of one field of a document. A field left out is None in the model (so that a dump
    without None is the document as given) and takes its default where the document is read; JSON null is allowed
    where the reader takes it as left out."""
    kind = value_type(spec)
    if spec.required:
        return kind, Field(description=spec.description, json_schema_extra=_schema_edit(spec))
    return kind | None if spec.nullable else kind, Field(
        None, description=spec.description, json_schema_extra=_schema_edit(spec)
    )


@cache
def document_model(document: Document, name: str | None = None) -> Any:
    """The strict pydantic model of one input document, from its definition: the request schema of that document,
    refusing what :mod:`optimizer.problem.documents` refuses field by field (the reader also checks what one
    field cannot say: a divisor, a preset that exists)."""
    return create_model(  # type: ignore[call-overload]
        name or f"{document.name}Document",
        __config__=STRICT,
        __doc__=document.help,
        **{spec.name: _member(spec) for spec in document.fields},
    )


def _inline(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with its ``$defs`` written in where they are referred to (the documents do not nest themselves),
    so that it can stand inside another schema."""
    defs = schema.pop("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                return walk({**defs[ref.removeprefix("#/$defs/")], **{k: v for k, v in node.items() if k != "$ref"}})
            return {k: walk(v) for k, v in node.items()}
        return [walk(v) for v in node] if isinstance(node, list) else node

    return walk(schema)  # type: ignore[no-any-return]


def member_schema(name: str) -> dict[str, Any]:
    """The JSON Schema of request member ``name``, from its definition, with nothing referred to elsewhere."""
    return _inline(TypeAdapter(value_type(REQUEST[name])).json_schema())
