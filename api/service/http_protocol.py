"""uvicorn's HTTP protocols, answering a request they cannot parse with a problem document.

uvicorn's parsers (httptools, else h11) refuse malformed HTTP before the app sees it (a
``Content-Length: abc``, a header name with a space, a request line that is not one) and answer a
``text/plain`` 400. The protocols here answer the same 400 as every other error of the service: an RFC
9457 problem document (``application/problem+json``, built by :func:`api.service.problem_details.problem_document`)
saying what the parser refused and how to send it right, then close the connection as uvicorn does.
``dhp serve`` runs :data:`ProblemHTTPProtocol`, the one of the two that uvicorn's ``auto`` would pick.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import orjson
from uvicorn.protocols.http.h11_impl import H11Protocol

from api.service.problem_details import PROBLEM_JSON, problem_document

DETAIL_CHARACTERS = 200
"""Longest parser message quoted in the problem document."""


def malformed_response(reason: BaseException | None, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    """The whole HTTP/1.1 response to a request the parser refused with ``reason``."""
    said = " ".join(str(reason or "").encode("ascii", "replace").decode().split())[:DETAIL_CHARACTERS]
    detail = "the request is not valid HTTP/1.1" + (f": {said}" if said else "")
    body = orjson.dumps(
        problem_document(
            400,
            "Malformed HTTP request",
            detail,
            kind="malformed-http",
            field="request",
            hint="send a well-formed HTTP/1.1 request: a request line 'METHOD /path HTTP/1.1', "
            "header names without spaces, and a Content-Length of decimal digits equal to the body's bytes (any "
            "HTTP client library sends these right).",
        )
    )
    head = [b"HTTP/1.1 400 Bad Request"]
    head += [name + b": " + value for name, value in default_headers]
    head += [
        b"content-type: " + PROBLEM_JSON.encode(),
        b"content-length: " + str(len(body)).encode(),
        b"connection: close",
    ]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


class _ProblemOn400:
    """Replaces the protocol's ``send_400_response``, which uvicorn calls while handling the parser's error."""

    transport: asyncio.Transport
    server_state: Any

    def send_400_response(self, msg: str) -> None:
        self.transport.write(malformed_response(sys.exc_info()[1], self.server_state.default_headers))
        self.transport.close()


class H11ProblemProtocol(_ProblemOn400, H11Protocol):
    """uvicorn's h11 protocol with malformed requests answered by a problem document."""


ProblemHTTPProtocol: type[asyncio.Protocol] = H11ProblemProtocol
"""The protocol ``dhp serve`` gives uvicorn: httptools' where it is installed (as uvicorn's ``auto``), else h11's."""

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # no httptools: uvicorn's auto runs h11 too
    pass
else:

    class HttpToolsProblemProtocol(_ProblemOn400, HttpToolsProtocol):
        """uvicorn's httptools protocol with malformed requests answered by a problem document."""

    ProblemHTTPProtocol = HttpToolsProblemProtocol
