"""The real FlexSP solver as a bench baseline: same cost model, rank layout, skips, and the quick suite end to end.

Tests that run FlexSP's code skip (with the reason) only when its source folder or pyscipopt is absent;
in CI both are present (the Makefile installs the ``flexsp`` extra, ``../shared/peers/flexsp`` lies
beside the clone).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from api.cli.main import main
from bench.flexsp_real import FlexSPSettings, build_optimizer, import_flexsp, layout, missing, translation
from bench.grid import make_problem, resolve_profile
from bench.workload_catalog import WORKLOADS
from optimizer.costs.tables import CostTables
from optimizer.errors import ProblemError

WHY = missing(FlexSPSettings())
needs_flexsp = pytest.mark.skipif(WHY is not None, reason=WHY or "")


def _tables(profile: str, ranks: int, n: int = 64, workload: str = "mixed", seed: int = 2) -> CostTables:
    return CostTables.build(
        make_problem(
            WORKLOADS[workload],
            ranks,
            n,
            seed,
            200.0,
            resolve_profile(profile),
            max_micro_batches=n,
            whole_domain_groups=True,
        )
    )


@needs_flexsp
@pytest.mark.parametrize(
    "profile,ranks",
    [
        ("flexsp-gpt7b", 64),
        ("flexsp-gpt30b", 256),
        ("stress-slow-inter", 64),
        ("stress-comm-dominant", 256),
        ("stress-group-constant", 16),
        ("flexsp-gpt13b", 128),
    ],
)
def test_flexsp_group_time_and_capacity_equal_ours_for_every_size_it_may_choose(profile, ranks):
    tables = _tables(profile, ranks)
    params, why = translation(tables)
    assert params is not None, why
    solver = import_flexsp(FlexSPSettings().source)
    opt = build_optimizer(solver, params, 1.0)
    assert opt.device_token_capacity == tables.profile.capacity_tokens_per_rank
    rng = np.random.default_rng(0)
    size = 2
    while size <= ranks:
        ranks_of_group = tuple(
            range(ranks - size, ranks)
        )  # the last ranks: inside the last node up to its size, spanning above
        assert tables.group_span(ranks_of_group)[0] == (size <= tables.node_size)
        for k in (1, 3, 12):
            samples = sorted(rng.choice(tables.n_samples, size=k, replace=False).tolist())
            ours = tables.group_time(samples, ranks_of_group)
            theirs = opt.costmodel.total_time([int(tables.lengths[i]) for i in samples], size) / 1e3
            assert theirs == pytest.approx(ours, rel=1e-12, abs=0.0), (size, k)
        size *= 2


def test_profiles_flexsp_cannot_express_are_skipped_with_the_reason():
    params, why = translation(_tables("analytical", 16))
    assert params is None and "ring profile" in why
    base = resolve_profile("flexsp-gpt7b")
    with_constant = {**base, "time": {**base["time"], "sample_constant": 1e-3}}
    p = make_problem(WORKLOADS["video"], 16, 16, 0, 200.0, with_constant, whole_domain_groups=True)
    assert "per-sample constant" in translation(CostTables.build(p))[1]
    assert "mixed GPU" in translation(_tables("stress-mixed-gpu", 32))[1]
    narrow = CostTables.build(
        make_problem(WORKLOADS["video"], 64, 16, 0, 200.0, base)
    )  # default max_degree and 64 heads: sizes up to 64 only
    assert translation(narrow)[0] is not None
    capped = CostTables.build(make_problem(WORKLOADS["image-sft"], 16, 16, 0, 200.0, base).with_options(max_degree=8))
    assert "does not allow" in translation(capped)[1]


def test_layout_puts_groups_largest_first_on_contiguous_aligned_ranks():
    a = layout([[(2, [5]), (8, [0, 1]), (4, [2]), (2, [3, 4])], [(16, [6, 7])]], 16)
    first = a.micro_batches[0]
    assert [r for r, _ in first] == [tuple(range(0, 8)), tuple(range(8, 12)), (12, 13), (14, 15)]
    for ranks, _ in first:
        assert ranks[0] % len(ranks) == 0 and ranks[0] // 8 == ranks[-1] // 8  # aligned, inside one node of 8
    assert a.micro_batches[1] == ((tuple(range(16)), (6, 7)),)
    with pytest.raises(ValueError):
        layout([[(16, [0]), (2, [1])]], 16)


def test_missing_source_or_solver_is_a_clear_error(tmp_path, capsys):
    settings = FlexSPSettings(src=str(tmp_path / "nowhere"))
    assert "--flexsp-src" in (missing(settings) or "")
    assert (
        main(
            [
                "bench",
                "--suite",
                "flexsp",
                "--quick",
                "--flexsp-src",
                str(tmp_path / "nowhere"),
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "FlexSP's source is not at" in err and "--flexsp-src" in err
    with pytest.raises(ProblemError):
        FlexSPSettings(time_limit_s=0)


@needs_flexsp
def test_quick_suite_runs_flexsp_and_dhp_scored_by_the_verifier(tmp_path, capsys):
    out, cache = tmp_path / "r", tmp_path / "cache"
    assert main(["bench", "--suite", "flexsp", "--quick", "--out", str(out), "--flexsp-cache", str(cache)]) == 0
    printed = capsys.readouterr().out
    assert "| flexsp-gpt7b | video | 16 |" in printed and "at most FlexSP's step time" in printed
    doc = json.loads((out / "results.json").read_text())
    assert doc["spec"]["flexsp"]["time_limit_s"] == 1.0 and doc["spec"]["flexsp"]["workers"] == 2
    recs = {r["planner"]: r for r in doc["records"]}
    assert set(recs) == {"dhp-heuristic-default", "dhp-default", "dhp-1s", "flexsp"}
    for r in recs.values():
        assert r["status"] == "ok", r.get("note")
        assert r["step_time_s"] == pytest.approx(r["verified_step_time_s"], rel=1e-9)
        assert r["step_time_s"] >= r["lower_bound_s"] * (1 - 1e-9)
    flex = recs["flexsp"]
    # FlexSP's own objective (its cost model) equals our verifier's step time for its plan: the same cost model.
    assert flex["details"]["flexsp_predicted_step_time_s"] == pytest.approx(flex["step_time_s"], rel=1e-9)
    assert flex["details"]["solve_wall_s"] > 0 and len(flex["wall_ms"]) == 1
    case = doc["cases"][0]
    assert case["dhp_over_flexsp"] == pytest.approx(recs["dhp-default"]["step_time_s"] / flex["step_time_s"])
    assert doc["summary"]["cases_with_flexsp"] == 1
    assert (out / "report.md").is_file() and (out / "versus_flexsp-gpt7b.png").stat().st_size > 0
    assert Path(doc["spec"]["flexsp"]["src"]).is_dir()
    # The answer was kept by its inputs: the same batch again is read back, not solved again.
    assert len(list(cache.glob("flexsp-*.json"))) == 1
    spec = doc["spec"]
    tables = CostTables.build(
        make_problem(
            WORKLOADS["video"],
            16,
            32,
            0,
            200.0,
            resolve_profile("flexsp-gpt7b"),
            max_micro_batches=spec["max_micro_batches"],
            whole_domain_groups=True,
        )
    )
    from bench.flexsp_real import solve

    again = solve(tables, FlexSPSettings(time_limit_s=1.0, cache=str(cache)))
    assert again.details.get("cached") and again.assignment is not None
    other = solve(
        tables, FlexSPSettings(time_limit_s=2.0, cache=str(tmp_path / "empty"))
    )  # other inputs: not in that cache
    assert not other.details.get("cached")


def _earlier_run(path: Path, time_limit_s: float = 1.0, step_s: float = 10.0) -> Path:
    """An earlier flexsp-suite run's results.json holding FlexSP's record of the quick suite's batch."""
    record = {
        "profile": "flexsp-gpt7b",
        "workload": "video",
        "ranks": 16,
        "samples": 32,
        "seed": 0,
        "planner": "flexsp",
        "rules": "default",
        "status": "ok",
        "step_time_s": step_s,
        "verified_step_time_s": step_s,
        "micro_batches": 3,
        "wall_ms": [4321.0],
        "details": {"solve_wall_s": 4.3},
    }
    spec = {"flexsp": {"time_limit_s": time_limit_s, "mb_option_num": 5, "bucket_num": 16}}
    path.write_text(json.dumps({"spec": spec, "records": [record]}))
    return path


def test_flexsp_answers_are_taken_from_an_earlier_run_without_the_solver(tmp_path):
    """--flexsp-from: FlexSP's record comes from the earlier run (no solver, here no source either), scored against
    this run's bound and compared with this run's dhp plans."""
    earlier = _earlier_run(tmp_path / "earlier.json")
    out = tmp_path / "r"
    argv = ["bench", "--suite", "flexsp", "--quick", "--out", str(out), "--flexsp-src", str(tmp_path / "nowhere")]
    assert main([*argv, "--flexsp-from", str(earlier)]) == 0
    doc = json.loads((out / "results.json").read_text())
    recs = {r["planner"]: r for r in doc["records"]}
    flexsp = recs["flexsp"]
    assert flexsp["reused"] is True and flexsp["status"] == "ok" and flexsp["step_time_s"] == 10.0
    assert flexsp["wall_ms"] == [4321.0]
    assert flexsp["ratio_to_bound"] == pytest.approx(10.0 / flexsp["lower_bound_s"])
    (case,) = doc["cases"]
    assert case["dhp_over_flexsp"] == pytest.approx(recs["dhp-default"]["step_time_s"] / 10.0)
    assert doc["spec"]["flexsp"]["reuse"] == str(earlier)
    assert "taken from the earlier run" in (out / "report.md").read_text()


def test_flexsp_answers_of_other_settings_or_an_unreadable_file_are_refused(tmp_path, capsys):
    out = str(tmp_path / "r")
    earlier = _earlier_run(tmp_path / "earlier.json", time_limit_s=2.0)
    assert main(["bench", "--suite", "flexsp", "--quick", "--out", out, "--flexsp-from", str(earlier)]) == 2
    err = capsys.readouterr().err
    assert "time_limit_s 2.0" in err and "--flexsp-time-limit 2.0" in err
    missing_file = str(tmp_path / "none.json")
    assert main(["bench", "--suite", "flexsp", "--quick", "--out", out, "--flexsp-from", missing_file]) == 2
    err = capsys.readouterr().err
    assert "--flexsp-from" in err and "none.json" in err
