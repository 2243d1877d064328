"""The slot model of :mod:`solver_models.formulation` as a PuLP MILP, solved by HiGHS or CBC.

The variables, rows and objective come from :class:`~solver_models.formulation.SlotModel` (its
docstring numbers the constraints), translated row by row; times are the model's
integers of ``formulation.UNIT`` seconds divided by :func:`time_scale` (the incumbent's step time
becomes about 1e4) so that the solvers' tolerances stay meaningful. HiGHS runs in process
(``highspy``), starts from the incumbent (``setSolution``) and reports its MIP dual bound; CBC runs as
a subprocess, takes the incumbent as a warm start, reports its best possible objective in its log and
gets a shorter time limit because its start-up and shut-down come on top. The status is read from
``sol_status`` (CBC says "Optimal" on a time-out while the solution status says integer-feasible),
so only a proven optimum is called ``optimal``. Neither solver reports improving solutions while it
runs here; the anytime trace of these backends holds the answers of the search rounds.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

from optimizer.costs.tables import CostTables
from optimizer.plan.records import Assignment
from optimizer.problem.options import PlanOptions
from solver_models.base import ImprovementCallback, SolveResult, register
from solver_models.formulation import SlotModel
from solver_models.lns import ModelResult, improve
from solver_models.stop import Stopped, check_stop, current_stop, stop_requested

CBC_OVERHEAD_S = 0.06
"""Seconds CBC needs beyond its time limit (process start, model file, solution file); chosen by hand."""
CBC_MIN_LIMIT_S = 0.05
"""Shortest time limit CBC is started with (below it, it seldom gets past its root node); chosen by hand."""
CBC_ROUND_S = 0.3
"""Most seconds of solving in one neighbourhood round of CBC (CBC_OVERHEAD_S comes on top): its process
start makes short rounds pay mostly overhead. Chosen by hand."""
CBC_LATENESS_S = 0.02
"""Seconds CBC may answer after its time limit, beyond CBC_OVERHEAD_S (the neighbourhood search raises
it to the lateness it sees). Chosen by hand."""
HIGHS_LATENESS_S = 0.015
"""Seconds HiGHS may answer after its time limit (it checks the clock between phases). Chosen by hand;
the neighbourhood search raises it to the lateness it sees."""


SCALE_TARGET = 1e4
"""The incumbent's step time in the MILPs' scaled time unit (see :func:`time_scale`)."""
HIGHS_GAP = 1e-6
"""HiGHS's relative MIP gap (its default, 1e-4, would equal the planner's OPTIMAL_GAP and leave no room)."""
_HIGHS_THREADS: list[int] = []
"""Threads of the first HiGHS solve of this process (highspy's task scheduler is set up once per process)."""


def time_scale(model: SlotModel) -> float:
    """Model units per MILP time unit: the incumbent's step time becomes about SCALE_TARGET.

    The slot model counts 0.1 us units, so coefficients reach 1e7 to 1e8 for steps of seconds; at that
    size the MILP solvers' absolute tolerances (1e-6 to 1e-9 on rows and integrality) stop meaning
    anything and a "proven" optimum can be wrong. Scaled, times are moderate floats (T_m continuous,
    no rounding added), and memory rows are divided by the slot's capacity.
    """
    return max(1.0, model.upper / SCALE_TARGET)


def build_problem(model: SlotModel) -> tuple[Any, list[Any], dict[tuple[int, int], Any], list[Any]]:
    """The PuLP problem of ``model`` (times divided by :func:`time_scale`) and its y, x and T variables."""
    import pulp

    scale = time_scale(model)
    prob = pulp.LpProblem("dhp_slots", pulp.LpMinimize)
    v: dict[Any, Any] = {}
    for key, low, high in model.variables():
        name = key[0] + "_".join(str(k) for k in key[1:])
        if key[0] in ("T", "U"):  # times in seconds / scale: coefficients near 1
            v[key] = prob.add_variable(name, low / scale, high / scale)
        else:
            v[key] = prob.add_variable(name, low, high, cat="Binary" if (low, high) == (0, 1) else "Integer")
    prob += pulp.lpSum(c * v[key] for key, c in model.objective())
    for k, row in enumerate(model.rows()):
        check_stop(k)
        # Rows rescaled: time rows to scaled seconds (the T and U variables are scaled already), memory rows to a
        # share of the slot's capacity.
        if row.kind == "time":
            terms = [(c if key[0] in ("T", "U") else c / scale, key) for key, c in row.terms]
            rhs = row.rhs / scale
        elif row.kind == "memory":
            cap = max(1, max(abs(c) for key, c in row.terms if key[0] == "y"))
            terms = [(c / cap, key) for key, c in row.terms]
            rhs = row.rhs / cap
        else:
            terms = [(c, key) for key, c in row.terms]
            rhs = row.rhs
        expr = pulp.lpSum(c * v[key] for c, key in terms)
        prob += expr == rhs if row.sense == "==" else expr <= rhs if row.sense == "<=" else expr >= rhs
    y = [v[("y", s)] for s in range(model.n_slots)]
    x: dict[tuple[int, int], Any] = {(q, s): v[("x", q, s)] for q, s, _ in model.arcs}
    t_mb = [v[("T", m)] for m in range(model.n_mb)]
    return prob, y, x, t_mb


@functools.cache
def _silence_highs_banner() -> None:
    """HiGHS prints a banner to stdout when the first instance of a process is made; make that one here, muted."""
    import highspy

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def highs_module() -> Any:
    """The ``highspy`` module with its banner already muted, or None when it is not installed."""
    try:
        import highspy
    except ImportError:
        return None
    _silence_highs_banner()
    return highspy


def highs_threads(requested: int) -> int:
    """The thread count HiGHS runs with in this process: the first one asked for.

    highspy sets up its task scheduler once per process with the first run's thread count; a later
    run asking for another count fails ("error" on every solve), so every run keeps the first count.
    """
    if not _HIGHS_THREADS:
        _HIGHS_THREADS.append(max(1, int(requested)))
    return _HIGHS_THREADS[0]


def _highs_solver(time_limit_s: float, options: PlanOptions, warm: bool) -> Any:
    """PuLP's in-process HiGHS, given the variables' initial values as a starting solution when ``warm``.

    The time limit counts from this call: PuLP passes the model to HiGHS one column and row at a time
    after it has set the limit, so the limit is set again, to what is left, just before the run. A
    stop of this thread's solve (:mod:`solver_models.stop`) cancels the run."""
    import pulp

    ends = time.perf_counter() + time_limit_s

    class WarmHiGHS(pulp.HiGHS):  # PuLP's HiGHS interface has no warm start: pass the values through setSolution
        def callSolver(self, lp: Any) -> None:
            if warm:
                columns = lp.variables()
                index = [v.index for v in columns if v.varValue is not None]
                values = [float(v.varValue) for v in columns if v.varValue is not None]
                if index:
                    import numpy as np

                    lp.solverModel.setSolution(
                        len(index), np.asarray(index, dtype=np.int32), np.asarray(values, dtype=np.float64)
                    )
            highs = lp.solverModel
            if not options.deterministic:
                highs.setOptionValue("time_limit", max(0.001, ends - time.perf_counter()))
            signal = current_stop()
            unregister = None
            if signal is not None and hasattr(highs, "cancelSolve"):
                highs.HandleUserInterrupt = True
                unregister = signal.on_stop(highs.cancelSolve)
            try:
                highs.run()
            finally:
                if unregister is not None:
                    unregister()

    return WarmHiGHS(
        msg=False, timeLimit=max(0.001, time_limit_s), threads=highs_threads(options.solver_workers), gapRel=HIGHS_GAP
    )


@functools.cache
def _cbc_processes_stoppable() -> None:
    """Let a stop end the CBC process of the solve running in a thread (:mod:`solver_models.stop`).

    PuLP starts CBC with ``subprocess.Popen`` in ``pulp.apis.coin_api`` and keeps no handle to it;
    that module's ``subprocess`` becomes a copy of the real module whose ``Popen`` registers each
    process it starts with the starting thread's stop signal (a process that has ended ignores it).
    """
    import subprocess
    import types

    from pulp.apis import coin_api

    class StoppablePopen(subprocess.Popen):  # type: ignore[type-arg]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            signal = current_stop()
            if signal is not None:
                signal.on_stop(self.kill)

    view = types.ModuleType("subprocess", subprocess.__doc__)
    view.__dict__.update({k: v for k, v in vars(subprocess).items() if not k.startswith("__")})
    view.Popen = StoppablePopen  # type: ignore[attr-defined]
    coin_api.subprocess = view  # type: ignore[attr-defined]


def _set_start(model: SlotModel, y: list[Any], x: dict[tuple[int, int], Any], t_mb: list[Any]) -> bool:
    """Give the hint's values to the variables (the starting solution); False when the model has no
    complete hint, or when a hinted micro-batch time lies above its variable's bound (a neighbourhood's
    times rounded up to the model's units can pass the incumbent's; PuLP refuses such a start)."""
    if not model.hint_x:
        return False
    scale = time_scale(model)
    times = [max(v, model.floor[m]) / scale for m, v in enumerate(model.hint_t)]
    if any(t_mb[m].upBound is not None and value > t_mb[m].upBound for m, value in enumerate(times)):
        return False
    for s, v in enumerate(model.hint_y):
        y[s].setInitialValue(v)
    for key, var in x.items():
        var.setInitialValue(model.hint_x.get(key, 0))
    for m, value in enumerate(times):
        t_mb[m].setInitialValue(value)
    return True


def _solve_with(solver_name: str, model: SlotModel, time_limit_s: float, options: PlanOptions) -> ModelResult:
    called = (
        time.perf_counter()
    )  # the limit counts from here: loading PuLP (the first time) and building the model are part of it
    import pulp

    if solver_name == "highs":
        _silence_highs_banner()
    else:
        _cbc_processes_stoppable()
    try:
        prob, y, x, t_mb = build_problem(model)
    except Stopped as exc:
        return ModelResult("timeout", None, None, None, None, message=str(exc))
    scale = time_scale(model)
    warm = _set_start(model, y, x, t_mb) and not model.tiebreak
    if not options.deterministic:
        time_limit_s -= time.perf_counter() - called
        if time_limit_s < 0.001:
            return ModelResult("timeout", None, None, None, None, message="no time left after building the model")
    if stop_requested():
        return ModelResult("timeout", None, None, None, None, message="stopped at the deadline")
    log = None
    if solver_name == "highs":
        solver = _highs_solver(time_limit_s, options, warm)
    else:
        limit = time_limit_s - CBC_OVERHEAD_S
        if limit < CBC_MIN_LIMIT_S:
            return ModelResult("timeout", None, None, None, None)
        import tempfile

        log = tempfile.NamedTemporaryFile("r", suffix=".log", prefix="dhp-cbc-", delete=False)
        log.close()
        with warnings.catch_warnings():  # the bundled CBC binary is what a plain install has
            warnings.simplefilter("ignore", DeprecationWarning)
            solver = pulp.PULP_CBC_CMD(
                msg=False,
                timeLimit=limit,
                # One worker: CBC's serial search, whose path does not depend on the machine's load;
                # ``-threads 1`` runs its parallel search with one worker, paced by a waiting main thread.
                threads=options.solver_workers if options.solver_workers > 1 else None,
                warmStart=warm,
                timeMode="elapsed",
                logPath=log.name,
            )
    try:
        try:
            prob.solve(solver)
        except pulp.PulpSolverError as exc:  # CBC may exit without a solution file when stopped very early
            return ModelResult("error", None, None, None, None, message=str(exc))
        except Exception as exc:  # noqa: BLE001 - HiGHS errors (e.g. its scheduler) are errors, not time-outs
            return ModelResult("error", None, None, None, None, message=f"{type(exc).__name__}: {exc}")
        cbc_bound = _cbc_bound(log.name) if log is not None else None
    finally:
        if log is not None:
            os.unlink(log.name)
    sol = prob.sol_status
    highs_state = _highs_status(prob) if solver_name == "highs" else None
    if sol == pulp.LpSolutionInfeasible:
        return ModelResult("infeasible", None, None, None, None)
    if sol not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        if solver_name == "highs" and highs_state not in ("kTimeLimit", "kInterrupt", "kIterationLimit"):
            return ModelResult("error", None, None, None, None, message=f"HiGHS ended with model status {highs_state}")
        state = "timeout" if sol == pulp.LpSolutionNoSolutionFound else "error"
        return ModelResult(
            state,
            None,
            None,
            None,
            _scaled_bound(_highs_bound(prob, solver_name), scale) if not model.tiebreak else None,
        )
    yv = [int(round(v.value() or 0)) for v in y]
    xv = {k: int(round(v.value() or 0)) for k, v in x.items()}
    objective = int(round(sum(v.value() or 0.0 for v in t_mb) * scale))
    status = "optimal" if sol == pulp.LpSolutionOptimal else "feasible"
    bound = None
    if not model.tiebreak:
        # The solver's own bound: HiGHS's MIP dual bound; CBC's from its log when it stopped early. CBC states
        # no bound when it proves optimality ("Optimal solution found"), and then (only then) its objective
        # is its bound.
        raw = _highs_bound(prob, solver_name) if solver_name == "highs" else cbc_bound
        if status == "optimal" and solver_name == "cbc":
            raw = sum(v.value() or 0.0 for v in t_mb)
        bound = _scaled_bound(raw, scale)
    return ModelResult(status, yv, xv, objective, bound)


def _scaled_bound(raw: float | None, scale: float) -> int | None:
    """A bound in model units from one in scaled units, rounded down past the solvers' tolerances (1e-6)."""
    if raw is None or not raw > -1e30 or raw != raw:
        return None
    return max(0, math.floor(raw * scale * (1 - 1e-6)))


def _highs_status(prob: Any) -> str | None:
    try:
        return str(prob.solverModel.getModelStatus()).rsplit(".", 1)[-1]
    except Exception:  # noqa: BLE001 - no model status to read
        return None


def _cbc_bound(path: str) -> float | None:
    """CBC's best possible objective from its log when it stopped early: its final "Lower bound:", else
    the last "best possible" of its progress lines (bounds only rise, so an earlier one is still valid)."""
    import re

    try:
        with open(path) as fh:
            text = fh.read()
    except OSError:
        return None
    found = re.findall(r"Lower bound:\s*(-?[0-9.eE+-]+)", text) or re.findall(r"best possible (-?[0-9.eE+-]+)", text)
    try:
        return float(found[-1]) if found else None
    except ValueError:
        return None


def _highs_bound(prob: Any, solver_name: str) -> float | None:
    """HiGHS's MIP dual bound (in the MILP's scaled units)."""
    if solver_name != "highs":
        return None
    try:
        info = prob.solverModel.getInfo()
        bound = float(info.mip_dual_bound)
    except Exception:  # noqa: BLE001 - an unreadable bound is simply not reported
        return None
    if not bound > -1e30 or bound != bound:
        return None
    return bound


def _model_solver(
    solver_name: str,
) -> Callable[[SlotModel, float, PlanOptions, Callable[[int, int | None], None] | None], ModelResult]:
    def solve_model(
        model: SlotModel,
        time_limit_s: float,
        options: PlanOptions,
        on_solution: Callable[[int, int | None], None] | None = None,
    ) -> ModelResult:
        res = _solve_with(solver_name, model, time_limit_s, options)
        if on_solution is not None and res.objective is not None:
            on_solution(res.objective, res.bound)
        return res

    return solve_model


def _installed(solver_name: str) -> bool:
    """PuLP found on the path and, for HiGHS, highspy; for CBC, PuLP's bundled binary or one on the PATH."""
    import importlib.util
    import shutil

    spec = importlib.util.find_spec("pulp")
    if spec is None:
        return False
    if solver_name == "highs":
        return importlib.util.find_spec("highspy") is not None
    bundled = [os.path.join(p, "solverdir", "cbc") for p in (spec.submodule_search_locations or [])]
    return any(os.path.isdir(p) for p in bundled) or shutil.which("cbc") is not None


PULP_IMPORT_MS = 100.0
"""Milliseconds loading PuLP with highspy costs in a fresh process: measured 26 to 62 ms on the 2-core
development machine; this leaves room for a busy machine."""


class PulpBackend:
    deterministic_limits = False
    """HiGHS has no limit on its work at the root node but the clock (its node limit starts after the
    root, and its callbacks report no LP iterations there), and CBC runs under its time limit alone: a
    round's answer depends on how fast the machine ran it, in deterministic mode too."""

    def __init__(self, solver_name: str) -> None:
        self.name = solver_name

    def available(self) -> bool:
        """Whether PuLP and this solver are installed; found without loading PuLP when it is not loaded yet."""
        if "pulp" not in sys.modules:
            return _installed(self.name)
        import pulp

        try:
            if self.name == "highs":
                return bool(pulp.HiGHS(msg=False).available())
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                return bool(pulp.PULP_CBC_CMD(msg=False).available())
        except Exception:  # noqa: BLE001 - a broken installation counts as missing
            return False

    def load_ms(self) -> float:
        return 0.0 if "pulp" in sys.modules else PULP_IMPORT_MS

    def cold_load_ms(self) -> float:
        """What loading PuLP costs a process that has not loaded it (whatever this one has)."""
        return PULP_IMPORT_MS

    def solve(
        self,
        tables: CostTables,
        options: PlanOptions,
        hint: Assignment | None,
        deadline: float,
        on_improvement: ImprovementCallback | None = None,
    ) -> SolveResult:
        if self.name == "cbc":
            return improve(
                tables,
                options,
                hint,
                deadline,
                _model_solver(self.name),
                on_improvement,
                round_s=CBC_ROUND_S + CBC_OVERHEAD_S,
                min_round_s=2 * CBC_OVERHEAD_S,
                lateness_s=CBC_LATENESS_S,
            )
        return improve(
            tables, options, hint, deadline, _model_solver(self.name), on_improvement, lateness_s=HIGHS_LATENESS_S
        )


register("highs", lambda: PulpBackend("highs"))
register("cbc", lambda: PulpBackend("cbc"))
