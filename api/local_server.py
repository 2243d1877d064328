"""``dhp serve`` on 127.0.0.1 and a free port, in a child process, for tests, benchmarks and local trials.

    server = LocalServer(Path("/tmp/dhp"), workers=2, env={"DHP_SOLVE_WORKERS": "2"})
    ... httpx.post(server.url + "/v1/plans", json=...) ...
    server.stop()

The child gets this process's environment without any DHP_ setting or DATABASE_URL (so the store is
SQLite under ``data_dir``), plus ``env``; its output goes to ``server-<port>.log`` in ``data_dir``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalServer:
    """A running ``dhp serve`` child process; ready (``/readyz`` answered 200) once constructed."""

    def __init__(
        self, data_dir: Path, workers: int = 1, env: dict[str, str] | None = None, ready_timeout_s: float = 60.0
    ) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full_env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("DHP_") and k not in ("DATABASE_URL", "PROMETHEUS_MULTIPROC_DIR")
        }
        full_env.update(env or {})
        self.log = data_dir / f"server-{self.port}.log"
        self._log_file = open(self.log, "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "api.cli.main",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                str(workers),
                "--data-dir",
                str(data_dir),
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
            env=full_env,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._log_file.close()
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
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log_file.close()
