"""Budgets honoured whatever the problem and the backend: random problems planned against their budget.

    .venv/bin/python -m bench.budget_run                        # 5,000 problems (about 30 min on 2 cores)
    .venv/bin/python -m bench.budget_run --problems 300 --out budget.json

Each problem is drawn at random (seeded, one generator per problem index, so any index can be run
again alone with ``--only I``): a cluster of 1 to 256 ranks (log-uniform; 1 to 8 GPUs per node, the
mixed-GPU stress profile on H100 and A100 nodes), a workload of :mod:`optimizer.problem.workloads`
with 1 to 2,048 samples (log-uniform), a profile of the zoo (:mod:`optimizer.costs.zoo`, the stress
profiles included), a backend among ``auto``, ``heuristic``, ``cpsat``, ``highs`` and ``cbc``, and
a budget from 10 ms to 3 s: log-uniform over 10-300 ms for three problems in four, over 300 ms-3 s
for the rest (so that 5,000 problems take about half an hour). A batch the cluster cannot hold (a
sample longer than the whole cluster's memory) is drawn again.

Each problem is planned in this process the way a program calls the planner (``plan(problem)``,
after one warm-up plan at start-up); a share (``--cli-share``) goes through ``dhp plan`` in a fresh
process instead. The wall time of the whole call is compared with the budget: a call is *over* when
it took more than the budget + 20 ms (``--margin-ms``). For ``dhp plan``, whose budget counts from the
process's start, the time compared is the plan's own ``solver.wall_ms`` less the start-up before
planning began (``phases.queue_ms``: the interpreter and the imports, some 0.5 s here, which a budget
below it cannot cover; loading the compiled kernels, which the plan does as it goes, counts); the
process's whole run time is reported beside it (``python -m bench.fresh_process`` times fresh processes
alone). Every plan is
checked by the verifier (:func:`optimizer.verify.verifier.verify` and
:func:`optimizer.verify.verifier.check_assignment`). A problem the planner refuses (no plan within
the memory) counts as refused, with its wall time compared like any other.

Prints the invalid plans, the calls over budget + margin (count, worst, per backend and per budget
band), p50/p99/max of wall / budget, and the load average before and after; ``--out`` writes every
record and the summary as JSON. Figures depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.fresh_process import dhp_command

BACKENDS = ("auto", "heuristic", "cpsat", "highs", "cbc")
BANDS_MS = (10.0, 30.0, 100.0, 300.0, 1000.0, 3001.0)
"""Budget bands the report counts over-budget calls in (lower edges, last one the end)."""
STARVED_SHARE = 0.6
"""A call whose process got less CPU time than this share of its wall time (all threads together) was
mostly waiting for the machine: counted apart among the calls over budget (they are still over)."""
SHORT_SHARE = 0.75
"""Share of the budgets drawn from 10-300 ms (log-uniform); the rest from 300 ms-3 s."""
MAX_RANKS = 256
MAX_SAMPLES = 2048
TEXT_MODEL = {
    "name": "gpt-7b-64h",
    "llm": {
        "layers": 32,
        "hidden": 4096,
        "heads": 64,
        "kv_heads": 64,
        "ffn_hidden": 11008,
        "vocab": 32000,
        "parameters": 7.0e9,
    },
    "training": {"zero_stage": 3, "recompute": "full"},
}
"""The model of the profile files (FlexSP's fits and the stress profiles): a 7B text model with 64 heads."""


@dataclass
class Case:
    """One random problem: the request document and what was drawn."""

    index: int
    doc: dict[str, Any]
    ranks: int
    samples: int
    workload: str
    profile: str
    backend: str
    budget_ms: float


@dataclass
class Record:
    index: int
    via: str  # "python" or "cli"
    backend: str
    budget_ms: float
    ranks: int
    samples: int
    workload: str
    profile: str
    wall_ms: float
    outcome: str  # "plan", "refused" (the planner's domain error), "error" (anything else)
    valid: bool | None = None
    solver_backend: str | None = None
    solver_status: str | None = None
    note: str | None = None
    process_ms: float | None = None
    phases: dict[str, float] = field(default_factory=dict)
    strategies: dict[str, float] = field(default_factory=dict)
    """Milliseconds per heuristic strategy (the plan's ``solver.details.heuristic.strategies_ms``)."""
    late_solves: int = 0
    """Exact solves stopped at an earlier deadline still running when this call started (they share the machine)."""
    cpu_ms: float | None = None
    """CPU time of this process (all its threads) during the call: far below the wall time when the
    machine was busy elsewhere."""
    plan_ms: float | None = None
    """The plan's own ``solver.wall_ms`` (its deadline's start to its last step); the rest of
    ``wall_ms`` was spent around it."""
    gc_ms: float | None = None
    """The longest pass of Python's cyclic garbage collector during the call, and its generation (``gc_generation``)."""
    gc_generation: int | None = None


def draw_budget(rng: random.Random) -> float:
    low, high = (10.0, 300.0) if rng.random() < SHORT_SHARE else (300.0, 3000.0)
    return round(math.exp(rng.uniform(math.log(low), math.log(high))), 1)


def expected_budget_ms() -> float:
    """Mean budget of :func:`draw_budget` (log-uniform over [a, b] has mean (b - a) / ln(b / a))."""
    return SHORT_SHARE * 290.0 / math.log(30.0) + (1 - SHORT_SHARE) * 2700.0 / math.log(10.0)


def expected_minutes(count: int, cli_share: float) -> float:
    """Rough run time: a call takes about 0.7 of its budget plus 30 ms of drawing and verifying (measured
    on the 2-core development machine: the heuristic alone often ends early), a ``dhp plan`` process 3 s."""
    return count * ((1 - cli_share) * (0.7 * expected_budget_ms() + 30.0) + cli_share * 3000.0) / 60000.0


def draw_case(index: int, seed: int, backends: tuple[str, ...] = BACKENDS) -> Case:
    """Problem ``index`` of run ``seed`` (the same on every machine)."""
    from optimizer.costs.tables import CostTables
    from optimizer.costs.zoo import load_profile, profile_names
    from optimizer.errors import PlannerError
    from optimizer.presets import load_preset, preset_names
    from optimizer.problem.documents import problem_from_json
    from optimizer.problem.workloads import WORKLOADS

    rng = random.Random(seed * 1_000_003 + index)
    backend = rng.choice(backends)
    budget = draw_budget(rng)
    profiles = profile_names()
    for _ in range(50):
        ranks = int(round(math.exp(rng.uniform(0.0, math.log(MAX_RANKS)))))
        per_node = rng.choice([g for g in (8, 4, 2, 1) if ranks % g == 0][:2])
        nodes = ranks // per_node
        name = rng.choice(profiles)
        profile = load_profile(name)
        workload = rng.choice(sorted(WORKLOADS))
        n = int(round(math.exp(rng.uniform(0.0, math.log(MAX_SAMPLES)))))
        batch = WORKLOADS[workload](n, seed=rng.randrange(1 << 30))
        model = next(
            (
                load_preset("models", m, "model_preset")
                for m in preset_names("models")
                if name.startswith(f"analytical-{m}-")
            ),
            TEXT_MODEL,
        )
        cluster: dict[str, Any] = {"nodes": nodes, "gpus_per_node": per_node}
        other = next(iter(profile.get("speed_by_gpu") or {}), None)
        if other is not None and nodes >= 2:
            cluster = {
                "nodes": [
                    {"count": nodes - nodes // 2, "gpus": per_node, "gpu": "H100-SXM"},
                    {"count": nodes // 2, "gpus": per_node, "gpu": other},
                ]
            }
        doc = {
            "batch": batch,
            "cluster": cluster,
            "model": model,
            "profile": profile,
            "options": {"backend": backend, "time_budget_ms": budget},
        }
        try:
            CostTables.build(problem_from_json(doc))
        except PlannerError:
            continue  # a sample the whole cluster cannot hold: draw again
        return Case(index, doc, nodes * per_node, n, workload, name, backend, budget)
    raise RuntimeError(f"no plannable problem drawn for index {index}")


def _record(case: Case, via: str, wall_ms: float, outcome: str, **kw: Any) -> Record:
    return Record(
        case.index,
        via,
        case.backend,
        case.budget_ms,
        case.ranks,
        case.samples,
        case.workload,
        case.profile,
        round(wall_ms, 3),
        outcome,
        **kw,
    )


def run_python(case: Case, planner: Callable[..., Any] | None = None, backends: Any = None) -> Record:
    """Plan ``case`` in this process (``planner``: :func:`planning.planner.plan` unless given) and verify the plan."""
    from bench.planners import plan_assignment
    from optimizer.errors import PlannerError
    from optimizer.problem.documents import problem_from_json
    from optimizer.verify.verifier import check_assignment, verify
    from planning.planner import plan

    problem = problem_from_json(case.doc)
    call = planner or plan
    late = late_solves()
    gc_passes.clear()
    cpu = time.process_time()
    start = time.perf_counter()
    try:
        result = call(problem) if backends is None else call(problem, backends=backends)
    except PlannerError as exc:
        return _record(
            case, "python", (time.perf_counter() - start) * 1000.0, "refused", note=f"{type(exc).__name__}: {exc}"[:300]
        )
    except Exception as exc:  # noqa: BLE001 - a crash is a result of the run, never its end
        return _record(
            case, "python", (time.perf_counter() - start) * 1000.0, "error", note=f"{type(exc).__name__}: {exc}"[:300]
        )
    wall = (time.perf_counter() - start) * 1000.0
    cpu_ms = round((time.process_time() - cpu) * 1000.0, 3)
    report = verify(result, problem)
    valid = report.ok and check_assignment(problem, plan_assignment(result, problem)).ok
    details = result.solver.details
    return _record(
        case,
        "python",
        wall,
        "plan",
        valid=valid,
        solver_backend=result.solver.backend,
        solver_status=result.solver.status,
        note=(
            result.solver.fallback_reason or None
            if valid
            else "; ".join(report.violations[:2]) or "check_assignment failed"
        ),
        phases=dict(details.get("phases") or {}),
        strategies=dict((details.get("heuristic") or {}).get("strategies_ms") or {}),
        late_solves=late,
        cpu_ms=cpu_ms,
        plan_ms=round(result.solver.wall_ms, 3),
        **longest_collection(),
    )


gc_passes: list[tuple[int, float]] = []
"""(generation, milliseconds) of every garbage collection since the current call started."""
_collection_start: list[float] = [0.0]


def _on_collection(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _collection_start[0] = time.perf_counter()
    else:
        gc_passes.append((int(info["generation"]), (time.perf_counter() - _collection_start[0]) * 1000.0))


def longest_collection() -> dict[str, Any]:
    if not gc_passes:
        return {}
    generation, ms = max(gc_passes, key=lambda c: c[1])
    return {"gc_ms": round(ms, 3), "gc_generation": generation}


def late_solves() -> int:
    from planning import solve_watch

    return sum(solve_watch.still_running(name) for name in BACKENDS)


def run_cli(case: Case, folder: Path) -> Record:
    """Plan ``case`` with ``dhp plan`` in a fresh process and verify the plan it prints."""
    from optimizer.plan.records import assignment_from_json
    from optimizer.problem.documents import problem_from_json
    from optimizer.verify.verifier import check_assignment

    files = {}
    for part in ("batch", "cluster", "model", "profile", "options"):
        path = folder / f"{part}.json"
        path.write_text(json.dumps(case.doc[part]))
        files[part] = str(path)
    out = folder / "plan.json"
    command = dhp_command()
    command += [
        "plan",
        "--compact",
        "--no-shards",
        "--out",
        str(out),
        *(x for part, path in files.items() for x in (f"--{part}", path)),
    ]
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    process_ms = (time.perf_counter() - start) * 1000.0
    if proc.returncode != 0:
        outcome = "refused" if proc.returncode in (2, 3) else "error"
        return _record(
            case,
            "cli",
            math.nan,
            outcome,
            process_ms=round(process_ms, 3),
            note=f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}",
        )
    doc = json.loads(out.read_text())
    problem = problem_from_json(case.doc)
    report = check_assignment(problem, assignment_from_json(doc, problem.batch.index))
    solver = doc.get("solver") or {}
    start_up_ms = float(((solver.get("details") or {}).get("phases") or {}).get("queue_ms", 0.0))
    return _record(
        case,
        "cli",
        float(solver.get("wall_ms", math.nan)) - start_up_ms,
        "plan",
        valid=report.ok,
        solver_backend=solver.get("backend"),
        solver_status=solver.get("status"),
        process_ms=round(process_ms, 3),
        note=None if report.ok else "; ".join(report.violations[:2]),
        phases=dict((solver.get("details") or {}).get("phases") or {}),
    )


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q / 100.0 * len(ordered)) - 1))]


def band_of(budget_ms: float) -> str:
    for low, high in zip(BANDS_MS, BANDS_MS[1:], strict=False):
        if budget_ms < high:
            return f"{low:.0f}-{min(high, 3000.0):.0f} ms"
    return f"{BANDS_MS[-2]:.0f}-3000 ms"


def summarise(records: list[Record], margin_ms: float) -> dict[str, Any]:
    timed = [r for r in records if not math.isnan(r.wall_ms)]
    over = [r for r in timed if r.wall_ms > r.budget_ms + margin_ms]
    ratio = [r.wall_ms / r.budget_ms for r in timed]

    def counts(key: Callable[[Record], str], order: list[str]) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {k: {"calls": 0, "over": 0, "worst_over_ms": None} for k in order}
        for r in timed:
            row = out.setdefault(key(r), {"calls": 0, "over": 0, "worst_over_ms": None})
            row["calls"] += 1
            if r in over:
                row["over"] += 1
                worst = r.wall_ms - r.budget_ms
                row["worst_over_ms"] = round(max(worst, row["worst_over_ms"] or -math.inf), 1)
        return {k: v for k, v in out.items() if v["calls"]}

    worst = max(over, key=lambda r: r.wall_ms - r.budget_ms, default=None)
    cli = [r for r in records if r.via == "cli"]
    return {
        "problems": len(records),
        "margin_ms": margin_ms,
        "plans": sum(r.outcome == "plan" for r in records),
        "refused": sum(r.outcome == "refused" for r in records),
        "errors": sum(r.outcome == "error" for r in records),
        "invalid": sum(r.valid is False for r in records),
        "over": len(over),
        "worst_over_ms": round(worst.wall_ms - worst.budget_ms, 1) if worst else None,
        "worst_over_index": worst.index if worst else None,
        "wall_over_budget_p50": percentile(ratio, 50),
        "wall_over_budget_p99": percentile(ratio, 99),
        "wall_over_budget_max": max(ratio, default=None),
        "by_backend": counts(lambda r: r.backend, list(BACKENDS)),
        "by_band": counts(lambda r: band_of(r.budget_ms), [band_of(b) for b in BANDS_MS[:-1]]),
        "over_starved": sum(1 for r in over if r.cpu_ms is not None and r.cpu_ms < STARVED_SHARE * r.wall_ms),
        "stopped_at_deadline": sum(1 for r in records if (r.solver_status or "") == "stopped"),
        "cli_calls": len(cli),
        "cli_process_ms_p50": percentile([r.process_ms for r in cli if r.process_ms is not None], 50),
        "cli_process_ms_max": max((r.process_ms for r in cli if r.process_ms is not None), default=None),
    }


def print_summary(s: dict[str, Any], records: list[Record]) -> None:
    p = print
    p(
        f"{s['problems']} problems: {s['plans']} plans, {s['refused']} refused by the planner, {s['errors']} errors; "
        f"{s['invalid']} invalid plans; {s['stopped_at_deadline']} exact solves stopped at the deadline"
    )
    p(
        f"over budget + {s['margin_ms']:.0f} ms: {s['over']}"
        + (
            f" (worst +{s['worst_over_ms']} ms, problem {s['worst_over_index']}); "
            f"{s['over_starved']} of them with under {STARVED_SHARE:.0%} of their wall time in CPU (the process "
            "waiting for the machine)"
            if s["over"]
            else ""
        )
    )

    def fmt(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.3f}"

    p(
        f"wall / budget: p50 {fmt(s['wall_over_budget_p50'])}, p99 {fmt(s['wall_over_budget_p99'])}, "
        f"max {fmt(s['wall_over_budget_max'])}"
    )
    for title, key in (("backend", "by_backend"), ("budget band", "by_band")):
        p(
            f"by {title}: "
            + "; ".join(
                f"{k} {v['over']}/{v['calls']}" + (f" (worst +{v['worst_over_ms']} ms)" if v["over"] else "")
                for k, v in s[key].items()
            )
        )
    if s["cli_calls"]:
        p(
            f"dhp plan in fresh processes: {s['cli_calls']} calls, "
            f"whole process p50 {s['cli_process_ms_p50']:.0f} ms, max {s['cli_process_ms_max']:.0f} ms"
        )
    for r in records:
        if not math.isnan(r.wall_ms) and r.wall_ms > r.budget_ms + s["margin_ms"]:
            p(
                (
                    f"  over: problem {r.index} ({r.via}, {r.backend}, {r.budget_ms} ms, {r.ranks} ranks, "
                    f"{r.samples} samples): {r.wall_ms:.1f} ms"
                )
                + (f", {r.plan_ms:.1f} ms on the plan's own clock" if r.plan_ms is not None else "")
                + (
                    f", longest garbage collection {r.gc_ms:.1f} ms (generation {r.gc_generation})"
                    if r.gc_ms is not None
                    else ""
                )
                + (f", {r.solver_status}" if r.solver_status else "")
            )
        if r.valid is False or r.outcome == "error":
            p(f"  problem {r.index} ({r.via}, {r.backend}, {r.budget_ms} ms): {r.outcome} {r.note}")


def progress(done: int, total: int, over: int, invalid: int, started: float, stream: Any = sys.stderr) -> None:
    width = 30
    filled = int(width * done / max(1, total))
    elapsed = time.perf_counter() - started
    eta = elapsed / done * (total - done) if done else 0.0
    stream.write(
        f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total}  over {over}  invalid {invalid}  "
        f"{elapsed / 60:.1f} min, about {eta / 60:.1f} min left "
    )
    stream.flush()


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def run(
    problems: int,
    seed: int = 0,
    cli_share: float = 0.0,
    margin_ms: float = 20.0,
    backends: tuple[str, ...] = BACKENDS,
    only: list[int] | None = None,
    show_progress: bool = True,
) -> tuple[list[Record], dict[str, Any]]:
    """Plan the problems of run ``seed`` and summarise (see the module docstring)."""
    from planning.planner import warm_up_service

    # Code and solver libraries loaded before the first budget, as a program planning repeatedly has them.
    warm_up_service()
    if _on_collection not in gc.callbacks:
        gc.callbacks.append(_on_collection)
    indices = only if only is not None else list(range(problems))
    picker = random.Random(seed ^ 0x5EED)
    records: list[Record] = []
    over = invalid = 0
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dhp-budget-") as tmp:
        for k, index in enumerate(indices):
            case = draw_case(index, seed, backends)
            via_cli = picker.random() < cli_share
            record = run_cli(case, Path(tmp)) if via_cli else run_python(case)
            records.append(record)
            over += int(not math.isnan(record.wall_ms) and record.wall_ms > record.budget_ms + margin_ms)
            invalid += int(record.valid is False)
            if show_progress:
                progress(k + 1, len(indices), over, invalid, started)
    if show_progress:
        sys.stderr.write("\n")
    return records, summarise(records, margin_ms)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.budget_run", description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", type=int, default=5000, help="random problems to plan (default 5000)")
    ap.add_argument("--seed", type=int, default=0, help="the run's seed (problem i is the same for a given seed)")
    ap.add_argument(
        "--cli-share", type=float, default=0.02, help="share planned by 'dhp plan' in a fresh process (default 0.02)"
    )
    ap.add_argument(
        "--margin-ms",
        type=float,
        default=20.0,
        help="a call is over when it takes longer than budget + this (default 20)",
    )
    ap.add_argument(
        "--backends", default=",".join(BACKENDS), help=f"backends drawn from (default {','.join(BACKENDS)})"
    )
    ap.add_argument("--only", help="comma-separated problem indices to run alone (e.g. to look at one that overran)")
    ap.add_argument("--out", help="write every record and the summary to this JSON file")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    backends = tuple(b.strip() for b in args.backends.split(",") if b.strip())
    if (
        not 1 <= args.problems <= 1_000_000
        or not 0.0 <= args.cli_share <= 1.0
        or not backends
        or set(backends) - set(BACKENDS)
    ):
        print(f"--problems 1 to 1000000, --cli-share 0 to 1, --backends among {','.join(BACKENDS)}", file=sys.stderr)
        return 2
    only = [int(x) for x in args.only.split(",")] if args.only else None
    count = len(only) if only else args.problems
    print(
        f"{count} problems, backends {','.join(backends)}, budgets 10 ms-3 s ({SHORT_SHARE:.0%} under 300 ms), "
        f"seed {args.seed}; expected about {expected_minutes(count, args.cli_share):.0f} min; "
        f"load average {load_average()}",
        flush=True,
    )
    started = time.perf_counter()
    records, summary = run(
        args.problems, args.seed, args.cli_share, args.margin_ms, backends, only, not args.no_progress
    )
    summary.update(seconds=round(time.perf_counter() - started, 1), load_average_after=load_average(), seed=args.seed)
    print_summary(summary, records)
    print(f"{summary['seconds'] / 60:.1f} min; load average after {summary['load_average_after']}")
    if args.out:
        Path(args.out).write_text(
            json.dumps({"summary": summary, "records": [asdict(r) for r in records]}, indent=1, default=str)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
