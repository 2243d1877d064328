"""Helpers for the service tests: small requests, plan checks and a real server process on loopback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from optimizer.documents import problem_from_json
from optimizer.plan import assignment_from_json
from optimizer.verify import check_assignment
from optimizer.workloads import WORKLOADS

ROOT = Path(__file__).resolve().parent.parent


def small_request(n: int = 24, seed: int = 0, workload: str = "video", nodes: int = 2, **options: Any) -> dict[str, Any]:
    return {"batch": WORKLOADS[workload](n, seed=seed), "cluster": {"nodes": nodes, "gpus_per_node": 8}, "model_preset": "qwen2-vl-7b",
            "options": {"backend": "heuristic", "time_budget_ms": 2000, **options}}


def assert_verified(plan_doc: dict[str, Any], request_doc: dict[str, Any]) -> None:
    """The plan covers the batch on the cluster within memory, and its step time is what the cost model says."""
    problem = problem_from_json({k: v for k, v in request_doc.items() if k not in ("wait", "cache")})
    report = check_assignment(problem, assignment_from_json(plan_doc, problem.batch.index))
    assert report.ok, report.violations
    assert abs(report.step_time_s - plan_doc["predicted_step_time_s"]) <= 1e-9 * max(1.0, report.step_time_s)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """``dhp serve`` on 127.0.0.1 and a free port, in a child process."""

    def __init__(self, data_dir: Path, workers: int = 1, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("DHP_") and k not in ("DATABASE_URL", "PROMETHEUS_MULTIPROC_DIR")}
        full_env.update(env or {})
        self.log = data_dir / f"server-{self.port}.log"
        self._log_file = open(self.log, "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen([sys.executable, "-m", "optimizer.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port),
                                      "--workers", str(workers), "--data-dir", str(data_dir), "--log-level", "warning"],
                                     cwd=ROOT, env=full_env, stdout=self._log_file, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server did not become ready: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log_file.close()
