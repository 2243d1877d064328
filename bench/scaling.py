"""Planning cost of the heuristic as samples and ranks grow, with the fitted growth exponent.

Each point (ranks, samples) runs in its own process with a memory limit and a time limit, so a
point that runs out of memory or time is recorded as such (with the error, the time to failure and
a cProfile summary of where the time went) instead of ending the run. Measured per point: the
first call in the fresh process (another batch of the same size; it pays the first touch of the
process's memory at that size and loads the compiled kernels), then, after it, the median and p99
wall time of ``planning.planner.plan`` (each call on a fresh copy of the problem, as a new request
comes: nothing cached per batch from the call before)
with the heuristic backend, as users call it (tables, bound, heuristic, the best static layout as
a floor, verification), the heuristic phase alone,
the ratio to the lower bound and the peak resident memory of the process.

The growth exponent k is the least-squares slope of log(median time) against log(samples) over
the points that finished (time ~ samples^k; ranks grow with samples on the default diagonal).

``--budget-ms`` and ``--backend`` plan as a request with that budget would (instead of a budget no
plan reaches); each point then also reports the median of every planner phase over the repeats
(``phase_medians``), the fixed work this machine is expected to need for the batch
(:mod:`planning.fixed_work`: ``estimate_ms`` and the ``minimum_budget_ms`` below which the planner
refuses), what was skipped for lack of time, and the refusal when the budget was too small.
The point's process keeps the memory it frees, as ``dhp``'s own processes do
(:mod:`planning.allocator`); ``--glibc-defaults`` measures it as a program that calls the planner in its
own process with the allocator untouched. ``--table`` prints these as text instead of the JSON line;
``--cli`` measures the batch of ``dhp example`` with the options of ``dhp plan`` (no micro-batch cap)
instead of the bench's problem.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import os
import pstats
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.plots import pyplot, save_figure

DIAGONAL = ((64, 512), (256, 2048), (1024, 8192), (4096, 32768), (8192, 65536))
TARGETS_MS = {(64, 512): 6.0, (1024, 8192): 50.0, (8192, 65536): 600.0}
"""Planning-time goals at three points of the diagonal (median, heuristic)."""


def _problem(ranks: int, samples: int, workload: str, seed: int, cli: bool = False) -> Any:
    """The point's problem: the bench's (``bench.grid.make_problem``), or with ``cli`` the batch of
    ``dhp example --workload W --samples N --seed S`` planned as ``dhp plan --nodes ranks/8
    --gpus-per-node 8 --model-preset qwen2-vl-7b`` plans it (default options)."""
    if cli:
        from optimizer.problem.documents import problem_from_json
        from optimizer.problem.workloads import WORKLOADS

        return problem_from_json(
            {
                "cluster": {"nodes": max(1, ranks // 8), "gpus_per_node": min(8, ranks)},
                "model_preset": "qwen2-vl-7b",
                "batch": WORKLOADS[workload](samples, seed=seed),
                "options": {"time_budget_ms": 600_000.0},
            }
        )
    from bench.grid import make_problem
    from bench.workload_catalog import get_workload

    return make_problem(get_workload(workload), ranks, samples, seed, 600_000.0)


def _fresh_copy(problem: Any) -> Any:
    """The same request as a new problem of a new batch (the same samples), as a new request arrives:
    nothing a plan of ``problem`` worked out per batch or per problem (lengths, images, the profile in
    force) is at hand."""
    from dataclasses import replace

    from optimizer.problem.batch import Batch

    return replace(problem, batch=Batch(problem.batch.samples))


def _plan(problem: Any, budget_ms: float | None = None, backend: str = "heuristic") -> Any:
    from dataclasses import replace

    from planning.planner import plan

    budget = problem.options.time_budget_ms if budget_ms is None else budget_ms
    return plan(replace(problem, options=replace(problem.options, backend=backend, time_budget_ms=budget)))


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def _profile_summary(fn: Any, top: int = 15) -> tuple[str, str | None]:
    prof = cProfile.Profile()
    error = None
    prof.enable()
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the profile of a failing call is what we want
        error = f"{type(exc).__name__}: {exc}"
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(top)
    return buf.getvalue(), error


def _peak_rss_mb() -> float:
    """Peak resident memory of this process since it started (VmHWM; ru_maxrss would include the
    parent's pages before exec)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def measure_point(
    ranks: int,
    samples: int,
    repeats: int,
    workload: str,
    profile: bool,
    budget_ms: float | None = None,
    backend: str = "heuristic",
    cli: bool = False,
) -> dict[str, Any]:
    """One point, in this process (see the module docstring)."""
    from optimizer.errors import ProblemError
    from planning import allocator, fixed_work

    out: dict[str, Any] = {"ranks": ranks, "samples": samples, "workload": workload, "backend": backend}
    out["freed_memory_kept"] = allocator.in_force()
    if budget_ms is not None:
        out["budget_ms"] = budget_ms
    problem = _problem(ranks, samples, workload, 0, cli)
    walls: list[float] = []
    heur: list[float] = []
    phases: dict[str, list[float]] = {}
    start = time.perf_counter()
    try:
        warm = _problem(ranks, samples, workload, 99, cli)  # warm-up: another batch of the same size
        t0 = time.perf_counter()
        try:
            _plan(warm, budget_ms, backend)
        except ProblemError:
            pass  # a refused budget refuses the measured batch alike, below
        out["first_call_ms"] = (time.perf_counter() - t0) * 1000.0
        del warm
        out.update(
            estimate_ms=fixed_work.problem_estimate_ms(problem),
            minimum_budget_ms=fixed_work.problem_budget_ms(problem),
            rates=fixed_work.describe(),
        )
        for _ in range(repeats):
            fresh = _fresh_copy(problem)
            t0 = time.perf_counter()
            p = _plan(fresh, budget_ms, backend)
            walls.append((time.perf_counter() - t0) * 1000.0)
            heur.append(p.solver.details.get("phases", {}).get("heuristic_ms", float("nan")))
            for name, ms in p.solver.details.get("phases", {}).items():
                phases.setdefault(name, []).append(ms)
        out.update(
            status="ok",
            wall_ms=walls,
            heuristic_ms=heur,
            ratio_to_bound=p.ratio_to_bound,
            phases=p.solver.details.get("phases", {}),
            phase_medians={name: _median(ms) for name, ms in phases.items()},
            solver_wall_ms=p.solver.wall_ms,
            skipped=p.solver.details.get("skipped", {}),
            backend_used=p.solver.backend,
            solver_status=p.solver.status,
        )
    except ProblemError as exc:  # a budget below what the batch needs here: refused at once
        out.update(
            status="refused", error=str(exc), refused_after_ms=(time.perf_counter() - t0) * 1000.0, wall_ms=walls
        )
    except (MemoryError, Exception) as exc:  # noqa: BLE001 - a failing point is a result
        out.update(
            status="error",
            error=f"{type(exc).__name__}: {exc}",
            failed_after_ms=(time.perf_counter() - start) * 1000.0,
            wall_ms=walls,
        )
    if profile or out["status"] == "error":
        text, _ = _profile_summary(lambda: _plan(problem, budget_ms, backend))
        out["profile"] = text
    out["peak_rss_mb"] = _peak_rss_mb()
    return out


def point_table(point: dict[str, Any]) -> str:
    """One measured point as text: wall times, the median of each phase, the fixed-work estimate."""
    lines = [
        f"{point['ranks']} ranks x {point['samples']} samples ({point['workload']}), backend {point['backend']}, "
        f"budget {point.get('budget_ms', 'none')} ms: {point['status']}"
    ]
    if point.get("estimate_ms") is not None:
        lines.append(
            f"fixed work expected here: about {point['estimate_ms']:.0f} ms (refused below "
            f"{point['minimum_budget_ms']:.0f} ms)"
        )
    if point.get("error"):
        lines.append(point["error"])
    if "freed_memory_kept" in point:
        lines.append(
            "allocator: freed memory kept, as dhp's processes run (planning.allocator)"
            if point["freed_memory_kept"]
            else "allocator: glibc's defaults (freed blocks go back to the kernel)"
        )
    if point.get("wall_ms"):
        lines.append(
            f"plan() wall ms over {len(point['wall_ms'])} calls: median {_median(point['wall_ms']):.1f}, "
            f"all {', '.join(f'{w:.0f}' for w in point['wall_ms'])}; "
            f"first call in the process {point.get('first_call_ms', float('nan')):.0f}"
        )
    for name, ms in point.get("phase_medians", {}).items():
        lines.append(f"  {name:<16} {ms:9.1f}")
    for name, why in point.get("skipped", {}).items():
        lines.append(f"  skipped {name}: {why}")
    return "\n".join(lines)


def run_point(
    ranks: int,
    samples: int,
    repeats: int,
    workload: str = "video",
    profile: bool = False,
    timeout_s: float = 600.0,
    memory_gb: float = 8.0,
) -> dict[str, Any]:
    """One point in a child process under ``memory_gb`` of address space and ``timeout_s`` seconds."""
    limit = int(memory_gb * 2**30)

    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    cmd = [
        sys.executable,
        "-m",
        "bench.scaling",
        "--point",
        str(ranks),
        str(samples),
        "--repeats",
        str(repeats),
        "--workload",
        workload,
    ]
    if profile:
        cmd.append("--profile")
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            preexec_fn=limits,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
    except subprocess.TimeoutExpired:
        return {
            "ranks": ranks,
            "samples": samples,
            "workload": workload,
            "status": "timeout",
            "error": f"no answer within {timeout_s:.0f} s",
            "failed_after_ms": timeout_s * 1000.0,
        }
    if proc.returncode != 0 or not proc.stdout.strip():
        return {
            "ranks": ranks,
            "samples": samples,
            "workload": workload,
            "status": "crashed",
            "error": (proc.stderr or "")[-2000:],
            "failed_after_ms": (time.perf_counter() - start) * 1000.0,
        }
    return json.loads(proc.stdout.strip().splitlines()[-1])


def fit_exponent(points: list[dict[str, Any]]) -> float | None:
    """Least-squares slope of log(median ms) against log(samples) over finished points."""
    xs, ys = [], []
    for p in points:
        if p.get("status") == "ok" and p.get("wall_ms"):
            xs.append(math.log(p["samples"]))
            ys.append(math.log(sorted(p["wall_ms"])[len(p["wall_ms"]) // 2]))
    if len(xs) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else None


def run_scaling(
    points: tuple[tuple[int, int], ...] = DIAGONAL,
    workload: str = "video",
    timeout_s: float = 600.0,
    memory_gb: float = 8.0,
    progress: Any = None,
) -> dict[str, Any]:
    results = []
    for ranks, samples in points:
        repeats = 7 if samples <= 2048 else 5 if samples <= 8192 else 3
        r = run_point(
            ranks, samples, repeats, workload, profile=samples >= 32768, timeout_s=timeout_s, memory_gb=memory_gb
        )
        if r.get("wall_ms"):
            w = sorted(r["wall_ms"])
            r["median_ms"] = w[len(w) // 2]
            r["p99_ms"] = w[-1] if len(w) < 100 else w[math.ceil(0.99 * len(w)) - 1]
        target = TARGETS_MS.get((ranks, samples))
        if target is not None:
            r["target_ms"] = target
        results.append(r)
        if progress:
            progress(1)
    return {
        "workload": workload,
        "memory_limit_gb": memory_gb,
        "timeout_s": timeout_s,
        "points": results,
        "exponent": fit_exponent(results),
    }


def markdown(doc: dict[str, Any]) -> str:
    lines = [
        "## Heuristic planning cost as the problem grows",
        "",
        f"Workload {doc['workload']}; each point in its own process (limit {doc['memory_limit_gb']:.0f} GiB, "
        f"{doc['timeout_s']:.0f} s); `plan()` with the heuristic backend, as users call it: tables, bound, "
        "heuristic, static floor, verification.",
        "",
        "Median and p99 over the calls after a first one on another batch of the same size; "
        "the first call in the fresh process (kernels loaded, the process's memory first touched at that size) is "
        "shown apart.",
        "",
        (
            "| ranks | samples | median ms | p99 ms | first call ms | heuristic phase ms | goal ms | ratio to bound | "
            "peak RSS MiB | status |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in doc["points"]:
        heur = p.get("heuristic_ms") or []
        h = sorted(heur)[len(heur) // 2] if heur else None
        lines.append(
            f"| {p['ranks']} | {p['samples']} | {p.get('median_ms', float('nan')):.1f} | "
            f"{p.get('p99_ms', float('nan')):.1f} | {p.get('first_call_ms', float('nan')):.1f} | "
            f"{h if h is None else round(h, 1)} | {p.get('target_ms', '')} | "
            f"{p.get('ratio_to_bound', float('nan')):.3f} | {p.get('peak_rss_mb', float('nan')):.0f} | "
            f"{p['status']}{': ' + p['error'][:160].replace('|', '/') if p.get('error') else ''} |"
        )
    k = doc.get("exponent")
    lines += [
        "",
        f"Fitted growth exponent (time ~ samples^k over finished points): k = {'n/a' if k is None else f'{k:.2f}'}.",
        "",
    ]
    return "\n".join(lines)


def plot(doc: dict[str, Any], path: Path) -> str:
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ok = [p for p in doc["points"] if p.get("median_ms")]
    ax.plot([p["samples"] for p in ok], [p["median_ms"] for p in ok], marker="o", label="dhp heuristic, median")
    goals = [(s, t) for (_, s), t in TARGETS_MS.items()]
    ax.plot([s for s, _ in goals], [t for _, t in goals], linestyle="none", marker="x", color="red", label="goal")
    for p in doc["points"]:
        if p.get("status") != "ok":
            ax.annotate(p["status"], (p["samples"], p.get("failed_after_ms") or 1.0), color="red", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("samples (ranks = samples / 8)")
    ax.set_ylabel("planning wall time (ms)")
    k = doc.get("exponent")
    ax.set_title("Heuristic planning time" + ("" if k is None else f" (~ samples^{k:.2f})"))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.scaling", description="one scaling point (used by dhp bench --scaling)"
    )
    ap.add_argument("--point", nargs=2, type=int, metavar=("RANKS", "SAMPLES"), required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workload", default="video")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument(
        "--budget-ms", type=float, default=None, help="plan with this budget (default: one no plan reaches)"
    )
    ap.add_argument("--backend", default="heuristic")
    ap.add_argument("--table", action="store_true", help="print the point's phases as text instead of JSON")
    ap.add_argument(
        "--cli",
        action="store_true",
        help="the batch of 'dhp example' with the options of 'dhp plan' (no micro-batch cap)",
    )
    ap.add_argument(
        "--glibc-defaults",
        action="store_true",
        help="leave the allocator as another program's process has it (default: freed memory kept, as in dhp's)",
    )
    args = ap.parse_args(argv)
    if not args.glibc_defaults:
        from planning.allocator import retain_freed_memory

        retain_freed_memory()
    point = measure_point(
        args.point[0], args.point[1], args.repeats, args.workload, args.profile, args.budget_ms, args.backend, args.cli
    )
    print(point_table(point) if args.table else json.dumps(point))
    return 0


if __name__ == "__main__":
    sys.exit(main())
