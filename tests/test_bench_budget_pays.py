"""bench.budget_pays on a tiny grid in deterministic mode: every backend's plan against the heuristic alone,
and budget monotonicity, printed per profile; ``--samples`` fixes the batch size whatever the ranks."""

from __future__ import annotations

import json

import pytest

from bench import budget_pays

pytest.importorskip("highspy")


def test_a_tiny_deterministic_grid_prints_both_checks(tmp_path, capsys):
    out = tmp_path / "pays.json"
    argv = ["--profiles", "analytical", "--workloads", "video", "--ranks", "8", "--seeds", "1", "--samples", "24"]
    argv += ["--budgets-ms", "50", "100", "--backends", "highs", "--deterministic", "--no-noise", "--out", str(out)]
    assert budget_pays.main(argv) == 0
    printed = capsys.readouterr().out
    assert "mode: deterministic" in printed
    assert "analytical     50 ms  highs: over the heuristic alone median" in printed
    assert "highs 100 ms against 50 ms: slower on 0 of 1" in printed
    rows = json.loads(out.read_text())["rows"]
    assert {(r["backend"], r["budget_ms"]) for r in rows} == {(b, t) for b in ("heuristic", "highs") for t in (50, 100)}
    assert all(r["ranks"] == 8 and r["samples"] == 24 and r["step_s"] > 0 for r in rows)


def test_a_batch_no_planner_answers_is_skipped_and_named(tmp_path, capsys):
    # 64 long-text samples on 8 ranks within one micro-batch: no packing fits the memory
    out = tmp_path / "pays.json"
    argv = ["--profiles", "analytical", "--workloads", "long-text", "--ranks", "8", "--seeds", "1"]
    argv += ["--samples", "64", "--max-micro-batches", "1", "--budgets-ms", "50", "--backends", "highs"]
    argv += ["--deterministic", "--no-noise", "--out", str(out)]
    assert budget_pays.main(argv) == 0
    printed = capsys.readouterr().out
    assert "skipped analytical long-text 8 ranks seed 0: " in printed
    written = json.loads(out.read_text())
    assert written["rows"] == [] and written["skipped"][0]["workload"] == "long-text"
