"""A lean HTTP/1.1 load generator for loopback benchmarks: asyncio streams, one keep-alive connection per client.

A benchmark's own client must not be what it measures: a thread per client with a full HTTP library spends
milliseconds of CPU (and of waiting for the GIL) per request on a small machine. Here each client writes a
pre-encoded request and reads the status line, the headers and a ``Content-Length`` body, nothing more. Each
answer keeps the time the client saw and the service's own ``Server-Timing`` ``app`` time (arrival to first
byte, inside the service), so that a report can tell the service's latency from the machine's.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit


@dataclass
class Answer:
    status: int
    seconds: float
    """From the first byte written to the last byte read, as the client saw it."""
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    sent_at: float = 0.0
    """``time.perf_counter()`` when the request was written."""

    @property
    def server_ms(self) -> float | None:
        """The service's own time for this request (``Server-Timing: app;dur=``), None when absent."""
        for part in self.headers.get("server-timing", "").split(","):
            name, _, dur = part.strip().partition(";dur=")
            if name == "app" and dur:
                return float(dur)
        return None


class Connection:
    """One keep-alive HTTP/1.1 connection (reopened after the server closes it)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None or self._writer.is_closing():
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port, limit=1 << 24)
        return self._reader, self._writer

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None

    async def request(
        self, method: str, path: str, body: bytes = b"", content_type: str = "application/json"
    ) -> Answer:
        reader, writer = await self._open()
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
        if body or method in ("POST", "PUT", "PATCH"):
            head += f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
        t0 = time.perf_counter()
        writer.write(head.encode() + b"\r\n" + body)
        try:
            await writer.drain()
            status_line = await reader.readuntil(b"\r\n")
            status = int(status_line.split()[1])
            headers: dict[str, str] = {}
            while True:
                line = await reader.readuntil(b"\r\n")
                if line == b"\r\n":
                    break
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            data = await reader.readexactly(int(headers.get("content-length", "0")))
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
            self.close()
            raise ConnectionError(f"{method} {path}: the connection failed or the answer was malformed") from None
        if headers.get("connection", "").lower() == "close":
            self.close()
        return Answer(status, time.perf_counter() - t0, headers, data, t0)


async def drive(
    url: str,
    clients: int,
    seconds: float,
    body_for: Callable[[int, int], bytes],
    path: str = "/v1/plans",
    pause_after_503_s: float = 0.01,
) -> list[Answer]:
    """``clients`` connections, each sending ``POST path`` with ``body_for(client, n)`` one after the other for
    ``seconds`` (no retries; after a 503 a client waits ``pause_after_503_s``). Connection failures are answers
    with status 0."""
    stop = time.perf_counter() + seconds
    answers: list[Answer] = []

    async def client(k: int) -> None:
        conn = Connection(url)
        n = 0
        try:
            while time.perf_counter() < stop:
                body = body_for(k, n)
                n += 1
                t0 = time.perf_counter()
                try:
                    answer = await conn.request("POST", path, body)
                except ConnectionError:
                    answer = Answer(0, time.perf_counter() - t0, sent_at=t0)
                    await asyncio.sleep(0.05)
                answers.append(answer)
                if answer.status == 503:
                    await asyncio.sleep(pause_after_503_s)
        finally:
            conn.close()

    await asyncio.gather(*(client(k) for k in range(clients)))
    return answers


async def probe(url: str, path: str, every_s: float, until: asyncio.Event) -> list[Answer]:
    """``GET path`` every ``every_s`` seconds (on its own connection) until ``until`` is set."""
    conn = Connection(url)
    out: list[Answer] = []
    try:
        while not until.is_set():
            t0 = time.perf_counter()
            try:
                out.append(await conn.request("GET", path))
            except ConnectionError:
                out.append(Answer(0, time.perf_counter() - t0, sent_at=t0))
            await asyncio.sleep(every_s)
    finally:
        conn.close()
    return out


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (nearest rank), None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def probe_for(url: str, path: str, every_s: float, seconds: float) -> list[tuple[int, float]]:
    """``GET path`` every ``every_s`` seconds for ``seconds``: (status, seconds) of each answer. Meant to run in a
    process of its own (:class:`Probe`), so that what it measures is the service, not the load's client."""

    async def run() -> list[Answer]:
        until = asyncio.Event()
        asyncio.get_running_loop().call_later(seconds, until.set)
        return await probe(url, path, every_s, until)

    return [(a.status, a.seconds) for a in asyncio.run(run())]


class Probe:
    """:func:`probe_for` in a child process (``python -m bench.http_load URL PATH EVERY_S SECONDS``); :meth:`result`
    waits for it and gives its answers."""

    def __init__(self, url: str, path: str, every_s: float, seconds: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.http_load", url, path, str(every_s), str(seconds)],
            stdout=subprocess.PIPE,
            cwd=Path(__file__).resolve().parent.parent,
        )

    def result(self) -> list[tuple[int, float]]:
        out, _ = self.proc.communicate()
        return [(int(status), float(took)) for status, took in json.loads(out)]


if __name__ == "__main__":
    print(json.dumps(probe_for(sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))))
