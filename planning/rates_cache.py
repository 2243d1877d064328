"""The fixed work's rates (:mod:`planning.fixed_work`) kept on disk between processes of one machine and one code.

Measuring them plans three calibration batches, a few hundred milliseconds that a fresh ``dhp plan``
would otherwise spend before every answer. They are facts of the machine and of the planner's code,
so a file keyed by both serves every later process: ``$DHP_CACHE_DIR`` (else ``$XDG_CACHE_HOME`` or
``~/.cache``, under ``dhp-planner``), one JSON file per key, trusted for :data:`MAX_AGE_S` (a day:
a machine's speed is measured again as its load and its software change). Any failure to read or
write the file only means measuring again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import sys
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import TypeVar

log = logging.getLogger("planning.rates_cache")
MAX_AGE_S = 24 * 3600.0
"""Seconds a file of rates is trusted (a day, chosen by hand: see the module docstring)."""
_CODE = ("optimizer", "planning")
"""The packages whose code the rates time: any change to a file of theirs is another key."""
R = TypeVar("R")


def cache_dir() -> Path:
    given = os.environ.get("DHP_CACHE_DIR")
    if given:
        return Path(given)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dhp-planner"


def key() -> str:
    """The machine (host, processor, cores, Python) and the code (every file of the planning packages)."""
    digest = hashlib.sha256(
        f"{platform.node()}|{platform.machine()}|{platform.processor()}|{os.cpu_count()}|{sys.version}".encode()
    )
    root = Path(__file__).resolve().parent.parent
    for package in _CODE:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:32]


def load(kind: type[R]) -> R | None:
    """The rates kept for this machine and code, when a fresh enough file holds them."""
    try:
        path = cache_dir() / f"rates-{key()}.json"
        if time.time() - path.stat().st_mtime > MAX_AGE_S:
            return None
        values = json.loads(path.read_text())
        return kind(**{f.name: float(values[f.name]) for f in fields(kind)})  # type: ignore[arg-type]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(rates: object) -> None:
    """Keep ``rates`` (a dataclass of numbers) for later processes; a failure is logged and otherwise ignored."""
    try:
        folder = cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"rates-{key()}.json"
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(asdict(rates)))  # type: ignore[call-overload]
        partial.replace(path)  # whole or not at all, whatever other processes read meanwhile
    except OSError as exc:
        log.info("could not keep the measured rates in %s: %s", cache_dir(), exc)
