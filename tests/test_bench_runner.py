"""The benchmark grid, its report and the dhp bench command on a tiny grid; workloads and replay files."""

from __future__ import annotations

import json

import pytest

from api.cli.main import main
from bench.grid import GridSpec, make_problem, percentile, resolve_profile, run_grid, total_steps
from bench.report import summarize
from bench.scaling import fit_exponent
from bench.workload_catalog import WORKLOADS, get_workload, load_replay, save_replay
from optimizer.errors import ProblemError
from optimizer.problem.documents import batch_from_json

TINY = dict(
    workloads=("video", "image-sft"),
    ranks=(8, 16),
    samples_per_rank=(2,),
    seeds=1,
    repeats=1,
    budget_ms=100.0,
    planners=("static-deployed", "static-best", "bucket-milp", "dhp-heuristic"),
)


def test_generated_batches_respect_the_workload_longest_allowed_sample():
    for w in WORKLOADS.values():
        batch = batch_from_json(w.batch(200, 5))
        assert max(batch.lengths) <= w.max_length, w.name
        assert batch_from_json(w.batch(200, 5)).lengths == batch.lengths  # seeded


def test_replay_json_and_csv(tmp_path):
    save_replay(tmp_path / "mine.json", [100, 2000, 30000], max_length=65536)
    w = load_replay(tmp_path / "mine.json")
    assert w.max_length == 65536 and w.name == "mine"
    lengths = batch_from_json(w.batch(50, 1)).lengths
    assert set(lengths) <= {100, 2000, 30000} and len(lengths) == 50
    (tmp_path / "mine.csv").write_text("text_tokens,visual_tokens\n100,576\n4000,0\n")
    c = get_workload(str(tmp_path / "mine.csv"))
    assert set(batch_from_json(c.batch(20, 0)).lengths) <= {676, 4000}
    assert c.max_length == 4000


@pytest.mark.parametrize(
    "content,field",
    [
        ('{"lengths": []}', "lengths"),
        ('{"lengths": [10, -3]}', "lengths[1]"),
        ('{"lengths": [10], "max_length": 5}', "max_length"),
        ('{"other": 1}', "mine.json"),
        ("not json", "mine.json"),
    ],
)
def test_bad_replay_files_name_the_field(tmp_path, content, field):
    (tmp_path / "mine.json").write_text(content)
    with pytest.raises(ProblemError) as exc:
        load_replay(tmp_path / "mine.json")
    assert field in exc.value.field


def test_unknown_workload_and_bad_grid_are_clear_errors():
    with pytest.raises(ProblemError) as exc:
        get_workload("nope")
    assert exc.value.field == "--workloads"
    with pytest.raises(ProblemError):
        GridSpec(ranks=(12,))
    with pytest.raises(ProblemError):
        GridSpec(planners=("magic",))


def test_grid_records_every_planner_and_speedups_relative_to_static_best():
    spec = GridSpec(**TINY)
    steps = []
    doc = run_grid(spec, progress=steps.append)
    assert sum(steps) == total_steps(spec)
    recs = doc["records"]
    assert len(recs) == 4 * len(spec.planners)
    for r in recs:
        assert r["status"] in ("ok", "no-plan", "infeasible"), r
        if r["status"] == "ok":
            assert r["ratio_to_bound"] >= 1 - 1e-6
            assert r["step_time_s"] == pytest.approx(r["verified_step_time_s"], rel=1e-6)
            assert len(r["wall_ms"]) == 1 and "peak_mb" in r
        if r["planner"] == "static-best" and r["status"] == "ok":
            assert r["speedup_over_static_best"] == pytest.approx(1.0)
    summary = summarize(doc)
    assert set(summary["per_workload"]) == {"video", "image-sft"}
    assert summary["goals"]["median_ratio_to_bound"] >= 1 - 1e-6


def test_percentile_is_nearest_rank():
    assert percentile([5.0], 99) == 5.0
    assert percentile([float(x) for x in range(1, 101)], 99) == 99.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0


def test_fit_exponent_recovers_a_power_law():
    pts = [{"status": "ok", "samples": s, "wall_ms": [0.01 * s**1.5]} for s in (512, 2048, 8192)]
    assert fit_exponent(pts + [{"status": "error", "samples": 65536}]) == pytest.approx(1.5)
    assert fit_exponent(pts[:1]) is None


def test_dhp_bench_writes_json_markdown_and_plots(tmp_path, capsys):
    out = tmp_path / "res"
    code = main(
        [
            "bench",
            "--out",
            str(out),
            "--workloads",
            "video",
            "--ranks",
            "8",
            "--samples-per-rank",
            "2",
            "--seeds",
            "1",
            "--repeats",
            "1",
            "--budget-ms",
            "100",
            "--planners",
            "static-deployed,static-best,static-best-megatron,dhp-heuristic",
        ]
    )
    assert code == 0
    for name in ("results.json", "report.md", "speedup.png", "ratio_to_bound.png", "planning_time.png"):
        assert (out / name).stat().st_size > 0, name
    doc = json.loads((out / "results.json").read_text())
    assert doc["summary"]["per_workload"]["video"]["dhp-heuristic"]["valid"] == 1
    report = (out / "report.md").read_text()
    assert "Median speedup over static at its best" in report and "dhp bench" in report
    assert "Under Megatron-Core's rules (static at its best (Megatron's rules)): planned, verified and scored" in report
    assert {r["rules"] for r in doc["records"]} == {"default", "megatron"}


def test_dhp_bench_rejects_bad_flags(tmp_path, capsys):
    assert main(["bench", "--out", str(tmp_path), "--workloads", "nope"]) == 2
    assert "--workloads" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "--ranks", "8,x"])


def test_scaling_point_that_runs_out_of_time_is_reported_not_raised():
    from bench.scaling import markdown, run_point

    r = run_point(64, 512, 1, timeout_s=0.05)
    assert r["status"] == "timeout" and "0 s" in r["error"]
    text = markdown({"workload": "video", "memory_limit_gb": 8, "timeout_s": 0.05, "points": [r], "exponent": None})
    assert "timeout" in text and "k = n/a" in text


def test_grid_runs_under_several_profiles_with_a_model_that_suits_ulysses():
    spec = GridSpec(
        workloads=("image-sft",),
        ranks=(16,),
        samples_per_rank=(2,),
        seeds=1,
        repeats=1,
        budget_ms=100.0,
        memory=False,
        planners=("static-best", "dhp-heuristic"),
        profiles=("analytical", "flexsp-gpt7b", "stress-mixed-gpu"),
    )
    doc = run_grid(spec)
    recs = doc["records"]
    assert {r["profile"] for r in recs} == {"analytical", "flexsp-gpt7b", "stress-mixed-gpu"}
    assert all(r["status"] == "ok" for r in recs), [
        (r["profile"], r["planner"], r.get("note")) for r in recs if r["status"] != "ok"
    ]
    by = {(r["profile"], r["planner"]): r["step_time_s"] for r in recs}
    assert (
        by["flexsp-gpt7b", "dhp-heuristic"] != by["analytical", "dhp-heuristic"]
    )  # planned and scored under another cost model
    assert (
        by["stress-mixed-gpu", "dhp-heuristic"] != by["flexsp-gpt7b", "dhp-heuristic"]
    )  # A100 half of the cluster is slower
    problem = make_problem(WORKLOADS["image-sft"], 16, 32, 0, 100.0, resolve_profile("flexsp-gpt7b"))
    assert (
        problem.model.llm.heads == 16
        and problem.scheme == "ulysses"
        and problem.cost_profile.capacity_tokens_per_rank == 6449
    )
    mixed = make_problem(WORKLOADS["image-sft"], 16, 32, 0, 100.0, resolve_profile("stress-mixed-gpu"))
    assert [n.gpu.name for n in mixed.cluster.nodes] == ["H100-SXM", "A100-80GB"]
    summary = summarize(doc)
    assert "image-sft [flexsp-gpt7b]" in summary["per_workload"]


def test_unknown_profile_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(ProblemError) as exc:
        GridSpec(profiles=("flexsp-gpt70b",))
    assert exc.value.field == "--profiles"
    assert main(["bench", "--quick", "--profiles", "nope", "--out", str(tmp_path)]) == 2
    assert "--profiles" in capsys.readouterr().err


def test_bench_scores_against_the_best_bound_proven(monkeypatch):
    """The bench's bound is the engine's or, when higher, the group-size LP's; without HiGHS the engine's."""
    pytest.importorskip("highspy")
    from bench.grid import best_bound
    from optimizer.bounds.lower_bounds import lower_bound
    from optimizer.costs.tables import CostTables
    from solver_models import size_bound

    tables = CostTables.build(
        make_problem(get_workload("long-text"), 64, 512, 2, 200.0, resolve_profile("flexsp-gpt7b"))
    )
    engine = lower_bound(tables)
    value, source = best_bound(tables)
    assert source == "group_sizes" and value == pytest.approx(size_bound.size_bound(tables))
    assert value > engine * 1.01
    monkeypatch.setattr(size_bound, "_highs", lambda: None)
    assert best_bound(tables) == (engine, "engine")


def test_bench_raises_each_rules_bound_below_its_fastest_plan():
    """After the planners, a rules case's bound is proven again below its fastest verified plan and written
    into that case's rows with their ratios; rows of other rules and failed rows keep theirs."""
    pytest.importorskip("highspy")
    from bench.grid import _raise_bounds, best_bound, rules_case

    problem = make_problem(get_workload("mixed"), 256, 512, 0, 200.0, resolve_profile("flexsp-gpt7b"))
    case = rules_case(problem, "default")
    step = case.bound * 1.06  # the plan's step time at 1 s when measured: 1.064 times the bound
    rows = [
        {"rules": "default", "status": "ok", "step_time_s": step, "lower_bound_s": case.bound},
        {"rules": "default", "status": "error", "lower_bound_s": case.bound},
        {"rules": "megatron", "status": "ok", "step_time_s": step / 2, "lower_bound_s": 1.0},
    ]
    _raise_bounds({"default": case, "megatron": "infeasible"}, rows)
    raised, source = best_bound(case.tables, step)
    assert raised > case.bound
    assert rows[0]["lower_bound_s"] == rows[1]["lower_bound_s"] == raised and rows[0]["bound_source"] == source
    assert rows[0]["ratio_to_bound"] == pytest.approx(step / raised)
    assert rows[2] == {"rules": "megatron", "status": "ok", "step_time_s": step / 2, "lower_bound_s": 1.0}
