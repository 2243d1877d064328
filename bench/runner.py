"""The benchmark grid: workloads x cluster sizes x batch sizes, every planner on every batch.

For each cell (workload, ranks, samples) and each seeded batch, every planner plans the batch
from the same :class:`~optimizer.problem.problem.Problem`. Its answer is evaluated with
:func:`optimizer.plan.evaluate.assignment_step_time` and verified with
:func:`optimizer.verify.verifier.check_assignment` (an answer that fails verification is recorded as
invalid and never counted). Recorded per planner and batch: predicted step time, speedup over
static at its best, ratio to the best lower bound proven (:func:`best_bound`), planning wall times (one
warm-up call on the cell's first batch, then ``repeats`` timed calls per batch) and peak Python
memory of one extra call under :mod:`tracemalloc` (kept apart so tracing does not slow the timed
calls). The real FlexSP solver (planner ``flexsp``) is called once per batch, without warm-up or
memory tracing: one call takes seconds to minutes.

Profiles (``--profiles``): ``analytical`` is the analytical profile of the bench's model on the
bench's cluster (the default); any other name is a profile of the zoo (:func:`optimizer.presets.load_profile`)
or a profile file (.json). Every planner plans and is scored under the same profile. Under a Ulysses
profile the model (Qwen2-VL-7B-like) gets as many attention heads as the domain has ranks, so every
power-of-two group size divides them (FlexSP places no head limit on its sizes). A profile with
``speed_by_gpu`` gets a mixed cluster: the first half of the nodes H100, the second half the first GPU
type the profile lists. With ``flexsp`` among the planners, groups may span the whole domain
(``max_degree`` = ranks) as FlexSP's may; the bound is taken under that rule.
"""

from __future__ import annotations

import math
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.flexsp_real import FlexSPSettings
from bench.planners import PLANNERS, Outcome, default_planners, planner_for
from bench.workloads import Workload, get_workload
from optimizer.bounds.lower_bounds import lower_bound
from optimizer.costs.tables import CostTables
from optimizer.errors import PlannerError, ProblemError
from optimizer.plan.evaluate import assignment_step_time
from optimizer.problem.documents import problem_from_json
from optimizer.problem.problem import Problem
from optimizer.verify.verifier import check_assignment

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
    """Time budget of the planner with an exact backend and of the bucket MILP."""
    planners: tuple[str, ...] = field(default_factory=lambda: tuple(default_planners()))
    memory: bool = True
    profiles: tuple[str, ...] = ("analytical",)
    """Cost profiles the grid runs under: ``analytical``, zoo names or profile files."""
    samples: tuple[int, ...] = ()
    """Batch sizes in samples; when given they replace ``samples_per_rank``."""
    max_micro_batches: int = 16
    """``options.max_micro_batches`` of the grid's problems (dhp's default-option planners use their own)."""
    flexsp: FlexSPSettings = field(default_factory=FlexSPSettings)

    def __post_init__(self) -> None:
        for name in self.profiles:
            resolve_profile(name)
        if any(n < 1 for n in self.samples):
            raise ProblemError(f"batch sizes must be >= 1, got {self.samples}", field="--samples", hint="e.g. --samples 512.")
        for r in self.ranks:
            if r < 1 or (r > GPUS_PER_NODE and r % GPUS_PER_NODE):
                raise ProblemError(f"{r} ranks is not a whole number of {GPUS_PER_NODE}-GPU nodes", field="--ranks", hint=f"use 1..{GPUS_PER_NODE} or a multiple of {GPUS_PER_NODE}.")
        unknown = [p for p in self.planners if p not in PLANNERS]
        if unknown:
            raise ProblemError(f"unknown planner(s) {unknown}", field="--planners", hint=f"use some of {list(PLANNERS)}.")
        if self.seeds < 1 or self.repeats < 1:
            raise ProblemError("seeds and repeats must be >= 1", field="--seeds", hint="e.g. --seeds 3 --repeats 3.")

    def cells(self) -> list[tuple[str, int, int]]:
        if self.samples:
            return [(w, r, n) for w in self.workloads for r in self.ranks for n in self.samples]
        return [(w, r, r * k) for w in self.workloads for r in self.ranks for k in self.samples_per_rank]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "flexsp": self.flexsp.to_json()}


ANALYTICAL = "analytical"


def resolve_profile(name: str) -> dict[str, Any] | None:
    """The profile document ``name`` stands for (None: the analytical default); a zoo name or a .json file."""
    if name == ANALYTICAL:
        return None
    if name.endswith(".json"):
        from optimizer.problem.documents import profile_from_json, read_json_file

        doc = read_json_file(name, "--profiles")
        profile_from_json(doc)  # names the bad field now rather than in the middle of a run
        return dict(doc)
    from optimizer.costs.zoo import load_profile

    return load_profile(name, "--profiles")


def cluster_doc(ranks: int, profile: dict[str, Any] | None = None) -> dict[str, Any]:
    """A cluster of ``ranks`` GPUs (8 per node; one smaller node below 8): H100 nodes, or for a profile with
    ``speed_by_gpu`` (and at least two nodes) the second half of the nodes of the first GPU type it lists."""
    if ranks <= GPUS_PER_NODE:
        return {"nodes": 1, "gpus_per_node": ranks}
    nodes = ranks // GPUS_PER_NODE
    other = next(iter((profile or {}).get("speed_by_gpu") or {}), None)
    if other is not None and nodes >= 2:
        return {"nodes": [{"count": nodes - nodes // 2, "gpus": GPUS_PER_NODE, "gpu": "H100-SXM"}, {"count": nodes // 2, "gpus": GPUS_PER_NODE, "gpu": other}]}
    return {"nodes": nodes, "gpus_per_node": GPUS_PER_NODE}


def model_doc(ranks: int, profile: dict[str, Any] | None) -> dict[str, Any]:
    """The bench's model; under a Ulysses profile with as many attention heads as ranks (see the module docstring)."""
    from optimizer.presets import load_preset

    doc = load_preset("models", MODEL_PRESET, "model_preset")
    if profile is not None and (profile.get("comm") or {}).get("scheme") == "ulysses":
        doc = {**doc, "name": f"{doc.get('name', MODEL_PRESET)}-{ranks}heads", "llm": {**doc["llm"], "heads": ranks, "kv_heads": ranks}}
    return doc


def make_problem(workload: Workload, ranks: int, n: int, seed: int, budget_ms: float, profile: dict[str, Any] | None = None,
                 max_micro_batches: int = MAX_MICRO_BATCHES, whole_domain_groups: bool = False) -> Problem:
    options: dict[str, Any] = {"time_budget_ms": budget_ms, "solver_workers": 1, "max_micro_batches": max_micro_batches}
    if whole_domain_groups:
        options["max_degree"] = ranks
    doc: dict[str, Any] = {"batch": workload.batch(n, seed), "cluster": cluster_doc(ranks, profile), "options": options}
    if profile is None:
        doc["model_preset"] = MODEL_PRESET
    else:
        doc["model"] = model_doc(ranks, profile)
        doc["profile"] = profile
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


def best_bound(tables: CostTables) -> tuple[float, str]:
    """The best lower bound the project proves for the batch, without a time limit, and where it
    comes from: the engine's (:func:`optimizer.bounds.lower_bounds.lower_bound`, ``engine``) or the
    group-size LP of :mod:`solver_models.size_bound` (``group_sizes``) when HiGHS is installed and the
    LP is higher."""
    bound = lower_bound(tables)
    from solver_models.size_bound import size_bound

    lp = size_bound(tables)
    return (lp, "group_sizes") if lp is not None and lp > bound else (bound, "engine")


def run_cell(spec: GridSpec, workload_name: str, ranks: int, n: int, tick: Callable[[], None] = lambda: None,
             profile: str = ANALYTICAL) -> Iterator[dict[str, Any]]:
    """Records (one per planner and batch) of one cell; an infeasible batch gives one record per planner saying so."""
    workload = get_workload(workload_name)
    profile_doc = resolve_profile(profile)
    for seed in range(spec.seeds):
        base = {"workload": workload.name, "ranks": ranks, "samples": n, "seed": seed, "profile": profile}
        try:
            problem = make_problem(workload, ranks, n, seed, spec.budget_ms, profile_doc, spec.max_micro_batches, "flexsp" in spec.planners)
            tables = CostTables.build(problem)
        except PlannerError as exc:
            for name in spec.planners:
                tick()
                yield {**base, "planner": name, "status": "infeasible", "note": str(exc)}
            continue
        bound, bound_source = best_bound(tables)
        steps: dict[str, float] = {}
        rows = []
        for name in spec.planners:
            planner = planner_for(name, spec.flexsp)
            once = name == "flexsp"  # minutes per call: no warm-up, no repeats, no traced call

            def call(planner=planner, problem=problem) -> Outcome:
                return planner(problem, workload)

            if seed == 0 and not once:
                _timed(call)  # warm-up
            walls = []
            out: Outcome | None = None
            error = None
            for _ in range(1 if once else spec.repeats):
                out, ms, error = _timed(call)
                walls.append(ms)
            row: dict[str, Any] = {**base, "planner": name, "wall_ms": walls, "lower_bound_s": bound, "bound_source": bound_source}
            if spec.memory and seed == 0 and not once:
                row["peak_mb"] = _peak_mb(call)
            if error is not None or out is None:
                row.update(status="error", note=error)
            elif out.assignment is None and out.details.get("skipped"):
                row.update(status="skipped", note=out.note)
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
    for profile in spec.profiles:
        for w, r, n in spec.cells():
            if n > spec.max_samples:
                skipped.append({"workload": w, "ranks": r, "samples": n, "profile": profile, "reason": f"more than max_samples {spec.max_samples}"})
                if progress:
                    progress(spec.seeds * len(spec.planners))
                continue
            records.extend(run_cell(spec, w, r, n, (lambda: progress(1)) if progress else (lambda: None), profile))
    return {"spec": spec.to_json(), "backends": backends, "started_unix": started, "elapsed_s": time.time() - started,
            "records": records, "skipped": skipped}


def total_steps(spec: GridSpec) -> int:
    return len(spec.profiles) * len(spec.cells()) * spec.seeds * len(spec.planners)
