"""The import rules of docs/architecture.md hold: no cycle between modules, no upward import."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import import_graph  # noqa: E402


def test_no_cycle_and_no_upward_import():
    lines, violations = import_graph.report()
    assert violations == [], "\n".join(violations)
    assert any(line.startswith("optimizer") for line in lines)


def test_the_checker_sees_a_cycle_and_an_upward_import():
    graph = {
        "optimizer.a": {"optimizer.b"},
        "optimizer.b": {"optimizer.a", "solver_models.x"},
        "solver_models.x": set(),
    }
    assert import_graph.cycles(graph) == [["optimizer.a", "optimizer.b"]]
    assert import_graph.upward(graph) == [
        "optimizer.b -> solver_models.x (optimizer is layer 0, solver_models is layer 1)"
    ]


def test_lazy_and_relative_imports_count(tmp_path):
    pkg = tmp_path / "optimizer"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from . import b\n")
    (pkg / "b.py").write_text("import solver_models.s\n")
    (tmp_path / "solver_models").mkdir()
    (tmp_path / "solver_models" / "__init__.py").write_text("")
    (tmp_path / "solver_models" / "s.py").write_text("")
    graph = import_graph.imports(import_graph.modules(tmp_path))
    assert graph["optimizer.a"] == {"optimizer.b"}
    assert graph["optimizer.b"] == {"solver_models.s"}
