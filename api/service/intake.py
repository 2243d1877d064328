"""Request bodies: how many bytes are held at once, and JSON parsed off the event loop in small steps.

A body of many megabytes parsed by ``json.loads`` on the event loop holds the interpreter for hundreds of
milliseconds, during which no other request (``/healthz`` included) is answered; parsed in another thread it
holds it just as long, since the parser never lets go of the GIL inside one call. Here a large body is parsed
on a parse thread one element at a time (the C parser takes each sample whole, this module walks the
containers above them), with the cyclic collector paused (the parse makes no reference cycles, and a full
collection over hundreds of thousands of fresh objects would stop every thread), so the event loop gets the
interpreter back between elements. Bodies of up to :data:`INLINE_BYTES` are parsed in place: a thread hop
would cost more.

:class:`BodyBudget` caps the bytes of request bodies held at once, from the first byte read until the answer
is sent; the parsed documents, several times larger, live about as long, so this bounds the memory that
large requests take.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from json.decoder import JSONDecodeError, scanstring  # type: ignore[attr-defined]  # json.loads's C scanner
from typing import Any, TypeVar

from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from optimizer.gc_pause import collector_paused
from optimizer.problem.text import check_text_rule, may_break_rule

T = TypeVar("T")
INLINE_BYTES = 64 * 1024
"""Bodies up to this size are parsed on the event loop (a few hundred microseconds)."""
PARSE_THREADS = 2
OBJECT_STEPS = 3
"""Objects are walked element by element down to this depth (the request, the batch, a sample); deeper ones are
parsed whole."""
ARRAY_STEPS = 6
"""Arrays are walked element by element down to this depth (the samples, a sample's images or videos, rank groups)."""

_decoder = json.JSONDecoder()
_space = re.compile(r"[ \t\n\r]*").match
_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


class BodyBudget:
    """At most ``max_bytes`` of request bodies held at once; a body larger than that is taken only when no other is
    held."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        """Hold ``n`` more bytes; False (nothing held) when that would go over the budget."""
        with self._lock:
            if self.used and self.used + n > self.max_bytes:
                return False
            self.used += n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.used -= n


def loads(data: bytes | str) -> Any:
    """``json.loads`` in small steps: the same values and the same errors (:class:`json.JSONDecodeError`), but the
    interpreter is free for other threads between the elements of the containers near the top."""
    text = data.decode(json.detect_encoding(data), "surrogatepass") if isinstance(data, bytes) else data
    value, end = _value(text, _skip(text, 0), 0)
    end = _skip(text, end)
    if end != len(text):
        raise JSONDecodeError("Extra data", text, end)
    return value


def _skip(s: str, i: int) -> int:
    """The index of the first character at or after ``i`` that is not JSON white space."""
    space = _space(s, i)
    return space.end() if space else i


def _value(s: str, i: int, depth: int) -> tuple[Any, int]:
    c = s[i : i + 1]
    if c == "{" and depth < OBJECT_STEPS:
        return _object(s, i + 1, depth + 1)
    if c == "[" and depth < ARRAY_STEPS:
        return _array(s, i + 1, depth + 1)
    return _decoder.raw_decode(s, i)


def _object(s: str, i: int, depth: int) -> tuple[dict[str, Any], int]:
    out: dict[str, Any] = {}
    i = _skip(s, i)
    more = s[i : i + 1] != "}"
    while more:
        if s[i : i + 1] != '"':
            raise JSONDecodeError("Expecting property name enclosed in double quotes", s, i)
        key, i = scanstring(s, i + 1)
        i = _skip(s, i)
        if s[i : i + 1] != ":":
            raise JSONDecodeError("Expecting ':' delimiter", s, i)
        out[key], i = _value(s, _skip(s, i + 1), depth)
        more, i = _next_item(s, i, "}")
    return out, i + 1


def _array(s: str, i: int, depth: int) -> tuple[list[Any], int]:
    out: list[Any] = []
    i = _skip(s, i)
    more = s[i : i + 1] != "]"
    while more:
        value, i = _value(s, i, depth)
        out.append(value)
        more, i = _next_item(s, i, "]")
    return out, i + 1


def _next_item(s: str, i: int, close: str) -> tuple[bool, int]:
    """After a container's element: (False, the index of ``close``) when it ends there, else (True, the next
    element's index)."""
    i = _skip(s, i)
    c = s[i : i + 1]
    if c == close:
        return False, i
    if c != ",":
        raise JSONDecodeError("Expecting ',' delimiter", s, i)
    return True, _skip(s, i + 1)


def parse_body(data: bytes) -> tuple[Any, ExitStack]:
    """The parsed body, and the pause of the cyclic collector it was parsed in: closing it resumes the collector.
    The pause lasts as long as the document (:class:`Keeper` closes it once the document is taken apart): the
    first collection after a resume goes over every object allocated during the pause that is still alive,
    which for a large document is as long a stop as the one the pause avoided."""
    pause = ExitStack()
    pause.enter_context(collector_paused())
    try:
        return loads(data), pause
    except BaseException:
        pause.close()
        raise


def _parse_threads() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=PARSE_THREADS, thread_name_prefix="dhp-parse")
        return _executor


async def in_parse_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on a parse thread (for work on a large body that should not hold up the event loop)."""
    return await asyncio.get_running_loop().run_in_executor(_parse_threads(), fn, *args)


async def for_body(size: int, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in place for a body of up to :data:`INLINE_BYTES`, else on a parse thread."""
    return fn(*args) if size <= INLINE_BYTES else await in_parse_thread(fn, *args)


def _is_json(request: Request) -> bool:
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    return not kind or kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


class Keeper:
    """Holds large parsed documents until nothing else refers to them, then takes them apart on its own thread a
    piece at a time. Freeing hundreds of thousands of objects is one call that holds the interpreter for tens of
    milliseconds, wherever it happens (on the event loop, where the last reference to a request's document usually
    goes, or on any other thread); emptied a few hundred elements at a time, it lets the event loop in between.
    Only containers that nothing else refers to are emptied; a shared one is merely let go. Documents are let go
    after ``max_age_s`` at the latest."""

    def __init__(self, every_s: float = 0.05, max_age_s: float = 600.0) -> None:
        self.every_s = every_s
        self.max_age_s = max_age_s
        self._items: list[list[Any]] = []
        """[since, document, then] (lists, so that a document can be taken out of its entry without another
        reference)."""
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def keep(self, document: Any, then: ExitStack | None = None) -> None:
        """Hold ``document``; ``then`` is closed once it has been taken apart."""
        with self._lock:
            self._items.append([time.monotonic(), document, then])
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="dhp-free", daemon=True)
                self._thread.start()

    def __len__(self) -> int:
        return len(self._items)

    def sweep(self) -> int:
        """Take apart the documents nothing else refers to (let go of those held too long); how many."""
        now = time.monotonic()
        with self._lock:
            # Two references when only this list holds it: its entry's and getrefcount's argument.
            done = {
                k
                for k in range(len(self._items))
                if sys.getrefcount(self._items[k][1]) <= 2 or now - self._items[k][0] > self.max_age_s
            }
            ready = [self._items[k] for k in done]
            self._items = [item for k, item in enumerate(self._items) if k not in done]
        for _ in range(len(ready)):
            entry = ready.pop()
            _dismantle(entry.pop(1), 0)
            if entry[1] is not None:
                entry[1].close()
        return len(done)

    def _run(self) -> None:
        while True:
            time.sleep(self.every_s)
            self.sweep()


DISMANTLE_DEPTH = 3
"""Containers are emptied one element at a time above this depth; at it, a few hundred elements at a time."""
DISMANTLE_CHUNK = 256


def _dismantle(value: Any, depth: int) -> None:
    """Empty ``value`` piece by piece when nothing but this call refers to it (two references: this frame's and
    getrefcount's argument); else only let go of it."""
    if sys.getrefcount(value) > 2:
        return
    if isinstance(value, list):
        while value:
            if depth + 1 >= DISMANTLE_DEPTH:
                del value[-DISMANTLE_CHUNK:]
            else:
                _dismantle(value.pop(), depth + 1)
    elif isinstance(value, dict):
        while value:
            _dismantle(value.popitem()[1], depth + 1)


KEEPER = Keeper()


class ParsedOffLoop(APIRoute):
    """A route whose JSON body is parsed before FastAPI reads it: in steps on a parse thread when large, in place
    when small; FastAPI then validates the parsed document as usual (what it reads is cached on the request).
    Malformed JSON gives the same 422 as FastAPI's own parse; text that breaks :mod:`optimizer.problem.text`'s rule
    (NUL, a lone surrogate) a 422 naming its field."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()

        async def parse_then_handle(request: Request) -> Response:
            if request.method in ("POST", "PUT", "PATCH") and _is_json(request):
                data = await request.body()
                if data:
                    try:
                        if len(data) <= INLINE_BYTES:
                            parsed = json.loads(data)
                        else:
                            parsed, pause = await in_parse_thread(parse_body, data)
                            KEEPER.keep(parsed, pause)
                    except JSONDecodeError as exc:
                        raise RequestValidationError(
                            [
                                {
                                    "type": "json_invalid",
                                    "loc": ("body", exc.pos),
                                    "msg": "JSON decode error",
                                    "input": {},
                                    "ctx": {"error": exc.msg},
                                }
                            ],
                            body=exc.doc,
                        ) from None
                    except (
                        ValueError,
                        RecursionError,
                    ):  # not UTF-8 / UTF-16 / UTF-32, or nested beyond the parser's depth
                        raise HTTPException(400, "There was an error parsing the body") from None
                    if may_break_rule(
                        data
                    ):  # NUL or a lone surrogate reaches no encoder or store: refused naming the field
                        await for_body(len(data), check_text_rule, parsed)
                    request._json = (
                        parsed  # what Request.json() returns from now on (FastAPI reads the body through it)
                    )
            return await handle(request)

        return parse_then_handle
