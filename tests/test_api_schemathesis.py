"""Property-based run of schemathesis over the OpenAPI spec: no input, valid or not, makes the service fail with 5xx.

A small number of examples per operation keeps the run short; every generated request goes
through the ASGI app, including the plan endpoint's full validation and solving path.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from api.app import create_app
from api.settings import Settings

_DATA = Path(tempfile.mkdtemp(prefix="dhp-schemathesis-"))
app = create_app(Settings(data_dir=_DATA, max_samples=64, max_ranks=256, max_budget_ms=200, queue_limit=64))
schema = schemathesis.openapi.from_asgi("/openapi.json", app)


@schema.parametrize()
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_server_error(case):
    response = case.call_and_validate(checks=[not_a_server_error])
    assert response.status_code < 500 or (response.status_code == 503 and "retry-after" in response.headers)
