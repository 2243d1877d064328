"""The plan store on SQLite and on a real PostgreSQL server (``DHP_TEST_DATABASE_URL``; .ci/run starts one)."""

from __future__ import annotations

import json
import os
import threading
import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from api_support import empty_postgres
from sqlalchemy import inspect, text

from api.store import PlanRecord, Store
from api.store.migrate import current_revision, downgrade, upgrade
from api.store.repository import utcnow

PG_URL = os.environ.get("DHP_TEST_DATABASE_URL")


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    if request.param == "sqlite":
        s = Store(f"sqlite:///{tmp_path / 'store.sqlite3'}")
    else:
        if not PG_URL:
            pytest.skip("DHP_TEST_DATABASE_URL is not set: no PostgreSQL server to test against (.ci/run starts one)")
        s = empty_postgres(PG_URL)  # a clean schema for every test
    upgrade(s.engine)
    yield s
    s.close()


def record(status="done", created_at=None, backend="heuristic", cluster="h100-8x8", **extra):
    created = created_at or utcnow()
    base = dict(
        id=uuid.uuid4().hex,
        created_at=created,
        status=status,
        request_hash=uuid.uuid4().hex * 2,
        n_samples=8,
        n_ranks=64,
        cluster=cluster,
        model="qwen2-vl-7b",
        request_json='{"batch":{"samples":[]}}',
    )
    if status == "done":
        base.update(
            finished_at=created,
            plan_json='{"predicted_step_time_s":1.5,"micro_batches":[]}',
            backend=backend,
            solver_status="heuristic",
            predicted_step_time_s=1.5,
            lower_bound_s=1.2,
            gap=0.2,
            solve_ms=9.0,
        )
    base.update(extra)
    return PlanRecord(**base)


def head_revision() -> str:
    """The newest migration (one head: two migrations on the same parent would fail here)."""
    from alembic.script import ScriptDirectory

    from api.store.migrate import alembic_config

    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head is not None
    return head


def test_migrations_create_and_drop_the_schema(store):
    assert current_revision(store.engine) == head_revision()
    assert {"plans", "feedback"} <= set(inspect(store.engine).get_table_names())
    upgrade(store.engine)  # idempotent
    downgrade(store.engine, "base")
    assert "plans" not in inspect(store.engine).get_table_names()
    upgrade(store.engine)
    assert current_revision(store.engine) == head_revision()


def test_add_get_roundtrip(store):
    rec = record()
    store.add(rec)
    got = store.get(rec.id)
    assert got is not None
    assert got.plan_json == rec.plan_json and got.request_json == rec.request_json
    assert got.created_at == rec.created_at and got.created_at.tzinfo is not None
    assert got.predicted_step_time_s == 1.5 and got.backend == "heuristic"
    assert store.get("missing") is None
    assert store.get(rec.id, with_documents=False).plan_json is None


def test_pending_then_finished_or_failed(store):
    a, b = record(status="pending"), record(status="pending")
    store.add(a)
    store.add(b)
    plan = SimpleNamespace(
        solver=SimpleNamespace(backend="cpsat", status="optimal", wall_ms=50.0),
        predicted_step_time_s=2.0,
        lower_bound_s=2.0,
        gap=0.0,
    )
    store.finish(a.id, '{"x":1}', plan)
    store.fail(b.id, {"status": 422, "detail": "no plan", "field": "batch"})
    done, failed = store.get(a.id), store.get(b.id)
    assert (
        done.status == "done"
        and done.plan_json == '{"x":1}'
        and done.solver_status == "optimal"
        and done.finished_at is not None
    )
    assert failed.status == "failed" and failed.error == {"status": 422, "detail": "no plan", "field": "batch"}


def test_cache_lookup_finds_the_newest_finished_plan(store):
    old = record(created_at=utcnow() - timedelta(minutes=5))
    new = record(request_hash=old.request_hash)
    pending = record(status="pending", request_hash=old.request_hash, created_at=utcnow() + timedelta(seconds=1))
    for r in (old, new, pending):
        store.add(r)
    assert store.find_done(old.request_hash).id == new.id
    assert store.find_done("0" * 64) is None


def test_list_filters_and_pages(store):
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    recs = [
        record(created_at=t0 + timedelta(minutes=i), backend="cpsat" if i % 2 else "heuristic", cluster=f"c{i % 3}")
        for i in range(7)
    ]
    recs.append(record(status="pending", created_at=t0 + timedelta(minutes=10)))
    for r in recs:
        store.add(r)
    items, total = store.search(limit=3)
    assert total == 8 and [i.id for i in items] == [recs[7].id, recs[6].id, recs[5].id]
    assert all(i.plan_json is None for i in items)
    pages = [store.search(limit=3, offset=o)[0] for o in (0, 3, 6)]
    assert sorted(i.id for p in pages for i in p) == sorted(r.id for r in recs)
    assert store.search(backend="cpsat")[1] == 3
    assert store.search(status="pending")[1] == 1
    assert store.search(cluster="c0")[1] == 3
    assert store.search(created_after=t0 + timedelta(minutes=5))[1] == 3
    assert store.search(created_before=t0 + timedelta(minutes=2))[1] == 2


def test_feedback_beside_prediction(store):
    rec = record()
    store.add(rec)
    fb = store.add_feedback(rec.id, 1.8, {"measured_step_time_s": 1.8, "group_times_s": [[1.0, 1.7]]})
    assert fb.predicted_step_time_s == 1.5 and fb.measured_step_time_s == 1.8
    store.add_feedback(rec.id, 1.9, {"measured_step_time_s": 1.9})
    listed = store.feedback_for(rec.id)
    assert [f.measured_step_time_s for f in listed] == [1.8, 1.9]
    assert listed[0].document["group_times_s"] == [[1.0, 1.7]]
    assert store.add_feedback("missing", 1.0, {}) is None


def test_large_plan_documents_survive(store):
    plan = {"micro_batches": [{"groups": [{"ranks": list(range(64)), "samples": [f"s{i}" for i in range(512)]}]}] * 8}
    rec = record(plan_json=json.dumps(plan))
    store.add(rec)
    assert json.loads(store.get(rec.id).plan_json) == plan


def test_ping(store):
    assert store.ping()
    broken = Store("postgresql+psycopg://nobody:nothing@127.0.0.1:1/none")
    assert not broken.ping()
    broken.close()


def test_service_keeps_plans_in_postgres(tmp_path):
    if not PG_URL:
        pytest.skip("DHP_TEST_DATABASE_URL is not set: no PostgreSQL server to test against (.ci/run starts one)")
    from api_support import assert_verified, small_request
    from fastapi.testclient import TestClient

    from api.app import create_app
    from api.service.settings import Settings

    empty_postgres(PG_URL).close()
    settings = Settings(database_url=PG_URL, data_dir=tmp_path)
    req = small_request(n=8)
    with TestClient(create_app(settings)) as c:
        plan = c.post("/v1/plans", json=req).json()
        assert c.post(f"/v1/plans/{plan['id']}/feedback", json={"measured_step_time_s": 1.0}).status_code == 201
    with TestClient(create_app(settings)) as c:  # a new instance on the same database
        again = c.get(f"/v1/plans/{plan['id']}").json()
        assert again == plan
        assert_verified(again, req)
        assert c.get("/v1/plans").json()["total"] == 1
    assert not (tmp_path / "dhp.sqlite3").exists()


def test_record_table_and_summary_agree():
    """The stored record is defined once: the table has its fields, the summary shows the non-document ones."""
    from dataclasses import fields

    from api.service.schemas import PlanSummary
    from api.store.models import PlanRow
    from api.store.repository import SUMMARY_FIELDS, PlanRecord

    assert {f.name for f in fields(PlanRecord)} == set(PlanRow.__table__.columns.keys())
    assert set(PlanSummary.model_fields) == set(SUMMARY_FIELDS)


def test_processes_starting_together_migrate_once(store):
    """Replicas starting on a fresh database run the migrations at the same time: one migrates, the others
    wait and find nothing to do."""
    downgrade(store.engine, "base")
    stores = [Store(store.url) for _ in range(6)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(stores))

    def start(s: Store) -> None:
        barrier.wait()
        try:
            upgrade(s.engine)
        except BaseException as exc:  # noqa: BLE001 (collected and asserted below)
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in stores:
        s.close()
    assert errors == []
    assert current_revision(store.engine) == head_revision()
    store.add(record())


def test_the_figures_migration_fills_stored_plans_from_their_documents(tmp_path):
    """Plans stored before the figure columns existed get them from their documents when the store is upgraded."""
    from sqlalchemy import create_engine

    engine = create_engine(f"sqlite:///{tmp_path / 'old.db'}")
    upgrade(engine)
    downgrade(engine, "0003_plan_claims")
    request = '{"batch":{"samples":[]},"options":{"time_budget_ms":750},"profile":{"source":"site fit"}}'
    plan = '{"micro_batches":[],"static_baseline":{"speedup":1.3}}'
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO plans (id, created_at, status, request_hash, request_json, plan_json, n_samples, n_ranks) "
                "VALUES ('a', '2026-01-01 00:00:00', 'done', 'h', :r, :p, 1, 8), "
                "('b', '2026-01-01 00:00:01', 'pending', 'h2', '{\"batch\":{\"samples\":[]}}', NULL, 1, 8)"
            ),
            {"r": request, "p": plan},
        )
    upgrade(engine)
    with engine.connect() as conn:
        rows = {r[0]: tuple(r[1:]) for r in conn.execute(text("SELECT id, budget_ms, speedup, profile FROM plans"))}
    assert rows == {"a": (750.0, 1.3, "site fit"), "b": (200.0, None, "analytical")}
