"""Megatron-Core's own scheduler as the bench's peer: its plans verified under Megatron's rules, skipped
cleanly without megatron-core, dhp as Megatron's scheduler against it, rules recorded per planner,
and ``dhp bench --suite megatron`` on a tiny grid."""

from __future__ import annotations

import json
import sys

import pytest

from api.cli.main import main
from bench.baselines import megatron_real
from bench.grid import GridSpec, best_bound, make_request, resolve_profile, rules_case, run_grid
from bench.planners import PLANNERS, default_planners, planner_for, under_rules
from bench.workload_catalog import WORKLOADS
from optimizer.costs.tables import CostTables
from optimizer.problem.documents import problem_from_json
from optimizer.verify.verifier import check_assignment
from trainer.megatron import MEGATRON_RULES, SCHEDULER_MODULE, DomainGroup, balanced_scheduler_class


def _megatron_core() -> None:
    pytest.importorskip(SCHEDULER_MODULE, reason="megatron-core is not installed (dhp-planner[megatron])")


def _request(
    workload: str = "video", ranks: int = 16, n: int = 64, seed: int = 0, profile: str = "flexsp-gpt7b"
) -> dict:
    return make_request(WORKLOADS[workload], ranks, n, seed, 200.0, resolve_profile(profile))


def test_real_megatron_plans_pass_the_verifier_under_megatron_rules():
    _megatron_core()
    case = rules_case(problem_from_json(_request()), "megatron")
    assert case.problem.options.degree_policy == "aligned" and case.problem.options.memory == "sample"
    assert case.problem.options.max_micro_batches is None
    out = PLANNERS["megatron"](case.problem, WORKLOADS["video"])
    assert out.assignment is not None, out.note
    report = check_assignment(case.problem, out.assignment)
    assert report.ok, report.violations[:3]
    assert out.wall_ms is not None and out.wall_ms > 0
    assert out.details["max_seq_len_per_rank"] == 6449
    assert out.details["barrier_groups"] == len(out.assignment.micro_batches)
    # The assignment is Megatron's schedule: each barrier group uses every rank, each sample on the ranks that list it.
    raw = balanced_scheduler_class()(6449, DomainGroup(16))
    _, sample_id_groups = raw.get_groups_and_subsamples(list(enumerate(case.problem.batch.lengths)), None)
    for mb, per_rank in zip(out.assignment.micro_batches, sample_id_groups, strict=True):
        assert sum(len(ranks) for ranks, _ in mb) == 16
        for ranks, samples in mb:
            assert all(per_rank[r] and set(samples) <= set(per_rank[r]) for r in ranks)


def test_megatron_is_skipped_with_its_reason_when_megatron_core_cannot_be_imported(monkeypatch):
    monkeypatch.setitem(sys.modules, "megatron.core", None)
    monkeypatch.setitem(sys.modules, SCHEDULER_MODULE, None)
    megatron_real._scheduler.cache_clear()  # a scheduler made by an earlier test would answer without importing
    assert not megatron_real.available()
    assert "megatron" not in default_planners()
    case = rules_case(problem_from_json(_request(n=32)), "megatron")
    out = PLANNERS["megatron"](case.problem, WORKLOADS["video"])
    assert out.assignment is None and out.details == {"skipped": True}
    assert out.note is not None and out.note.startswith("skipped: megatron-core's scheduler cannot be imported")
    assert "pip install 'dhp-planner[megatron]'" in out.note
    spec = GridSpec(
        workloads=("video",),
        ranks=(16,),
        samples=(32,),
        seeds=1,
        repeats=1,
        memory=False,
        profiles=("flexsp-gpt7b",),
        planners=("megatron",),
    )
    (record,) = run_grid(spec)["records"]
    assert record["status"] == "skipped" and record["rules"] == "megatron" and "dhp-planner[megatron]" in record["note"]


def test_dhp_as_megatrons_scheduler_is_at_least_as_fast_as_megatrons_own():
    _megatron_core()
    for workload, ranks, seed in (("video", 16, 1), ("long-text", 32, 0)):
        request = _request(workload, ranks, 64, seed)
        case = rules_case(problem_from_json(request), "megatron")
        steps = {}
        for name in ("megatron", "dhp-megatron"):
            out = planner_for(name, request=request)(case.problem, WORKLOADS[workload])
            assert out.assignment is not None, (name, out.note)
            report = check_assignment(case.problem, out.assignment)
            assert report.ok, (name, report.violations[:3])
            steps[name] = report.step_time_s
            if name == "dhp-megatron":  # its own prediction is the bench's score (no vision terms in this profile)
                assert out.details["predicted_step_time_s"] == pytest.approx(report.step_time_s, rel=1e-6)
        assert steps["dhp-megatron"] <= steps["megatron"] * (1 + 1e-9), (workload, steps)


def test_runner_records_the_rules_and_bounds_each_planner_under_its_own():
    spec = GridSpec(
        workloads=("long-text",),
        ranks=(16,),
        samples=(48,),
        seeds=1,
        repeats=1,
        memory=False,
        profiles=("flexsp-gpt7b",),
        planners=("static-best", "static-best-megatron"),
    )
    recs = {r["planner"]: r for r in run_grid(spec)["records"]}
    assert recs["static-best"]["rules"] == "default" and recs["static-best-megatron"]["rules"] == "megatron"
    request = make_request(
        WORKLOADS["long-text"], 16, 48, 0, spec.budget_ms, resolve_profile("flexsp-gpt7b"), spec.max_micro_batches
    )
    problem = problem_from_json(request)
    for name, options in (("static-best", {}), ("static-best-megatron", {**MEGATRON_RULES, "max_micro_batches": None})):
        r = recs[name]
        assert r["status"] == "ok", r
        tables = CostTables.build(problem.with_options(**options) if options else problem)
        # each rules case has one plan here: the bound is the best proven below it
        bound, source = best_bound(tables, r["step_time_s"])
        assert bound >= best_bound(tables)[0]
        assert r["lower_bound_s"] == pytest.approx(bound) and r["bound_source"] == source
        assert r["ratio_to_bound"] == pytest.approx(r["step_time_s"] / bound)
    assert under_rules(problem, "default") is problem


def test_megatron_suite_writes_its_report(tmp_path, capsys):
    _megatron_core()
    out = tmp_path / "meg"
    code = main(
        [
            "bench",
            "--suite",
            "megatron",
            "--workloads",
            "video",
            "--ranks",
            "16",
            "--samples",
            "64",
            "--seeds",
            "1",
            "--profiles",
            "flexsp-gpt7b",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    for name in ("results.json", "report.md", "megatron.png"):
        assert (out / name).stat().st_size > 0, name
    doc = json.loads((out / "results.json").read_text())
    assert {r["planner"] for r in doc["records"]} == {"megatron", "dhp-megatron", "static-best-megatron"}
    assert all(r["rules"] == "megatron" and r["status"] == "ok" for r in doc["records"]), doc["records"]
    s = doc["summary"]["per_profile"]["flexsp-gpt7b"]
    assert s["with_both"] == 1 and s["median_speedup"] >= 1 - 1e-9
    report = (out / "report.md").read_text()
    assert "dhp faster on" in report and "| flexsp-gpt7b | video | 16 | 0 |" in report
    assert "dhp faster on" in capsys.readouterr().out


def test_megatron_suite_without_megatron_core_names_the_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(megatron_real, "available", lambda: False)
    assert main(["bench", "--suite", "megatron", "--quick", "--out", str(tmp_path)]) == 2
    assert "dhp-planner[megatron]" in capsys.readouterr().err
