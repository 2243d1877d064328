"""Large batches over HTTP: the service's own time and memory at 16,384 and 65,536 samples on 256 ranks.

    .venv/bin/python -m bench.large_requests
    .venv/bin/python -m bench.large_requests --samples 65536 --budgets 200 --repeat 1

One ``dhp serve`` process on 127.0.0.1 (its defaults: SQLite, one worker process). Each request is a
video batch (``optimizer.problem.workloads``) on 32 x 8 GPUs with model qwen2-vl-7b, ``backend:
heuristic`` and the budget given, plan cache off, sent ``--repeat`` times in a row. Reported per
request: the status, the service's time from arrival to the answer's first byte (``Server-Timing:
app``) and its phases, the client's time, the body size, and the server's resident memory after the
answer and at its peak (``VmRSS`` / ``VmHWM``). Figures depend on the machine and on whatever else
runs on it.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from api.local_server import LocalServer
from optimizer.problem.workloads import WORKLOADS


def memory_mib(pid: int) -> dict[str, float | None]:
    """The process's resident memory now and at its peak (Linux), in MiB."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {"rss": None, "peak": None}

    def field(name: str) -> float | None:
        m = re.search(rf"{name}:\s+(\d+) kB", text)
        return round(int(m.group(1)) / 1024, 1) if m else None

    return {"rss": field("VmRSS"), "peak": field("VmHWM")}


def timings(header: str) -> dict[str, float]:
    """The ``Server-Timing`` phases of an answer (ms)."""
    out = {}
    for part in header.split(","):
        name, _, dur = part.strip().partition(";dur=")
        if dur:
            out[name] = round(float(dur), 1)
    return out


def body(samples: int, budget_ms: float, seed: int) -> bytes:
    doc = {
        "batch": WORKLOADS["video"](samples, seed=seed),
        "cluster": {"nodes": 32, "gpus_per_node": 8},
        "model_preset": "qwen2-vl-7b",
        "options": {"backend": "heuristic", "time_budget_ms": budget_ms},
        "cache": False,
    }
    return json.dumps(doc).encode()


def run(samples: list[int], budgets: list[float], repeat: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="dhp-large-") as tmp:
        srv = LocalServer(Path(tmp))
        try:
            rows.append({"before": memory_mib(srv.proc.pid)})
            with httpx.Client(base_url=srv.url, timeout=120, headers={"content-type": "application/json"}) as http:
                for n in samples:
                    for budget in budgets:
                        for k in range(repeat):
                            data = body(n, budget, seed=k)
                            t0 = time.perf_counter()
                            r = http.post("/v1/plans", content=data)
                            took = (time.perf_counter() - t0) * 1000
                            row = {
                                "samples": n,
                                "budget_ms": budget,
                                "status": r.status_code,
                                "body_mib": round(len(data) / 2**20, 1),
                                "client_ms": round(took, 1),
                                "server": timings(r.headers.get("server-timing", "")),
                                "memory_mib": memory_mib(srv.proc.pid),
                            }
                            if r.status_code >= 400:
                                row["error"] = {k: r.json().get(k) for k in ("detail", "field", "hint")}
                            rows.append(row)
                            print(json.dumps(row), flush=True)
        finally:
            srv.stop()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.large_requests", description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, nargs="+", default=[16_384, 65_536])
    parser.add_argument("--budgets", type=float, nargs="+", default=[200.0, 1000.0])
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args(argv)
    run(args.samples, args.budgets, args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
