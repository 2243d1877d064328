"""Preset clusters, models, GPU types and cost profiles, kept as JSON data files beside this module.

Each preset file has exactly the shape of the matching input document, so a preset can be copied,
edited and passed as ``--cluster FILE``, ``--model FILE`` or ``--profile FILE``.

Profiles (the profile zoo, :func:`profile_names` / :func:`load_profile`):

- ``flexsp-gpt7b``, ``flexsp-gpt13b``, ``flexsp-gpt30b``: FlexSP's fitted cost models (files);
- ``stress-*``: profiles a real cluster can produce that stress one side of planning, each with a
  ``source`` saying what it stresses (files; ``stress-mixed-gpu`` is for the ``mixed-h100-a100``
  cluster);
- ``analytical-<model>-<cluster>``: the analytical profile of every preset model on every preset
  cluster with the ring scheme, computed when loaded by :func:`optimizer.analytical.analytical_profile`
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
        "profiles": {n: load_profile(n) for n in profile_names()},
    }


ANALYTICAL_PREFIX = "analytical-"


def _analytical_pairs() -> dict[str, tuple[str, str]]:
    return {f"{ANALYTICAL_PREFIX}{m}-{c}": (m, c) for m in preset_names("models") for c in preset_names("clusters")}


def profile_names() -> list[str]:
    """Every profile of the zoo: the files in ``profiles/`` and the analytical model x cluster pairs."""
    return sorted(preset_names("profiles")) + sorted(_analytical_pairs())


def load_profile(name: str, field: str = "profile_preset") -> dict[str, Any]:
    """The profile document of zoo profile ``name`` (the shape ``--profile FILE`` reads)."""
    if name in preset_names("profiles"):
        return json.loads(json.dumps(_read(str(HERE / "profiles" / f"{name}.json"))))
    pair = _analytical_pairs().get(name)
    if pair is None:
        raise ProblemError(f"unknown profile preset {name!r}", field=field, hint=f"use one of {profile_names()} (dhp presets lists them).")
    from optimizer.analytical import analytical_profile
    from optimizer.documents import cluster_from_json, model_from_json

    model_name, cluster_name = pair
    model = model_from_json(load_preset("models", model_name, field))
    cluster = cluster_from_json(load_preset("clusters", cluster_name, field))
    return analytical_profile(model, cluster).to_json()
