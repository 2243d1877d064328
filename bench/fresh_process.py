"""The first answer of a fresh process: ``dhp plan`` run N times, and the client's local fallback.

    .venv/bin/python -m bench.fresh_process                  # 20 processes at a 200 ms budget
    .venv/bin/python -m bench.fresh_process --runs 5 --budget-ms 1000 --client-runs 3

``dhp plan``: N processes one after another (``dhp plan --batch B --cluster-preset C --model-preset M
--budget-ms X``, the plan read from standard output), each timed from its start to its exit: start-up,
imports, loading the compiled kernels and planning. One process runs first untimed, so that numba's
disk cache and the fixed work's rates (:mod:`planning.rates_cache`) are in place as they are on any
machine after its first plan; its time is printed apart. Printed: the median and the max of the wall
time, the CPU time of the processes (user + system, from ``getrusage``), the planner's own figures from
the plans (``solver.wall_ms``, counted from the process's start; the backend that answered).

The client (``--client-runs``, each in a fresh process): a
:class:`api.client.planner_client.PlannerClient` with ``local_fallback=True`` and ``retries=0`` against
a port nothing listens on (the retries' own pauses are not planning), for the same request. Printed:
how long the engine's warm-up thread took from the client's creation, the first plan made locally once
it has ended (a trainer creates its client before its first batch is ready), and the first plan asked
for at once, which waits for the warm-up.

Figures depend on the machine and on what else runs on it; ``uptime``'s load is printed before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.output import write_json

ROOT = Path(__file__).resolve().parent.parent

CLIENT_SCRIPT = r"""
import json, sys, time
created = time.perf_counter()
from api.client import PlannerClient
request = json.loads(sys.argv[1])
client = PlannerClient(sys.argv[2], retries=0, local_fallback=True, timeout_s=5.0)
thread = getattr(client, "warm_thread", None)  # None: a client that does not warm the engine up
warm_ms = None
if sys.argv[3] == "after-warm-up" and thread is not None:
    thread.join()
    warm_ms = (time.perf_counter() - created) * 1000.0
start = time.perf_counter()
plan = client.plan(request)
plan_ms = (time.perf_counter() - start) * 1000.0
print(json.dumps({"warm_ms": warm_ms, "plan_ms": plan_ms, "status": plan["status"],
                  "warm_error": getattr(client, "warm_error", None), "solver_wall_ms": plan["solver"]["wall_ms"]}))
"""


def dhp_command() -> list[str]:
    """The ``dhp`` entry point next to this interpreter, as users run it, else its module run as the process's
    command (both run :func:`api.cli.main.main` on the process's own arguments)."""
    dhp = Path(sys.executable).with_name("dhp")
    if dhp.exists():
        return [str(dhp)]
    return [sys.executable, "-m", "api.cli.main"]


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def run_dhp(args: argparse.Namespace) -> dict[str, Any]:
    """One ``dhp plan`` process: its wall and CPU seconds and the plan's own figures."""
    command = [*dhp_command(), "plan", "--batch", args.batch, "--budget-ms", str(args.budget_ms)]
    command += ["--cluster-preset", args.cluster_preset, "--model-preset", args.model_preset]
    cpu = _children_cpu_s()
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300, check=False)
    wall_ms = (time.perf_counter() - start) * 1000.0
    out: dict[str, Any] = {"wall_ms": wall_ms, "cpu_ms": (_children_cpu_s() - cpu) * 1000.0, "rc": proc.returncode}
    if proc.returncode != 0:
        out["error"] = proc.stderr.strip()[-300:]
        return out
    solver = json.loads(proc.stdout)["solver"]
    phases = solver.get("details", {}).get("phases", {})
    out.update(
        solver_wall_ms=solver["wall_ms"],
        backend=solver["backend"],
        kernels=solver.get("details", {}).get("kernels", "n/a"),
        start_up_ms=phases.get("queue_ms"),
        skipped=sorted(solver.get("details", {}).get("skipped", {})),
    )
    return out


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_client(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    """One fresh process with a fallback client (see the module docstring); ``mode`` ``after-warm-up`` or
    ``at-once``."""
    request = {
        "batch": json.loads((ROOT / args.batch).read_text()),
        "cluster_preset": args.cluster_preset,
        "model_preset": args.model_preset,
        "options": {"time_budget_ms": args.budget_ms},
    }
    url = f"http://127.0.0.1:{_closed_port()}"
    cpu = _children_cpu_s()
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", CLIENT_SCRIPT, json.dumps(request), url, mode],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    wall_ms = (time.perf_counter() - start) * 1000.0
    if proc.returncode != 0:
        return {"error": proc.stderr.strip()[-300:], "wall_ms": wall_ms}
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    out.update(process_ms=wall_ms, cpu_ms=(_children_cpu_s() - cpu) * 1000.0)
    return out


def _spread(values: list[float]) -> str:
    if not values:
        return "n/a"
    return f"median {statistics.median(values):.0f} ms, max {max(values):.0f} ms, min {min(values):.0f} ms"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fresh_process", description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20, help="dhp plan processes timed (default 20)")
    ap.add_argument("--budget-ms", type=float, default=200.0, help="the requests' budget (default 200)")
    ap.add_argument("--batch", default="examples/batch_video_512.json")
    ap.add_argument("--cluster-preset", default="h100-8x8")
    ap.add_argument("--model-preset", default="qwen2-vl-7b")
    ap.add_argument("--client-runs", type=int, default=5, help="fresh processes per client measurement (default 5)")
    ap.add_argument("--out", help="write every run and the summary as JSON here")
    args = ap.parse_args(argv)
    if args.runs < 1 or args.client_runs < 0 or args.budget_ms <= 0:
        print("--runs of at least 1, --client-runs of at least 0, a positive --budget-ms", file=sys.stderr)
        return 2

    print(f"load before: {_load()}")
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print("PYTHONDONTWRITEBYTECODE is set: modules without a .pyc are compiled from source in every process")
    first = run_dhp(args)
    print(f"untimed first process (fills the disk caches when empty): {first['wall_ms']:.0f} ms, rc {first['rc']}")
    runs = [run_dhp(args) for _ in range(args.runs)]
    failed = [r for r in runs if r["rc"] != 0]
    ok = [r for r in runs if r["rc"] == 0]
    print(
        f"dhp plan --budget-ms {args.budget_ms:g} ({args.batch}, {args.cluster_preset}, {args.model_preset}), "
        f"{len(runs)} fresh processes:"
    )
    print(f"  wall: {_spread([r['wall_ms'] for r in runs])}")
    print(f"  CPU (user + system): {_spread([r['cpu_ms'] for r in runs])}")
    print(f"  plan's solver.wall_ms (from the process's start): {_spread([r['solver_wall_ms'] for r in ok])}")
    print(f"  start-up before planning (phases.queue_ms): {_spread([r['start_up_ms'] or 0.0 for r in ok])}")
    backends = sorted({r["backend"] for r in ok})
    kernels = sorted({r["kernels"] for r in ok})
    print(
        f"  answered by: {', '.join(backends) or 'n/a'}; kernels: {', '.join(kernels) or 'n/a'}; failed: {len(failed)}"
    )
    for r in failed[:3]:
        print(f"  failure: rc {r['rc']}: {r.get('error')}")

    client: dict[str, list[dict[str, Any]]] = {}
    for mode in ("after-warm-up", "at-once") if args.client_runs else ():
        client[mode] = [run_client(args, mode) for _ in range(args.client_runs)]
    if client:
        done = [r for r in client["after-warm-up"] if "error" not in r]
        at_once = [r for r in client["at-once"] if "error" not in r]
        print(f"client local fallback, {args.client_runs} fresh processes each, budget {args.budget_ms:g} ms:")
        warmed = [r["warm_ms"] for r in done if r["warm_ms"] is not None]
        print(f"  warm-up thread, from the client's creation to its end: {_spread(warmed)}")
        print(f"  first local plan after the warm-up: {_spread([r['plan_ms'] for r in done])}")
        print(
            f"  first local plan asked for at once (waits for the warm-up): {_spread([r['plan_ms'] for r in at_once])}"
        )
        errors = [r["error"] for rs in client.values() for r in rs if "error" in r]
        for error in errors[:3]:
            print(f"  failure: {error}")
    print(f"load after: {_load()}")
    if args.out:
        summary = {"first": first, "runs": runs, "client": client, "budget_ms": args.budget_ms}
        write_json(args.out, summary)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
