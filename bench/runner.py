"""The benchmark grid: workloads x cluster sizes x batch sizes, every planner on every batch.

For each cell (workload, ranks, samples) and each seeded batch, every planner plans the batch
from the same :class:`~optimizer.problem.Problem`. Its answer is evaluated with
:func:`optimizer.evaluate.assignment_step_time` and verified with
:func:`optimizer.verify.check_assignment` (an answer that fails verification is recorded as
invalid and never counted). Recorded per planner and batch: predicted step time, speedup over
static at its best, ratio to :func:`optimizer.bounds.lower_bound`, planning wall times (one
warm-up call on the cell's first batch, then ``repeats`` timed calls per batch) and peak Python
memory of one extra call under :mod:`tracemalloc` (kept apart so tracing does not slow the timed
calls).
"""

from __future__ import annotations

import math
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.planners import PLANNERS, Outcome, default_planners
from bench.workloads import Workload, get_workload
from optimizer.bounds import lower_bound
from optimizer.costs import CostTables
from optimizer.documents import problem_from_json
from optimizer.errors import PlannerError, ProblemError
from optimizer.evaluate import assignment_step_time
from optimizer.problem import Problem
from optimizer.verify import check_assignment

GPUS_PER_NODE = 8
MODEL_PRESET = "qwen2-vl-7b"
MAX_MICRO_BATCHES = 16
"""Most micro-batches per step for every planner: above the engine's default of 8 so that a static
mesh as deployed, which packs without balancing and may need more, still gives a valid plan."""


@dataclass(frozen=True)
class GridSpec:
    """What to run. ``samples_per_rank`` gives the batch sizes (samples = ranks x each value)."""

    workloads: tuple[str, ...] = ("video", "image-sft", "anyres", "dynamic-res", "long-text", "mixed")
    ranks: tuple[int, ...] = (8, 64, 512, 4096)
    samples_per_rank: tuple[int, ...] = (2, 8)
    max_samples: int = 8192
    """Cells with more samples are skipped (recorded as skipped): the scaling run covers larger ones."""
    seeds: int = 3
    repeats: int = 3
    budget_ms: float = 1000.0
    """Time budget of the planner with an exact backend and of the FlexSP-style MILP."""
    planners: tuple[str, ...] = field(default_factory=lambda: tuple(default_planners()))
    memory: bool = True

    def __post_init__(self) -> None:
        for r in self.ranks:
            if r < 1 or (r > GPUS_PER_NODE and r % GPUS_PER_NODE):
                raise ProblemError(f"{r} ranks is not a whole number of {GPUS_PER_NODE}-GPU nodes", field="--ranks", hint=f"use 1..{GPUS_PER_NODE} or a multiple of {GPUS_PER_NODE}.")
        unknown = [p for p in self.planners if p not in PLANNERS]
        if unknown:
            raise ProblemError(f"unknown planner(s) {unknown}", field="--planners", hint=f"use some of {list(PLANNERS)}.")
        if self.seeds < 1 or self.repeats < 1:
            raise ProblemError("seeds and repeats must be >= 1", field="--seeds", hint="e.g. --seeds 3 --repeats 3.")

    def cells(self) -> list[tuple[str, int, int]]:
        return [(w, r, r * k) for w in self.workloads for r in self.ranks for k in self.samples_per_rank]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def cluster_doc(ranks: int) -> dict[str, Any]:
    """A homogeneous H100 cluster of ``ranks`` GPUs (8 per node; one smaller node below 8)."""
    if ranks <= GPUS_PER_NODE:
        return {"nodes": 1, "gpus_per_node": ranks}
    return {"nodes": ranks // GPUS_PER_NODE, "gpus_per_node": GPUS_PER_NODE}


def make_problem(workload: Workload, ranks: int, n: int, seed: int, budget_ms: float) -> Problem:
    doc = {"batch": workload.batch(n, seed), "cluster": cluster_doc(ranks), "model_preset": MODEL_PRESET,
           "options": {"time_budget_ms": budget_ms, "solver_workers": 1, "max_micro_batches": MAX_MICRO_BATCHES}}
    return problem_from_json(doc)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of ``values``."""
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, math.ceil(q / 100.0 * len(ordered)) - 1))
    return ordered[k]


def _timed(fn: Callable[[], Outcome]) -> tuple[Outcome | None, float, str | None]:
    start = time.perf_counter()
    try:
        out = fn()
        error = None
    except PlannerError as exc:
        out, error = None, f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # noqa: BLE001 - one planner's crash is a result, not the end of the run
        out, error = None, f"{type(exc).__name__}: {exc}"
    return out, (time.perf_counter() - start) * 1000.0, error


def _peak_mb(fn: Callable[[], Outcome]) -> float:
    tracemalloc.start()
    try:
        fn()
    except Exception:  # noqa: BLE001 - the error is recorded by the timed calls
        pass
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 2**20


def run_cell(spec: GridSpec, workload_name: str, ranks: int, n: int, tick: Callable[[], None] = lambda: None) -> Iterator[dict[str, Any]]:
    """Records (one per planner and batch) of one cell; an infeasible batch gives one record per planner saying so."""
    workload = get_workload(workload_name)
    for seed in range(spec.seeds):
        base = {"workload": workload.name, "ranks": ranks, "samples": n, "seed": seed}
        try:
            problem = make_problem(workload, ranks, n, seed, spec.budget_ms)
            tables = CostTables.build(problem)
        except PlannerError as exc:
            for name in spec.planners:
                tick()
                yield {**base, "planner": name, "status": "infeasible", "note": str(exc)}
            continue
        bound = lower_bound(tables)
        steps: dict[str, float] = {}
        rows = []
        for name in spec.planners:
            planner = PLANNERS[name]

            def call(planner=planner, problem=problem) -> Outcome:
                return planner(problem, workload)

            if seed == 0:
                _timed(call)  # warm-up
            walls = []
            out: Outcome | None = None
            error = None
            for _ in range(spec.repeats):
                out, ms, error = _timed(call)
                walls.append(ms)
            row: dict[str, Any] = {**base, "planner": name, "wall_ms": walls, "lower_bound_s": bound}
            if spec.memory and seed == 0:
                row["peak_mb"] = _peak_mb(call)
            if error is not None or out is None:
                row.update(status="error", note=error)
            elif out.assignment is None:
                row.update(status="no-plan", note=out.note, details=out.details)
            else:
                report = check_assignment(problem, out.assignment)
                step = assignment_step_time(tables, out.assignment)
                row.update(details=out.details, note=out.note, micro_batches=len(out.assignment.micro_batches))
                if report.ok:
                    row.update(status="ok", step_time_s=step, ratio_to_bound=step / bound if bound > 0 else 1.0, verified_step_time_s=report.step_time_s)
                    steps[name] = step
                else:
                    row.update(status="invalid", step_time_s=step, note="; ".join(report.violations[:3]))
            rows.append(row)
            tick()
        ref = steps.get("static-best")
        for row in rows:
            if ref is not None and row.get("status") == "ok":
                row["speedup_over_static_best"] = ref / row["step_time_s"]
            yield row


def run_grid(spec: GridSpec, progress: Callable[[int], Any] | None = None) -> dict[str, Any]:
    """Run every cell; ``progress(k)`` is called after each planner call group. Returns the result document."""
    from solver_models import available_backends

    try:
        backends = available_backends()
    except Exception as exc:  # noqa: BLE001 - recorded, the benchmark runs without them
        backends = [f"unavailable ({type(exc).__name__}: {exc})"]
    records: list[dict[str, Any]] = []
    skipped = []
    started = time.time()
    for w, r, n in spec.cells():
        if n > spec.max_samples:
            skipped.append({"workload": w, "ranks": r, "samples": n, "reason": f"more than max_samples {spec.max_samples}"})
            if progress:
                progress(spec.seeds * len(spec.planners))
            continue
        records.extend(run_cell(spec, w, r, n, (lambda: progress(1)) if progress else (lambda: None)))
    return {"spec": spec.to_json(), "backends": backends, "started_unix": started, "elapsed_s": time.time() - started,
            "records": records, "skipped": skipped}


def total_steps(spec: GridSpec) -> int:
    return len(spec.cells()) * spec.seeds * len(spec.planners)
