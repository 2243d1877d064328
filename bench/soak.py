"""A bounded soak of the planning service on loopback: one plan per batch, overload, kill -9 under load.

    .venv/bin/python -m bench.soak                      # about two minutes
    .venv/bin/python -m bench.soak --seconds 5 --kills 5

1. One plan per batch: 16 clients send the same request at once; counts the distinct plan ids
   answered and the solves the service ran (its ``dhp_solve_duration_seconds_count`` metric).
2. Overload at 2x and 8x capacity: one server process with ``--solve-workers`` solve threads and
   ``--queue-limit`` waiting places (capacity = their sum) is driven by 2x and 8x that many clients
   for ``--seconds`` each, without retries (a client that got 503 waits 10 ms). Every request asks
   for a 200 ms budget with ``backend: auto`` (the exact solver uses what is left), so a solve holds
   a worker for most of its budget. Reports p50/p99 of accepted requests, the share within budget
   + 50 ms, p50/p99/max of the 503 answers, other statuses, the server's peak memory (VmHWM), and one
   request after the load (recovery).
3. kill -9 under load, ``--kills`` runs: 4 clients send plan-now and plan-ahead requests; the server
   is killed with SIGKILL halfway, then started again on the same store. Every acknowledged plan
   (201 or 202 with an id) is read back after the restart: counts of plans pending when the server
   was killed, and of done, failed, still pending and missing (acknowledged but not stored), and of
   500 answers.

Everything runs on 127.0.0.1 with an SQLite store under a temporary folder; figures depend on the
machine and on whatever else runs on it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from api.local_server import LocalServer
from api.store import Store
from optimizer.problem.workloads import WORKLOADS

BUDGET_MS = 200.0


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def request(seed: int, n: int = 48, backend: str = "auto", cache: bool = False) -> dict[str, Any]:
    return {"batch": WORKLOADS["video"](n, seed=seed), "cluster": {"nodes": 2, "gpus_per_node": 8}, "model_preset": "qwen2-vl-7b",
            "options": {"backend": backend, "time_budget_ms": BUDGET_MS}, "cache": cache}


def server(data_dir: Path, **env: str) -> LocalServer:
    return LocalServer(data_dir, env={f"DHP_{k.upper()}": v for k, v in env.items()})


def peak_rss_mib(pid: int) -> float | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    m = re.search(r"VmHWM:\s+(\d+) kB", text)
    return int(m.group(1)) / 1024 if m else None


def solves(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(r"^dhp_solve_duration_seconds_count\{[^}]*\} (\S+)$", text, re.M))


def one_plan_per_batch(root: Path) -> dict[str, Any]:
    srv = server(root / "one-plan")
    try:
        body = json.dumps({**request(seed=7), "cache": True}).encode()
        barrier = threading.Barrier(16)
        answers: list[tuple[int, str | None]] = []

        def post() -> None:
            barrier.wait()
            r = httpx.post(srv.url + "/v1/plans", content=body, headers={"content-type": "application/json"}, timeout=60)
            answers.append((r.status_code, r.json().get("id") if r.status_code < 300 else None))

        threads = [threading.Thread(target=post) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return {"requests": 16, "statuses": sorted({s for s, _ in answers}), "distinct_plan_ids": len({i for _, i in answers if i}),
                "solves": solves(srv.url)}
    finally:
        srv.stop()


def overload(root: Path, clients: int, seconds: float, workers: int, queue_limit: int) -> dict[str, Any]:
    srv = server(root / f"overload-{clients}", solve_workers=str(workers), queue_limit=str(queue_limit))
    ok: list[float] = []
    refused: list[float] = []
    other: dict[int, int] = {}
    retry_after: list[int] = []
    reasons: dict[str, int] = {}
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def client(k: int) -> None:
        seed = 1000 * k
        with httpx.Client(base_url=srv.url, timeout=60) as http:
            while time.monotonic() < stop:
                seed += 1
                body = json.dumps(request(seed)).encode()
                t0 = time.perf_counter()
                r = http.post("/v1/plans", content=body, headers={"content-type": "application/json"})
                took = time.perf_counter() - t0
                with lock:
                    if r.status_code == 201:
                        ok.append(took)
                    elif r.status_code == 503:
                        refused.append(took)
                        retry_after.append(int(r.headers.get("retry-after", "-1")))
                        why = r.json().get("detail", "")
                        reasons[why] = reasons.get(why, 0) + 1
                    else:
                        other[r.status_code] = other.get(r.status_code, 0) + 1
                if r.status_code == 503:
                    time.sleep(0.01)

    try:
        threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        time.sleep(0.5)
        t0 = time.perf_counter()
        after = httpx.post(srv.url + "/v1/plans", json=request(seed=99_999), timeout=60)
        recovery_ms = (time.perf_counter() - t0) * 1000
        ms = [x * 1000 for x in ok]
        rms = [x * 1000 for x in refused]
        return {"clients": clients, "capacity": workers + queue_limit, "accepted": len(ok), "accepted_p50_ms": pct(ms, 50), "accepted_p99_ms": pct(ms, 99),
                "accepted_within_budget_plus_50ms": sum(1 for x in ms if x <= BUDGET_MS + 50), "refused_503": len(rms), "refused_p50_ms": pct(rms, 50),
                "refused_p99_ms": pct(rms, 99), "refused_max_ms": max(rms) if rms else None,
                "retry_after_s": sorted(set(retry_after)), "refusals_by_reason": reasons, "other_statuses": other, "server_peak_rss_mib": peak_rss_mib(srv.proc.pid),
                "after_load_status": after.status_code, "after_load_ms": recovery_ms}
    finally:
        srv.stop()


def kill_run(root: Path, run: int, seconds: float) -> dict[str, Any]:
    data = root / f"kill-{run}"
    srv = server(data, solve_workers="2", queue_limit="8")
    acked: list[str] = []
    statuses: dict[int, int] = {}
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def client(k: int) -> None:
        seed = 10_000 * (run + 1) + 1000 * k
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            while time.monotonic() < stop:
                seed += 1
                body = {**request(seed), "wait": bool(seed % 2)}
                try:
                    r = http.post("/v1/plans", json=body)
                except httpx.TransportError:
                    time.sleep(0.05)
                    continue
                with lock:
                    statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                    if r.status_code in (200, 201, 202):
                        acked.append(r.json()["id"])

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    time.sleep(seconds / 2)
    os.kill(srv.proc.pid, signal.SIGKILL)
    srv.proc.wait()
    for t in threads:
        t.join()
    srv.stop()
    store = Store(f"sqlite:///{(data / 'dhp.sqlite3').resolve()}")
    pending_at_restart = store.search(status="pending", limit=1)[1]
    store.close()
    again = server(data, solve_workers="2", queue_limit="8")
    try:
        counts = {"done": 0, "failed": 0, "pending": 0, "missing": 0}
        with httpx.Client(base_url=again.url, timeout=60) as http:
            for plan_id in acked:
                r = http.get(f"/v1/plans/{plan_id}", params={"wait_ms": 20_000})
                if r.status_code == 404:
                    counts["missing"] += 1
                else:
                    counts[r.json()["status"]] = counts.get(r.json()["status"], 0) + 1
            stored = http.get("/v1/plans", params={"limit": 1}).json()["total"]
        return {"run": run, "acknowledged": len(acked), "stored_total": stored, "pending_when_killed": pending_at_restart, **counts, "statuses_during_load": statuses}
    finally:
        again.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="load per overload level and per kill run")
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--solve-workers", type=int, default=2)
    ap.add_argument("--queue-limit", type=int, default=2)
    ap.add_argument("--skip", default="", help="comma-separated phases to skip: one-plan, overload, kill")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="dhp-soak-") as tmp:
        root = Path(tmp)
        if "one-plan" not in skip:
            out["one_plan_per_batch"] = one_plan_per_batch(root)
            print(json.dumps({"one_plan_per_batch": out["one_plan_per_batch"]}), flush=True)
        if "overload" not in skip:
            capacity = args.solve_workers + args.queue_limit
            for factor in (2, 8):
                res = overload(root, factor * capacity, args.seconds, args.solve_workers, args.queue_limit)
                out[f"overload_{factor}x"] = res
                print(json.dumps({f"overload_{factor}x": res}), flush=True)
        if "kill" not in skip:
            runs = [kill_run(root, k, args.seconds) for k in range(args.kills)]
            for r in runs:
                print(json.dumps({"kill": r}), flush=True)
            out["kill"] = {"runs": len(runs), "acknowledged": sum(r["acknowledged"] for r in runs), "missing": sum(r["missing"] for r in runs),
                           "still_pending": sum(r["pending"] for r in runs), "pending_when_killed": sum(r["pending_when_killed"] for r in runs), "done": sum(r["done"] for r in runs), "failed": sum(r["failed"] for r in runs),
                           "http_500": sum(r["statuses_during_load"].get(500, 0) for r in runs),
                           "median_acknowledged": statistics.median(r["acknowledged"] for r in runs)}
            print(json.dumps({"kill_summary": out["kill"]}), flush=True)


if __name__ == "__main__":
    main()
