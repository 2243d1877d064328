"""Hostile and careless requests against the live planning service, on SQLite and on a private PostgreSQL.

    .venv/bin/python -m bench.hostile                          # both stores, every case (well over 400 each)
    .venv/bin/python -m bench.hostile --store sqlite --limit 50
    .venv/bin/python -m bench.hostile --json report.json       # the full report as JSON too

The service runs as ``dhp serve`` in a child process (:class:`api.local_server.LocalServer`) with bearer tokens
on; the PostgreSQL run gives it a server of its own (:class:`bench.postgres_server.PostgresServer`). Every case
is a request written byte for byte on a raw socket, so that lone surrogates, NUL bytes, broken encodings, bad
headers and unnormalised paths reach the service exactly as meant. The cases are generated from a few tables
(hostile strings by field, wrong types and out-of-range numbers by field, malformed bodies by endpoint, bad
paths and query values, token variants by endpoint, HTTP framing faults), in a fixed order; ``--limit N`` takes
N of them, each family's share in proportion to its size and at least one, so that a small slice still touches
every family.

Each answer is judged on its own:

* a 500, or no answer at all (reset, closed without ``Connection: close``, timeout), is a failure;
* after the answer a ``GET /healthz`` on the same keep-alive connection must answer 200 (a server that closes
  the connection after saying ``Connection: close`` is recorded, not failed);
* every 4xx/5xx answer must be an RFC 9457 problem document (``application/problem+json`` with ``type``,
  ``title``, ``status`` equal to the HTTP status, ``detail``) carrying ``field`` and ``hint``; for 401, 404,
  405, 413 and 503 ``hint`` alone is required;
* some cases carry an expectation: valid emoji (surrogate pairs, raw UTF-8) in free text must be accepted; a
  missing or wrong token must be refused (a 2xx there leaks data); a reused ``Idempotency-Key`` with another
  body must not be taken as a replay; a value of the wrong JSON type, or a non-finite number, must be refused
  even where it could be coerced;
* an accepted plan-ahead request or job is polled until it ends; one that then failed with an internal error
  (a 500 problem document, or a job error without a field) is reported.

The exit status is 1 when any store saw a 500, a dropped connection or the server process dying.
"""

from __future__ import annotations

import argparse
import base64
import json
import socket
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from api.local_server import LocalServer
from optimizer.costs.zoo import describe_presets, load_profile
from optimizer.problem.options import OPTION_SPECS

TOKEN = "hostile-bench-token-5f0c2a9e77d1"
AUTH = b"Bearer " + TOKEN.encode()
PLAN = "@PLAN@"
"""Stands in a case's target or body for the id of a finished plan made before the cases run."""
JOB = "@JOB@"
"""The same for a finished job."""
HINT_ONLY = {401, 404, 405, 413, 503}
"""Statuses whose problem documents need a ``hint`` but may lack ``field`` (they are not about one field)."""
READ_TIMEOUT_S = 30.0
FOLLOW_UP_TIMEOUT_S = 5.0
"""``GET /healthz`` after a case answers in milliseconds; a connection that gives no answer in
this long is not usable."""
IDLE_REOPEN_S = 3.0
"""A connection idle this long is reopened before use: uvicorn closes idle keep-alive connections after 5 s."""


@dataclass(frozen=True)
class Case:
    """One request, as the bytes to send (``raw``) or as the parts the bytes are made from."""

    name: str
    method: str = "GET"
    target: str = "/"
    body: bytes | None = None
    content_type: bytes | None = b"application/json"
    auth: bytes | None = AUTH
    headers: tuple[tuple[bytes, bytes], ...] = ()
    raw: bytes | None = None
    expect: str = "any"
    """``accept``: anything but 2xx is a finding; ``refuse``: a 2xx is a finding; ``any``: no expectation."""
    first: Case | None = None
    """Sent just before on the same connection, its answer not judged (the first half of a pair)."""

    def encode(self, host: str, plan_id: str, job_id: str) -> bytes:
        if self.raw is not None:
            data = self.raw
        else:
            lines = [f"{self.method} {self.target} HTTP/1.1".encode(), b"Host: " + host.encode()]
            if self.auth is not None:
                lines.append(b"Authorization: " + self.auth)
            if self.body is not None:
                if self.content_type is not None:
                    lines.append(b"Content-Type: " + self.content_type)
                if not any(k.lower() in (b"content-length", b"transfer-encoding") for k, _ in self.headers):
                    lines.append(b"Content-Length: " + str(len(self.body)).encode())
            lines += [k + b": " + v for k, v in self.headers]
            data = b"\r\n".join(lines) + b"\r\n\r\n" + (self.body or b"")
        return data.replace(PLAN.encode(), plan_id.encode()).replace(JOB.encode(), job_id.encode())


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    cut: bool = False
    """The request could not be written whole: the server answered early and stopped reading."""

    @property
    def closes(self) -> bool:
        """The server said it closes the connection after this answer."""
        return "close" in self.headers.get("connection", "").lower()

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None


class Dropped(Exception):
    """The connection failed before a whole answer came back."""


class Wire:
    """One HTTP/1.1 connection on a raw socket: writes the bytes given, reads one answer (1xx skipped)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock: socket.socket | None = None
        self.buf = bytearray()
        self.used = 0.0

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock, self.buf = None, bytearray()

    def exchange(self, data: bytes, method: str, timeout_s: float = READ_TIMEOUT_S) -> Reply:
        """Send ``data``, read the answer. A send that fails is not yet a drop: a server may answer early (413)
        and close before the whole body is written; the answer is then read all the same."""
        if self.sock is not None and time.monotonic() - self.used > IDLE_REOPEN_S:
            self.close()
        try:
            if self.sock is None:
                self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=timeout_s)
            self.sock.settimeout(timeout_s)
            broken = False
            try:
                self.sock.sendall(data)
            except OSError:
                broken = True
            reply = self._answer(method)
        except (OSError, ValueError, IndexError) as exc:
            self.close()
            raise Dropped(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__) from None
        finally:
            self.used = time.monotonic()
        if reply.closes or broken:
            self.close()
        reply.cut = broken
        return reply

    def _fill(self) -> None:
        assert self.sock is not None
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("closed by the server")
        self.buf += chunk

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def _line(self) -> bytes:
        while (end := self.buf.find(b"\r\n")) < 0:
            self._fill()
        return self._take(end + 2)[:-2]

    def _answer(self, method: str) -> Reply:
        while True:
            status = int(self._line().split()[1])
            headers: dict[str, str] = {}
            while line := self._line():
                name, _, value = line.decode("latin-1").partition(":")
                key = name.strip().lower()
                headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
            if status >= 200:
                break
        if method == "HEAD" or status in (204, 304):
            return Reply(status, headers, b"")
        if "chunked" in headers.get("transfer-encoding", "").lower():
            parts = []
            while size := int(self._line().split(b";")[0], 16):
                parts.append(self._take(size + 2)[:-2])
            while self._line():  # trailers
                pass
            return Reply(status, headers, b"".join(parts))
        if "content-length" in headers:
            return Reply(status, headers, self._take(int(headers["content-length"])))
        while True:  # delimited by the close
            try:
                self._fill()
            except ConnectionError:
                return Reply(status, headers, self._take(len(self.buf)))


# ---- the cases ---------------------------------------------------------------------------------------------

SLOT = "\u0001slot\u0001"
"""A string placed where a case's raw JSON text goes; its JSON form is replaced by that text."""

STRINGS: list[tuple[str, str, bool]] = [  # (name, JSON text, a valid string to accept)
    ("lone-high", r'"\ud800"', False),
    ("lone-low", r'"\udfff"', False),
    ("lone-inside", r'"a\udc00b"', False),
    ("pair-reversed", r'"\ude00\ud83d"', False),
    ("nul", r'"a\u0000b"', False),
    ("soh", r'"\u0001"', False),
    ("tab", r'"tab\there"', False),
    ("newline", r'"a\nb"', False),
    ("escape", r'"\u001b[31mred"', False),
    ("del", r'"\u007f"', False),
    ("c1-nel", r'"a\u0085b"', False),
    ("line-separator", r'"a\u2028b"', False),
    ("noncharacter", r'"\uffff"', False),
    ("bom", r'"\ufeffname"', False),
    ("empty", '""', False),
    ("long-10k", '"' + "x" * 10_000 + '"', False),
    ("sql-quote", '"x\'); DROP TABLE plans;--"', False),
    ("emoji-escaped", r'"ok\ud83d\ude00"', True),
    ("emoji-utf8", '"ok\U0001f600\u00e9"', True),
]
"""Hostile strings as JSON text: lone and reversed surrogates, control characters, odd code points, 10k
characters; the two emoji spellings are valid text and must be accepted where the field is free text."""

VALUES: list[tuple[str, str, bool]] = [  # (name, JSON text, to refuse whatever the field's range)
    ("tiny", "1e-300", False),
    ("huge", "1e300", False),
    ("negative", "-1", False),
    ("zero", "0", False),
    ("half", "0.5", False),
    ("nan", "NaN", True),
    ("infinity", "Infinity", True),
    ("minus-infinity", "-Infinity", True),
    ("beyond-64-bits", str(2**64 + 1), False),
    ("40-digits", "9" * 40, False),
    ("float-overflow", "1e400", True),
    ("string", '"5"', True),
    ("true", "true", True),
    ("null", "null", False),
    ("array", "[1]", True),
    ("object", "{}", True),
]
"""Out-of-range numbers (NaN and Infinity as bare tokens) and wrong types for a numeric field. Whether 0 or 1e300
is in range depends on the field; a non-finite number or a value that is not a number never is."""

QUERY_VALUES: list[tuple[str, str, bool]] = [
    ("nul", "a%00b", False),
    ("soh", "%01", False),
    ("tab", "a%09b", False),
    ("utf8-surrogate", "%ED%A0%80", False),
    ("not-utf8", "%FF%FE", False),
    ("overlong", "%C0%AF", False),
    ("emoji", "ok%F0%9F%98%80", True),
    ("long-10k", "x" * 10_000, False),
    ("sql-quote", "%27%20OR%201%3D1--", True),
]

BAD_IDS = [
    "..%2F..%2Fetc%2Fpasswd",
    "%27%20OR%20%271%27%3D%271",
    "1'--",
    "%27%3B%20DROP%20TABLE%20plans%3B--",
    "%00",
    "a%00b",
    "%FF",
    "%ED%A0%80",
    "%F0%9F%98%80",
    "x" * 5000,
    "%25",
    "-1",
    "%2e%2e",
    "0" * 32,
    "a%20b",
    "%0d%0aX-Injected:%201",
]


def _samples(n: int) -> list[dict[str, Any]]:
    return [
        {
            "id": f"s{k + 1}",
            "text_tokens": 300 + 211 * k,
            "images": [{"tokens": 256}],
            "videos": [{"frames": 4, "tokens_per_frame": 64}],
        }
        for k in range(n)
    ]


def _without(doc: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in keys}


def base_documents() -> dict[str, dict[str, Any]]:
    """The valid documents the cases spoil, one field at a time."""
    presets = describe_presets()
    cluster = {**presets["clusters"]["h100-1x8"], "name": "bench-cluster"}
    model = {**presets["models"]["qwen2-vl-7b"], "name": "bench-model"}
    plan = {
        "batch": {"samples": _samples(3)},
        "cluster": {"nodes": 1, "gpus_per_node": 8},
        "model_preset": "qwen2-vl-7b",
        "options": {"backend": "heuristic", "time_budget_ms": 200},
    }
    job = {
        "dataset": {"samples": _samples(4)},
        "global_batch_size": 2,
        "cluster": {"nodes": 1, "gpus_per_node": 8},
        "model_preset": "qwen2-vl-7b",
    }
    return {
        "plan": plan,
        "plan-full-cluster": {**plan, "cluster": cluster},
        "plan-full-model": {**_without(plan, "model_preset"), "model": model},
        "plan-profile": {**plan, "profile": load_profile("flexsp-gpt7b")},
        "plan-preset": {**_without(plan, "cluster"), "cluster_preset": "h100-1x8"},
        "job": job,
        "job-batches": {
            **_without(job, "dataset", "global_batch_size"),
            "batches": [{"samples": _samples(4)[:2]}, {"samples": _samples(4)[2:]}],
        },
        "job-full-cluster": {**job, "cluster": cluster},
        "job-full-model": {**_without(job, "model_preset"), "model": model},
        "job-profile": {**job, "profile": load_profile("flexsp-gpt7b")},
        "job-preset": {**_without(job, "cluster"), "cluster_preset": "h100-1x8"},
        "job-sampler": {**job, "sampler": {"kind": "shuffle", "seed": 3}},
        "feedback": {"measured_step_time_s": 0.5, "step": 7, "metrics": {"peak_gib": 61.5}, "notes": "fine"},
        "replan": {"options": {"backend": "heuristic", "time_budget_ms": 100}},
    }


def splice(doc: dict[str, Any], path: tuple[Any, ...], text: str) -> bytes:
    """``doc`` as JSON with the value at ``path`` (an absent key is added; ``...`` as the last step means the key
    itself, under a value of 1.0) replaced by the JSON text ``text``, exactly as given."""
    copy = json.loads(json.dumps(doc))
    node = copy
    for step in path[:-1]:
        node = node[step]
    if path[-1] is ...:
        node.clear()
        node[SLOT] = 1.0
    else:
        node[path[-1]] = SLOT
    return json.dumps(copy).replace(json.dumps(SLOT), text).encode()


TARGETS = {
    "plan": "/v1/plans",
    "job": "/v1/jobs",
    "feedback": f"/v1/plans/{PLAN}/feedback",
    "replan": f"/v1/dashboard/plans/{PLAN}/replan",
}


def _target(base: str) -> str:
    return TARGETS[base.split("-")[0]]


STRING_FIELDS: list[tuple[str, str, tuple[Any, ...], bool]] = (
    [  # (field, base document, path, free text: emoji must pass)
        ("cluster.name", "plan-full-cluster", ("cluster", "name"), True),
        ("model.name", "plan-full-model", ("model", "name"), True),
        ("profile.source", "plan-profile", ("profile", "source"), True),
        ("cluster_preset", "plan-preset", ("cluster_preset",), False),
        ("model_preset", "plan", ("model_preset",), False),
        ("batch.samples[0].id", "plan", ("batch", "samples", 0, "id"), True),
        ("feedback.notes", "feedback", ("notes",), True),
        ("feedback.metrics.<key>", "feedback", ("metrics", ...), True),
        ("job.dataset.samples[0].id", "job", ("dataset", "samples", 0, "id"), True),
        ("job.batches[0].samples[0].id", "job-batches", ("batches", 0, "samples", 0, "id"), True),
        ("job.cluster.name", "job-full-cluster", ("cluster", "name"), True),
        ("job.model.name", "job-full-model", ("model", "name"), True),
        ("job.profile.source", "job-profile", ("profile", "source"), True),
        ("job.cluster_preset", "job-preset", ("cluster_preset",), False),
        ("job.model_preset", "job", ("model_preset",), False),
        ("job.sampler.kind", "job-sampler", ("sampler", "kind"), False),
        ("job.sampler", "job", ("sampler",), False),
        ("job.options.backend", "job", ("options",), False),
    ]
    + [(f"options.{spec.name}", "plan", ("options", spec.name), False) for spec in OPTION_SPECS if spec.kind == "str"]
)

NUMBER_FIELDS: list[tuple[str, str, tuple[Any, ...]]] = [
    ("batch.samples[0].text_tokens", "plan", ("batch", "samples", 0, "text_tokens")),
    ("batch.samples[0].images[0].tokens", "plan", ("batch", "samples", 0, "images", 0, "tokens")),
    ("batch.samples[0].videos[0].frames", "plan", ("batch", "samples", 0, "videos", 0, "frames")),
    ("cluster.nodes", "plan", ("cluster", "nodes")),
    ("cluster.gpus_per_node", "plan", ("cluster", "gpus_per_node")),
    ("cluster.efficiency", "plan-full-cluster", ("cluster", "efficiency")),
    ("cluster.memory_reserve_bytes", "plan-full-cluster", ("cluster", "memory_reserve_bytes")),
    ("cluster.nodes[0].count", "plan-full-cluster", ("cluster", "nodes", 0, "count")),
    ("model.llm.layers", "plan-full-model", ("model", "llm", "layers")),
    ("model.llm.hidden", "plan-full-model", ("model", "llm", "hidden")),
    ("profile.capacity_tokens_per_rank", "plan-profile", ("profile", "capacity_tokens_per_rank")),
    ("profile.time.quadratic", "plan-profile", ("profile", "time", "quadratic")),
    ("profile.comm.bytes_per_token", "plan-profile", ("profile", "comm", "bytes_per_token")),
    ("existing_groups[0][1]", "plan", ("existing_groups",)),
    ("job.global_batch_size", "job", ("global_batch_size",)),
    ("job.max_steps", "job", ("max_steps",)),
    ("job.workers", "job", ("workers",)),
    ("job.sampler.seed", "job-sampler", ("sampler", "seed")),
    ("job.options.time_budget_ms", "job", ("options",)),
    ("job.profile.capacity_tokens_per_rank", "job-profile", ("profile", "capacity_tokens_per_rank")),
    ("feedback.measured_step_time_s", "feedback", ("measured_step_time_s",)),
    ("feedback.step", "feedback", ("step",)),
    ("feedback.group_times_s[0][0]", "feedback", ("group_times_s",)),
    ("feedback.metrics.peak_gib", "feedback", ("metrics", "peak_gib")),
    ("replan.options.time_budget_ms", "replan", ("options", "time_budget_ms")),
] + [
    (f"options.{spec.name}", "plan", ("options", spec.name)) for spec in OPTION_SPECS if spec.kind in ("int", "number")
]

WRAP = {
    "existing_groups[0][1]": "[[0, {}]]",
    "job.options.time_budget_ms": '{{"time_budget_ms": {}}}',
    "feedback.group_times_s[0][0]": "[[{}]]",
    "job.options.backend": '{{"backend": {}}}',
}
"""Fields whose path ends above the value: the text around it."""

SHAPES: list[tuple[str, str, tuple[Any, ...], list[str]]] = [  # wrong types and shapes where the schema says a type
    ("wait", "plan", ("wait",), ['"false"', '"true"', "0", "1", "null", "[]"]),
    ("cache", "plan", ("cache",), ['"yes"', "1", "0", "null", "{}"]),
    ("options.deterministic", "plan", ("options", "deterministic"), ['"true"', "1", "null"]),
    (
        "existing_groups",
        "plan",
        ("existing_groups",),
        [
            "[[true, false]]",
            '[["0", "1"]]',
            '"0,1"',
            "{}",
            "[[]]",
            "[[0, 0]]",
            "[[0.5, 1]]",
            "[[-1, 0]]",
            "[[0, 99]]",
            "[0, 1]",
            "[[null]]",
            "[[0, 1]]",
        ],
    ),
    (
        "batch",
        "plan",
        ("batch",),
        [
            "null",
            "[]",
            '"x"',
            "5",
            "{}",
            '{"samples": null}',
            '{"samples": {}}',
            '{"samples": [null]}',
            '{"samples": [[]]}',
            '{"samples": ["s1"]}',
            '{"samples": []}',
            '{"samples": [{}]}',
        ],
    ),
    (
        "batch.samples[0].images",
        "plan",
        ("batch", "samples", 0, "images"),
        ["{}", '"x"', "[null]", "[[]]", '[{"tokens": "576"}]', '[{"bogus": 1}]'],
    ),
    (
        "cluster",
        "plan",
        ("cluster",),
        [
            "null",
            "[]",
            '"h100"',
            "5",
            "{}",
            '{"nodes": []}',
            '{"nodes": [null]}',
            '{"nodes": "2", "gpus_per_node": "8"}',
            '{"nodes": true, "gpus_per_node": 8}',
        ],
    ),
    ("model", "plan-full-model", ("model",), ["null", "[]", '"llama"', "{}", '{"name": "x"}', '{"llm": null}']),
    ("profile", "plan", ("profile",), ["[]", '"p"', "{}", '{"time": null}', '{"time": {}, "comm": []}']),
    ("options", "plan", ("options",), ["null", "[]", '"fast"', "5", '{"bogus": 1}']),
    ("cluster_preset", "plan-preset", ("cluster_preset",), ["5", "[]", "{}", "true"]),
    ("model_preset", "plan", ("model_preset",), ["5", "[]", "{}", "false"]),
    (
        "job.dataset",
        "job",
        ("dataset",),
        ["[]", '"x"', '{"samples": "x"}', '{"path": "/etc/passwd"}', '{"samples": [null]}', "{}"],
    ),
    ("job.batches", "job-batches", ("batches",), ["[[]]", "[null]", "{}", '"x"', "[]", '[{"samples": []}]']),
    ("job.drop_last", "job", ("drop_last",), ['"no"', "1", "[]"]),
    ("job.sampler.group_batches", "job-sampler", ("sampler", "group_batches"), ["0", '"16"', str(2**64)]),
    (
        "feedback.group_times_s",
        "feedback",
        ("group_times_s",),
        ['"x"', '[["x"]]', "[[[1]]]", "[1, 2]", "[[" + ",".join(["1"] * 5000) + "]]"],
    ),
    (
        "feedback.metrics",
        "feedback",
        ("metrics",),
        [
            "[]",
            '{"k": "v"}',
            '{"k": null}',
            "{" + ",".join(f'"m{k}": 1' for k in range(65)) + "}",
            '{"' + "k" * 129 + '": 1}',
        ],
    ),
    ("feedback.notes", "feedback", ("notes",), ["5", "[]", '"' + "n" * 2001 + '"']),
    ("feedback.extra", "feedback", ("bogus",), ["1"]),
    ("replan.options", "replan", ("options",), ["null", "[]", '{"bogus": 1}', '{"backend": 5}']),
]

MUST_REFUSE = {
    "wait": {'"false"', '"true"', "0", "1", "[]"},
    "cache": {'"yes"', "1", "0", "{}"},
    "options.deterministic": {'"true"', "1"},
    "existing_groups": {"[[true, false]]", '[["0", "1"]]', '"0,1"', "{}", "[[0.5, 1]]", "[0, 1]", "[[null]]"},
    "batch": {
        "null",
        "[]",
        '"x"',
        "5",
        '{"samples": null}',
        '{"samples": {}}',
        '{"samples": [null]}',
        '{"samples": [[]]}',
        '{"samples": ["s1"]}',
    },
    "job.drop_last": {'"no"', "1", "[]"},
    "job.dataset": {"[]", '"x"', '{"samples": "x"}', '{"path": "/etc/passwd"}'},
    "job.batches": {"[[]]", "[null]", "{}", '"x"'},
    "job.sampler.group_batches": {'"16"'},
}
"""The shapes above that are of the wrong JSON type where the schema names one (or a server-side path, which the
service must not read): accepting them, even coerced, is a finding."""

SAMPLE_SETS: list[tuple[str, str, bool]] = [  # (name, the samples as JSON text, against the batch schema)
    ("missing-id", '[{"text_tokens": 10}]', False),
    ("duplicate-id", '[{"id": "s1", "text_tokens": 10}, {"id": "s1", "text_tokens": 20}]', True),
    ("no-id-beside-s1", '[{"id": "s1", "text_tokens": 10}, {"text_tokens": 20}]', False),
    ("id-null", '[{"id": null, "text_tokens": 10}]', True),
    ("id-number", '[{"id": 5, "text_tokens": 10}]', False),
    ("id-empty", '[{"id": "", "text_tokens": 10}]', True),
    ("id-array", '[{"id": [], "text_tokens": 10}]', True),
    ("ids-1-and-int-1", '[{"id": "1", "text_tokens": 10}, {"id": 1, "text_tokens": 20}]', True),
    ("nfc-and-nfd", '[{"id": "\\u00e9", "text_tokens": 10}, {"id": "e\\u0301", "text_tokens": 20}]', False),
    ("no-tokens", '[{"id": "s1"}]', False),
    ("unknown-member", '[{"id": "s1", "text_tokens": 10, "bogus": 1}]', True),
]


def _malformed(valid: bytes) -> list[tuple[str, bytes, bytes | None]]:
    """(name, body, content type) of bodies that are not a JSON document in UTF-8, or not as JSON at all."""
    as_text = valid.decode()
    return [
        ("empty", b"", b"application/json"),
        ("whitespace", b" \r\n\t", b"application/json"),
        ("open-brace", b"{", b"application/json"),
        ("truncated", valid[: len(valid) // 2], b"application/json"),
        ("missing-value", b'{"batch": }', b"application/json"),
        ("trailing-garbage", valid + b" x", b"application/json"),
        ("two-documents", valid + valid, b"application/json"),
        ("single-quotes", as_text.replace('"', "'").encode(), b"application/json"),
        ("trailing-comma", valid[:-1] + b",}", b"application/json"),
        ("comment", b"/* c */" + valid, b"application/json"),
        ("bare-nan", b"NaN", b"application/json"),
        ("top-array", b"[]", b"application/json"),
        ("top-null", b"null", b"application/json"),
        ("top-string", b'"x"', b"application/json"),
        ("deep-array-10000", b"[" * 10_000 + b"]" * 10_000, b"application/json"),
        ("deep-object-10000", b'{"a":' * 10_000 + b"1" + b"}" * 10_000, b"application/json"),
        (
            "deep-in-field-10000",
            valid[:-1] + b', "bogus": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
            b"application/json",
        ),
        ("not-utf8", b'{"batch": "\xff\xfe\xfd"}', b"application/json"),
        ("bad-utf8-in-string", valid[:-1] + b', "x": "\xc3\x28"}', b"application/json"),
        ("overlong-utf8", b'{"\xc0\xaf": 1}', b"application/json"),
        ("utf8-encoded-surrogate", valid[:-1] + b', "x": "\xed\xa0\x80"}', b"application/json"),
        ("utf16-le-bom", as_text.encode("utf-16"), b"application/json"),
        ("utf16-be-bom", b"\xfe\xff" + as_text.encode("utf-16-be"), b"application/json"),
        ("utf16-no-bom", as_text.encode("utf-16-le"), b"application/json"),
        ("utf8-bom", b"\xef\xbb\xbf" + valid, b"application/json"),
        ("utf32", as_text.encode("utf-32"), b"application/json"),
        ("int-5000-digits", b'{"x": ' + b"9" * 5000 + b"}", b"application/json"),
        ("duplicate-keys", valid[:-1] + b', "batch": 5}', b"application/json"),
        ("text-plain", valid, b"text/plain"),
        ("no-content-type", valid, None),
        ("form", b"batch=1&cluster=2", b"application/x-www-form-urlencoded"),
        (
            "multipart",
            b'--b\r\nContent-Disposition: form-data; name="batch"\r\n\r\n1\r\n--b--\r\n',
            b"multipart/form-data; boundary=b",
        ),
        ("charset-utf16-label", valid, b"application/json; charset=utf-16"),
        ("problem-json", valid, b"application/problem+json"),
        ("content-type-nul", valid, b"application/json\x00"),
        ("content-type-junk", valid, b";;;==="),
    ]


def body_cases(docs: dict[str, dict[str, Any]]) -> Iterator[Case]:
    for base, doc in docs.items():  # the unspoilt documents: the controls every other case departs from
        yield Case(f"valid/{base}", "POST", _target(base), json.dumps(doc).encode(), expect="accept")
    for fld, base, path, free in STRING_FIELDS:
        for sname, text, valid in STRINGS:
            raw = WRAP[fld].format(text) if fld in WRAP else text
            expect = "accept" if valid and free else "any"
            yield Case(f"string/{fld}/{sname}", "POST", _target(base), splice(docs[base], path, raw), expect=expect)
    for fld, base, path in NUMBER_FIELDS:
        for vname, text, invalid in VALUES:
            raw = WRAP[fld].format(text) if fld in WRAP else text
            yield Case(
                f"number/{fld}/{vname}",
                "POST",
                _target(base),
                splice(docs[base], path, raw),
                expect="refuse" if invalid else "any",
            )
    for fld, base, path, texts in SHAPES:
        for k, text in enumerate(texts):
            expect = "refuse" if text in MUST_REFUSE.get(fld, ()) else "any"
            yield Case(
                f"type/{fld}/{k}:{text[:24]}", "POST", _target(base), splice(docs[base], path, text), expect=expect
            )
    for sname, text, invalid in SAMPLE_SETS:
        yield Case(
            f"samples/plan/{sname}",
            "POST",
            "/v1/plans",
            splice(docs["plan"], ("batch", "samples"), text),
            expect="refuse" if invalid else "any",
        )
        # An epoch job reads its dataset row by row: an invalid row fails the steps that hold it, with a problem
        # document naming the row (the job is followed to its end, where an internal failure would be a finding); a
        # repeated id makes the steps ambiguous and is refused at once.
        yield Case(
            f"samples/job/{sname}",
            "POST",
            "/v1/jobs",
            splice(docs["job"], ("dataset", "samples"), text),
            expect="refuse" if sname in ("duplicate-id", "ids-1-and-int-1") else "any",
        )
    for fld in ("cluster.name", "batch.samples[0].id", "model.name"):  # plan-ahead: checked before it is stored
        base, path = next((b, p) for f, b, p, _ in STRING_FIELDS if f == fld)
        for sname, text, valid in STRINGS:
            doc = {**docs[base], "wait": False, "cache": False}
            yield Case(
                f"ahead/{fld}/{sname}",
                "POST",
                "/v1/plans",
                splice(doc, path, text),
                expect="accept" if valid else "any",
            )
    for base in ("plan", "job", "feedback", "replan"):
        for mname, body, ctype in _malformed(json.dumps(docs[base]).encode()):
            yield Case(f"malformed/{base}/{mname}", "POST", TARGETS[base], body, content_type=ctype)


def feedback_cases(docs: dict[str, dict[str, Any]]) -> Iterator[Case]:
    target, doc = TARGETS["feedback"], docs["feedback"]
    body = json.dumps(doc).encode()
    other = json.dumps({**doc, "measured_step_time_s": 0.75}).encode()
    first = Case("idempotency/first", "POST", target, body, headers=((b"Idempotency-Key", b"hostile-key-1"),))
    yield Case(
        "idempotency/same-key-other-body",
        "POST",
        target,
        other,
        headers=((b"Idempotency-Key", b"hostile-key-1"),),
        first=first,
        expect="refuse",
    )
    yield Case(
        "idempotency/same-key-same-body",
        "POST",
        target,
        body,
        headers=((b"Idempotency-Key", b"hostile-key-2"),),
        first=Case("idempotency/first-2", "POST", target, body, headers=((b"Idempotency-Key", b"hostile-key-2"),)),
        expect="accept",
    )
    for kname, key in (
        ("empty", b""),
        ("space", b"a b"),
        ("nul", b"a\x00b"),
        ("utf8", "clé".encode()),
        ("latin1", b"cl\xe9"),
        ("65-chars", b"k" * 65),
        ("10k-chars", b"k" * 10_000),
        ("quote", b"k'--"),
        ("ctl", b"a\x01b"),
    ):
        yield Case(f"idempotency/key-{kname}", "POST", target, body, headers=((b"Idempotency-Key", key),))
    yield Case("idempotency/no-key-empty-object", "POST", target, b"{}")
    yield Case("idempotency/no-key-no-such-plan", "POST", "/v1/plans/" + "f" * 32 + "/feedback", body)


ID_PARAMETERS = ("{plan_id}", "{job_id}")


def id_routes() -> list[tuple[str, str]]:
    """(method, address with ``{}`` for the id) of every route of the application that takes one plan or job
    id, read from its routers, so that a new route is covered without being listed here."""
    from api.app import ROUTERS

    found: set[tuple[str, str]] = set()
    for router in ROUTERS:
        for route in router.routes:
            path, methods = getattr(route, "path", ""), getattr(route, "methods", None) or set()
            for name in ID_PARAMETERS:
                if path.count("{") == 1 and name in path:
                    found.update((method, path.replace(name, "{}")) for method in methods - {"HEAD"})
    return sorted(found, key=lambda mr: (mr[1], mr[0]))


BODIES = {"/v1/plans/{}/feedback": b'{"measured_step_time_s": 1.0}', "/v1/dashboard/plans/{}/replan": b"{}"}


def path_cases() -> Iterator[Case]:
    for method, route in id_routes():
        for k, bad in enumerate(BAD_IDS):
            body = BODIES.get(route, b"" if method == "POST" else None)
            yield Case(f"path/{method} {route}/{k}:{bad[:24]}", method, route.format(bad), body)
    for target in (
        "/v1/plans/../../etc/passwd",
        "/v1/plans/%2e%2e/%2e%2e/etc/passwd",
        "/../../../../etc/passwd",
        "/dashboard/../../../etc/passwd",
        "/static/../../etc/passwd",
        "/v1/plans/./x",
        "//v1//plans",
        "/v1/plans/",
        "/V1/PLANS",
        "/v1/plans;x=1",
        "/v1/plans?%00",
        "/v1/plans#frag",
        "/v1/plans/" + PLAN + "/../../jobs/" + JOB,
        "/v1/plans/" + PLAN + "%00",
        "/v1/plans/%",
        "/v1/%ff",
        "/" + "a" * 20_000,
        "/v1/plans?" + "&".join(f"p{k}=1" for k in range(2000)),
        "http://evil.example/v1/plans",
        "*",
    ):
        yield Case(f"path/raw/{target[:40]}", "GET", target)
    queries = [
        ("limit", "abc"),
        ("limit", "-1"),
        ("limit", "0"),
        ("limit", "501"),
        ("limit", "1e300"),
        ("limit", "9" * 30),
        ("limit", "NaN"),
        ("offset", "-1"),
        ("offset", "9" * 30),
        ("status", "bogus"),
        ("status", "%00"),
        ("status", "done&status=failed"),
        ("created_after", "NaN"),
        ("created_after", "0"),
        ("created_after", "9999-12-31T23:59:59-23:59"),
        ("created_after", "0001-01-01T00:00:00%2B23:59"),
        ("created_before", "2026-13-45T99:99:00"),
        ("created_before", "2026-01-01T00:00:00%2B99:00"),
        ("created_after", "x" * 5000),
    ]
    for name, value in queries:
        yield Case(f"query/plans/{name}={value[:24]}", "GET", f"/v1/plans?{name}={value}")
        yield Case(f"query/dashboard/{name}={value[:24]}", "GET", f"/v1/dashboard/plans?{name}={value}")
    for route in (
        "/v1/plans?cluster=",
        "/v1/plans?model=",
        "/v1/plans?backend=",
        "/v1/dashboard/plans?cluster=",
        "/v1/dashboard/calibration?profile=",
        "/v1/dashboard/plans?id_prefix=",
        "/v1/dashboard/plans?sort=",
        "/v1/dashboard/calibration?limit=",
    ):
        for qname, value, valid in QUERY_VALUES:
            accept = valid and "sort=" not in route and "limit=" not in route and "id_prefix=" not in route
            yield Case(f"query/{route}{qname}", "GET", route + value, expect="accept" if accept else "any")
    for wait in ("abc", "-1", "1e300", "9" * 30, "NaN", "600001"):
        yield Case(f"query/wait_ms={wait[:24]}", "GET", f"/v1/plans/{PLAN}?wait_ms={wait}")


def token_routes() -> list[tuple[str, str, bool]]:
    """(method, target, whether it takes no body) of every route behind the token, read from the
    application's routers with the ids filled in, and ``HEAD /v1/plans``."""
    from api.app import ROUTERS
    from api.service.deps import require_token

    found: set[tuple[str, str, bool]] = set()
    for router in ROUTERS:
        guarded = any(getattr(d, "dependency", None) is require_token for d in router.dependencies)
        for route in router.routes:
            mine = getattr(route, "dependencies", None) or []
            if not (guarded or any(getattr(d, "dependency", None) is require_token for d in mine)):
                continue
            target = getattr(route, "path", "").replace("{plan_id}", PLAN).replace("{job_id}", JOB)
            if "{" not in target:
                bodiless = getattr(route, "body_field", None) is None
                found.update((m, target, bodiless) for m in getattr(route, "methods", set()) - {"HEAD"})
    return sorted(found, key=lambda r: (r[1], r[0])) + [("HEAD", "/v1/plans", True)]


BAD_AUTH: list[tuple[str, bytes | None]] = [
    ("missing", None),
    ("wrong", b"Bearer wrong-token-0000000000000000"),
    ("empty", b""),
    ("scheme-only", b"Bearer"),
    ("empty-token", b"Bearer "),
    ("basic", b"Basic " + base64.b64encode(b"dhp:" + TOKEN.encode())),
    ("other-scheme", b"Token " + TOKEN.encode()),
    ("token-plus-x", AUTH + b"x"),
    ("token-prefix", AUTH[:-1]),
    ("very-long", b"Bearer " + b"A" * 60_000),
    ("nul", b"Bearer a\x00b"),
    ("token-nul", AUTH + b"\x00"),
    ("latin1", b"Bearer \xe9\xe9"),
    ("comma-list", b"Bearer wrong, " + AUTH),
]


def token_cases() -> Iterator[Case]:
    for method, target, bodiless in token_routes():
        body = b"" if method == "POST" else None
        for aname, auth in BAD_AUTH:
            yield Case(f"token/{aname}/{method} {target}", method, target, body, auth=auth, expect="refuse")
        yield Case(
            f"token/lowercase-scheme/{method} {target}",
            method,
            target,
            body,
            auth=b"bearer " + TOKEN.encode(),
            expect="accept" if method != "HEAD" and bodiless else "any",
        )
    wrong = b"Bearer wrong-token-0000000000000000"
    yield Case(
        "token/two-headers-right-then-wrong", "GET", "/v1/plans", auth=AUTH, headers=((b"Authorization", wrong),)
    )
    yield Case(
        "token/two-headers-wrong-then-right", "GET", "/v1/plans", auth=wrong, headers=((b"Authorization", AUTH),)
    )
    yield Case(
        "token/post-plan-without-token", "POST", "/v1/plans", b'{"batch": "\\ud800"}', auth=None, expect="refuse"
    )


def http_cases() -> Iterator[Case]:
    body = b'{"measured_step_time_s": 1.0}'
    fb = f"/v1/plans/{PLAN}/feedback"
    head = (
        f"POST {fb} HTTP/1.1\r\nHost: h\r\nAuthorization: {AUTH.decode()}\r\nContent-Type: application/json\r\n"
    ).encode()
    raws = [
        ("content-length-abc", head + b"Content-Length: abc\r\n\r\n" + body),
        ("content-length-negative", head + b"Content-Length: -1\r\n\r\n" + body),
        ("content-length-float", head + b"Content-Length: 29.0\r\n\r\n" + body),
        ("content-length-hex", head + b"Content-Length: 0x1d\r\n\r\n" + body),
        ("content-length-twice-differing", head + b"Content-Length: 29\r\nContent-Length: 5\r\n\r\n" + body),
        (
            "content-length-and-chunked",
            head + b"Content-Length: 29\r\nTransfer-Encoding: chunked\r\n\r\n1d\r\n" + body + b"\r\n0\r\n\r\n",
        ),
        ("chunked-valid", head + b"Transfer-Encoding: chunked\r\n\r\n1d\r\n" + body + b"\r\n0\r\n\r\n"),
        ("chunked-bad-size", head + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n" + body + b"\r\n0\r\n\r\n"),
        ("transfer-encoding-gzip", head + b"Transfer-Encoding: gzip\r\n\r\n" + body),
        ("content-encoding-gzip-not-gzip", head + b"Content-Encoding: gzip\r\nContent-Length: 29\r\n\r\n" + body),
        ("header-nul", head + b"X-A: a\x00b\r\nContent-Length: 29\r\n\r\n" + body),
        ("header-name-space", head + b"X A: b\r\nContent-Length: 29\r\n\r\n" + body),
        ("header-64k", head + b"X-Big: " + b"b" * 65_536 + b"\r\nContent-Length: 29\r\n\r\n" + body),
        ("headers-300", head + b"".join(b"X-%d: v\r\n" % k for k in range(300)) + b"Content-Length: 29\r\n\r\n" + body),
        ("header-folded", head + b"X-A: a\r\n b\r\nContent-Length: 29\r\n\r\n" + body),
        ("bare-lf", head.replace(b"\r\n", b"\n") + b"Content-Length: 29\n\n" + body),
        ("expect-100", head + b"Expect: 100-continue\r\nContent-Length: 29\r\n\r\n" + body),
        ("method-unknown", b"FOO /v1/plans HTTP/1.1\r\nHost: h\r\n\r\n"),
        ("method-lowercase", b"get /v1/plans HTTP/1.1\r\nHost: h\r\n\r\n"),
        ("http-1.0-no-host", b"GET /v1/plans HTTP/1.0\r\nAuthorization: " + AUTH + b"\r\n\r\n"),
        ("http-1.1-no-host", b"GET /v1/plans HTTP/1.1\r\nAuthorization: " + AUTH + b"\r\n\r\n"),
        ("http-2.0-version", b"GET /v1/plans HTTP/2.0\r\nHost: h\r\n\r\n"),
        ("http-9.9-version", b"GET /v1/plans HTTP/9.9\r\nHost: h\r\n\r\n"),
        ("target-with-space", b"GET /v1/plans x HTTP/1.1\r\nHost: h\r\n\r\n"),
        ("target-ctl", b"GET /v1/pl\x01ans HTTP/1.1\r\nHost: h\r\n\r\n"),
        ("target-utf8", "GET /v1/plans/é HTTP/1.1\r\nHost: h\r\n\r\n".encode()),
        ("host-nul", b"GET /healthz HTTP/1.1\r\nHost: a\x00b\r\n\r\n"),
    ]
    for name, data in raws:
        yield Case(f"http/{name}", "POST" if data.startswith(b"POST") else "GET", raw=data)
    for method in ("PUT", "DELETE", "PATCH", "TRACE", "OPTIONS"):
        yield Case(
            f"http/method-{method}/v1/plans", method, "/v1/plans", body=b"{}" if method in ("PUT", "PATCH") else None
        )
        yield Case(f"http/method-{method}/v1/plans/id", method, f"/v1/plans/{PLAN}")
    yield Case("http/head-plan", "HEAD", f"/v1/plans/{PLAN}")
    yield Case("http/get-with-body", "GET", "/v1/plans", b'{"x": "\\ud800"}')
    big = b'{"batch": {"samples": [' + b" " * (17 << 20) + b"]}}"
    yield Case(
        "http/body-over-16-mib",
        "POST",
        "/v1/plans",
        raw=head.replace(fb.encode(), b"/v1/plans") + b"Content-Length: %d\r\n\r\n" % len(big) + big,
    )


def all_cases() -> list[Case]:
    """Every case, in a fixed order."""
    docs = base_documents()
    return [*body_cases(docs), *feedback_cases(docs), *path_cases(), *token_cases(), *http_cases()]


def family(case: Case) -> str:
    return case.name.split("/")[0]


def spread(cases: list[Case], limit: int | None) -> list[Case]:
    """``limit`` cases (all of them without a limit), in their order: each family's share in proportion to its
    size but at least one case (while the limit allows), taken evenly spaced within the family."""
    if limit is None or limit >= len(cases):
        return cases
    groups: dict[str, list[int]] = {}
    for k, case in enumerate(cases):
        groups.setdefault(family(case), []).append(k)
    share = {f: max(1, len(ks) * limit // len(cases)) for f, ks in groups.items()}
    while sum(share.values()) > limit:
        share[max(share, key=share.__getitem__)] -= 1
    while sum(share.values()) < limit:
        share[max((f for f in share if share[f] < len(groups[f])), key=lambda f: len(groups[f]) - share[f])] += 1
    picked = sorted(ks[j * len(ks) // share[f]] for f, ks in groups.items() for j in range(share[f]))
    return [cases[k] for k in picked]


# ---- running them ------------------------------------------------------------------------------------------


def judge(reply: Reply, method: str) -> tuple[str | None, list[str]]:
    """What is wrong with an error answer as a problem document: (why it is not one, or None; the members it lacks of
    field and hint). An answer to HEAD has no body: only its content type is judged."""
    ctype = reply.headers.get("content-type", "")
    doc = reply.json()
    if not ctype.startswith("application/problem+json"):
        return f"content-type {ctype or 'absent'}: {reply.body[:60]!r}", []
    if method == "HEAD":
        return None, []
    if not isinstance(doc, dict):
        return f"body is not a JSON object: {reply.body[:60]!r}", []
    absent = [
        m for m in ("type", "title", "status", "detail") if not isinstance(doc.get(m), int if m == "status" else str)
    ]
    if absent:
        return f"lacks {absent}", []
    if doc["status"] != reply.status:
        return f"status member {doc['status']} differs", []
    wanted = ("hint",) if reply.status in HINT_ONLY else ("field", "hint")
    return None, [m for m in wanted if not doc.get(m)]


@dataclass
class Tally:
    """What one store's run found."""

    store: str
    cases: int = 0
    by_status: Counter[int] = field(default_factory=Counter)
    http_500: list[str] = field(default_factory=list)
    dropped: list[dict[str, Any]] = field(default_factory=list)
    not_problem: list[dict[str, Any]] = field(default_factory=list)
    lacking: list[dict[str, Any]] = field(default_factory=list)
    refused_valid: list[dict[str, Any]] = field(default_factory=list)
    accepted_invalid: list[dict[str, Any]] = field(default_factory=list)
    closed_by_server: list[str] = field(default_factory=list)
    server_exits: list[str] = field(default_factory=list)
    later: Counter[str] = field(default_factory=Counter)
    failed_later: list[dict[str, Any]] = field(default_factory=list)
    answers: dict[str, int | None] = field(default_factory=dict)
    """Each case's status (None: no answer)."""
    elapsed_s: float = 0.0

    def report(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "cases": self.cases,
            "by_status": {str(k): v for k, v in sorted(self.by_status.items())},
            "no_answer": sum(1 for d in self.dropped if not d["answered"]),
            "http_500": self.http_500,
            "dropped": self.dropped,
            "not_problem_json": self.not_problem,
            "lacking_field_or_hint": self.lacking,
            "refused_valid": self.refused_valid,
            "accepted_invalid": self.accepted_invalid,
            "closed_by_server": self.closed_by_server,
            "server_exits": self.server_exits,
            "accepted_then_polled": dict(self.later),
            "failed_internally_later": self.failed_later,
            "elapsed_s": round(self.elapsed_s, 1),
            "answers": self.answers,
        }


class Target:
    """The service under test, with a plan and a job made before the cases (their ids replace the placeholders);
    started again on its store when a case kills it."""

    def __init__(self, data_dir: Path, env: dict[str, str]) -> None:
        self.data_dir, self.env = data_dir, env
        self.server = LocalServer(data_dir, env=env)
        self.wire = Wire(self.server.port)
        self.host = f"127.0.0.1:{self.server.port}"
        self.plan_id = self.job_id = ""
        docs = base_documents()
        try:
            plan = self.send(Case("setup/plan", "POST", "/v1/plans", json.dumps(docs["plan"]).encode()))
            job = self.send(Case("setup/job", "POST", "/v1/jobs", json.dumps(docs["job"]).encode()))
            if plan.status != 201 or job.status != 202:
                raise RuntimeError(
                    f"setup failed: plan {plan.status} {plan.body[:300]!r}, job {job.status} {job.body[:300]!r}"
                )
            self.plan_id, self.job_id = plan.json()["id"], job.json()["id"]
            self.poll(f"/v1/jobs/{self.job_id}", "status", ("running", "cancelling"))
        except BaseException:
            self.stop()
            raise

    def send(self, case: Case) -> Reply:
        return self.wire.exchange(case.encode(self.host, self.plan_id, self.job_id), case.method)

    def get(self, target: str, timeout_s: float = READ_TIMEOUT_S) -> Reply:
        return self.wire.exchange(
            Case("poll", "GET", target).encode(self.host, self.plan_id, self.job_id), "GET", timeout_s
        )

    def poll(self, target: str, member: str, waiting: tuple[str, ...], deadline_s: float = 60.0) -> dict[str, Any]:
        """GET ``target`` until its ``member`` is none of ``waiting``; the last document."""
        end = time.monotonic() + deadline_s
        while True:
            doc = self.get(target).json() or {}
            if doc.get(member) not in waiting or time.monotonic() > end:
                return doc
            time.sleep(0.05)

    def alive(self) -> bool:
        return self.server.proc.poll() is None

    def restart(self) -> None:
        self.wire.close()
        self.server.stop()
        self.server = LocalServer(self.data_dir, env=self.env)
        self.wire = Wire(self.server.port)
        self.host = f"127.0.0.1:{self.server.port}"

    def stop(self) -> None:
        self.wire.close()
        self.server.stop()


def _later(target: Target, case: Case, reply: Reply, tally: Tally) -> None:
    """Follow an accepted plan-ahead request or job to its end; record an internal failure."""
    doc = reply.json() or {}
    if case.target == "/v1/plans" and reply.status == 202:
        final = target.poll(f"/v1/plans/{doc['id']}?wait_ms=20000", "status", ("pending",))
        tally.later[f"plan:{final.get('status')}"] += 1
        error = final.get("error") or {}
        if final.get("status") == "failed" and (error.get("status", 500) >= 500 or not error.get("field")):
            tally.failed_later.append({"case": case.name, "error": error})
    elif case.target == "/v1/jobs" and reply.status == 202:
        final = target.poll(f"/v1/jobs/{doc['id']}", "status", ("running", "cancelling"))
        tally.later[f"job:{final.get('status')}"] += 1
        internal = [f for f in (final.get("summary") or {}).get("failures", []) if f.get("kind") == "internal"]
        error = final.get("error") or {}
        if (
            (final.get("status") == "failed" and not error.get("field"))
            or internal
            or final.get("status") == "interrupted"
        ):
            tally.failed_later.append(
                {"case": case.name, "status": final.get("status"), "error": error, "internal_steps": internal[:3]}
            )


def run_case(target: Target, case: Case, tally: Tally) -> None:
    tally.cases += 1
    try:
        if case.first is not None:
            target.send(case.first)
        reply = target.send(case)
    except Dropped as exc:
        tally.dropped.append({"case": case.name, "answered": False, "why": str(exc)})
        tally.answers[case.name] = None
        if not target.alive():
            tally.server_exits.append(case.name)
            target.restart()
        return
    tally.by_status[reply.status] += 1
    tally.answers[case.name] = reply.status
    if reply.status >= 500 and reply.status != 503:
        tally.http_500.append(case.name)
    if reply.status >= 400:
        why, lacks = judge(reply, case.method)
        if why:
            tally.not_problem.append({"case": case.name, "status": reply.status, "why": why})
        elif lacks:
            tally.lacking.append({"case": case.name, "status": reply.status, "lacks": lacks})
    if case.expect == "accept" and reply.status >= 300:
        tally.refused_valid.append(
            {
                "case": case.name,
                "status": reply.status,
                "detail": (reply.json() or {}).get("detail") if reply.status >= 400 else None,
            }
        )
    if case.expect == "refuse" and reply.status < 300:
        tally.accepted_invalid.append({"case": case.name, "status": reply.status})
    if reply.closes or reply.cut:
        tally.closed_by_server.append(case.name + (" (stopped reading the body)" if reply.cut else ""))
    else:
        try:
            check = target.get("/healthz", FOLLOW_UP_TIMEOUT_S)
            if check.status != 200:
                tally.dropped.append(
                    {"case": case.name, "answered": True, "why": f"GET /healthz after it answered {check.status}"}
                )
                target.wire.close()
        except Dropped as exc:
            tally.dropped.append({"case": case.name, "answered": True, "why": f"GET /healthz after it: {exc}"})
    if not target.alive():
        tally.server_exits.append(case.name)
        target.restart()
        return
    if reply.status == 202:
        try:
            _later(target, case, reply, tally)
        except (Dropped, KeyError, TypeError) as exc:
            tally.failed_later.append({"case": case.name, "error": f"polling failed: {exc}"})


def run_store(store: str, root: Path, limit: int | None = None, progress: bool = True) -> dict[str, Any]:
    """Every case (or ``limit`` of them) against a fresh service on ``store`` (``sqlite`` or
    ``postgresql``); its report."""
    cases = spread(all_cases(), limit)
    env = {"DHP_TOKENS": TOKEN}
    pg = None
    if store == "postgresql":
        from bench.postgres_server import PostgresServer

        root.chmod(0o755)  # as root, PostgreSQL runs as the postgres user, which must reach its folder
        pg = PostgresServer(root / "pg")
        env["DHP_DATABASE_URL"] = pg.url
    tally = Tally(store)
    t0 = time.perf_counter()
    try:
        target = Target(root / f"service-{store}", env)
        try:
            for case in tqdm(cases, desc=store, unit="case", file=sys.stderr, disable=not progress, mininterval=0.5):
                run_case(target, case, tally)
        finally:
            target.stop()
    finally:
        if pg is not None:
            pg.stop()
    tally.elapsed_s = time.perf_counter() - t0
    return tally.report()


def failed(report: dict[str, Any]) -> bool:
    return bool(report["http_500"] or report["dropped"] or report["server_exits"])


def text(report: dict[str, Any]) -> str:
    """The report of one store for a reader."""
    lines = [
        f"== {report['store']}: {report['cases']} cases in {report['elapsed_s']} s; "
        f"answers by status {report['by_status']}, no answer {report['no_answer']}"
    ]
    sections = [
        ("500 answers", report["http_500"]),
        ("dropped connections", report["dropped"]),
        ("server exits", report["server_exits"]),
        ("not a problem document", report["not_problem_json"]),
        ("problem documents lacking field/hint", report["lacking_field_or_hint"]),
        ("valid input refused", report["refused_valid"]),
        ("invalid input accepted", report["accepted_invalid"]),
        ("accepted, then failed internally", report["failed_internally_later"]),
        ("connection closed by the server (announced)", report["closed_by_server"]),
    ]
    lines.append(f"   accepted and followed to the end: {report['accepted_then_polled']}")
    for title, items in sections:
        lines.append(f"-- {title}: {len(items)}")
        lines += [f"   {json.dumps(item, ensure_ascii=True) if isinstance(item, dict) else item}" for item in items]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--store", choices=("sqlite", "postgresql", "both"), default="both")
    ap.add_argument("--limit", type=int, default=None, help="run this many cases per store, spread over every family")
    ap.add_argument("--json", type=Path, default=None, help="also write the full report here")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    stores = ["sqlite", "postgresql"] if args.store == "both" else [args.store]
    reports = []
    with tempfile.TemporaryDirectory(prefix="dhp-hostile-") as tmp:
        for store in stores:
            reports.append(run_store(store, Path(tmp), args.limit, not args.no_progress))
            print(text(reports[-1]), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(reports, indent=1, ensure_ascii=True))
    return 1 if any(failed(r) for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
