"""Seeded tiny instances for the brute-force comparison (<= 6 ranks, <= 8 samples).

Each seed picks a cost profile, a cluster shape, a CP scheme, a degree policy, a micro-batch limit
and a batch whose lengths are drawn relative to the profile's memory capacity, so that memory binds
on many instances. The profiles:

- ``analytical``: no profile, the planner's analytical default for the model and GPUs;
- ``flexsp-gpt7b`` / ``flexsp-gpt30b``: the FlexSP fits of ``optimizer/presets/profiles`` with the
  capacity lowered so that a few thousand tokens fill a rank;
- ``big-group``: a group constant far above any sample's time;
- ``slow-inter``: inter-node bandwidth a thousandth of the intra-node one;
- ``quadratic``: attention (the quadratic term) dominating.

Clusters are single-node (3 to 6 GPUs) or multi-node (2 x 2, 2 x 3, 3 x 2), and some mix H100 and
A100 nodes. :func:`instance` returns a request document (``options.backend`` and
``options.time_budget_ms`` are left for the caller to set) and a dict of tags for reporting.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

from optimizer.problem.documents import problem_from_json

PROFILES = ("analytical", "flexsp-gpt7b", "flexsp-gpt30b", "big-group", "slow-inter", "quadratic")
SHAPES = ((1, 3), (1, 4), (1, 5), (1, 6), (2, 2), (2, 3), (3, 2))
_PRESETS = Path(__file__).resolve().parents[1] / "optimizer" / "presets" / "profiles"

_BASE = {
    "time": {"quadratic": 2e-10, "linear": 5e-5, "sample_constant": 1e-3, "group_constant": 5e-3},
    "comm": {"scheme": "ring", "bytes_per_token": 1.5e5, "bandwidth_bytes_per_s": {"intra": 3e11, "inter": 2.5e10}},
    "capacity_tokens_per_rank": 4000,
}


def _model(heads: int) -> dict:
    return {
        "name": f"tiny-{heads}h",
        "llm": {
            "layers": 32,
            "hidden": 3840,
            "heads": heads,
            "kv_heads": heads,
            "ffn_hidden": 11008,
            "vocab": 32000,
            "parameters": 7.0e9,
        },
        "training": {"zero_stage": 3, "recompute": "full"},
    }


def _profile(name: str, rng: random.Random, scheme: str) -> dict | None:
    if name == "analytical":
        return None
    if name.startswith("flexsp"):
        prof = json.loads((_PRESETS / f"{name}.json").read_text())
        prof.pop("source", None)
        prof["capacity_tokens_per_rank"] = rng.choice([1500, 3000, 6000])
        return prof
    prof = copy.deepcopy(_BASE)
    prof["comm"]["scheme"] = scheme
    prof["capacity_tokens_per_rank"] = rng.choice([2000, 4000, 16000])
    if name == "big-group":
        prof["time"]["group_constant"] = 0.2
    elif name == "slow-inter":
        prof["comm"]["bandwidth_bytes_per_s"]["inter"] = 3e8
    elif name == "quadratic":
        prof["time"].update(quadratic=2e-8, linear=1e-6, sample_constant=1e-4)
    return prof


def instance(seed: int) -> tuple[dict, dict]:
    """The request document of instance ``seed`` and its tags (profile, shape, scheme, policy)."""
    rng = random.Random(seed)
    name = PROFILES[seed % len(PROFILES)]
    nodes, per_node = rng.choice(SHAPES)
    mixed = nodes > 1 and rng.random() < 0.25
    scheme = "ulysses" if name.startswith("flexsp") else rng.choice(["ring", "ulysses"])
    policy = rng.choice(["any", "pow2"])
    heads = rng.choice([60, 60, 12, 32])  # hidden is 60 x 64 (divisible by each)
    prof = _profile(name, rng, scheme)
    if mixed:
        cluster = {
            "nodes": [
                {"count": 1, "gpus": per_node, "gpu": "H100-SXM"},
                {"count": nodes - 1, "gpus": per_node, "gpu": "A100-80GB"},
            ]
        }
        if prof is not None:
            prof["speed_by_gpu"] = {"A100-80GB": 0.6}
            prof["capacity_tokens_per_rank"] = {
                "default": prof["capacity_tokens_per_rank"],
                "A100-80GB": int(prof["capacity_tokens_per_rank"] * 0.8),
            }
    else:
        cluster = {"nodes": [{"count": nodes, "gpus": per_node, "gpu": "H100-SXM"}]}
    options: dict = {"degree_policy": policy, "max_micro_batches": rng.choice([1, 2, 2, 3])}
    doc: dict = {"cluster": cluster, "model": _model(heads), "options": options}
    if prof is None:
        options["cp_scheme"] = scheme
    else:
        doc["profile"] = prof
    capacity = _capacity(doc)
    n = rng.randint(2, 8)
    lengths = []
    for _ in range(n):
        share = rng.choice([rng.uniform(0.02, 0.4), rng.uniform(0.4, 1.0), rng.uniform(1.0, 2.5)])
        lengths.append(max(16, int(share * capacity)))
    doc["batch"] = {"samples": [{"id": f"s{i}", "text_tokens": x} for i, x in enumerate(lengths)]}
    tags = {
        "seed": seed,
        "profile": name,
        "shape": f"{nodes}x{per_node}{'-mixed' if mixed else ''}",
        "scheme": scheme,
        "policy": policy,
    }
    return doc, tags


def _capacity(doc: dict) -> float:
    """Tokens per rank of the instance's fastest GPU (from the problem as the planner reads it)."""
    probe = copy.deepcopy(doc)
    probe["batch"] = {"samples": [{"id": "probe", "text_tokens": 16}]}
    problem = problem_from_json(probe)
    cluster = problem.cluster
    return max(problem.cost_profile.capacity_for(cluster.rank_gpu(r).name) for r in range(cluster.domain_size))


def with_options(doc: dict, **options) -> dict:
    out = copy.deepcopy(doc)
    out["options"] = {**out.get("options", {}), **options}
    return out
