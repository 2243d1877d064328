"""Fingerprints of the plans of a fixed set of problems, to show that a change left every plan as it was.

Problems: the first 60 brute-force oracle instances (``tests/oracle_instances.py``) and 8 batches of 512
samples on 64 ranks (video, long-text, mixed, image-SFT; seeds 0 and 1), planned by the heuristic with a
60 s budget (so the clock never cuts it). One line per problem: index, sha256 of every group's ranks and
samples, step time and bound; or the error. Run it before and after a change and ``diff`` the outputs::

    python scripts/plan_fingerprints.py > before.txt   # on the old tree
    python scripts/plan_fingerprints.py > after.txt    # on the new one
    diff before.txt after.txt && echo identical
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from oracle_instances import instance  # noqa: E402

from optimizer.problem.documents import problem_from_json  # noqa: E402
from optimizer.problem.workloads import WORKLOADS  # noqa: E402
from planning.planner import plan  # noqa: E402


def problems() -> list[dict]:
    docs = [instance(seed)[0] for seed in range(60)]
    for workload in ("video", "long-text", "mixed", "image-sft"):
        for seed in range(2):
            docs.append(
                {
                    "cluster_preset": "h100-8x8",
                    "model_preset": "qwen2-vl-7b",
                    "batch": WORKLOADS[workload](512, seed=seed),
                }
            )
    return docs


def fingerprint(doc: dict) -> str:
    doc = {**doc, "options": {**doc.get("options", {}), "backend": "heuristic", "time_budget_ms": 60000}}
    try:
        p = plan(problem_from_json(doc))
    except Exception as exc:  # noqa: BLE001 - an error is part of the fingerprint
        return f"error {type(exc).__name__}: {str(exc)[:80]}"
    body = json.dumps([[(list(g.ranks), list(g.samples)) for g in mb.groups] for mb in p.micro_batches], sort_keys=True)
    return f"{hashlib.sha256(body.encode()).hexdigest()[:16]} {p.predicted_step_time_s:.12g} {p.lower_bound_s:.12g}"


def main() -> None:
    for k, doc in enumerate(problems()):
        print(k, fingerprint(doc))


if __name__ == "__main__":
    main()
