"""The one place where API documents become domain objects and plans become API documents.

A request body is the ``dhp plan`` request document as sent (its options already checked by the request
model, which carries what they read into), read once by :func:`optimizer.problem.documents.problem_from_json`,
the same code the command line uses, so an input file that works with ``dhp plan`` works over HTTP
unchanged. The deployment's limits (samples, ranks, budget, solver threads) are applied here too.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime
from typing import Any

import orjson

from api.service.schemas import PlanRequest
from api.service.settings import Settings
from api.store.repository import DEFAULT_BUDGET_MS, PlanRecord
from optimizer.errors import ProblemError
from optimizer.plan.records import Plan
from optimizer.problem.definitions import REQUEST
from optimizer.problem.documents import ENVELOPE, problem_from_json
from optimizer.problem.options import AUTO_BUDGET
from optimizer.problem.problem import Problem
from planning.budget_policy import AUTO_CAP_MS, auto_budget, resolve_budget

_PARTS = tuple(spec.name for spec in REQUEST.fields if spec.name not in ENVELOPE)
"""The members of a request document, in the order it is stored in."""


def request_document(body: PlanRequest) -> dict[str, Any]:
    """The ``dhp plan`` request document a body describes: its members as sent (envelope fields and nulls dropped),
    the options with what the request model read them into."""
    doc: dict[str, Any] = {k: value for k in _PARTS if (value := getattr(body, k)) is not None}
    return doc


def read_request(body: PlanRequest) -> tuple[dict[str, Any], str | None]:
    """The request document of a body and, when the body may be answered from the plan cache, its raw hash."""
    doc = request_document(body)
    return doc, raw_hash(doc) if body.cache else None


NAME_LENGTH = 128
"""Longest cluster or model name the plan store keeps (its listing columns)."""


def check_text(value: str, field: str, max_length: int) -> None:
    """Text stored as it is (not inside a JSON document): at most ``max_length`` characters, no control characters."""
    if len(value) > max_length:
        raise ProblemError(
            f"has {len(value)} characters, more than {max_length}",
            field=field,
            hint=f"use a name of at most {max_length} characters.",
        )
    bad = next((c for c in value if ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        raise ProblemError(
            f"contains the control character {bad!r}", field=field, hint="use printable characters only."
        )


def to_problem(doc: dict[str, Any], settings: Settings) -> Problem:
    """Validate a request document into a problem within the deployment's limits."""
    if (count := sample_count(doc)) > settings.max_samples:
        raise ProblemError(
            f"has {count} samples, more than this service's limit of {settings.max_samples}",
            field="batch.samples",
            hint="split the batch, or raise DHP_MAX_SAMPLES on the server.",
        )
    problem = problem_from_json(doc)
    ranks = problem.cluster.total_gpus
    if ranks > settings.max_ranks:
        field = "cluster" if "cluster" in doc else "cluster_preset"
        raise ProblemError(
            f"has {ranks} GPUs, more than this service's limit of {settings.max_ranks}",
            field=field,
            hint="plan for a smaller cluster, or raise DHP_MAX_RANKS on the server.",
        )
    # "auto" becomes a number here, once: the deadline, the admission and the plan all take that one.
    problem = resolve_budget(problem, min(AUTO_CAP_MS, settings.max_budget_ms))
    options = problem.options
    if options.budget_ms > settings.max_budget_ms:
        raise ProblemError(
            f"is {options.budget_ms:g} ms, more than this service's limit of {settings.max_budget_ms:g} ms",
            field="options.time_budget_ms",
            hint=f"ask for at most {settings.max_budget_ms:g} ms.",
        )
    for part, name in zip(("cluster", "model"), names(doc, problem), strict=True):
        field = f"{part}_preset" if f"{part}_preset" in doc else f"{part}.name"
        check_text(name, field, NAME_LENGTH)
    if options.solver_workers > settings.solver_threads:
        problem = replace(problem, options=replace(options, solver_workers=settings.solver_threads))
    return problem


_HASH_VERSION = b"dhp-request-2"
"""Changes whenever what the request hash covers changes, so that no stored plan of an older hash is taken for a
newer request."""


def sample_count(doc: dict[str, Any]) -> int:
    """The samples a request document lists, before validation (0 when it lists none)."""
    batch = doc.get("batch")
    samples = batch.get("samples") if isinstance(batch, dict) else None
    return len(samples) if isinstance(samples, list) else 0


def budget_ms(doc: dict[str, Any]) -> float:
    """The time budget a request document asks for, before validation (the default when it gives none or an
    unusable value; for ``"auto"``, its share of a usable ``previous_step_s``)."""
    options = doc.get("options")
    value = _usable(options.get("time_budget_ms")) if isinstance(options, dict) else None
    if value is not None:
        return value
    if isinstance(options, dict) and options.get("time_budget_ms") == AUTO_BUDGET:
        return auto_budget(_usable(options.get("previous_step_s")))[0]
    return DEFAULT_BUDGET_MS


def _usable(value: Any) -> float | None:
    """``value`` when it is a positive finite number (a JSON boolean is none), else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
        return float(value)
    return None


def request_hash(doc: dict[str, Any], problem: Problem) -> str:
    """Hash of the normalised request: everything that changes the plan. The batch with its keys in
    canonical order, and the cluster, model, options, profile and existing groups after validation
    (defaults filled in, presets resolved, ``"auto"`` resolved to its budget, and how, which the plan states)."""
    try:
        batch = orjson.dumps(doc.get("batch"), option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        batch = json.dumps(doc.get("batch"), sort_keys=True).encode()
    how = (problem.budget_reason,) if problem.budget_reason else ()  # "auto" and a number differ in their answer
    resolved = repr(
        (problem.cluster, problem.model, problem.options, problem.profile, problem.existing_groups, *how)
    ).encode()
    return hashlib.sha256(_HASH_VERSION + b"\x00" + batch + b"\x00" + resolved).hexdigest()


RAW_STEPS = 3
"""The request, its documents and their lists are hashed element by element (a sample at a time)."""
TEXT_STEPS = 3
"""Plans are encoded a micro-batch member at a time (a micro-batch's groups in one call, about a millisecond on the
largest plans); finer pieces cost more in calls than they give back to other threads (16,384 samples: 297 ms at six
levels, 21 ms at three, 13 ms in one call)."""
PIECE_ITEMS = 256
"""Elements of a long list written by one encoding call."""


def raw_hash(doc: dict[str, Any]) -> str:
    """Hash of the request document as sent (keys in canonical order), before any validation."""
    digest = hashlib.sha256()
    for piece in _pieces(doc, RAW_STEPS, sort=True):
        digest.update(piece)
    return digest.hexdigest()


def _pieces(value: Any, steps: int, sort: bool = False) -> Iterator[bytes]:
    """Compact JSON of ``value`` in pieces: the containers of its first ``steps`` levels are written a key or a few
    elements at a time (a long list :data:`PIECE_ITEMS` elements per piece, a short one element by element), so that
    no single encoding call holds the interpreter for long on a large document; the joined pieces are what one
    call would write."""
    if steps > 0 and isinstance(value, dict) and value:
        opening = b"{"
        for key in sorted(value, key=str) if sort else value:
            yield opening + _json(str(key), sort) + b":"
            yield from _pieces(value[key], steps - 1, sort)
            opening = b","
        yield b"}"
    elif steps > 0 and isinstance(value, list) and len(value) > PIECE_ITEMS:
        for start in range(0, len(value), PIECE_ITEMS):
            part = _json(value[start : start + PIECE_ITEMS], sort)
            yield (b"[" if start == 0 else b",") + part[1:-1]
        yield b"]"
    elif steps > 0 and isinstance(value, list) and value:
        opening = b"["
        for item in value:
            yield opening
            yield from _pieces(item, steps - 1, sort)
            opening = b","
        yield b"]"
    else:
        yield _json(value, sort)


def _json(value: Any, sort: bool) -> bytes:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS if sort else 0)
    except (orjson.JSONEncodeError, TypeError):  # e.g. an integer beyond 64 bits, which the standard encoder writes
        return json.dumps(value, sort_keys=sort, separators=(",", ":"), default=str).encode()


STEPWISE_SAMPLES = 2048
"""Documents of larger batches are encoded in pieces; smaller ones in one call (faster, and short anyway)."""


def plan_text(plan: Plan, samples: int = 0) -> str:
    """The plan document as stored and returned (the JSON ``dhp plan`` prints, compact); ``samples``: the batch's
    size."""
    return _dumps(plan.to_json(shards=True), samples)


def request_text(doc: dict[str, Any]) -> str:
    """The request document as stored (compact JSON)."""
    return _dumps(doc, sample_count(doc))


def _dumps(doc: Any, samples: int) -> str:
    return b"".join(_pieces(doc, TEXT_STEPS if samples > STEPWISE_SAMPLES else 0)).decode()


def names(doc: dict[str, Any], problem: Problem) -> tuple[str, str]:
    """Cluster and model names for listings: the preset name, else the document's name."""
    return (doc.get("cluster_preset") or problem.cluster.name, doc.get("model_preset") or problem.model.name)


def _iso(value: datetime) -> str:
    return value.isoformat()


def model_note(doc: dict[str, Any]) -> str | None:
    """What the answer to the request document ``doc`` says of its model when it names none: the default
    preset's name, and how to name one; None when it names one."""
    if doc.get("model") is not None or doc.get("model_preset") is not None:
        return None
    return f"{REQUEST['model_preset'].default} (default; send model or model_preset)"


def plan_body(record: PlanRecord, note: str | None = None) -> bytes:
    """The response body for a stored plan: the plan document with ``id``, ``status``, ``created_at`` first,
    and ``model_note`` (:func:`model_note` of the request answered) when given.

    The stored plan text is spliced in as it is, so a large plan is not decoded and encoded again. The note
    belongs to the request answered, not to the stored plan: an identical request that named the default model
    is answered from the same plan without it.
    """
    head: dict[str, Any] = {"id": record.id, "status": record.status, "created_at": _iso(record.created_at)}
    if note is not None:
        head["model_note"] = note
    if record.status == "done" and record.plan_json:
        head_bytes = orjson.dumps(head)
        inner = record.plan_json.encode()
        if inner == b"{}":
            return head_bytes
        return head_bytes[:-1] + b"," + inner[1:]
    if record.status == "failed":
        head["error"] = record.error
    return orjson.dumps(head)
