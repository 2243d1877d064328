"""Preset clusters, models and GPU types, kept as JSON data files beside this module.

Each preset file has exactly the shape of the matching input document, so a preset can be copied,
edited and passed as ``--cluster FILE`` or ``--model FILE``.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from optimizer.errors import ProblemError

HERE = Path(__file__).resolve().parent


@cache
def _read(path: str) -> Any:
    return json.loads(Path(path).read_text())


def gpu_catalog() -> dict[str, dict[str, float]]:
    """Known GPU types: memory, peak dense bf16 FLOP/s and default link bandwidths."""
    doc = _read(str(HERE / "gpus.json"))
    return {name: {k: v for k, v in entry.items() if k != "source"} for name, entry in doc.items()}


def preset_names(kind: str) -> list[str]:
    return sorted(p.stem for p in (HERE / kind).glob("*.json"))


def load_preset(kind: str, name: str, field: str) -> dict[str, Any]:
    """The document of preset ``name`` of ``kind`` (``clusters`` or ``models``)."""
    names = preset_names(kind)
    if name not in names:
        raise ProblemError(f"unknown preset {name!r}", field=field, hint=f"use one of {names}.")
    return dict(_read(str(HERE / kind / f"{name}.json")))


def describe_presets() -> dict[str, Any]:
    """Every preset with its document, for listings (``dhp presets``, ``GET /v1/presets``)."""
    return {
        "clusters": {n: load_preset("clusters", n, "cluster_preset") for n in preset_names("clusters")},
        "models": {n: load_preset("models", n, "model_preset") for n in preset_names("models")},
        "gpus": _read(str(HERE / "gpus.json")),
    }
