"""The one text rule of every input document: no NUL character and no lone UTF-16 surrogate, in any string.

JSON may spell both (``"\\u0000"``, ``"\\ud800"``), and Python's parser takes them, but neither can be
written where text goes next: a lone surrogate has no UTF-8 form (every encoder, the plan store and the
Parquet plan files refuse it) and PostgreSQL's text and JSON types cannot hold NUL. A document is
checked once, where it enters (a request body, an input file), so nothing downstream meets such text;
the error names the field that holds it. A surrogate *pair* is a character like any other: the
parser joins it into one code point, which passes.
"""

from __future__ import annotations

import json
import re
from typing import Any

from optimizer.errors import ProblemError

_BAD = re.compile("[\x00\ud800-\udfff]")
_MAYBE_BAD = re.compile(rb"\\u(?:0000|[dD][89a-fA-F][0-9a-fA-F]{2})|\x00|\xed[\xa0-\xbf]")
"""In the bytes of a UTF-8 JSON text: every spelling of NUL or of a surrogate (escaped, or raw bytes that
``surrogatepass`` decoding would let through). Matches may be false alarms (a valid pair, an escaped
backslash); only a match calls for the walk over the parsed document."""


def _path(parent: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else key


def _describe(text: str) -> str:
    c = _BAD.search(text).group()  # type: ignore[union-attr]  # only called on text that has one
    return (
        "contains a NUL character (\\u0000)" if c == "\x00" else f"contains a lone UTF-16 surrogate (\\u{ord(c):04x})"
    )


def first_bad_text(value: Any, where: str = "") -> tuple[str, str] | None:
    """The first string (value or key) in ``value`` that breaks the rule: (its field path, what is wrong), else None."""
    stack: list[tuple[str, Any]] = [(where, value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if _BAD.search(item):
                return path or "body", _describe(item)
        elif isinstance(item, dict):
            for key, sub in reversed(item.items()):
                if isinstance(key, str) and _BAD.search(key):
                    return path or "body", f"has a key that {_describe(key)}"
                stack.append((_path(path, key), sub))
        elif isinstance(item, list):
            stack.extend((_path(path, k), sub) for k, sub in reversed(list(enumerate(item))))
    return None


def may_break_rule(data: bytes) -> bool:
    """Whether a JSON text's bytes may hold text that breaks the rule (False is certain; True needs the walk)."""
    if data[:4].count(0) and json.detect_encoding(data) != "utf-8":  # UTF-16 or UTF-32: no cheap look at the bytes
        return True
    if b"\\u" not in data and b"\xed" not in data and b"\x00" not in data:  # the common case, at memchr speed
        return False
    return _MAYBE_BAD.search(data) is not None


HINT = "remove the character: text must be valid Unicode without NUL (a surrogate pair such as \\ud83d\\ude00 is fine)."


def check_text_rule(value: Any, where: str = "") -> None:
    """Raise a ProblemError naming the first string in ``value`` that holds NUL or a lone surrogate."""
    bad = first_bad_text(value, where)
    if bad is not None:
        raise ProblemError(bad[1], field=bad[0], hint=HINT)
