"""Benchmark of the planning service on loopback: latency, overhead over the solve, throughput, overload.

    .venv/bin/python -m bench.service_bench            # full run (about a minute)
    .venv/bin/python -m bench.service_bench --quick    # a smoke run

1. Latency of POST /v1/plans at 64 ranks x 512 samples (video workload, cluster h100-8x8, model
   qwen2-vl-7b, backend heuristic, plan cache off so every request is solved) against the solve
   alone in process (``planning.planner.plan``). The overhead is measured per request as the
   end-to-end time minus the planner's own wall time reported in that response's Server-Timing
   header, and, for comparison, as the difference of the two medians. The part of it that is the
   service's own (HTTP, validation envelope, hashing, queueing, store) also leaves out the
   translation of the request into a problem and the encoding of the plan, which ``dhp plan``
   does as well. End-to-end: the pre-encoded body is sent and the whole answer is read (the
   client's JSON decoding is not counted).
2. Throughput of small requests (16 samples on 2 x 8 GPUs, cache off) against ``dhp serve --workers 2``.
3. Twice capacity: one process with 2 solve workers and 2 waiting places (capacity 4), driven by 8
   clients without retries: counts of 201, 503 (with Retry-After) and other 5xx; then every
   accepted plan (answered 201, or 202 for plan-ahead) is read back and must be done.

Everything runs on 127.0.0.1; server processes are started and stopped here. Figures depend on
the machine and on whatever else runs on it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from api.local_server import LocalServer
from optimizer.problem.documents import problem_from_json
from optimizer.problem.workloads import WORKLOADS
from planning.planner import plan as run_planner


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def Server(data_dir: Path, workers: int = 1, **env: str) -> LocalServer:
    """``dhp serve`` on loopback with DHP_ settings given as keywords (solve_workers="2" -> DHP_SOLVE_WORKERS)."""
    return LocalServer(data_dir, workers=workers, env={f"DHP_{k.upper()}": v for k, v in env.items()})


def big_request() -> dict[str, Any]:
    return {
        "batch": WORKLOADS["video"](512),
        "cluster_preset": "h100-8x8",
        "model_preset": "qwen2-vl-7b",
        "options": {"backend": "heuristic", "time_budget_ms": 1000},
        "cache": False,
    }


def small_request(seed: int) -> dict[str, Any]:
    return {
        "batch": WORKLOADS["video"](16, seed=seed),
        "cluster": {"nodes": 2, "gpus_per_node": 8},
        "model_preset": "qwen2-vl-7b",
        "options": {"backend": "heuristic", "time_budget_ms": 1000},
        "cache": False,
    }


def server_timing(header: str) -> dict[str, float]:
    out = {}
    for part in header.split(","):
        name, _, dur = part.strip().partition(";dur=")
        out[name] = float(dur)
    return out


def latency(data_dir: Path, rounds: int) -> dict[str, Any]:
    doc = big_request()
    body = json.dumps(doc).encode()
    plain = json.dumps({k: v for k, v in doc.items() if k != "cache"})
    problem = problem_from_json(json.loads(plain))
    server = Server(data_dir / "latency", solve_workers="1")
    e2e, solve, overhead, service_only, in_process = [], [], [], [], []
    phases: dict[str, list[float]] = {}
    try:
        with httpx.Client(base_url=server.url, headers={"content-type": "application/json"}, timeout=30) as client:
            for _ in range(5):  # warm up both paths
                client.post("/v1/plans", content=body).raise_for_status()
                run_planner(problem)
            for _ in range(rounds):  # interleaved, so that drift in machine load hits both alike
                # This process's garbage from the in-process runs must not be collected inside a timed request.
                gc.collect()
                t0 = time.perf_counter()
                r = client.post("/v1/plans", content=body)
                _ = r.content
                t1 = time.perf_counter()
                r.raise_for_status()
                ms = (t1 - t0) * 1000
                timing = server_timing(r.headers["server-timing"])
                for name, value in timing.items():
                    phases.setdefault(name, []).append(value)
                e2e.append(ms)
                overhead.append(ms - timing["solve"])
                service_only.append(ms - timing["translate"] - timing["solve"] - timing["encode"])
                phases.setdefault("outside_app", []).append(ms - timing["app"])
                gc.collect()
                t0 = time.perf_counter()
                run_planner(problem)
                solve.append((time.perf_counter() - t0) * 1000)
                gc.collect()
                t0 = time.perf_counter()
                json.dumps(run_planner(problem_from_json(json.loads(plain))).to_json())
                in_process.append((time.perf_counter() - t0) * 1000)
            cached_body = json.dumps({**doc, "cache": True}).encode()
            client.post("/v1/plans", content=cached_body).raise_for_status()
            hits = []
            for _ in range(rounds):
                t0 = time.perf_counter()
                r = client.post("/v1/plans", content=cached_body)
                _ = r.content
                hits.append((time.perf_counter() - t0) * 1000)
                assert r.headers["x-plan-cache"] == "hit"
    finally:
        server.stop()
    return {
        "cache_hit_median_ms": statistics.median(hits),
        "cache_hit_p99_ms": pct(hits, 99),
        "e2e_median_ms": statistics.median(e2e),
        "e2e_p99_ms": pct(e2e, 99),
        "solve_median_ms": statistics.median(solve),
        "solve_p99_ms": pct(solve, 99),
        "overhead_median_ms": statistics.median(overhead),
        "overhead_p99_ms": pct(overhead, 99),
        "service_only_median_ms": statistics.median(service_only),
        "service_only_p99_ms": pct(service_only, 99),
        "median_difference_ms": statistics.median(e2e) - statistics.median(solve),
        "in_process_parse_plan_encode_median_ms": statistics.median(in_process),
        "rounds": rounds,
        "server_phases_median_ms": {k: statistics.median(v) for k, v in phases.items()},
    }


async def _drive(
    url: str, docs: list[bytes], concurrency: int, path: str = "/v1/plans"
) -> list[tuple[int, dict[str, str], bytes]]:
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    for d in docs:
        queue.put_nowait(d)
    out: list[tuple[int, dict[str, str], bytes]] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(
        base_url=url, headers={"content-type": "application/json"}, timeout=60, limits=limits
    ) as client:

        async def worker() -> None:
            while not queue.empty():
                body = queue.get_nowait()
                r = await client.post(path, content=body)
                out.append((r.status_code, dict(r.headers), r.content))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


def throughput(data_dir: Path, n: int, concurrency: int) -> dict[str, float]:
    docs = [json.dumps(small_request(s)).encode() for s in range(n)]
    server = Server(data_dir / "throughput", workers=2, solve_workers="2", queue_limit="64")
    try:
        asyncio.run(_drive(server.url, docs[: min(20, n)], concurrency))  # warm up both workers
        t0 = time.perf_counter()
        results = asyncio.run(_drive(server.url, docs, concurrency))
        wall = time.perf_counter() - t0
    finally:
        server.stop()
    codes = [c for c, _, _ in results]
    return {
        "requests": n,
        "concurrency": concurrency,
        "ok": sum(c in (200, 201) for c in codes),
        "non_ok": sum(c not in (200, 201) for c in codes),
        "seconds": wall,
        "requests_per_s": n / wall,
    }


def overload(data_dir: Path, n: int) -> dict[str, Any]:
    workers, queue_limit = 2, 2
    capacity = workers + queue_limit
    server = Server(data_dir / "overload", solve_workers=str(workers), queue_limit=str(queue_limit), retry_after_s="1")
    doc = big_request()
    now_docs = [json.dumps(doc).encode() for _ in range(n)]
    ahead_docs = [json.dumps({**doc, "wait": False}).encode() for _ in range(n)]
    try:
        t0 = time.perf_counter()
        now = asyncio.run(_drive(server.url, now_docs, 2 * capacity))
        ahead = asyncio.run(_drive(server.url, ahead_docs, 2 * capacity))
        wall = time.perf_counter() - t0
        all_results = now + ahead
        accepted = [json.loads(b)["id"] for c, _, b in all_results if c in (200, 201, 202)]
        rejected = [h for c, h, _ in all_results if c == 503]
        other_5xx = sum(1 for c, _, _ in all_results if c >= 500 and c != 503)
        other = sum(1 for c, _, _ in all_results if c not in (200, 201, 202, 503) and c < 500)
        found_done = 0
        with httpx.Client(base_url=server.url, timeout=60) as client:
            for pid in accepted:
                r = client.get(f"/v1/plans/{pid}", params={"wait_ms": 30_000})
                if r.status_code == 200 and r.json()["status"] == "done" and r.json()["micro_batches"]:
                    found_done += 1
            stored = client.get("/v1/plans", params={"limit": 1}).json()["total"]
    finally:
        server.stop()
    return {
        "capacity": capacity,
        "clients": 2 * capacity,
        "requests": len(all_results),
        "seconds": wall,
        "answered_now_201": sum(c == 201 for c, _, _ in now),
        "accepted_ahead_202": sum(c == 202 for c, _, _ in ahead),
        "rejected_503": len(rejected),
        "rejected_503_with_retry_after": sum(1 for h in rejected if h.get("retry-after")),
        "other_5xx": other_5xx,
        "other_4xx": other,
        "accepted": len(accepted),
        "accepted_read_back_done": found_done,
        "stored_plans": stored,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    rounds, n_small, n_over = (15, 60, 16) if args.quick else (200, 600, 80)
    load_before = os.getloadavg()[0]
    print(
        f"machine: {os.cpu_count()} CPUs, load average {load_before:.2f} at the start (other work on the machine "
        "inflates every figure)"
    )
    with tempfile.TemporaryDirectory(prefix="dhp-service-bench-") as tmp:
        data = Path(tmp)
        lat = latency(data, rounds)
        print(f"latency, POST /v1/plans, 64 ranks x 512 samples, heuristic, {lat['rounds']} requests:")
        print(f"  end-to-end  median {lat['e2e_median_ms']:.2f} ms   p99 {lat['e2e_p99_ms']:.2f} ms")
        print(
            f"  solve alone median {lat['solve_median_ms']:.2f} ms   p99 {lat['solve_p99_ms']:.2f} ms   "
            "(planning.planner.plan in process)"
        )
        print(
            f"  overhead    median {lat['overhead_median_ms']:.2f} ms   p99 {lat['overhead_p99_ms']:.2f} ms   "
            "(per request: end-to-end minus that request's planner wall time; goal <= 3 ms)"
        )
        print(
            f"  of which the service alone median {lat['service_only_median_ms']:.2f} ms   p99 "
            f"{lat['service_only_p99_ms']:.2f} ms   (also minus the request's translation by problem_from_json and "
            "the plan's encoding, which `dhp plan` pays too)"
        )
        print(
            "  server-side phases, median ms (Server-Timing): "
            + ", ".join(f"{k} {v:.2f}" for k, v in lat["server_phases_median_ms"].items())
        )
        print(
            f"  identical request again (plan cache hit): median {lat['cache_hit_median_ms']:.2f} ms   p99 "
            f"{lat['cache_hit_p99_ms']:.2f} ms"
        )
        print(
            f"  difference of medians {lat['median_difference_ms']:.2f} ms; in process parse + plan + encode (what "
            f"`dhp plan` does) median {lat['in_process_parse_plan_encode_median_ms']:.2f} ms"
        )
        thr = throughput(data, n_small, 8)
        print(
            "throughput, small requests (16 samples, 2x8 GPUs), dhp serve --workers 2, "
            f"{thr['concurrency']} concurrent clients:"
        )
        print(
            f"  {thr['requests']} requests in {thr['seconds']:.2f} s = {thr['requests_per_s']:.0f} requests/s "
            f"({thr['non_ok']} not OK)"
        )
        ov = overload(data, n_over)
        print(
            f"twice capacity: capacity {ov['capacity']} (2 solving + 2 waiting), "
            f"{ov['clients']} clients without retries, {ov['requests']} requests:"
        )
        print(
            f"  answered 201: {ov['answered_now_201']}, plan-ahead 202: {ov['accepted_ahead_202']}, 503: "
            f"{ov['rejected_503']} ({ov['rejected_503_with_retry_after']} with Retry-After), other 5xx: "
            f"{ov['other_5xx']}, other 4xx: {ov['other_4xx']}"
        )
        print(
            f"  accepted {ov['accepted']}, read back done {ov['accepted_read_back_done']}, stored {ov['stored_plans']}"
        )
        print(f"load average {os.getloadavg()[0]:.2f} at the end")
        if args.json:
            Path(args.json).write_text(json.dumps({"latency": lat, "throughput": thr, "overload": ov}, indent=2))


if __name__ == "__main__":
    main()
