"""Property-based run of schemathesis over the OpenAPI spec, on SQLite and (when DHP_TEST_DATABASE_URL is
set) PostgreSQL: no input, valid or not and NUL bytes included, makes the service fail with 5xx (503 only
with Retry-After), every status it answers is documented, answers match their documented schemas, content
types and headers, and input that violates the schema is refused.

A small number of examples per operation keeps the run short; every generated request goes
through the ASGI app, including the plan endpoint's full validation and solving path.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import schemathesis
from api_support import empty_postgres
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from api.app import create_app
from api.service.settings import Settings

PG_URL = os.environ.get("DHP_TEST_DATABASE_URL")
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
"""Every check of ``schemathesis run --checks all`` that looks at one answer, but positive_data_acceptance:
this API validates more than its schema can say (a preset that exists, a sample that fits a group, feedback
shaped like the stored plan) and answers such requests 422, as documented."""
TOKEN = "schemathesis-token-0123456789"
LIMITS = {"max_samples": 64, "max_ranks": 256, "max_budget_ms": 200, "queue_limit": 64, "tokens": TOKEN}


@schemathesis.auth()
class BearerToken:
    """The service's token on every generated request (schemathesis leaves it out where it tests a missing one)."""

    def get(self, case, context):  # type: ignore[no-untyped-def]
        return TOKEN

    def set(self, case, data, context):  # type: ignore[no-untyped-def]
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


def _schema(database_url: str | None):  # type: ignore[no-untyped-def]
    if database_url:
        empty_postgres(database_url).close()  # a clean schema
    app = create_app(
        Settings(data_dir=Path(tempfile.mkdtemp(prefix="dhp-schemathesis-")), database_url=database_url, **LIMITS)
    )
    return schemathesis.openapi.from_asgi("/openapi.json", app)


sqlite_schema = _schema(None)
pg_schema = _schema(PG_URL) if PG_URL else None


def _check(case) -> None:  # type: ignore[no-untyped-def]
    response = case.call_and_validate(checks=CHECKS)
    assert response.status_code < 500 or (response.status_code == 503 and "retry-after" in response.headers)


@sqlite_schema.parametrize()
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_server_error_sqlite(case):
    _check(case)


if pg_schema is not None:

    @pg_schema.parametrize()
    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    def test_no_server_error_postgresql(case):
        _check(case)
else:

    def test_no_server_error_postgresql():
        pytest.skip("DHP_TEST_DATABASE_URL is not set: no PostgreSQL server to test against (.ci/run starts one)")
