"""Where a benchmark writes what it measured: ``--out FILE`` as indented JSON, its folder made first."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_json(path: str | Path, doc: Any) -> None:
    """``doc`` as indented JSON at ``path`` (the folders above it made where missing)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(doc, indent=2))
