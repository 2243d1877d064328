"""The benchmark grid: workloads x cluster sizes x batch sizes, every planner on every batch.

For each cell (workload, ranks, samples) and each seeded batch, every planner plans the batch
from the same :class:`~optimizer.problem.problem.Problem`. Its answer is evaluated with
:func:`optimizer.plan.evaluate.assignment_step_time` and verified with
:func:`optimizer.verify.verifier.check_assignment` (an answer that fails verification is recorded as
invalid and never counted). Recorded per planner and batch: predicted step time, speedup over
static at its best, ratio to the best lower bound proven (:func:`best_bound`, its LP run again below
the fastest verified plan of the batch once every planner has planned it), planning wall times (one
warm-up call on the cell's first batch, then ``repeats`` timed calls per batch) and peak Python
memory of one extra call under :mod:`tracemalloc` (kept apart so tracing does not slow the timed
calls). The real FlexSP solver and Megatron-Core's scheduler (planners of :data:`CALLED_ONCE`) are
called once per batch, without warm-up or memory tracing: a FlexSP call takes seconds to minutes,
and Megatron's pure-Python scheduler takes seconds per call on thousands of ranks, where the
grid's repeats would multiply that.

Profiles (``--profiles``): ``analytical`` is the analytical profile of the bench's model on the
bench's cluster (the default); any other name is a profile of the zoo (:func:`optimizer.costs.zoo.load_profile`)
or a profile file (.json). Every planner plans and is scored under the same profile. Under a Ulysses
profile the model (Qwen2-VL-7B-like) gets as many attention heads as the domain has ranks, so every
power-of-two group size divides them (FlexSP places no head limit on its sizes). A profile with
``speed_by_gpu`` gets a mixed cluster: the first half of the nodes H100, the second half the first GPU
type the profile lists. With ``flexsp`` among the planners, groups may span the whole domain
(``max_degree`` = ranks) as FlexSP's may; the bound is taken under that rule.

Rules (:func:`bench.planners.rules_of`): a planner of a runtime's rules (Megatron-Core's:
``megatron``, ``dhp-megatron``, ``static-best-megatron``) gets the batch's problem under those rules
(:func:`bench.planners.under_rules`), is verified and scored under them, and its ratio to the bound is
to the best bound proven under them (one per rules and batch). Every record names its ``rules``. A
batch the rules' problem cannot hold is infeasible for those planners only. A planner that times its
own call (a scheduler's call inside the conversion around it, ``Outcome.wall_ms``) has that as its
wall time, and the whole call in ``call_ms``. The speedup over static at its best is against the
``static-best`` record for every planner: the static mesh as it runs.
"""

from __future__ import annotations

import math
import time
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.flexsp_real import FlexSPSettings, stored_records
from bench.planners import NAMES, Outcome, Planner, default_planners, planner_for, rules_of, under_rules
from bench.workload_catalog import Workload, get_workload
from optimizer.bounds.lower_bounds import lower_bound
from optimizer.costs.tables import CostTables
from optimizer.errors import PlannerError, ProblemError
from optimizer.plan.evaluate import assignment_step_time
from optimizer.problem.documents import problem_from_json
from optimizer.problem.problem import Problem
from optimizer.verify.verifier import check_assignment

GPUS_PER_NODE = 8
CALLED_ONCE = ("flexsp", "megatron")
"""Planners called once per batch (see the module docstring)."""
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
            raise ProblemError(
                f"batch sizes must be >= 1, got {self.samples}", field="--samples", hint="e.g. --samples 512."
            )
        for r in self.ranks:
            if r < 1 or (r > GPUS_PER_NODE and r % GPUS_PER_NODE):
                raise ProblemError(
                    f"{r} ranks is not a whole number of {GPUS_PER_NODE}-GPU nodes",
                    field="--ranks",
                    hint=f"use 1..{GPUS_PER_NODE} or a multiple of {GPUS_PER_NODE}.",
                )
        unknown = [p for p in self.planners if p not in NAMES]
        if unknown:
            raise ProblemError(f"unknown planner(s) {unknown}", field="--planners", hint=f"use some of {list(NAMES)}.")
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
        return {
            "nodes": [
                {"count": nodes - nodes // 2, "gpus": GPUS_PER_NODE, "gpu": "H100-SXM"},
                {"count": nodes // 2, "gpus": GPUS_PER_NODE, "gpu": other},
            ]
        }
    return {"nodes": nodes, "gpus_per_node": GPUS_PER_NODE}


def model_doc(ranks: int, profile: dict[str, Any] | None) -> dict[str, Any]:
    """The bench's model; under a Ulysses profile with as many attention heads as ranks (see the module docstring)."""
    from optimizer.presets import load_preset

    doc = load_preset("models", MODEL_PRESET, "model_preset")
    if profile is not None and (profile.get("comm") or {}).get("scheme") == "ulysses":
        doc = {
            **doc,
            "name": f"{doc.get('name', MODEL_PRESET)}-{ranks}heads",
            "llm": {**doc["llm"], "heads": ranks, "kv_heads": ranks},
        }
    return doc


def make_request(
    workload: Workload,
    ranks: int,
    n: int,
    seed: int,
    budget_ms: float,
    profile: dict[str, Any] | None = None,
    max_micro_batches: int = MAX_MICRO_BATCHES,
    whole_domain_groups: bool = False,
) -> dict[str, Any]:
    """The request document of one seeded batch of ``workload`` on ``ranks`` GPUs: batch, cluster, options, and
    the bench's model (its preset name under the analytical profile, ``profile`` None) with the profile."""
    options: dict[str, Any] = {"time_budget_ms": budget_ms, "solver_workers": 1, "max_micro_batches": max_micro_batches}
    if whole_domain_groups:
        options["max_degree"] = ranks
    doc: dict[str, Any] = {"batch": workload.batch(n, seed), "cluster": cluster_doc(ranks, profile), "options": options}
    if profile is None:
        doc["model_preset"] = MODEL_PRESET
    else:
        doc["model"] = model_doc(ranks, profile)
        doc["profile"] = profile
    return doc


def whole_domain_groups(planners: Sequence[str]) -> bool:
    """Whether a grid run's groups may span the whole domain: when FlexSP is among its planners, whose
    plans use such groups, every planner gets them."""
    return "flexsp" in planners


def make_problem(
    workload: Workload,
    ranks: int,
    n: int,
    seed: int,
    budget_ms: float,
    profile: dict[str, Any] | None = None,
    max_micro_batches: int = MAX_MICRO_BATCHES,
    whole_domain_groups: bool = False,
) -> Problem:
    """The problem of :func:`make_request`'s document."""
    doc = make_request(workload, ranks, n, seed, budget_ms, profile, max_micro_batches, whole_domain_groups)
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


def best_bound(tables: CostTables, upper_s: float = math.inf) -> tuple[float, str]:
    """The best lower bound the project proves for the batch, without a time limit, and where it
    comes from: the engine's (:func:`optimizer.bounds.lower_bounds.lower_bound`, ``engine``) or the
    group-size LP of :mod:`solver_models.size_bound` (``group_sizes``) when HiGHS is installed and the
    LP is higher. ``upper_s``: the step time of a plan of the batch, below which the LP drops the
    choices no better plan makes (a bound found so holds for every plan)."""
    bound = lower_bound(tables)
    from solver_models.size_bound import size_bound

    lp = size_bound(tables, upper_s)
    return (lp, "group_sizes") if lp is not None and lp > bound else (bound, "engine")


@dataclass(frozen=True)
class RulesCase:
    """One batch under one set of rules: its problem, cost tables and the best bound proven for them."""

    problem: Problem
    tables: CostTables
    bound: float
    bound_source: str


def rules_case(problem: Problem, rules: str) -> RulesCase:
    """The batch of ``problem`` under ``rules``; PlannerError when those rules cannot hold it."""
    under = under_rules(problem, rules)
    tables = CostTables.build(under)
    bound, source = best_bound(tables)
    return RulesCase(under, tables, bound, source)


def run_cell(
    spec: GridSpec,
    workload_name: str,
    ranks: int,
    n: int,
    tick: Callable[[], None] = lambda: None,
    profile: str = ANALYTICAL,
) -> Iterator[dict[str, Any]]:
    """Records (one per planner and batch) of one cell; a batch infeasible under a planner's rules gives a record
    saying so."""
    workload = get_workload(workload_name)
    profile_doc = resolve_profile(profile)
    stored = stored_records(spec.flexsp) if "flexsp" in spec.planners and spec.flexsp.reuse else None
    planners: dict[str, Planner] = {}  # made once per cell, from its first request (cluster, model, profile)
    for seed in range(spec.seeds):
        base = {"workload": workload.name, "ranks": ranks, "samples": n, "seed": seed, "profile": profile}
        request = make_request(
            workload,
            ranks,
            n,
            seed,
            spec.budget_ms,
            profile_doc,
            spec.max_micro_batches,
            whole_domain_groups(spec.planners),
        )
        cases: dict[str, RulesCase | str] = {}
        try:
            problem = problem_from_json(request)
        except PlannerError as exc:
            for name in spec.planners:
                tick()
                yield {**base, "planner": name, "rules": rules_of(name), "status": "infeasible", "note": str(exc)}
            continue
        steps: dict[str, float] = {}
        rows: list[dict[str, Any]] = []
        for name in spec.planners:
            rules = rules_of(name)
            if rules not in cases:
                try:
                    cases[rules] = rules_case(problem, rules)
                except PlannerError as exc:
                    cases[rules] = str(exc)
            case = cases[rules]
            if isinstance(case, str):
                rows.append({**base, "planner": name, "rules": rules, "status": "infeasible", "note": case})
                tick()
                continue
            if name == "flexsp" and stored is not None:
                kept = reused(stored.get((profile, workload.name, ranks, n, seed)), {**base, "rules": rules}, case)
                if kept.get("status") == "ok":
                    steps[name] = kept["step_time_s"]
                rows.append(kept)
                tick()
                continue
            if name not in planners:
                planners[name] = planner_for(name, spec.flexsp, request)
            once = name in CALLED_ONCE  # no warm-up, no repeats, no traced call

            def call(planner=planners[name], problem=case.problem) -> Outcome:
                return planner(problem, workload)

            if seed == 0 and not once:
                _timed(call)  # warm-up
            walls: list[float] = []
            calls: list[float] = []
            out: Outcome | None = None
            error = None
            for _ in range(1 if once else spec.repeats):
                out, ms, error = _timed(call)
                own = out.wall_ms if out is not None else None
                walls.append(ms if own is None else own)
                if own is not None:
                    calls.append(ms)
            row: dict[str, Any] = {
                **base,
                "planner": name,
                "rules": rules,
                "wall_ms": walls,
                "lower_bound_s": case.bound,
                "bound_source": case.bound_source,
            }
            if calls:
                row["call_ms"] = calls
            if spec.memory and seed == 0 and not once:
                row["peak_mb"] = _peak_mb(call)
            if error is not None or out is None:
                row.update(status="error", note=error)
            elif out.assignment is None and out.details.get("skipped"):
                row.update(status="skipped", note=out.note)
            elif out.assignment is None:
                row.update(status="no-plan", note=out.note, details=out.details)
            else:
                report = check_assignment(case.problem, out.assignment)
                step = assignment_step_time(case.tables, out.assignment)
                row.update(details=out.details, note=out.note, micro_batches=len(out.assignment.micro_batches))
                if report.ok:
                    ratio = step / case.bound if case.bound > 0 else 1.0
                    row.update(
                        status="ok", step_time_s=step, ratio_to_bound=ratio, verified_step_time_s=report.step_time_s
                    )
                    steps[name] = step
                else:
                    row.update(status="invalid", step_time_s=step, note="; ".join(report.violations[:3]))
            rows.append(row)
            tick()
        _raise_bounds(cases, rows)
        ref = steps.get("static-best")
        for row in rows:
            if ref is not None and row.get("status") == "ok":
                row["speedup_over_static_best"] = ref / row["step_time_s"]
            yield row


def reused(record: dict[str, Any] | None, base: dict[str, Any], case: RulesCase) -> dict[str, Any]:
    """FlexSP's row of a batch from an earlier run's ``record`` (:attr:`FlexSPSettings.reuse`), its ratio to this run's
    bound; skipped when that run did not have the batch."""
    row = {**base, "planner": "flexsp", "lower_bound_s": case.bound, "bound_source": case.bound_source}
    if record is None:
        return {**row, "status": "skipped", "note": "skipped: not in the run given by --flexsp-from"}
    kept = ("status", "note", "wall_ms", "details", "micro_batches", "step_time_s", "verified_step_time_s")
    row.update({k: record[k] for k in kept if k in record}, reused=True)
    if row.get("status") == "ok":
        row["ratio_to_bound"] = row["step_time_s"] / case.bound if case.bound > 0 else 1.0
    return row


def _raise_bounds(cases: dict[str, RulesCase | str], rows: list[dict[str, Any]]) -> None:
    """Each rules case's bound again, below the fastest verified plan made under those rules, written into
    its rows (with their ratios) where it is higher."""
    for rules, case in cases.items():
        if isinstance(case, str):
            continue
        mine = [row for row in rows if row["rules"] == rules and row.get("status") == "ok"]
        if not mine:
            continue
        bound, source = best_bound(case.tables, min(row["step_time_s"] for row in mine))
        if bound <= case.bound:
            continue
        for row in rows:
            if row["rules"] != rules or "lower_bound_s" not in row:
                continue
            row.update(lower_bound_s=bound, bound_source=source)
            if row.get("status") == "ok":
                row["ratio_to_bound"] = row["step_time_s"] / bound


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
                skipped.append(
                    {
                        "workload": w,
                        "ranks": r,
                        "samples": n,
                        "profile": profile,
                        "reason": f"more than max_samples {spec.max_samples}",
                    }
                )
                if progress:
                    progress(spec.seeds * len(spec.planners))
                continue
            records.extend(run_cell(spec, w, r, n, (lambda: progress(1)) if progress else (lambda: None), profile))
    return {
        "spec": spec.to_json(),
        "backends": backends,
        "started_unix": started,
        "elapsed_s": time.time() - started,
        "records": records,
        "skipped": skipped,
    }


def total_steps(spec: GridSpec) -> int:
    return len(spec.profiles) * len(spec.cells()) * spec.seeds * len(spec.planners)
