"""One definition per input document: the reader, the request schema and the flags all follow it.

Every number of every document (batch, cluster, model, profile, options, existing groups) has a range in its
definition; a value outside it is refused by the document reader (its fast path for samples included) and by
the pydantic model the request schema comes from. The OpenAPI document shows those schemas, with units; the
options are checked once; the stored plan row is defined once.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import fields
from typing import Any, get_type_hints

import pytest
from pydantic import TypeAdapter, ValidationError

import optimizer.problem.documents as documents
from api.service import translate
from api.service.document_models import value_type
from api.service.schemas import OptionsIn, PlanRequest, PlanSummary
from optimizer.errors import ProblemError
from optimizer.problem.definitions import CLUSTER, DOCUMENTS, REQUEST
from optimizer.problem.fields import FieldSpec
from optimizer.problem.options import OPTION_SPECS, OPTIONS, CheckedOptions, PlanOptions

PROFILE = {
    "time": {
        "quadratic": 1e-9,
        "linear": 1e-5,
        "sample_constant": 1e-4,
        "group_constant": 1e-3,
        "vision_linear": 1e-6,
        "vision_quadratic": 1e-10,
        "sample_step": 1e-5,
        "step_constant": 0.01,
    },
    "comm": {
        "scheme": "ring",
        "bytes_per_token": 1000,
        "ulysses_bytes_per_token": 3000,
        "bandwidth_bytes_per_s": {"intra": 4e11, "inter": {"2": 5e10, "8": 4e10}},
        "latency_s": {"intra": 5e-6, "inter": 2e-5},
        "messages_per_step": 2,
        "messages_fixed": 1,
        "overlap_with_attention": True,
        "group_messages": {"per_step": 1, "fixed": 1},
        "padded_bytes": True,
    },
    "capacity_tokens_per_rank": {"default": 16384, "A100-80GB": 8192},
    "speed_by_gpu": {"A100-80GB": 0.4},
    "source": "test",
}
BASES: list[dict[str, Any]] = [
    {  # every document with every field given, at least once
        "batch": {
            "samples": [
                {
                    "id": "a",
                    "text_tokens": 100,
                    "images": [{"tokens": 5, "frames": 2}, {"width": 64, "height": 48}, {"tokens_per_frame": 3}],
                    "videos": [
                        {"frames": 3, "tokens_per_frame": 7},
                        {"frames": 2, "tokens": 10},
                        {"frames": 2, "width": 28, "height": 28},
                    ],
                },
                {"id": "b", "text_tokens": 50, "images": [{"tokens": 9}], "videos": [{"frames": 4, "tokens": 40}]},
            ]
        },
        "cluster": {
            "name": "c",
            "nodes": [
                {
                    "count": 1,
                    "gpus": 8,
                    "gpu": {
                        "name": "X",
                        "memory_bytes": 8e10,
                        "peak_flops": 9e14,
                        "intra_bandwidth": 4e11,
                        "inter_bandwidth": 5e10,
                    },
                }
            ],
            "intra_bandwidth": 4e11,
            "inter_bandwidth": 5e10,
            "intra_latency": 5e-6,
            "inter_latency": 2e-5,
            "tensor_parallel": 1,
            "pipeline_parallel": 1,
            "memory_reserve_bytes": 4e9,
            "efficiency": 0.5,
        },
        "model": {
            "name": "m",
            "llm": {
                "layers": 2,
                "hidden": 64,
                "heads": 4,
                "kv_heads": 2,
                "ffn_hidden": 128,
                "vocab": 100,
                "parameters": 1e6,
                "gated_mlp": True,
            },
            "vision": {
                "layers": 1,
                "hidden": 8,
                "ffn_hidden": 8,
                "parameters": 10,
                "patch_size": 14,
                "merge_size": 2,
                "tokens_per_image": 4,
                "min_tokens": 4,
                "max_tokens": 100,
            },
            "training": {"zero_stage": 1, "recompute": "full"},
        },
        "profile": PROFILE,
        "options": {
            "degree_policy": "pow2",
            "memory": "sample",
            "max_degree": 4,
            "max_micro_batches": 8,
            "cp_scheme": "ring",
            "time_budget_ms": 300,
            "previous_step_s": 1.5,
            "backend": "heuristic",
            "solver_workers": 2,
            "deterministic": True,
            "group_reuse": "only",
            "new_group_cost_s": 1.5,
        },
        "existing_groups": [[0, 1]],
    },
    {  # the other forms: a node count, a GPU by name, one capacity, a budget the planner works out
        "batch": {"samples": [{"id": "a", "text_tokens": 10}]},
        "cluster": {"nodes": 2, "gpus_per_node": 8, "gpu": "H100-SXM"},
        "model_preset": "llama3-8b",
        "profile": {
            **PROFILE,
            "comm": {**PROFILE["comm"], "bandwidth_bytes_per_s": {"intra": {"4": 1e11}, "inter": 5e10}},
            "capacity_tokens_per_rank": 16384,
        },
        "options": {"time_budget_ms": "auto"},
    },
]


def _form(value: Any, spec: FieldSpec) -> FieldSpec:
    """The form of ``spec`` that ``value`` takes (a count or a list of nodes, a number or a table ...)."""
    for form in (spec, spec.either):
        if form is None:
            continue
        kind = form.kind
        if (
            (kind in ("document", "table") and isinstance(value, dict))
            or (kind == "list" and isinstance(value, list))
            or (kind == "int" and isinstance(value, int) and not isinstance(value, bool))
            or (kind == "number" and isinstance(value, (int, float)) and not isinstance(value, bool))
            or (kind == "str" and isinstance(value, str))
            or (kind == "bool" and isinstance(value, bool))
        ):
            return form
    raise AssertionError(f"{value!r} is no form of {spec.name}")


def _leaves(value: Any, spec: FieldSpec, path: tuple[Any, ...]) -> Iterator[tuple[tuple[Any, ...], FieldSpec]]:
    """Every value of a document under ``value`` with the definition it is read by."""
    form = _form(value, spec)
    if form.kind == "document":
        assert form.document is not None
        for name, item in value.items():
            yield from _leaves(item, form.document[name], (*path, name))
    elif form.kind in ("list", "table"):
        assert form.item is not None
        for key, item in enumerate(value) if form.kind == "list" else value.items():
            yield from _leaves(item, form.item, (*path, key))
    else:
        yield path, form


def _outside(spec: FieldSpec) -> list[Any]:
    """Values just outside a field's range or choices."""
    if spec.choices is not None:
        return ["not-a-choice"]
    low, high = spec.bounds
    out: list[Any] = []
    if low is not None:
        out.append(low - 1 if spec.kind == "int" else low - abs(low) * 0.5 - 1e-12)
    if high is not None:
        out.append(high + 1 if spec.kind == "int" else high * 2 + 1)
    return out


def _path(keys: tuple[Any, ...]) -> str:
    out = ""
    for k in keys:
        out += f"[{k}]" if isinstance(k, int) else ("." if out else "") + str(k)
    return out


def _set(doc: dict[str, Any], keys: tuple[Any, ...], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    at: Any = doc
    for k in keys[:-1]:
        at = at[k]
    at[keys[-1]] = value
    return doc


def _cases() -> Iterator[tuple[int, tuple[Any, ...], FieldSpec, Any]]:
    for b, base in enumerate(BASES):
        for member, value in base.items():
            for keys, spec in _leaves(value, REQUEST[member], (member,)):
                for bad in _outside(spec):
                    yield b, keys, spec, bad


CASES = list(_cases())


def test_the_bases_are_valid_and_cover_every_field():
    seen = set()
    for base in BASES:
        documents.problem_from_json(copy.deepcopy(base))
        for member, value in base.items():
            TypeAdapter(value_type(REQUEST[member])).validate_python(value)
            seen |= {id(spec) for _, spec in _leaves(value, REQUEST[member], (member,))}

    def every(document: Any) -> Iterator[FieldSpec]:
        for spec in document.fields:
            for form in (spec, spec.either):
                while form is not None and form.kind in ("list", "table"):
                    form = form.item
                if form is None:
                    continue
                if form.kind == "document":
                    yield from every(form.document)
                else:
                    yield form

    bounded = [s for d in (*DOCUMENTS.values(), OPTIONS) for s in every(d) if s.range is not None or s.choices]
    missing = [s.name for s in bounded if id(s) not in seen]
    assert not missing, f"no base gives {missing}"


@pytest.mark.parametrize(("base", "keys", "spec", "bad"), CASES, ids=[f"{_path(c[1])}={c[3]!r}" for c in CASES])
def test_every_range_is_what_the_reader_and_the_request_model_enforce(base, keys, spec, bad):
    doc = _set(BASES[base], keys, bad)
    with pytest.raises(ProblemError) as err:
        documents.problem_from_json(doc)
    assert _path(keys).startswith(err.value.field), (err.value.field, str(err.value))
    assert err.value.hint
    with pytest.raises(ValidationError):
        TypeAdapter(value_type(REQUEST[keys[0]])).validate_python(doc[keys[0]])
    if keys[0] == "options":  # the service's own check of a body's options
        with pytest.raises(ValidationError):
            PlanRequest.model_validate(doc)
    if keys[:2] == ("batch", "samples"):  # the fast path takes no sample the definitions refuse
        sample = doc["batch"]["samples"][keys[2]]
        assert documents._sample_fast(sample) is None


def test_the_fast_path_takes_the_well_formed_samples():
    for base in BASES:
        assert documents._sample_fast(base["batch"]["samples"][-1]) is not None


@pytest.mark.parametrize("spec", OPTION_SPECS, ids=[s.name for s in OPTION_SPECS])
def test_the_request_model_and_the_reader_agree_on_every_option(spec):
    """Values of every kind, in range or not: OptionsIn takes a value exactly when the reader does, and both
    read it into the same options."""
    low, high = spec.bounds
    values: list[Any] = ["x", True, [1], {"a": 1}, 2**1001, float("nan"), float("inf"), 1.5, 10**12]
    values += [v for v in (low, high, *_outside(spec)) if v is not None] + list(spec.choices or ())
    for value in values:
        try:
            reader = documents.options_from_json({spec.name: value})
        except ProblemError as exc:
            assert exc.field == f"options.{spec.name}"
            reader = None
        try:
            model = OptionsIn.model_validate({spec.name: value})
        except ValidationError:
            model = None
        if isinstance(value, float) and spec.kind == "int" and value.is_integer():
            continue  # a file's 2.0 is read as 2; a request's integer is a JSON integer
        assert (reader is None) == (model is None), (spec.name, value)
        if model is not None:
            assert PlanOptions.checked(**{spec.name: getattr(model, spec.name)}) == reader


def test_options_are_checked_once_and_travel_as_sent(make_client, monkeypatch):
    sent = {"time_budget_ms": 500, "backend": "heuristic", "max_degree": None}
    body = PlanRequest.model_validate({"batch": {"samples": [{"id": "a", "text_tokens": 10}]}, "options": sent})
    doc = translate.request_document(body)
    assert isinstance(doc["options"], CheckedOptions) and doc["options"] == {
        "time_budget_ms": 500,
        "backend": "heuristic",
    }
    assert doc["batch"] is body.batch  # the members are passed on as sent, not copied or dumped
    assert json.loads(translate.request_text(doc))["options"] == {"time_budget_ms": 500, "backend": "heuristic"}

    check = FieldSpec.check

    def checked_again(self: FieldSpec, value: Any, where: str) -> None:
        assert not where.startswith("options."), f"{where} checked again"
        check(self, value, where)

    monkeypatch.setattr(FieldSpec, "check", checked_again)
    problem = documents.problem_from_json({"batch": doc["batch"], "options": doc["options"]})
    monkeypatch.undo()
    assert (
        problem.options
        == documents.options_from_json(dict(sent))
        == PlanOptions(time_budget_ms=500, backend="heuristic")
    )


def test_the_openapi_document_shows_the_documents_with_units(make_client):
    schemas = make_client().get("/openapi.json").json()["components"]["schemas"]
    request = schemas["PlanRequest"]["properties"]
    sample = request["batch"]["properties"]["samples"]["items"]
    assert set(sample["properties"]) == {"id", "text_tokens", "images", "videos"} and not sample["additionalProperties"]
    text = sample["properties"]["text_tokens"]
    assert text["x-unit"] == "tokens" and "tokens" in text["description"] and text["default"] == 0
    image = sample["properties"]["images"]["anyOf"][0]["items"]
    assert (
        image["properties"]["width"]["x-unit"] == "pixels" and "pixels" in image["properties"]["width"]["description"]
    )
    for member, document in DOCUMENTS.items():
        schema = request[member] if member == "batch" else request[member]["anyOf"][0]
        assert schema["type"] == "object" and set(schema["properties"]) == set(document.names), member
        for spec in document.fields:
            if spec.unit:
                prop = schema["properties"][spec.name]
                assert prop["x-unit"] == spec.unit and spec.unit in prop["description"], (member, spec.name)
    efficiency = request["cluster"]["anyOf"][0]["properties"]["efficiency"]["anyOf"][0]
    assert (efficiency["minimum"], efficiency["maximum"]) == (CLUSTER["efficiency"].bounds)
    assert "$ref" not in json.dumps(request["profile"])  # written in full where the request names it
    assert set(schemas["OptionsIn"]["properties"]) == set(OPTIONS.names)


def test_the_request_members_are_the_documents_members():
    assert set(PlanRequest.model_fields) == set(REQUEST.names)
    assert set(translate._PARTS) == set(REQUEST.names) - set(documents.ENVELOPE)


def test_a_document_member_that_is_not_an_object_is_refused_by_type(make_client):
    client = make_client()
    for member in ("batch", "cluster", "model", "profile"):
        r = client.post("/v1/plans", json={"batch": {"samples": [{"text_tokens": 5}]}, member: [1]})
        assert r.status_code == 422 and r.json()["field"] == member and "JSON object" in r.json()["hint"], r.text


def test_the_plan_row_is_defined_once():
    from api.dashboard.view_schemas import PlanTableRow
    from api.store.models import PLANS, PlanRecord, PlanRow
    from api.store.queries import TABLE_FIELDS

    hints = get_type_hints(PlanRecord)
    assert PlanRow.__table__ is PLANS and [c.name for c in PLANS.columns] == [f.name for f in fields(PlanRecord)]
    for f in fields(PlanRecord):
        column = PLANS.c[f.name]
        assert column.doc == f.metadata["doc"]
        if f.name != "request_json":  # read without its documents, a record has none; a stored row always has one
            assert column.nullable == (type(None) in getattr(hints[f.name], "__args__", ())), f.name
    for name, field in PlanSummary.model_fields.items():
        assert field.annotation == hints[name] and field.description == PLANS.c[name].doc
    assert list(PlanTableRow.model_fields)[: len(TABLE_FIELDS)] == list(TABLE_FIELDS)
    for name in TABLE_FIELDS:
        assert PlanTableRow.model_fields[name].annotation == hints[name]


def test_the_cluster_shorthand_flags_come_from_the_definitions(capsys):
    from api.cli.main import main

    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    per_node = CLUSTER["gpus_per_node"]
    assert f"{per_node.help} ({per_node.range.span}; default {per_node.default})" in out
    assert f"default {CLUSTER['gpu'].default}" in out
    for spec in OPTION_SPECS:
        if spec.flag and spec.choices:
            assert f"{{{','.join(spec.choices)}}}" in out, spec.name


@pytest.mark.parametrize("given", [200, 2.5, 600_000, "auto"])
def test_the_budget_is_a_number_of_milliseconds_or_auto(given):
    options = documents.options_from_json({"time_budget_ms": given, "previous_step_s": 1.5})
    assert options.time_budget_ms == given and options.previous_step_s == 1.5
    model = OptionsIn.model_validate({"time_budget_ms": given})
    assert model.time_budget_ms == given


@pytest.mark.parametrize("bad", ["fast", "AUTO", "", "200", 0, 600_001, True, [200]])
def test_a_budget_neither_a_number_in_range_nor_auto_is_refused_with_a_hint_naming_both(bad, make_client):
    with pytest.raises(ProblemError) as err:
        documents.options_from_json({"time_budget_ms": bad})
    assert err.value.field == "options.time_budget_ms"
    assert "milliseconds" in (err.value.hint or "") and '"auto"' in (err.value.hint or "")
    answer = make_client().post(
        "/v1/plans", json={"batch": {"samples": [{"id": "a", "text_tokens": 10}]}, "options": {"time_budget_ms": bad}}
    )
    assert answer.status_code == 422, answer.text
    body = answer.json()
    assert body["field"] == "options.time_budget_ms", body  # the field, not one of pydantic's forms of it
    assert body["detail"] == f"options.time_budget_ms: {err.value.message}"
    assert '"auto"' in body["hint"]


def test_a_previous_step_time_is_a_positive_number_of_seconds():
    for bad in (0, -1.0, "1.5"):
        with pytest.raises(ProblemError) as err:
            documents.options_from_json({"time_budget_ms": "auto", "previous_step_s": bad})
        assert err.value.field == "options.previous_step_s" and "seconds" in (err.value.hint or "")
    with pytest.raises(ValidationError):
        OptionsIn.model_validate({"previous_step_s": 0})
