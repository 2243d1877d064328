"""Shared fixtures: small problems built from presets and generated batches, and the service's ASGI clients."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from optimizer.problem.documents import problem_from_json
from optimizer.problem.workloads import long_tail_video


@pytest.fixture
def make_problem():
    def make(batch=None, cluster_preset="h100-8x8", model_preset="qwen2-vl-7b", **options):
        doc = {
            "batch": batch or long_tail_video(64, seed=0),
            "cluster_preset": cluster_preset,
            "model_preset": model_preset,
        }
        if options:
            doc["options"] = options
        return problem_from_json(doc)

    return make


@pytest.fixture
def make_client(tmp_path: Path) -> Iterator[Any]:
    """``make(**settings)``: a started TestClient of the app over a store under ``tmp_path``; all
    closed after the test."""
    from fastapi.testclient import TestClient

    from api.app import create_app
    from api.service.settings import Settings

    clients = []

    def make(**settings: Any) -> TestClient:
        client = TestClient(create_app(Settings(data_dir=tmp_path / "data", **settings)), raise_server_exceptions=False)
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for c in clients:
        c.__exit__(None, None, None)
