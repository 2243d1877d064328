"""bench.class_bound: which grid batches it takes, and one run end to end on a small batch."""

from __future__ import annotations

import json

import pytest

from bench import class_bound as cb
from bench.grid import make_problem, resolve_profile
from bench.workload_catalog import get_workload
from optimizer.bounds.lower_bounds import lower_bound
from optimizer.costs.tables import CostTables
from planning.planner import plan

pytest.importorskip("highspy")


def _case(profile: str, ranks: int, plan_s: float, bound_s: float) -> dict:
    return {
        "profile": profile,
        "workload": "mixed",
        "ranks": ranks,
        "samples": 32,
        "seed": 0,
        "lower_bound_s": bound_s,
        "dhp-heuristic-default_status": "ok",
        "dhp-heuristic-default_s": plan_s,
        "dhp-default_status": "ok",
        "dhp-default_s": plan_s * 1.01,
        "dhp-1s_status": "ok" if profile == "stress-group-constant" else "timeout",
        "dhp-1s_s": plan_s if profile == "stress-group-constant" else None,
    }


def test_takes_the_batches_far_above_their_bound_on_the_ranks_asked():
    results = {"cases": [_case("a", 64, 1.10, 1.0), _case("b", 64, 1.01, 1.0), _case("c", 256, 1.2, 1.0)]}
    rows = cb.rows_of(results, 1.05, [64], None)
    assert [r["profile"] for r in rows] == ["a"]
    assert rows[0]["plan_s"] == 1.10  # the best dhp plan, not the slower one
    assert cb.rows_of(results, 1.05, [64, 256], ["c"])[0]["profile"] == "c"
    assert rows[0]["whole_domain_groups"] is False and rows[0]["max_micro_batches"] == 16


def test_rebuilds_the_batches_under_the_grids_rules():
    """A grid run beside FlexSP let groups span the whole domain and allowed its own micro-batch limit: the
    batch the LP bounds must be the one the grid planned, or its bound is of another problem."""
    results = {
        "spec": {"planners": ["dhp-default", "flexsp"], "max_micro_batches": 512},
        "cases": [_case("a", 64, 1.10, 1.0)],
    }
    row = cb.rows_of(results, 1.05, [64], None)[0]
    assert row["whole_domain_groups"] is True and row["max_micro_batches"] == 512


def _memory_tight_grid(tmp_path) -> tuple[float, object]:
    """A results.json with one memory-tight batch, and its heuristic plan's step time."""
    problem = make_problem(get_workload("mixed"), 32, 32, 0, 200.0, resolve_profile("stress-group-constant"))
    step = plan(problem.with_options(backend="heuristic", deterministic=True)).predicted_step_time_s
    bound = lower_bound(CostTables.build(problem)) + problem.cost_profile.step_constant
    source = tmp_path / "results.json"
    source.write_text(json.dumps({"cases": [_case("stress-group-constant", 32, step, bound)]}))
    return step, source


def test_raises_the_bound_of_a_memory_tight_batch(tmp_path, capsys):
    step, source = _memory_tight_grid(tmp_path)
    out = tmp_path / "rows.json"
    assert cb.main([str(source), "--above", "1.0", "--ranks", "32", "--limit-s", "30", "--out", str(out)]) == 0
    row = json.loads(out.read_text())["rows"][0]
    assert row["class_bound_s"] is not None and row["class_bound_s"] <= step * (1 + 1e-9)
    assert row["after"] <= row["before"]
    assert "| stress-group-constant | mixed | 32 | 0 |" in capsys.readouterr().out


def test_an_earlier_runs_bounds_are_reused_and_the_grid_summed_per_profile(tmp_path, capsys):
    step, source = _memory_tight_grid(tmp_path)
    first = tmp_path / "first.json"
    assert cb.main([str(source), "--above", "1.0", "--ranks", "32", "--limit-s", "30", "--out", str(first)]) == 0
    bound = json.loads(first.read_text())["rows"][0]["class_bound_s"]
    capsys.readouterr()
    again = tmp_path / "again.json"
    # a time limit no LP could meet: the bound can only come from the earlier run
    argv = [
        str(source),
        "--above",
        "1.0",
        "--ranks",
        "32",
        "--limit-s",
        "1e-9",
        "--reuse",
        str(first),
        "--out",
        str(again),
    ]
    assert cb.main(argv) == 0
    assert json.loads(again.read_text())["rows"][0]["class_bound_s"] == bound
    out = capsys.readouterr().out
    assert "| stress-group-constant | 1 |" in out  # the per-profile summary over the grid's batches
    # several earlier runs (side by side, each on some profiles) are read together
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"rows": []}))
    both = [*argv[: argv.index("--reuse") + 1], str(other), *argv[argv.index("--reuse") + 1 :]]
    assert cb.main(both) == 0
    assert json.loads(again.read_text())["rows"][0]["class_bound_s"] == bound
    # an earlier bound of the batch under other rules (another micro-batch limit) is not taken
    rows = json.loads(first.read_text())
    rows["rows"][0]["max_micro_batches"] = 3
    first.write_text(json.dumps(rows))
    assert cb.main(argv) == 0
    assert json.loads(again.read_text())["rows"][0]["class_bound_s"] is None
    assert cb.main([str(source), "--reuse", str(tmp_path / "missing.json")]) == 2
    assert "give files an earlier --out wrote" in capsys.readouterr().err


def test_the_group_column_bound_on_the_same_batch(tmp_path):
    step, source = _memory_tight_grid(tmp_path)
    out = tmp_path / "rows.json"
    argv = [str(source), "--above", "1.0", "--ranks", "32", "--limit-s", "30", "--bound", "columns", "--out", str(out)]
    assert cb.main(argv) == 0
    row = json.loads(out.read_text())["rows"][0]
    assert row["class_bound_s"] is not None and row["class_bound_s"] <= step * (1 + 1e-9)
    assert row["converged"] is True


def test_bad_arguments_say_what_to_fix(tmp_path, capsys):
    assert cb.main([str(tmp_path / "missing.json")]) == 2
    assert "give a results.json" in capsys.readouterr().err
    source = tmp_path / "results.json"
    source.write_text(json.dumps({"cases": []}))
    assert cb.main([str(source), "--limit-s", "0"]) == 2
    assert "--limit-s must be above 0" in capsys.readouterr().err
    source.write_text(json.dumps({"records": []}))
    assert cb.main([str(source)]) == 2
    assert "is not a results.json of dhp bench --suite flexsp" in capsys.readouterr().err
