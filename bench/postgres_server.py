"""A private PostgreSQL server on loopback for benchmarks that kill it: its own data folder and port, so that a
kill -9 touches nothing else on the machine.

    pg = PostgresServer(Path("/tmp/pg"))      # initdb (first time) and start
    ... pg.url ...                             # postgresql+psycopg://dhp@127.0.0.1:PORT/dhp (trust on loopback)
    pg.kill()                                  # SIGKILL to the postmaster (its backends exit with it)
    pg.start()                                 # crash recovery, then ready again
    pg.stop()

The binaries are the newest under /usr/lib/postgresql (Debian's packages) unless ``bin_dir`` is given. As root,
PostgreSQL runs as the ``postgres`` user (it refuses to run as root).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import psycopg


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def default_bin_dir() -> Path:
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: [int(x) for x in p.parent.name.split(".") if x.isdigit()],
    )
    if not versions:
        raise RuntimeError(
            "no PostgreSQL under /usr/lib/postgresql: install Debian's postgresql package, or pass bin_dir"
        )
    return versions[-1]


class PostgresServer:
    """One PostgreSQL server in ``root`` (data in ``root/data``, log in ``root/postgres.log``),
    started at construction."""

    def __init__(
        self, root: Path, port: int | None = None, bin_dir: Path | None = None, ready_timeout_s: float = 60.0
    ) -> None:
        self.root = root
        self.data = root / "data"
        self.port = port or free_port()
        self.bin = bin_dir or default_bin_dir()
        self.ready_timeout_s = ready_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self._as_postgres = os.geteuid() == 0
        root.mkdir(parents=True, exist_ok=True)
        if self._as_postgres:
            shutil.chown(root, "postgres")
        if not (self.data / "PG_VERSION").exists():
            self._run(
                [
                    str(self.bin / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    "dhp",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--no-sync",
                ],
                check=True,
            )
        self.start()
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = 'dhp'").fetchone() is None:
                conn.execute("CREATE DATABASE dhp")

    @property
    def admin_dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=dhp dbname=postgres"

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the ``dhp`` database."""
        return f"postgresql+psycopg://dhp@127.0.0.1:{self.port}/dhp"

    def _command(self, args: list[str]) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *args] if self._as_postgres else args

    def _run(self, args: list[str], check: bool = False) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(self._command(args), check=check, capture_output=True)

    def start(self) -> None:
        """Start the server (after a kill: crash recovery first) and wait until it accepts connections."""
        log = open(self.root / "postgres.log", "ab")  # noqa: SIM115 (the child keeps it)
        # fsync off: a kill -9 of the server process (not of the machine) loses nothing the server acknowledged.
        args = [
            str(self.bin / "postgres"),
            "-D",
            str(self.data),
            "-p",
            str(self.port),
            "-h",
            "127.0.0.1",
            "-k",
            str(self.root),
            "-c",
            "fsync=off",
            "-c",
            "max_connections=100",
        ]
        self.proc = subprocess.Popen(self._command(args), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"PostgreSQL exited with {self.proc.returncode}: {(self.root / 'postgres.log').read_text()[-2000:]}"
                )
            try:
                with psycopg.connect(self.admin_dsn, connect_timeout=1):
                    return
            except psycopg.OperationalError:
                time.sleep(0.1)
        raise RuntimeError("PostgreSQL did not accept connections in time")

    def postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def processes(self) -> list[int]:
        """The server's processes: the postmaster and its backends all work in the data folder."""
        pids = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    if (proc / "cwd").resolve() == self.data.resolve():
                        pids.append(int(proc.name))
                except OSError:
                    continue
        return pids

    def kill(self) -> None:
        """SIGKILL to the postmaster; returns once its backends have exited too (a restart needs them gone)."""
        os.kill(self.postmaster_pid(), signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()
        deadline = time.monotonic() + 30
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self._run([str(self.bin / "pg_ctl"), "-D", str(self.data), "stop", "-m", "fast", "-w"])
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
