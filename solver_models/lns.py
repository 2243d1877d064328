"""Anytime search with an exact model, shared by every backend.

A backend supplies ``solve_model(model, seconds, options, on_solution)`` for one
:class:`~solver_models.formulation.SlotModel`; :func:`improve` decides what to solve:

- *whole problem* (small instances, estimated model size below ``FULL_MODEL_PAIRS``): the full
  model of :func:`~solver_models.formulation.full_model`, hinted with the heuristic's plan; its
  proven bound is a bound of the problem on homogeneous clusters (less the rounding slack);
- *large-neighbourhood search* otherwise: starting from the heuristic's plan, each round frees the
  slowest group of one micro-batch together with the groups sharing its nodes and a few of the
  lightest groups, sometimes with the lightest groups of a second micro-batch, and every TRADE_EVERY
  rounds with the slowest groups of the slowest other micro-batch (so that long samples can trade
  micro-batches), and re-solves their samples and, on two
  rounds out of three, their group sizes (idle ranks included), with everything else fixed. A round is kept when the
  re-computed step time falls, so the incumbent never gets worse than the hint. The neighbourhood
  grows after rounds solved to optimality and shrinks after time-outs. No global bound comes out of
  a restricted model. With ``deterministic`` the number of rounds is fixed by the budget option and
  every round runs under the solver's deterministic limit; the clock decides nothing, so the same
  input gives the same plan on any machine (a loaded one may take longer than the budget).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from optimizer.costs.tables import CostTables
from optimizer.plan.evaluate import assignment_step_time
from optimizer.plan.records import Assignment, TracePoint
from optimizer.problem.options import PlanOptions
from solver_models.base import ImprovementCallback, SolveResult
from solver_models.formulation import UNIT, Group, SlotModel, full_model, neighbourhood_model, rounding_slack
from solver_models.stop import stop_requested

FULL_MODEL_PAIRS = 6000
"""Largest estimated (item, slot) pair count solved as one model."""
MARGIN_S = 0.003
"""Seconds kept back from the deadline for decoding and evaluating the last answer (chosen by hand; the
planner keeps its own, measured reserve after the backend's deadline)."""
MIN_ROUND_S = 0.008
"""No new neighbourhood is started with less time than this left (chosen by hand: about half a ROUND_S)."""
ROUND_S = 0.015
"""Most seconds one neighbourhood may take: several rounds fit a budget of 100 ms (chosen by hand;
``python -m bench.solver_bench`` compares the backends at each budget)."""
LATENESS_S = 0.002
"""Seconds a solver is expected to return after its time limit when its backend names no figure of its
own (CP-SAT names none; HiGHS and CBC pass theirs). Chosen by hand; the neighbourhood search raises it
to the lateness it sees."""
DETERMINISTIC_ROUND_S = 0.06
"""Wall-clock cap of a round in deterministic mode (CP-SAT stops at a tenth of it in deterministic time,
:data:`solver_models.cpsat.DETERMINISTIC_TIME_SHARE`)."""
DETERMINISTIC_ROUND_SHARE = 1.5
"""Deterministic mode runs one round per this many round caps of the budget (``options.time_budget_ms``):
rounds that each reach their wall-clock cap, with building half as long again, fit the budget."""
DETERMINISTIC_WHOLE_SHARE = 0.5
"""Deterministic mode: the whole-problem model's time limit as a share of the budget option (chosen by hand)."""
TRADE_EVERY = 3
"""Every this many rounds, the neighbourhood also frees the slowest groups of the slowest other micro-batch."""
SAMPLES_PER_EXTRA = 8
"""Most samples a neighbourhood frees besides those of the slowest groups, per light group it frees (the size
adapts). The slowest groups' own samples do not count against it: a slowest group that alone held more would
otherwise be freed alone, its ranks with nowhere to move, and the search would cycle between that trivial
round and a neighbourhood too large for its limit."""


@dataclass
class ModelResult:
    status: str  # optimal, feasible, infeasible, timeout, error
    y: list[int] | None
    x: dict[tuple[int, int], int] | None
    objective: int | None  # model units
    bound: int | None  # model units
    message: str | None = None


ModelSolver = Callable[[SlotModel, float, PlanOptions, Callable[[int, int | None], None] | None], ModelResult]


def whole_model_fits(tables: CostTables) -> bool:
    """Whether the problem is solved as one whole model (else by the neighbourhood search)."""
    return full_model_pairs(tables) <= FULL_MODEL_PAIRS


def full_model_pairs(tables: CostTables) -> int:
    """Estimated pair count of the full model (samples x slots)."""
    n = tables.n_samples
    n_mb = min(tables.problem.options.micro_batch_limit, n)
    degrees = [int(d) for d in tables.degrees]
    per_mb = sum((b - a) // d for a, b in tables.node_ranges for d in degrees if d <= b - a)
    if len(tables.node_ranges) > 1:
        per_mb += sum(tables.n_ranks // d for d in degrees if d >= 2)
    return n * n_mb * per_mb


def improve(
    tables: CostTables,
    options: PlanOptions,
    hint: Assignment | None,
    deadline: float,
    solve_model: ModelSolver,
    on_improvement: ImprovementCallback | None,
    clock: Callable[[], float] = time.perf_counter,
    round_s: float = ROUND_S,
    min_round_s: float = MIN_ROUND_S,
    lateness_s: float = LATENESS_S,
) -> SolveResult:
    """Improve ``hint`` with ``solve_model`` until ``deadline`` (see the module docstring).

    Without a hint (the heuristic found no plan) only the whole-problem model can run.

    ``lateness_s`` is how late the solver is expected to return after its time limit; it is kept
    back from every limit and raised to the worst lateness seen.
    """
    if whole_model_fits(tables):
        return solve_whole(tables, options, hint, deadline - lateness_s, solve_model, on_improvement, clock)
    if hint is None:
        return SolveResult(None, "error", message="no starting plan, and the problem is too large for one whole model")
    return _lns(tables, options, hint, deadline, solve_model, on_improvement, clock, round_s, min_round_s, lateness_s)


def solve_whole(
    tables: CostTables,
    options: PlanOptions,
    hint: Assignment | None,
    deadline: float,
    solve_model: ModelSolver,
    on_improvement: ImprovementCallback | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> SolveResult:
    """The whole problem as one model (:func:`~solver_models.formulation.full_model`) solved by
    ``solve_model`` from ``hint`` until ``deadline`` (in deterministic mode for the budget's share
    DETERMINISTIC_WHOLE_SHARE); status ``optimal`` only where the model is exact (one GPU type)."""
    start = clock()
    if hint is not None:
        h_time = assignment_step_time(tables, hint)
    else:  # no plan known: the slowest any group could be (every sample in it, slowest placement)
        slowest = tables.time_matrix(False, float(tables.rank_speed.min()))
        h_time = float(np.maximum(tables.group_constants(False), tables.group_constants(True)).max()) + float(
            slowest.max(axis=1).sum()
        )
    model = full_model(tables, hint, h_time)
    build_ms = (clock() - start) * 1000.0
    details = {"mode": "full", "build_ms": round(build_ms, 3), **model.size()}
    if options.deterministic:
        left = DETERMINISTIC_WHOLE_SHARE * options.budget_ms / 1000.0  # from the input, never from the clock
    else:
        left = deadline - clock() - MARGIN_S
    if left <= 0.001:
        return SolveResult(
            None,
            "timeout",
            wall_ms=(clock() - start) * 1000.0,
            message="no time left after building the model",
            details=details,
        )
    slack = rounding_slack(model)
    certified = bool(tables.homogeneous)
    trace: list[TracePoint] = []

    def bound_s(units: int | None) -> float | None:
        if units is None or not certified:
            return None
        return max(0.0, min(units * UNIT - slack, h_time))

    def on_solution(objective: int, bound: int | None) -> None:
        elapsed = (clock() - start) * 1000.0
        point = TracePoint(elapsed, objective * UNIT, bound_s(bound))
        trace.append(point)
        if on_improvement is not None:
            on_improvement(elapsed, point.objective_s, point.bound_s)

    res = solve_model(model, left, options, on_solution)
    wall_ms = (clock() - start) * 1000.0
    details.update(model_status=res.status, certified_bound=certified)
    if res.y is None or res.x is None:
        return SolveResult(
            None,
            res.status,
            bound_s=bound_s(res.bound),
            wall_ms=wall_ms,
            trace=trace,
            message=f"the solver returned no plan ({res.status}{': ' + res.message if res.message else ''})",
            details=details,
        )
    groups = model.decode(res.x)
    assignment = Assignment.of([[(r, s) for r, s in mb] for mb in groups])
    objective = assignment_step_time(tables, assignment)
    bound = bound_s(res.bound)
    status = "optimal" if res.status == "optimal" and certified else "feasible"
    return SolveResult(
        assignment, status, objective_s=objective, bound_s=bound, wall_ms=wall_ms, trace=trace, details=details
    )


def _mb_times(tables: CostTables, current: list[list[Group]]) -> list[list[float]]:
    return [[tables.group_time(list(s), r) for r, s in mb] for mb in current]


def _neighbourhood(
    tables: CostTables,
    current: list[list[Group]],
    times: list[list[float]],
    rng: np.random.Generator,
    extra: int,
    m: int,
    trade: bool = False,
) -> list[list[int]]:
    """Group indices to free per micro-batch: the slowest groups of ``m``, the slowest one's node mates
    and ``extra`` light groups, sometimes with groups of a second micro-batch (with ``trade``, the
    slowest of the slowest other one), at most SAMPLES_PER_EXTRA x ``extra`` samples besides the slowest groups'.
    With no idle rank in ``m``, a neighbourhood of the slowest groups alone also frees the lightest group of ``m``."""
    free: list[set[int]] = [set() for _ in current]
    node_of = tables.rank_node
    mb = current[m]
    order = [int(k) for k in np.argsort(times[m], kind="stable")]
    slow = order[-1]
    heavy = order[::-1][: max(1, extra // 3)]
    free[m].update(heavy)
    nodes = {int(node_of[r]) for r in mb[slow][0]}
    mates = (
        [k for k, (r, _) in enumerate(mb) if len({int(node_of[x]) for x in r}) == 1 and int(node_of[r[0]]) in nodes]
        if len(nodes) == 1
        else []
    )
    light = [k for k in order[: extra * 2] if k not in free[m]]
    if light:
        free[m].update(int(k) for k in rng.choice(light, size=min(extra, len(light)), replace=False))
    if len(current) > 1 and rng.random() < 0.35:
        other = int(rng.choice([k for k in range(len(current)) if k != m]))
        free[other].update(int(k) for k in np.argsort(times[other], kind="stable")[: max(1, extra // 2)])
    if trade and len(current) > 1:
        # The slowest groups of the slowest other micro-batch: long samples can trade places and sizes.
        slowest = max((k for k in range(len(current)) if k != m), key=lambda k: max(times[k], default=0.0))
        free[slowest].update(int(k) for k in np.argsort(times[slowest], kind="stable")[::-1][: max(1, extra // 3)])
    # Keep the model small: drop the slowest group's node mates first, then light groups, never the slowest.
    cap = sum(len(mb[g][1]) for g in heavy) + SAMPLES_PER_EXTRA * extra
    count = sum(len(current[k][g][1]) for k in range(len(current)) for g in free[k])
    for g in sorted(set(mates) - free[m], key=lambda g: -times[m][g]):
        if count + len(mb[g][1]) > cap:
            break
        free[m].add(g)
        count += len(mb[g][1])
    for k in range(len(current)):
        for g in sorted(free[k], key=lambda g: times[k][g]):
            if count <= cap:
                break
            if k == m and g in heavy:
                continue
            count -= len(current[k][g][1])
            free[k].discard(g)
    busy = sum(len(r) for r, _ in mb)
    if free[m] == set(heavy) and len(mb) > len(heavy) and busy == tables.n_ranks:
        # With no idle rank, the slowest groups alone have nowhere to move: the lightest group of m goes too.
        free[m].add(next(g for g in order if g not in free[m]))
    return [sorted(f) for f in free]


def _lns(
    tables: CostTables,
    options: PlanOptions,
    hint: Assignment,
    deadline: float,
    solve_model: ModelSolver,
    on_improvement: ImprovementCallback | None,
    clock: Callable[[], float],
    round_s: float,
    min_round_s: float,
    lateness_s: float,
) -> SolveResult:
    start = clock()
    current: list[list[Group]] = [list(mb) for mb in hint.micro_batches]
    times = _mb_times(tables, current)
    best = sum(max(t) for t in times)
    best_spread = sum(x * x for t in times for x in t)
    rng = np.random.default_rng(0)
    extra = 4
    rounds = improved = timeouts = errors = 0
    last_error: str | None = None
    build_ms = solve_ms = 0.0
    largest: dict[str, int] = {}
    trace: list[TracePoint] = []
    overrun = lateness_s
    # Deterministic mode: a round count fixed by the budget (each round under a deterministic limit),
    # so that the same input gives the same plan whenever the rounds fit the budget.
    # The clock is then never read to decide anything (a loaded machine may take longer than the budget).
    max_rounds = None
    if options.deterministic:
        round_s = DETERMINISTIC_ROUND_S
        max_rounds = int(options.budget_ms / 1000.0 / (DETERMINISTIC_ROUND_SHARE * round_s))
    while (
        (rounds < max_rounds) if max_rounds is not None else (deadline - clock() > min_round_s)
    ) and not stop_requested():
        mb_time = np.array([max(t) for t in times])
        m = int(rng.choice(len(current), p=mb_time / mb_time.sum())) if rounds % 2 else int(np.argmax(mb_time))
        free = _neighbourhood(tables, current, times, rng, extra, m, trade=rounds % TRADE_EVERY == TRADE_EVERY - 1)
        t0 = clock()
        model = neighbourhood_model(tables, current, free, best, resize=rounds % 3 != 0)
        t1 = clock()
        build_ms += (t1 - t0) * 1000.0
        size = model.size()
        if size["pairs"] > largest.get("pairs", -1):
            largest = size
        if max_rounds is None:
            left = deadline - clock() - MARGIN_S - overrun
            if left < 0.002:
                break
            limit = min(left, round_s)
        else:
            limit = round_s  # every round the same: the answer depends on the input alone
        res = solve_model(model, limit, options, None)
        spent = clock() - t1
        solve_ms += spent * 1000.0
        # The solver's own lateness, kept back from later rounds; a one-off delay (loading the library) fades.
        overrun = max(lateness_s, 0.8 * overrun, spent - limit)
        rounds += 1
        if res.status == "optimal":
            extra = min(extra + 1, 16)
        elif res.status in ("timeout", "feasible"):
            timeouts += 1
            extra = max(1, extra - 1)
        if res.status == "error":
            errors += 1
            last_error = res.message
        if res.y is None or res.x is None:
            continue
        touched = [k for k in range(len(current)) if free[k]]
        new = model.decode(res.x)
        candidate = list(current)
        for k, mb in zip(touched, new, strict=False):
            candidate[k] = [g for g in mb if g[1]]
        cand_times = list(times)
        for k in touched:
            cand_times[k] = [tables.group_time(list(s), r) for r, s in candidate[k]]
        total = sum(max(t, default=0.0) for t in cand_times)
        spread = sum(x * x for t in cand_times for x in t)
        better = total < best * (1 - 1e-9)
        if better or (total <= best * (1 + 1e-12) and spread < best_spread * (1 - 1e-9)):
            current, times, best, best_spread = candidate, cand_times, min(total, best), spread
        if better:
            improved += 1
            elapsed = (clock() - start) * 1000.0
            trace.append(TracePoint(elapsed, best, None))
            if on_improvement is not None:
                on_improvement(elapsed, best, None)
        # Drop micro-batches left empty.
        keep = [k for k in range(len(current)) if current[k]]
        current, times = [current[k] for k in keep], [times[k] for k in keep]
    assignment = Assignment.of([[(r, s) for r, s in mb] for mb in current])
    details = {
        "mode": "lns",
        "rounds": rounds,
        "improved_rounds": improved,
        "timeouts": timeouts,
        "build_ms": round(build_ms, 3),
        "solve_ms": round(solve_ms, 3),
        "overrun_ms": round(overrun * 1000.0, 3),
        "largest_model": largest,
    }
    if errors:
        details.update(errors=errors, last_error=last_error)
    return SolveResult(
        assignment,
        "feasible",
        objective_s=best,
        bound_s=None,
        wall_ms=(clock() - start) * 1000.0,
        trace=trace,
        details=details,
    )
