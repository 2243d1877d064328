"""The profile zoo and the preset listing: profile files from the presets, and the analytical
profile of every preset model on every preset cluster (``analytical-<model>-<cluster>``), computed
when loaded by :func:`optimizer.costs.analytical.analytical_profile`."""

from __future__ import annotations

import json
from typing import Any

from optimizer.costs.analytical import analytical_profile
from optimizer.errors import ProblemError
from optimizer.presets import HERE, load_preset, preset_names, read_data
from optimizer.problem.documents import cluster_from_json, model_from_json


def describe_presets() -> dict[str, Any]:
    """Every preset with its document, for listings (``dhp presets``, ``GET /v1/presets``)."""
    return {
        "clusters": {n: load_preset("clusters", n, "cluster_preset") for n in preset_names("clusters")},
        "models": {n: load_preset("models", n, "model_preset") for n in preset_names("models")},
        "gpus": read_data(str(HERE / "gpus.json")),
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
        return json.loads(json.dumps(read_data(str(HERE / "profiles" / f"{name}.json"))))
    pair = _analytical_pairs().get(name)
    if pair is None:
        raise ProblemError(
            f"unknown profile preset {name!r}",
            field=field,
            hint=f"use one of {profile_names()} (dhp presets lists them).",
        )
    model_name, cluster_name = pair
    model = model_from_json(load_preset("models", model_name, field))
    cluster = cluster_from_json(load_preset("clusters", cluster_name, field))
    return analytical_profile(model, cluster).to_json()
