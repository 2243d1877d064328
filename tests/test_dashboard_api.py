"""The dashboard's JSON endpoints (/v1/dashboard) through the ASGI app: the plans table's sorting, filters and
pages; one plan's Gantt blocks; re-plans; calibration figures; tokens; and the read-only queries on PostgreSQL."""

from __future__ import annotations

import json
import os
import statistics
import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from api_support import small_request
from fastapi.testclient import TestClient
from sqlalchemy import text

from api.app import create_app
from api.dashboard.calibration import EDGES, histogram
from api.dashboard.plan_view import cluster_nodes, runs
from api.service import translate
from api.service.settings import Settings
from api.store import PlanRecord, Store
from api.store import queries as q
from api.store.migrate import upgrade
from api.store.profile_names import SHORT_NAME, profile_name
from optimizer.costs.zoo import load_profile, profile_names

PG_URL = os.environ.get("DHP_TEST_DATABASE_URL")


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """A service with plans of several backends, budgets and profiles, and feedback on some of them."""
    app = create_app(Settings(data_dir=tmp_path_factory.mktemp("dash"), queue_limit=16))
    with TestClient(app) as client:
        specs = [
            dict(n=16, seed=0, backend="heuristic", time_budget_ms=100),
            dict(n=24, seed=1, backend="heuristic", time_budget_ms=300),
            dict(n=20, seed=2, backend="highs", time_budget_ms=150),
            dict(n=12, seed=3, workload="long-text", backend="heuristic"),
        ]
        plans = []
        for spec in specs:
            spec = dict(spec)
            req = small_request(n=spec.pop("n"), seed=spec.pop("seed"), workload=spec.pop("workload", "video"), **spec)
            r = client.post("/v1/plans", json=req)
            assert r.status_code == 201, r.text
            plans.append(r.json())
        prof = small_request(n=16, seed=9)
        prof["profile"] = load_profile("flexsp-gpt7b")
        r = client.post("/v1/plans", json=prof)
        assert r.status_code == 201, r.text
        plans.append(r.json())
        measured = {plans[0]["id"]: [1.10, 1.20], plans[2]["id"]: [0.95], plans[4]["id"]: [1.3, 1.25, 1.35]}
        for pid, factors in measured.items():
            pred = next(p for p in plans if p["id"] == pid)["predicted_step_time_s"]
            for f in factors:
                assert (
                    client.post(f"/v1/plans/{pid}/feedback", json={"measured_step_time_s": pred * f}).status_code == 201
                )
        yield client, plans, measured


def test_table_lists_every_plan_with_its_figures(filled):
    client, plans, measured = filled
    page = client.get("/v1/dashboard/plans").json()
    assert page["total"] == len(plans) and len(page["items"]) == len(plans)
    assert [r["id"] for r in page["items"]] == [p["id"] for p in reversed(plans)]  # newest first
    rows = {r["id"]: r for r in page["items"]}
    for p in plans:
        row = rows[p["id"]]
        assert row["predicted_step_time_s"] == pytest.approx(p["predicted_step_time_s"])
        assert row["lower_bound_s"] == pytest.approx(p["lower_bound_s"])
        assert (
            row["speedup"] == pytest.approx((p.get("static_baseline") or {}).get("speedup"))
            if p.get("static_baseline")
            else row["speedup"] is None
        )
        factors = measured.get(p["id"])
        assert row["feedback_count"] == len(factors or [])
        if factors:
            assert row["measured_step_time_s"] == pytest.approx(p["predicted_step_time_s"] * statistics.mean(factors))
        else:
            assert row["measured_step_time_s"] is None
    assert [rows[p["id"]]["budget_ms"] for p in plans] == [100, 300, 150, 2000, 2000]


@pytest.mark.parametrize("key", q.SORT_KEYS)
def test_every_column_sorts_server_side_with_missing_values_last(filled, key):
    client, plans, _ = filled
    for order in ("asc", "desc"):
        items = client.get("/v1/dashboard/plans", params={"sort": key, "order": order}).json()["items"]
        values = [r[key] for r in items]
        present = [v for v in values if v is not None]
        assert values[: len(present)] == present, "rows without a value come last"
        assert present == sorted(present, reverse=order == "desc")


def test_filters_and_pages(filled):
    client, plans, _ = filled
    highs = client.get("/v1/dashboard/plans", params={"backend": "highs"}).json()
    assert highs["total"] == 1 and highs["items"][0]["id"] == plans[2]["id"]
    pid = plans[1]["id"]
    assert [r["id"] for r in client.get("/v1/dashboard/plans", params={"id_prefix": pid[:10]}).json()["items"]] == [pid]
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    assert client.get("/v1/dashboard/plans", params={"created_after": later}).json()["total"] == 0
    seen = []
    offset = 0
    while offset is not None:
        page = client.get(
            "/v1/dashboard/plans", params={"limit": 2, "offset": offset, "sort": "gap", "order": "asc"}
        ).json()
        seen += [r["id"] for r in page["items"]]
        offset = page["next_offset"]
    assert sorted(seen) == sorted(p["id"] for p in plans) and len(seen) == len(plans)
    facets = client.get("/v1/dashboard/facets").json()
    assert facets["backend"] == ["heuristic", "highs"] and facets["status"] == ["done"]
    assert "analytical" in facets["profile"] and len(facets["profile"]) == 2
    assert sorted(facets["profile_names"].values()) == ["analytical", "flexsp-gpt7b"]
    assert set(facets["profile_names"]) == set(facets["profile"])


def test_rows_and_the_plan_view_name_the_profile_and_the_backend_asked(filled):
    client, plans, _ = filled
    rows = {r["id"]: r for r in client.get("/v1/dashboard/plans").json()["items"]}
    asked = ["heuristic", "heuristic", "highs", "heuristic", "heuristic"]  # the fixture's requests, in order
    for p, backend in zip(plans, asked, strict=True):
        row = rows[p["id"]]
        name = "flexsp-gpt7b" if p is plans[4] else "analytical"
        assert row["profile_name"] == name and row["backend_asked"] == backend, row
        assert row["profile"] == ("analytical" if name == "analytical" else load_profile(name)["source"][:200])
        view = client.get(f"/v1/dashboard/plans/{p['id']}").json()
        assert view["profile_name"] == name and view["backend_asked"] == backend
        assert view["solver"]["backend"] == row["backend"]


def test_bad_queries_name_the_field(filled):
    client, _, _ = filled
    for params, field in [
        ({"sort": "nope"}, "sort"),
        ({"order": "up"}, "order"),
        ({"id_prefix": "xyz!"}, "id_prefix"),
        ({"limit": 0}, "limit"),
    ]:
        r = client.get("/v1/dashboard/plans", params=params)
        assert r.status_code == 422 and r.json()["field"] == field, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
    r = client.get("/v1/dashboard/plans/" + "0" * 32)
    assert r.status_code == 404 and r.json()["field"] == "plan_id"


def test_one_plan_has_one_block_per_group_laid_out_in_time(filled):
    client, plans, _ = filled
    for p in plans:
        v = client.get(f"/v1/dashboard/plans/{p['id']}").json()
        g = v["gantt"]
        assert len(g["micro_batches"]) == len(p["micro_batches"])
        start = 0.0
        busy = 0.0
        for mb, pmb in zip(g["micro_batches"], p["micro_batches"], strict=True):
            assert mb["start_s"] == pytest.approx(start)
            assert [blk["ranks"] for blk in mb["groups"]] == [grp["ranks"] for grp in pmb["groups"]]
            for blk, grp in zip(mb["groups"], pmb["groups"], strict=True):
                assert blk["idle_s"] == pytest.approx(pmb["predicted_time_s"] - grp["predicted_time_s"])
                assert blk["samples"] == grp["samples"] and blk["intra_node"] == grp["intra_node"]
                assert sorted(r for a, b in blk["spans"] for r in range(a, b)) == sorted(grp["ranks"])
                assert (
                    blk["nodes"] == sorted({r // 8 for r in grp["ranks"]})
                    and (len(blk["nodes"]) == 1) == grp["intra_node"]
                )
                busy += grp["predicted_time_s"] * len(grp["ranks"])
            start += pmb["predicted_time_s"]
        assert g["step_s"] == pytest.approx(start)
        assert g["nodes"] == [[0, 8], [8, 16]] and g["domain_size"] == 16
        assert g["utilisation"] == pytest.approx(busy / (16 * start))
        assert v["solver"]["trace"] and v["solver"]["phases"]
        assert v["communicators"] == p["communicators"]
    assert client.get(f"/v1/dashboard/plans/{plans[4]['id']}").json()["profile"].startswith("FlexSP")
    assert g["node_gpus"] == ["H100-SXM", "H100-SXM"]  # the cluster shorthand's default GPU on both nodes


def test_nodes_of_a_mixed_cluster_carry_their_gpu_type():
    ranges, gpus = cluster_nodes({"cluster_preset": "mixed-h100-a100"})
    assert ranges == [[0, 8], [8, 16], [16, 24], [24, 32]]
    assert gpus == ["H100-SXM", "H100-SXM", "A100-80GB", "A100-80GB"]
    assert cluster_nodes({"cluster_preset": "no-such-cluster"}) == ([], [])


def test_profile_names_are_zoo_presets_else_a_short_source():
    for name in profile_names():  # every zoo profile, also the analytical model x cluster pairs
        assert profile_name(load_profile(name)["source"][:200]) == name
    assert profile_name(None) == profile_name("analytical") == "analytical"
    assert profile_name("given") == "given"
    assert profile_name("measured on site (8 nodes; May)") == "measured on site"
    assert profile_name("fit; from 2026-01") == "fit"
    long = profile_name("a fitted profile of a long name that goes on and on")
    assert len(long) == SHORT_NAME and long.endswith("\u2026") and long.startswith("a fitted profile")


def test_group_times_from_feedback_reach_the_blocks(filled):
    client, plans, _ = filled
    p = plans[3]
    times = [[0.5 + 0.01 * g for g in range(len(mb["groups"]))] for mb in p["micro_batches"]]
    assert (
        client.post(
            f"/v1/plans/{p['id']}/feedback", json={"measured_step_time_s": 1.0, "group_times_s": times, "step": 7}
        ).status_code
        == 201
    )
    v = client.get(f"/v1/dashboard/plans/{p['id']}").json()
    assert [[blk["measured_time_s"] for blk in mb["groups"]] for mb in v["gantt"]["micro_batches"]] == times
    assert v["feedback"][-1]["step"] == 7


def test_replan_with_other_options_is_not_stored(filled):
    client, plans, _ = filled
    p = plans[1]
    before = client.get("/v1/dashboard/changes").json()
    r = client.post(
        f"/v1/dashboard/plans/{p['id']}/replan",
        json={"options": {"time_budget_ms": 120, "degree_policy": "pow2", "max_micro_batches": 2}},
    )
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["options"] == {
        "backend": "heuristic",
        "time_budget_ms": 120,
        "degree_policy": "pow2",
        "max_micro_batches": 2,
    }
    assert out["micro_batches"] <= 2 and out["largest_group"] & (out["largest_group"] - 1) == 0
    assert out["ratio_to_bound"] == pytest.approx(out["predicted_step_time_s"] / out["lower_bound_s"])
    assert out["planner_ms"] > 0 and out["backend"] == "heuristic"
    same = client.post(f"/v1/dashboard/plans/{p['id']}/replan", json={"options": {"time_budget_ms": 300}}).json()
    assert same["predicted_step_time_s"] == pytest.approx(
        p["predicted_step_time_s"]
    )  # the stored options and budget give the stored plan
    assert client.get("/v1/dashboard/changes").json() == before


def test_replan_errors_name_the_option(filled):
    client, plans, _ = filled
    pid = plans[0]["id"]
    for body, field in [
        ({"options": {"backend": "gurobi"}}, "options.backend"),
        ({"options": {"time_budget_ms": 10**6}}, "options.time_budget_ms"),
        ({"options": {"colour": 1}}, "options.colour"),
        ({"budget": 5}, "budget"),
    ]:
        r = client.post(f"/v1/dashboard/plans/{pid}/replan", json=body)
        assert r.status_code == 422 and r.json()["field"] == field, r.text
    r = client.post(f"/v1/dashboard/plans/{pid}/replan", json={"options": {"time_budget_ms": 60_001}})
    assert r.status_code == 422 and r.json()["field"] == "options.time_budget_ms"  # above the service's limit
    assert client.post("/v1/dashboard/plans/" + "f" * 32 + "/replan", json={}).status_code == 404


def test_calibration_figures(filled):
    client, plans, measured = filled
    c = client.get("/v1/dashboard/calibration").json()
    points = [(pid, f) for pid, fs in measured.items() for f in fs]
    stored = sum(len(client.get(f"/v1/plans/{p['id']}/feedback").json()) for p in plans)
    assert c["total"] == stored >= len(points) and len(c["points"]) == c["total"]
    ratios = {(p["plan_id"], round(p["ratio"], 9)) for p in c["points"]}
    for pid, f in points:
        assert (pid, round(f, 9)) in ratios
    by = {g["profile"]: g for g in c["groups"]}
    flex = next(v for k, v in by.items() if k.startswith("FlexSP"))
    assert flex["profile_name"] == "flexsp-gpt7b" and by["analytical"]["profile_name"] == "analytical"
    assert c["overall"]["profile_name"] == "all"
    assert flex["n"] == 3 and flex["median_ratio"] == pytest.approx(1.30) and flex["verdict"] == "re-profile"
    assert flex["mean_abs_error"] == pytest.approx(0.30) and flex["cluster"] == "custom"
    assert sum(c["histogram"]["counts"]) == c["total"]
    only = client.get("/v1/dashboard/calibration", params={"profile": "analytical"}).json()
    assert [g["profile"] for g in only["groups"]] == ["analytical"] and {p["group"] for p in only["points"]} == {0}
    assert only["total"] == c["total"] - 3
    newest = client.get("/v1/dashboard/calibration", params={"limit": 2}).json()
    assert [p["feedback_id"] for p in newest["points"]] == sorted(
        (p["feedback_id"] for p in c["points"]), reverse=True
    )[:2]
    assert newest["groups"] == c["groups"] and newest["total"] == c["total"]  # the figures cover every point


def test_histogram_bins_and_runs():
    h = histogram([1.0, 1.001, 0.96, 2.0, 0.1, 1.49])
    assert h["edges"] == EDGES and sum(h["counts"]) == 6
    assert h["counts"][10] == 2 and h["counts"][9] == 1 and h["counts"][0] == 1 and h["counts"][-1] == 2
    assert runs([5, 0, 1, 2, 9, 10]) == [[0, 3], [5, 6], [9, 11]]


def test_pages_open_without_a_token_data_needs_one(tmp_path):
    token = "t" * 24
    app = create_app(Settings(data_dir=tmp_path, tokens=token))
    with TestClient(app) as client:
        for path in (
            "/dashboard",
            "/dashboard/",
            "/dashboard/calibration",
            "/dashboard/plans/abc",
            "/dashboard/plans/abc/tuning",
        ):
            r = client.get(path)
            assert r.status_code == 200 and "text/html" in r.headers["content-type"] and "/static/dashboard/" in r.text
        for path in (
            "/static/dashboard/vendor/uPlot.iife.min.js",
            "/static/dashboard/common.js",
            "/static/dashboard/dashboard.css",
        ):
            assert client.get(path).status_code == 200
        for path in (
            "/v1/dashboard/plans",
            "/v1/dashboard/facets",
            "/v1/dashboard/changes",
            "/v1/dashboard/calibration",
        ):
            r = client.get(path)
            assert r.status_code == 401 and r.json()["field"] == "Authorization"
            assert client.get(path, headers={"Authorization": f"Bearer {token}"}).status_code == 200
        spec = client.get("/openapi.json").json()["paths"]
        assert {
            "/v1/dashboard/plans",
            "/v1/dashboard/plans/{plan_id}",
            "/v1/dashboard/plans/{plan_id}/replan",
            "/v1/dashboard/calibration",
            "/v1/dashboard/facets",
            "/v1/dashboard/changes",
        } <= set(spec)
        assert not any(p.startswith("/dashboard") for p in spec)


def test_pages_reference_only_packaged_assets():
    from api.dashboard.endpoints import PAGES

    for page in PAGES.glob("*.html"):
        html = page.read_text()
        assert "http://" not in html and "https://" not in html.replace("http://www.w3.org", ""), page
    for js in PAGES.glob("*.js"):
        assert "https://" not in js.read_text() and "cdn" not in js.read_text().lower(), js


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    if request.param == "sqlite":
        s = Store(f"sqlite:///{tmp_path / 'q.sqlite3'}")
    else:
        if not PG_URL:
            pytest.skip("DHP_TEST_DATABASE_URL is not set: no PostgreSQL server to test against (.ci/run starts one)")
        schema = "dash_" + uuid.uuid4().hex[:8]
        admin = Store(PG_URL)
        with admin.engine.begin() as conn:
            conn.execute(text(f"CREATE SCHEMA {schema}"))
        sep = "&" if "?" in PG_URL else "?"
        s = Store(f"{PG_URL}{sep}options=-csearch_path%3D{schema}")
    upgrade(s.engine)
    yield s
    s.close()
    if request.param == "postgresql":
        with admin.engine.begin() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        admin.close()


def _record(
    k: int, *, budget: float | None, speedup: float | None, profile: dict | None, asked: str | None = None
) -> PlanRecord:
    # A sample id holding the profile key's text must not pass for a profile, nor one with the backend's for it.
    request = {
        "batch": {"samples": [{"id": '"profile": {"source": "x"}, "backend": "cbc"', "text_tokens": 5}]},
        "cluster_preset": "h100-8x8",
    }
    options = {"time_budget_ms": budget} if budget is not None else {}
    if asked is not None:
        options["backend"] = asked
    if options:
        request["options"] = options
    if profile is not None:
        request["profile"] = profile
    plan = {"predicted_step_time_s": 1.0 + k, "micro_batches": []}
    if speedup is not None:
        plan["static_baseline"] = {"speedup": speedup}
    t = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=k)
    return PlanRecord(
        id=f"{k:032x}",
        created_at=t,
        status="done",
        request_hash=str(k),
        n_samples=k,
        n_ranks=8,
        cluster="c",
        model="m",
        finished_at=t,
        plan_json=json.dumps(plan),
        request_json=translate.request_text(request),
        backend="heuristic",
        predicted_step_time_s=1.0 + k,
        lower_bound_s=1.0,
        gap=k / 10,
        solve_ms=1.0,
    )


def test_queries_read_figures_inside_the_documents(store):
    store.add(_record(1, budget=500, speedup=1.5, profile=None))
    store.add(_record(2, budget=None, speedup=None, profile={"source": "measured on site"}))
    store.add(_record(3, budget=50, speedup=1.1, profile={"time": {}}))
    rows, total = q.plan_table(store, q.PlanFilters(), sort="budget_ms", descending=False)
    assert total == 3 and [r["budget_ms"] for r in rows] == [50, q.DEFAULT_BUDGET_MS, 500]
    rows, _ = q.plan_table(store, q.PlanFilters(), sort="speedup", descending=True)
    assert [r["speedup"] for r in rows] == [1.5, 1.1, None]
    for k in (1, 2, 3, 3):
        store.add_feedback(f"{k:032x}", 2.0 * k, {})
    rows, _ = q.plan_table(store, q.PlanFilters(), sort="measured_step_time_s", descending=True, limit=2)
    assert [(r["measured_step_time_s"], r["feedback_count"]) for r in rows] == [(6.0, 2), (4.0, 1)]
    points, n = q.calibration_points(store)
    assert n == 4 and sorted({p["profile"] for p in points}) == ["analytical", "given", "measured on site"]
    assert [p["id"] for p in q.calibration_points(store, limit=2)[0]] == [4, 3] and q.calibration_points(
        store, limit=2
    )[1] == 4
    assert q.calibration_points(store, profile="measured on site")[1] == 1
    assert q.profile_labels(store) == ["analytical", "given", "measured on site"]
    stamp = q.change_stamp(store)
    assert stamp["plans"] == 3 and stamp["feedback"] == 4 and stamp["by_status"] == {"done": 3}
    assert q.facets(store)["status"] == ["done"]


def test_rows_carry_the_backend_the_request_asked_for(store):
    store.add(_record(1, budget=500, speedup=None, profile=None, asked="cpsat"))
    store.add(_record(2, budget=None, speedup=None, profile=None))
    store.add(_record(3, budget=50, speedup=None, profile={"source": "fit"}))
    rows, _ = q.plan_table(store, q.PlanFilters(), sort="n_samples", descending=False)
    assert [(r["backend_asked"], r["backend"], r["profile"]) for r in rows] == [
        ("cpsat", "heuristic", "analytical"),
        ("auto", "heuristic", "analytical"),
        ("auto", "heuristic", "fit"),
    ]
    assert q.plan_facts(store, [rows[0]["id"]])[rows[0]["id"]].backend_asked == "cpsat"


def test_facts_of_a_pending_plan_are_read_again_once_it_is_finished(store):
    pending = _record(5, budget=100, speedup=None, profile=None)
    store.add(PlanRecord(**{**pending.__dict__, "status": "pending", "plan_json": None, "finished_at": None}))
    assert q.plan_facts(store, [pending.id])[pending.id].speedup is None
    assert q.facets(store)["status"] == ["pending"]
    solved = SimpleNamespace(
        solver=SimpleNamespace(backend="highs", status="feasible", wall_ms=5.0),
        predicted_step_time_s=1.0,
        lower_bound_s=0.9,
        gap=0.1,
    )
    store.finish(pending.id, json.dumps({"static_baseline": {"speedup": 1.25}}), solved)
    assert q.plan_facts(store, [pending.id])[pending.id].speedup == 1.25
    assert q.plan_table(store, q.PlanFilters(), sort="speedup")[0][0]["speedup"] == 1.25
    assert q.facets(store)["status"] == ["done"] and q.facets(store)["backend"] == [
        "highs"
    ]  # the facets follow the store
