"""Golden plans for two presets: the planner's output for fixed inputs must not drift unnoticed.

Regenerate after an intended change with ``DHP_UPDATE_GOLDEN=1 pytest tests/test_golden.py`` and
review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from optimizer.problem.documents import problem_from_json
from optimizer.problem.workloads import image_sft, long_tail_video
from optimizer.verify.verifier import verify
from planning.planner import plan

GOLDEN = Path(__file__).parent / "golden"
CASES = {
    "qwen2vl-h100-8x8-video64": {
        "batch": long_tail_video(64, seed=7),
        "cluster_preset": "h100-8x8",
        "model_preset": "qwen2-vl-7b",
    },
    "internvl2-ascend-8x8-images128": {
        "batch": image_sft(128, seed=3),
        "cluster_preset": "ascend910b-8x8",
        "model_preset": "internvl2-8b",
    },
}


def essence(result) -> dict:
    doc = result.to_json(shards=False)
    return {
        "predicted_step_time_s": round(doc["predicted_step_time_s"], 9),
        "lower_bound_s": round(doc["lower_bound_s"], 9),
        "static_baseline": {k: (round(v, 9) if isinstance(v, float) else v) for k, v in doc["static_baseline"].items()},
        "micro_batches": [
            [{"ranks": g["ranks"], "samples": g["samples"]} for g in mb["groups"]] for mb in doc["micro_batches"]
        ],
    }


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_plan(name):
    doc = dict(
        CASES[name], options={"backend": "heuristic", "deterministic": True}
    )  # plans that do not depend on the clock
    problem = problem_from_json(doc)
    result = plan(problem)
    assert verify(result, problem).ok
    got = essence(result)
    path = GOLDEN / f"{name}.json"
    if os.environ.get("DHP_UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=1) + "\n")
    expected = json.loads(path.read_text())
    assert got == expected
