"""The hostile-input benchmark: its cases are exact bytes and many, a slice spreads over every family, and a small
run against a live SQLite service gives a report whose counts add up (whatever the service answers)."""

from __future__ import annotations

import json

from bench.hostile import Reply, all_cases, failed, family, judge, main, splice, spread


def test_cases_are_many_named_once_and_sent_as_written():
    cases = all_cases()
    assert len(cases) >= 400
    assert len({c.name for c in cases}) == len(cases)
    lone = next(c for c in cases if c.name == "string/cluster.name/lone-high")
    assert lone.body is not None and b'"name": "\\ud800"' in lone.body  # the escape itself, not a replacement character
    deep = next(c for c in cases if c.name == "malformed/plan/deep-array-10000")
    assert deep.body == b"[" * 10_000 + b"]" * 10_000
    assert splice({"a": {"b": 1}}, ("a", ...), '"k\\u0000"') == b'{"a": {"k\\u0000": 1.0}}'


def test_a_slice_keeps_every_family_and_the_order():
    cases = all_cases()
    picked = spread(cases, 40)
    assert len(picked) == 40 and len({c.name for c in picked}) == 40
    assert {family(c) for c in picked} == {family(c) for c in cases}
    assert [c.name for c in picked] == [c.name for c in cases if c in picked]  # in the run's order
    assert spread(cases, None) == cases


def test_problem_documents_are_judged():
    doc = {"type": "t", "title": "x", "status": 422, "detail": "d", "field": "batch"}
    reply = Reply(422, {"content-type": "application/problem+json"}, json.dumps(doc).encode())
    assert judge(reply, "POST") == (None, ["hint"])
    assert judge(
        Reply(404, reply.headers, json.dumps({**doc, "status": 404, "field": None, "hint": "h"}).encode()), "GET"
    ) == (None, [])
    why, _ = judge(Reply(400, {"content-type": "text/plain"}, b"Invalid HTTP request received."), "GET")
    assert why is not None and "text/plain" in why
    assert (
        judge(Reply(422, reply.headers, json.dumps({**doc, "status": 400}).encode()), "POST")[0]
        == "status member 400 differs"
    )


def test_a_small_run_on_sqlite_adds_up(tmp_path):
    out = tmp_path / "report.json"
    code = main(["--store", "sqlite", "--limit", "40", "--no-progress", "--json", str(out)])
    (report,) = json.loads(out.read_text())
    assert code == (1 if failed(report) else 0)
    assert report["store"] == "sqlite" and report["cases"] == 40 and len(report["answers"]) == 40
    assert sum(report["by_status"].values()) + report["no_answer"] == 40
    assert report["no_answer"] == sum(1 for s in report["answers"].values() if s is None)
    assert len(report["http_500"]) == sum(n for s, n in report["by_status"].items() if int(s) >= 500 and s != "503")
    named = set(report["answers"])
    for key in (
        "not_problem_json",
        "lacking_field_or_hint",
        "refused_valid",
        "accepted_invalid",
        "dropped",
        "failed_internally_later",
    ):
        assert {item["case"] for item in report[key]} <= named, key
    assert set(report["http_500"]) <= named
    assert sum(report["accepted_then_polled"].values()) <= sum(1 for s in report["answers"].values() if s == 202)
    assert report["elapsed_s"] > 0


def test_the_id_routes_come_from_the_application_and_cover_every_kind():
    from bench.hostile import id_routes

    routes = id_routes()
    assert ("POST", "/v1/plans/{}/feedback") in routes and ("GET", "/v1/jobs/{}/plan-file") in routes
    assert ("GET", "/dashboard/plans/{}/tuning") in routes and ("POST", "/v1/dashboard/plans/{}/replan") in routes
    assert all("{}" in route and "{" not in route.replace("{}", "") for _, route in routes)


def test_the_token_routes_come_from_the_application_and_cover_every_guarded_route():
    from bench.hostile import JOB, PLAN, token_routes

    routes = {(method, target): bodiless for method, target, bodiless in token_routes()}
    assert routes[("POST", "/v1/plans")] is False and routes[("POST", f"/v1/jobs/{JOB}/cancel")] is True
    assert ("GET", f"/v1/plans/{PLAN}/feedback") in routes and ("HEAD", "/v1/plans") in routes
    assert not any(target.startswith(("/dashboard", "/healthz", "/readyz")) for _, target in routes)
