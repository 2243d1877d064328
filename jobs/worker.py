"""Planning one step of a job: the step's samples with the job's request template, to a record.

A record holds what the plan file keeps of the step (the plan without wall-clock figures, so that
the same step gives the same record on any engine) and, apart, the planning time (wall and CPU
seconds of the process that planned it). A step that
cannot be planned gives a failed record naming the step, the field and the sample at fault; it
never stops the other steps.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from optimizer.errors import InfeasibleError, PlannerError
from optimizer.plan.records import Plan

_SAMPLE_IN_MESSAGE = re.compile(r"sample '([^']+)'")
_SAMPLE_IN_FIELD = re.compile(r"^batch\.samples\[(\d+)\]")


def plan_doc(plan: Plan) -> dict[str, Any]:
    """The plan as the plan file keeps it: the shape ``dhp plan`` prints, with each group's sample
    lengths (what :func:`trainer.apply.apply_plan` needs) instead of shards, and no timings."""
    doc: dict[str, Any] = {
        "predicted_step_time_s": plan.predicted_step_time_s,
        "lower_bound_s": plan.lower_bound_s,
        "gap": plan.gap,
        "ratio_to_bound": plan.ratio_to_bound,
        "scheme": plan.scheme,
        "domain_size": plan.domain_size,
        "micro_batches": [
            {
                "predicted_time_s": mb.predicted_time_s,
                "groups": [
                    {
                        "ranks": list(g.ranks),
                        "samples": list(g.samples),
                        "lengths": list(g.lengths),
                        "predicted_time_s": g.predicted_time_s,
                        "intra_node": g.intra_node,
                    }
                    for g in mb.groups
                ],
            }
            for mb in plan.micro_batches
        ],
        "communicators": [list(c) for c in plan.communicators],
        "solver": {"backend": plan.solver.backend, "status": plan.solver.status},
    }
    if plan.static_baseline is not None:
        sb = plan.static_baseline
        doc["static_baseline"] = {
            "degree": sb.degree,
            "micro_batches": sb.micro_batches,
            "predicted_step_time_s": sb.predicted_step_time_s,
        }
    if plan.new_communicators is not None:
        doc["new_communicators"] = [list(c) for c in plan.new_communicators]
    return doc


def static_by_degree(problem: Any) -> dict[int, float]:
    """Step time of the best static layout of each power-of-two group size that fits the step
    (the fewest micro-batches memory allows, or one more), for the epoch's static-mesh comparison."""
    from optimizer.costs.tables import CostTables
    from optimizer.heuristic.static_layout import static_assignment
    from optimizer.plan.evaluate import assignment_step_time

    tables = CostTables.build(problem)
    n = tables.n_ranks
    cap = float(tables.rank_capacity.min())
    total = float(tables.lengths.sum())
    longest = int(tables.lengths.max())
    most = problem.options.micro_batch_limit
    out: dict[int, float] = {}
    c = 1
    while c <= n:
        if longest <= cap * c and c in tables.degree_index:
            least = max(1, math.ceil(total / (cap * c * (n // c)) - 1e-12))
            best = math.inf
            for mb in range(least, min(most, least + 1) + 1):
                a = static_assignment(tables, c, mb)
                if a is not None:
                    best = min(best, assignment_step_time(tables, a))
            if best < math.inf:
                out[c] = best
        c *= 2
    return out


def _failure(step: int, ids: Sequence[str], exc: PlannerError) -> dict[str, Any]:
    sample = None
    m = _SAMPLE_IN_FIELD.match(exc.field or "")
    if m and int(m.group(1)) < len(ids):
        sample = ids[int(m.group(1))]
    else:
        found = _SAMPLE_IN_MESSAGE.search(exc.message)
        if found:
            sample = found.group(1)
    kind = "infeasible" if isinstance(exc, InfeasibleError) else "invalid"
    return {"kind": kind, "field": exc.field, "message": exc.message, "hint": exc.hint, "sample": sample, "step": step}


def failed_record(step: int, ids: Sequence[str], error: dict[str, Any], wall_ms: float = 0.0) -> dict[str, Any]:
    return {"step": step, "status": "failed", "sample_ids": list(ids), "error": error, "wall_ms": wall_ms}


def plan_step(
    template: Mapping[str, Any], step: int, samples: Sequence[Any], bad: tuple[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The record of one step (see the module docstring). ``bad``: the id and error document of
    an invalid sample of the step found when the dataset was read."""
    from optimizer.problem.documents import problem_from_json
    from planning.planner import plan

    start, cpu = time.perf_counter(), time.process_time()
    ids = [str(s.get("id")) if isinstance(s, Mapping) else "?" for s in samples]
    if bad is not None:
        return failed_record(step, ids, {**bad[1], "sample": bad[0], "step": step})
    try:
        problem = problem_from_json({**template, "batch": {"samples": list(samples)}})
        result = plan(problem)
        statics = static_by_degree(problem)
    except PlannerError as exc:
        return failed_record(step, ids, _failure(step, ids, exc), (time.perf_counter() - start) * 1000.0)
    doc = plan_doc(result)
    sb = result.static_baseline
    return {
        "step": step,
        "status": "ok",
        "sample_ids": ids,
        "predicted_step_time_s": result.predicted_step_time_s,
        "lower_bound_s": result.lower_bound_s,
        "gap": result.gap,
        "micro_batches": len(result.micro_batches),
        "static_step_time_s": sb.predicted_step_time_s if sb else None,
        "static_degree": sb.degree if sb else None,
        "static_degrees": sorted(statics),
        "static_times": [statics[c] for c in sorted(statics)],
        "communicators": [list(c) for c in result.communicators],
        "plan": json.dumps(doc, separators=(",", ":")),
        "error": None,
        "wall_ms": (time.perf_counter() - start) * 1000.0,
        "cpu_ms": (time.process_time() - cpu) * 1000.0,
    }


def plan_chunk(template: Mapping[str, Any], chunk: Sequence[tuple[int, Sequence[Any], Any]]) -> list[dict[str, Any]]:
    """Plan several steps in a row (one task of an engine)."""
    return [plan_step(template, step, samples, bad) for step, samples, bad in chunk]
