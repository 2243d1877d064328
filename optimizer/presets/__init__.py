"""Preset clusters, models, GPU types and cost profiles, kept as JSON data files beside this module.

Each preset file has exactly the shape of the matching input document, so a preset can be copied,
edited and passed as ``--cluster FILE``, ``--model FILE`` or ``--profile FILE``.

Profiles (the profile zoo, read through :mod:`optimizer.costs.zoo`):

- ``flexsp-gpt7b``, ``flexsp-gpt13b``, ``flexsp-gpt30b``: FlexSP's fitted cost models (files);
- ``stress-*``: profiles a real cluster can produce that stress one side of planning, each with a
  ``source`` saying what it stresses (files; ``stress-mixed-gpu`` is for the ``mixed-h100-a100``
  cluster);
- ``analytical-<model>-<cluster>``: the analytical profile of every preset model on every preset
  cluster with the ring scheme, computed when loaded by :func:`optimizer.costs.analytical.analytical_profile`
  (the same document ``dhp plan --model-preset M --cluster-preset C --show-profile`` prints).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from optimizer.errors import ProblemError

HERE = Path(__file__).resolve().parent


@cache
def read_data(path: str) -> Any:
    return json.loads(Path(path).read_text())


def gpu_catalog() -> dict[str, dict[str, float]]:
    """Known GPU types: memory, peak dense bf16 FLOP/s and default link bandwidths."""
    doc = read_data(str(HERE / "gpus.json"))
    return {name: {k: v for k, v in entry.items() if k != "source"} for name, entry in doc.items()}


def preset_names(kind: str) -> list[str]:
    return sorted(p.stem for p in (HERE / kind).glob("*.json"))


def load_preset(kind: str, name: str, field: str) -> dict[str, Any]:
    """The document of preset ``name`` of ``kind`` (``clusters`` or ``models``)."""
    names = preset_names(kind)
    if name not in names:
        raise ProblemError(f"unknown preset {name!r}", field=field, hint=f"use one of {names}.")
    return dict(read_data(str(HERE / kind / f"{name}.json")))
