"""The service's own budget on a busy machine: closed-loop clients on the same cores as the server.

    .venv/bin/python -m bench.busy                          # 16 and 32 clients, threads and the lean client, 20 s each
    .venv/bin/python -m bench.busy --clients 16 --kinds threads --seconds 10

One ``dhp serve`` process with its defaults (2 solve workers, 4 waiting places, solve threads at
``DHP_SOLVE_NICE``) on 127.0.0.1. Each client sends the next request as soon as it has the answer to
the last (after a 503 it waits 10 ms, not the Retry-After): 48 video samples on 2 x 8 GPUs,
``backend: auto``, a 200 ms budget, plan cache off, so that every accepted request is a solve that
may use its whole budget.

- ``threads``: one thread per client in this process, each with its own ``httpx.Client`` (what a
  trainer's Python client does); the threads share this process's interpreter, so the client side
  takes CPU from the server as real clients on the same machine would.
- ``lean``: the asyncio client of :mod:`bench.http_load`, which writes pre-encoded requests and reads
  the answers with little CPU of its own.

Reported per run: accepted requests (201) with the service's own time (``Server-Timing: app``,
arrival to first byte) p50 / p99 / max, how many stayed within budget + 50 ms, and each of its
``Server-Timing`` phases (queue, translate, solve, encode, store, handoff); 503 answers with
their service time p50 / p99; other statuses; the machine's load. Figures depend on the machine and
on whatever else runs on it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from bench.http_load import Answer, drive, percentile
from bench.soak import BUDGET_MS, request, server

BODIES = 40
"""Distinct requests each client cycles through."""


def _threads(url: str, clients: int, seconds: float, bodies: dict[tuple[int, int], bytes]) -> list[Answer]:
    """``clients`` threads, each sending the next request as soon as it has the last answer, for ``seconds``."""
    answers: list[Answer] = []
    lock = threading.Lock()
    stop = time.perf_counter() + seconds

    def client(k: int) -> None:
        with httpx.Client(base_url=url, timeout=60, headers={"content-type": "application/json"}) as http:
            n = 0
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                try:
                    r = http.post("/v1/plans", content=bodies[k, n % BODIES])
                    r.json()  # what a client does with its answer
                    answer = Answer(r.status_code, time.perf_counter() - t0, headers=dict(r.headers), sent_at=t0)
                except httpx.TransportError:
                    answer = Answer(0, time.perf_counter() - t0, sent_at=t0)
                n += 1
                with lock:
                    answers.append(answer)
                if answer.status == 503:
                    time.sleep(0.01)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def _ms(values: list[float]) -> dict[str, float | int | None]:
    def r(q: float) -> float | None:
        v = percentile(values, q)
        return None if v is None else round(v, 1)

    return {"n": len(values), "p50": r(50), "p99": r(99), "max": r(100)}


def phases(answers: list[Answer]) -> dict[str, dict[str, float | int | None]]:
    """p50 / p99 of each ``Server-Timing`` phase over ``answers``: where the service's time went."""
    seen: dict[str, list[float]] = {}
    for a in answers:
        for part in a.headers.get("server-timing", "").split(","):
            name, _, dur = part.strip().partition(";dur=")
            if dur:
                seen.setdefault(name, []).append(float(dur))
    return {name: _ms(values) for name, values in seen.items()}


def run(root: Path, clients: int, kind: str, seconds: float, **settings: str) -> dict[str, Any]:
    """One closed-loop run against a fresh server with ``settings`` (``DHP_`` names in lower
    case, e.g. solve_nice="0")."""
    bodies = {(k, n): json.dumps(request(1000 * k + n)).encode() for k in range(clients) for n in range(BODIES)}
    srv = server(root / f"{kind}-{clients}", **settings)
    try:
        load0 = os.getloadavg()[0]
        if kind == "threads":
            answers = _threads(srv.url, clients, seconds, bodies)
        else:
            answers = asyncio.run(drive(srv.url, clients, seconds, lambda k, n: bodies[k, n % BODIES]))
        load1 = os.getloadavg()[0]
    finally:
        srv.stop()
    accepted = [a.server_ms for a in answers if a.status == 201 and a.server_ms is not None]
    refused = [a.server_ms for a in answers if a.status == 503 and a.server_ms is not None]
    return {
        "clients": clients,
        "kind": kind,
        "seconds": seconds,
        "budget_ms": BUDGET_MS,
        "settings": settings,
        "accepted_server_ms": _ms(accepted),
        "accepted_within_budget_plus_50ms": sum(1 for x in accepted if x <= BUDGET_MS + 50),
        "accepted_client_ms": _ms([a.seconds * 1000 for a in answers if a.status == 201]),
        "accepted_phases_ms": phases([a for a in answers if a.status == 201]),
        "refused_503_server_ms": _ms(refused),
        "other_statuses": dict(Counter(a.status for a in answers if a.status not in (201, 503))),
        "load_average_1m": [round(load0, 2), round(load1, 2)],
        "cpus": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.busy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--kinds", nargs="+", choices=["threads", "lean"], default=["threads", "lean"])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--set", nargs="*", default=[], metavar="NAME=VALUE", help="server settings, e.g. solve_nice=0 (DHP_SOLVE_NICE)"
    )
    args = parser.parse_args(argv)
    settings = dict(item.split("=", 1) for item in args.set)
    with tempfile.TemporaryDirectory(prefix="dhp-busy-") as tmp:
        for clients in args.clients:
            for kind in args.kinds:
                print(json.dumps(run(Path(tmp), clients, kind, args.seconds, **settings)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
