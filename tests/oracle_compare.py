"""The planner's answers against the brute-force optimum: what each answer claims and whether it holds.

For one instance and one backend, :func:`judge` plans the instance and records every claim the
answer makes that the oracle can refute:

- ``bound_above``: the reported lower bound exceeds the optimum (a bound must hold for every plan);
- ``false_optimal``: status ``optimal`` but the step time is above the optimum by more than
  :data:`planning.planner.OPTIMAL_GAP` (the tolerance the status promises);
- ``false_optimal_strict``: the same with no tolerance beyond float noise (1e-9), for information;
- ``false_infeasible``: an InfeasibleError although a plan exists;
- ``below_optimum``: a plan faster than the optimum, or any plan for an infeasible instance (the
  oracle or the cost code is wrong);
- ``unknown``: another planner error for a feasible instance (honest, but no plan).

:func:`summarise` aggregates these per backend with the rate of reaching the optimum and the mean
and worst ratio of step time to optimum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from optimizer.errors import InfeasibleError, PlannerError
from optimizer.problem.documents import problem_from_json
from optimizer.verify.verifier import verify
from planning.planner import OPTIMAL_GAP, plan

REACHED = 1e-6
"""Relative tolerance for counting a step time as the optimum."""
NOISE = 1e-9


@dataclass
class Outcome:
    backend: str
    optimum: float
    kind: str  # plan, infeasible, error
    step: float | None = None
    bound: float | None = None
    status: str | None = None
    message: str | None = None
    verified: bool = True

    @property
    def feasible(self) -> bool:
        return math.isfinite(self.optimum)

    @property
    def ratio(self) -> float | None:
        return self.step / self.optimum if self.step is not None and self.feasible else None

    def flags(self) -> dict[str, bool]:
        opt = self.optimum
        plan_ok = self.kind == "plan"
        return {
            "bound_above": plan_ok and self.bound is not None and self.feasible and self.bound > opt * (1 + NOISE),
            "false_optimal": plan_ok
            and self.status == "optimal"
            and self.feasible
            and self.step > opt * (1 + OPTIMAL_GAP),
            "false_optimal_strict": plan_ok
            and self.status == "optimal"
            and self.feasible
            and self.step > opt * (1 + NOISE),
            "false_infeasible": self.kind == "infeasible" and self.feasible,
            "below_optimum": plan_ok and (not self.feasible or self.step < opt * (1 - NOISE)),
            "unknown": self.kind == "error" and self.feasible,
            "unverified": plan_ok and not self.verified,
        }


def judge(doc: dict, optimum: float, backend: str, budget_ms: float) -> Outcome:
    """Plan ``doc`` with ``backend`` in ``budget_ms`` and record its claims against ``optimum``."""
    request = {**doc, "options": {**doc.get("options", {}), "backend": backend, "time_budget_ms": budget_ms}}
    try:
        problem = problem_from_json(request)
        result = plan(problem)
    except InfeasibleError as exc:
        return Outcome(backend, optimum, "infeasible", message=str(exc))
    except PlannerError as exc:
        return Outcome(backend, optimum, "error", message=str(exc))
    return Outcome(
        backend,
        optimum,
        "plan",
        step=result.predicted_step_time_s,
        bound=result.lower_bound_s,
        status=result.solver.status,
        verified=verify(result, problem).ok,
    )


def summarise(outcomes: list[Outcome]) -> dict:
    """Counts of every flag, the optimum-reaching rate and the mean and worst ratio."""
    flags = [o.flags() for o in outcomes]
    counts = {k: sum(f[k] for f in flags) for k in (flags[0] if flags else {})}
    ratios = [o.ratio for o in outcomes if o.ratio is not None]
    feasible = sum(o.feasible for o in outcomes)
    reached = sum(r <= 1 + REACHED for r in ratios)
    return {
        "instances": len(outcomes),
        "feasible": feasible,
        "planned": len(ratios),
        "reached": reached,
        "reached_rate": reached / feasible if feasible else float("nan"),
        "optimal_claims": sum(o.status == "optimal" for o in outcomes),
        "mean_ratio": sum(ratios) / len(ratios) if ratios else float("nan"),
        "worst_ratio": max(ratios, default=float("nan")),
        **counts,
    }
