"""The backend interface every exact formulation implements.

``available()`` says whether the library is installed, ``load_ms()`` what loading it would still cost
in this process (the planning layer chooses a backend from both, never from ``sys.modules``),
``deterministic_limits`` whether its answer in deterministic mode depends on the input alone, and
``solve(tables, options, hint, deadline, on_improvement)`` solves:

- ``tables``: the cost tables of the problem (the only view of the problem a formulation gets);
- ``options``: the planner options (workers, determinism);
- ``hint``: the heuristic's assignment, a feasible starting point (full hint);
- ``deadline``: a ``time.perf_counter()`` value by which ``solve`` must have returned;
- ``on_improvement``: called with (elapsed_ms, objective_s, bound_s) for each improving solution.

It returns a :class:`SolveResult` with the best assignment found (or None), the status as the solver
reported it (``optimal``, ``feasible``, ``infeasible``, ``timeout``, ``error``), the objective and
the best proven bound in seconds, and the wall time. The orchestrator verifies the assignment
independently and keeps the heuristic's plan when the backend gives nothing better.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from optimizer.costs.tables import CostTables
from optimizer.plan.records import Assignment, TracePoint
from optimizer.problem.options import PlanOptions

ImprovementCallback = Callable[[float, float, float | None], None]


@dataclass
class SolveResult:
    assignment: Assignment | None
    status: str
    objective_s: float | None = None
    bound_s: float | None = None
    wall_ms: float = 0.0
    trace: list[TracePoint] = field(default_factory=list)
    message: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


class Backend(Protocol):
    name: str
    deterministic_limits: bool
    """True when, in deterministic mode, every solve stops at a limit of the solver's work rather than the
    clock, so that its answer depends on the input alone (deterministic ``auto`` picks only such backends)."""

    def available(self) -> bool:
        """True when the solver library can be imported (found without loading it)."""
        ...

    def load_ms(self) -> float:
        """Milliseconds loading the solver library would still cost in this process (0 once loaded)."""
        ...

    def solve(
        self,
        tables: CostTables,
        options: PlanOptions,
        hint: Assignment,
        deadline: float,
        on_improvement: ImprovementCallback | None = None,
    ) -> SolveResult: ...


_REGISTRY: dict[str, Callable[[], Backend]] = {}


def register(name: str, factory: Callable[[], Backend]) -> None:
    _REGISTRY[name] = factory


def builtin_backends() -> dict[str, Backend]:
    """One instance of every registered backend by name (installed or not)."""
    _load_builtin()
    return {name: factory() for name, factory in _REGISTRY.items()}


def get_backend(name: str) -> Backend | None:
    """The backend registered under ``name``, or None when there is none."""
    _load_builtin()
    factory = _REGISTRY.get(name)
    return factory() if factory else None


def available_backends() -> list[str]:
    _load_builtin()
    return [name for name, f in _REGISTRY.items() if f().available()]


def _load_builtin() -> None:
    """Import the built-in backends (each registers itself); missing modules are skipped."""
    import importlib

    for module in ("solver_models.cpsat", "solver_models.pulp_milp"):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
