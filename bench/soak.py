"""A bounded soak of the planning service on loopback: one plan per batch, overload, large bodies, kill -9 under load.

    .venv/bin/python -m bench.soak                      # about five minutes
    .venv/bin/python -m bench.soak --seconds 5 --kills 5 --skip one-plan

1. One plan per batch: 16 clients send the same request at once; counts the distinct plan ids
   answered and the solves the service ran (its ``dhp_solve_duration_seconds_count`` metric).
2. Overload at 2x and 8x capacity: one server process with ``--solve-workers`` solve threads and
   ``--queue-limit`` waiting places (capacity = their sum) is driven by 2x and 8x that many clients
   for ``--seconds`` each, without retries (a client that got 503 waits 10 ms), through the lean
   client of :mod:`bench.http_load`. Every request asks for a 200 ms budget with ``backend: auto``
   (the exact solver uses what is left), so a solve holds a worker for most of its budget. Reports
   p50/p99 of accepted requests and p50/p99/max of the 503 answers as the client saw them and as the
   service timed them (``Server-Timing: app``, arrival to first byte), the refusals by reason, other
   statuses, the server's peak memory (VmHWM), and one request after the load (recovery).
3. Large bodies: ``--big-clients`` clients each send a 15.8 MiB body at once, twice: bodies over the
   sample limit (parsed in full, then 422) and valid ones; ``GET /healthz`` is timed every 20 ms
   from another process meanwhile (and for as long with no load, as a reference). Reports statuses,
   answer times, /healthz p50/p99/max and the server's peak memory.
4. kill -9 of the service under load, ``--kills`` runs (SQLite store): 4 clients send plan-now and
   plan-ahead requests; the server is killed with SIGKILL halfway, then started again on the same
   store. Every acknowledged plan (201 or 202 with an id) is read back after the restart: counts of
   plans pending when the server was killed, and of done, failed, still pending and missing
   (acknowledged but not stored), and of 500 answers.
5. kill -9 of PostgreSQL under load, ``--kills`` runs: the service runs on a private PostgreSQL
   server (:mod:`bench.postgres_server`, its own data folder and port); halfway through the load its
   postmaster is killed with SIGKILL and started again ``--pg-down`` seconds later (crash recovery),
   while the clients go on. The same counts as 4 (pending: plan-ahead requests the service had
   accepted and not answered when PostgreSQL was killed), plus the answers while it was down.

Everything runs on 127.0.0.1 under a temporary folder; figures depend on the machine and on whatever
else runs on it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from api.local_server import LocalServer
from api.store import Store
from bench.http_load import Answer, Connection, Probe, drive, percentile
from optimizer.problem.workloads import WORKLOADS

BUDGET_MS = 200.0
BIG_BODY_BYTES = int(15.8 * 2**20)


def pct(values: list[float], q: float) -> float | None:
    value = percentile(values, q)
    return round(value, 2) if value is not None else None


def request(seed: int, n: int = 48, backend: str = "auto", cache: bool = False) -> dict[str, Any]:
    return {
        "batch": WORKLOADS["video"](n, seed=seed),
        "cluster": {"nodes": 2, "gpus_per_node": 8},
        "model_preset": "qwen2-vl-7b",
        "options": {"backend": backend, "time_budget_ms": BUDGET_MS},
        "cache": cache,
    }


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
            r = httpx.post(
                srv.url + "/v1/plans", content=body, headers={"content-type": "application/json"}, timeout=60
            )
            answers.append((r.status_code, r.json().get("id") if r.status_code < 300 else None))

        threads = [threading.Thread(target=post) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return {
            "requests": 16,
            "statuses": sorted({s for s, _ in answers}),
            "distinct_plan_ids": len({i for _, i in answers if i}),
            "solves": solves(srv.url),
        }
    finally:
        srv.stop()


def _times(answers: list[Answer]) -> dict[str, Any]:
    client = [a.seconds * 1000 for a in answers]
    inside = [a.server_ms for a in answers if a.server_ms is not None]
    return {
        "n": len(answers),
        "client_p50_ms": pct(client, 50),
        "client_p99_ms": pct(client, 99),
        "client_max_ms": pct(client, 100),
        "server_p50_ms": pct(inside, 50),
        "server_p99_ms": pct(inside, 99),
        "server_max_ms": pct(inside, 100),
    }


def overload(root: Path, clients: int, seconds: float, workers: int, queue_limit: int) -> dict[str, Any]:
    srv = server(root / f"overload-{clients}", solve_workers=str(workers), queue_limit=str(queue_limit))
    bodies: dict[tuple[int, int], bytes] = {}
    for k in range(clients):  # encoded before the load: the client does nothing but send and read
        for n in range(40):
            bodies[k, n] = json.dumps(request(1000 * k + n)).encode()
    try:
        answers = asyncio.run(drive(srv.url, clients, seconds, lambda k, n: bodies[k, n % 40]))
        accepted = [a for a in answers if a.status == 201]
        refused = [a for a in answers if a.status == 503]
        reasons: dict[str, list[Answer]] = {}
        for a in refused:
            reasons.setdefault(json.loads(a.body).get("detail", "").split(" (")[0], []).append(a)  # without its figures
        time.sleep(0.5)
        t0 = time.perf_counter()
        after = httpx.post(srv.url + "/v1/plans", json=request(seed=99_999), timeout=60)
        recovery_ms = (time.perf_counter() - t0) * 1000
        ok_ms = [a.seconds * 1000 for a in accepted]
        return {
            "clients": clients,
            "capacity": workers + queue_limit,
            "seconds": seconds,
            "accepted": _times(accepted),
            "accepted_within_budget_plus_50ms": sum(1 for x in ok_ms if x <= BUDGET_MS + 50),
            "refused_503": _times(refused),
            "refused_over_50ms": sum(1 for a in refused if a.seconds > 0.05),
            "retry_after_s": sorted({int(a.headers.get("retry-after", "-1")) for a in refused}),
            "refusals_by_reason": {
                why: {
                    "n": len(v),
                    "client_p99_ms": pct([a.seconds * 1000 for a in v], 99),
                    "client_max_ms": pct([a.seconds * 1000 for a in v], 100),
                }
                for why, v in reasons.items()
            },
            "other_statuses": dict(Counter(a.status for a in answers if a.status not in (201, 503))),
            "server_peak_rss_mib": peak_rss_mib(srv.proc.pid),
            "after_load_status": after.status_code,
            "after_load_ms": round(recovery_ms, 1),
            "load_average": os.getloadavg()[0],
        }
    finally:
        srv.stop()


def big_body(valid: bool) -> bytes:
    """A plan request of about 15.8 MiB: many small samples (more than the default limit of
    65,536), or fewer large ones."""
    samples: list[dict[str, Any]] = []
    size = 200
    pad = "x" * (0 if not valid else 820)
    while size < BIG_BODY_BYTES:
        k = len(samples)
        sample = {
            "id": f"clip-{k:08d}{pad}",
            "text_tokens": 100 + k % 900,
            "videos": [{"frames": 4 + k % 50, "tokens_per_frame": 196}] * 2,
        }
        samples.append(sample)
        size += len(json.dumps(sample)) + 2
    return json.dumps(
        {
            "batch": {"samples": samples},
            "cluster": {"nodes": 2, "gpus_per_node": 8},
            "model_preset": "qwen2-vl-7b",
            "options": {"backend": "heuristic", "time_budget_ms": 3000},
            "cache": False,
        }
    ).encode()


def _healthz(probe: list[tuple[int, float]]) -> dict[str, Any]:
    ms = [s * 1000 for _, s in probe]
    return {
        "n": len(ms),
        "p50_ms": pct(ms, 50),
        "p99_ms": pct(ms, 99),
        "max_ms": pct(ms, 100),
        "not_200": sum(1 for st, _ in probe if st != 200),
    }


def big_bodies(root: Path, clients: int) -> dict[str, Any]:
    srv = server(root / "big-bodies")
    out: dict[str, Any] = {"clients": clients}
    try:
        out["healthz_idle"] = _healthz(Probe(srv.url, "/healthz", 0.02, 6).result())
        for valid in (False, True):
            body = big_body(valid)

            async def one(payload: bytes = body) -> Answer:
                conn = Connection(srv.url)
                try:
                    return await conn.request("POST", "/v1/plans", payload)
                finally:
                    conn.close()

            async def all_at_once() -> list[Answer]:
                return list(await asyncio.gather(*(one() for _ in range(clients))))

            probe = Probe(srv.url, "/healthz", 0.02, 12)
            time.sleep(1.0)
            t0 = time.perf_counter()
            answers = asyncio.run(all_at_once())
            wall = time.perf_counter() - t0
            by_status = {
                str(s): {
                    "n": len(v),
                    "min_s": round(min(v), 2),
                    "median_s": round(statistics.median(v), 2),
                    "max_s": round(max(v), 2),
                }
                for s in sorted({a.status for a in answers})
                for v in [[a.seconds for a in answers if a.status == s]]
            }
            details = Counter(json.loads(a.body).get("detail", "")[:70] for a in answers if a.status >= 400 and a.body)
            out["valid" if valid else "over_sample_limit"] = {
                "body_mib": round(len(body) / 2**20, 2),
                "samples": body.count(b'"id"'),
                "wall_s": round(wall, 2),
                "answers": by_status,
                "details": dict(details),
                "healthz": _healthz(probe.result()),
            }
        out["server_peak_rss_mib"] = peak_rss_mib(srv.proc.pid)
        return out
    finally:
        srv.stop()


def _load(
    url: str, seconds: float, seed0: int, acked: list[str], statuses: Counter[int], lock: threading.Lock
) -> list[threading.Thread]:
    """4 clients sending plan-now and plan-ahead requests for ``seconds`` (connection failures are waited out)."""
    stop = time.monotonic() + seconds

    def client(k: int) -> None:
        seed = seed0 + 1000 * k
        with httpx.Client(base_url=url, timeout=30) as http:
            while time.monotonic() < stop:
                seed += 1
                try:
                    r = http.post("/v1/plans", json={**request(seed), "wait": bool(seed % 2)})
                except httpx.TransportError:
                    time.sleep(0.05)
                    continue
                with lock:
                    statuses[r.status_code] += 1
                    if r.status_code in (200, 201, 202):
                        acked.append(r.json()["id"])
                if r.status_code == 503:
                    time.sleep(0.05)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    return threads


def _read_back(url: str, acked: list[str]) -> dict[str, Any]:
    counts = {"done": 0, "failed": 0, "pending": 0, "missing": 0}
    with httpx.Client(base_url=url, timeout=60) as http:
        for plan_id in acked:
            r = http.get(f"/v1/plans/{plan_id}", params={"wait_ms": 20_000})
            if r.status_code == 404:
                counts["missing"] += 1
            else:
                counts[r.json()["status"]] = counts.get(r.json()["status"], 0) + 1
        stored = http.get("/v1/plans", params={"limit": 1}).json()["total"]
    return {"acknowledged": len(acked), "stored_total": stored, **counts}


def kill_run(root: Path, run: int, seconds: float) -> dict[str, Any]:
    data = root / f"kill-{run}"
    srv = server(data, solve_workers="2", queue_limit="8")
    acked: list[str] = []
    statuses: Counter[int] = Counter()
    threads = _load(srv.url, seconds, 10_000 * (run + 1), acked, statuses, threading.Lock())
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
        return {
            "run": run,
            "pending_when_killed": pending_at_restart,
            **_read_back(again.url, acked),
            "statuses_during_load": dict(statuses),
        }
    finally:
        again.stop()


def postgres_kill_run(root: Path, run: int, seconds: float, down_s: float) -> dict[str, Any]:
    from bench.postgres_server import PostgresServer

    root.chmod(0o755)  # as root, PostgreSQL runs as the postgres user, which must reach its folder
    pg = PostgresServer(root / f"pg-{run}")
    srv = server(root / f"pg-kill-{run}", solve_workers="2", queue_limit="8", database_url=pg.url)
    acked: list[str] = []
    statuses: Counter[int] = Counter()
    lock = threading.Lock()
    try:
        threads = _load(srv.url, seconds, 50_000 * (run + 1), acked, statuses, lock)
        time.sleep(seconds / 2)
        with lock:
            before = Counter(statuses)
        pending = httpx.get(srv.url + "/v1/plans", params={"status": "pending", "limit": 1}, timeout=10).json()["total"]
        pg.kill()
        time.sleep(down_s)
        pg.start()
        with lock:
            during = Counter(statuses)
        during.subtract(before)
        for t in threads:
            t.join()
        return {
            "run": run,
            "pending_when_killed": pending,
            **_read_back(srv.url, acked),
            "statuses_during_load": dict(statuses),
            "statuses_while_down": {k: v for k, v in during.items() if v},
            "server_alive": srv.proc.poll() is None,
        }
    finally:
        srv.stop()
        pg.stop()


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "runs": len(runs),
        "acknowledged": sum(r["acknowledged"] for r in runs),
        "missing": sum(r["missing"] for r in runs),
        "done": sum(r["done"] for r in runs),
        "failed": sum(r["failed"] for r in runs),
        "still_pending": sum(r["pending"] for r in runs),
        "pending_when_killed": sum(r.get("pending_when_killed", 0) for r in runs),
        "http_500": sum(r["statuses_during_load"].get(500, 0) for r in runs),
        "http_503": sum(r["statuses_during_load"].get(503, 0) for r in runs),
        "median_acknowledged": statistics.median(r["acknowledged"] for r in runs),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="load per overload level and per kill run")
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--solve-workers", type=int, default=2)
    ap.add_argument("--queue-limit", type=int, default=2)
    ap.add_argument("--big-clients", type=int, default=24)
    ap.add_argument("--pg-down", type=float, default=2.0, help="seconds PostgreSQL stays down after its kill")
    ap.add_argument(
        "--skip", default="", help="comma-separated phases to skip: one-plan, overload, big-bodies, kill, pg-kill"
    )
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    print(json.dumps({"machine": {"cpus": os.cpu_count(), "load_average": os.getloadavg()}}), flush=True)
    with tempfile.TemporaryDirectory(prefix="dhp-soak-") as tmp:
        root = Path(tmp)
        if "one-plan" not in skip:
            print(json.dumps({"one_plan_per_batch": one_plan_per_batch(root)}), flush=True)
        if "overload" not in skip:
            capacity = args.solve_workers + args.queue_limit
            for factor in (2, 8):
                print(
                    json.dumps(
                        {
                            f"overload_{factor}x": overload(
                                root, factor * capacity, args.seconds, args.solve_workers, args.queue_limit
                            )
                        }
                    ),
                    flush=True,
                )
        if "big-bodies" not in skip:
            print(json.dumps({"big_bodies": big_bodies(root, args.big_clients)}), flush=True)
        if "kill" not in skip:
            runs = [kill_run(root, k, args.seconds) for k in range(args.kills)]
            for r in runs:
                print(json.dumps({"kill": r}), flush=True)
            print(json.dumps({"kill_summary": _summary(runs)}), flush=True)
        if "pg-kill" not in skip:
            runs = [postgres_kill_run(root, k, args.seconds, args.pg_down) for k in range(args.kills)]
            for r in runs:
                print(json.dumps({"pg_kill": r}), flush=True)
            print(json.dumps({"pg_kill_summary": _summary(runs)}), flush=True)


if __name__ == "__main__":
    main()
