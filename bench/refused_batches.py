"""Batches a Ulysses-only planner refuses (a sample needs more ranks than the model has heads), planned.

    .venv/bin/python -m bench.refused_batches                 # deterministic, 1 s per batch
    .venv/bin/python -m bench.refused_batches --budget-ms 2000 --out bench-out/refused.json

Each batch is planned with the heuristic in deterministic mode, its plan document checked again as
``dhp validate`` checks it (:func:`optimizer.verify.plan_document.check_plan_document`), and printed
beside the best static layout: its scheme, step time, the static layout's, the speedup and the long
sample's group (size and Ulysses width). The batches:

- a 230,000-token sample and 60 of 500 to 12,000 tokens, qwen2-vl-7b (28 heads) on 8 x 8 H100 under
  ``stress-group-constant`` (a Ulysses profile), with the default ``max_degree`` and with 64;
- a 262,144-token sample and 120 of 500 to 12,000 tokens on 16 x 8 H100 with a 64-head model (Llama-3-70B's
  shape: 80 layers, hidden 8,192, 8 key/value heads), under FlexSP's GPT-30B fit (Ulysses) with 3,224
  tokens per rank, so the long sample needs all 128 ranks;
- the second batch asked as ``cp_scheme: "ulysses"`` (refused, with the fix: ``cp_scheme: "hybrid"``), and
  asked so.
"""

from __future__ import annotations

import argparse
import copy
import random
import sys
from typing import Any

from bench.output import write_json

SEVENTY_B = {
    "name": "llama3-70b-shape",
    "llm": {
        "layers": 80,
        "hidden": 8192,
        "heads": 64,
        "kv_heads": 8,
        "ffn_hidden": 28672,
        "vocab": 128256,
        "parameters": 7.06e10,
    },
    "training": {"zero_stage": 3, "recompute": "full"},
}
"""Llama-3-70B's published dimensions (its Hugging Face config), as a model document."""


def _batch(longest: int, n: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    samples = [{"id": "long", "text_tokens": longest}]
    samples += [{"id": f"s{i}", "text_tokens": rng.randint(500, 12_000)} for i in range(n)]
    return {"samples": samples}


def cases(budget_ms: float) -> list[tuple[str, dict[str, Any]]]:
    from optimizer.costs.zoo import load_profile

    options = {"backend": "heuristic", "time_budget_ms": budget_ms, "deterministic": True}
    first = {
        "batch": _batch(230_000, 60, 3),
        "cluster_preset": "h100-8x8",
        "model_preset": "qwen2-vl-7b",
        "profile": load_profile("stress-group-constant"),
        "options": options,
    }
    profile = copy.deepcopy(load_profile("flexsp-gpt30b"))
    profile["capacity_tokens_per_rank"] = 3224
    second = {
        "batch": _batch(262_144, 120, 4),
        "cluster": {"nodes": 16, "gpus_per_node": 8, "gpu": "H100-SXM"},
        "model": SEVENTY_B,
        "profile": profile,
        "options": options,
    }
    return [
        ("230,000 tokens + 60, qwen2-vl-7b, 64 ranks, stress-group-constant", first),
        ("the same, max_degree 64", {**first, "options": {**options, "max_degree": 64}}),
        ("262,144 tokens + 120, 64 heads, 128 ranks, flexsp-gpt30b at 3,224 tokens/rank", second),
        ("the same asked as cp_scheme ulysses", {**second, "options": {**options, "cp_scheme": "ulysses"}}),
        ("the same asked as cp_scheme hybrid (the fix)", {**second, "options": {**options, "cp_scheme": "hybrid"}}),
    ]


def run_case(doc: dict[str, Any]) -> dict[str, Any]:
    from optimizer.errors import PlannerError
    from optimizer.problem.documents import problem_from_json
    from optimizer.verify.plan_document import check_plan_document
    from planning.planner import plan

    try:
        problem = problem_from_json(doc)
        result = plan(problem)
    except PlannerError as exc:
        return {"refused": str(exc)}
    document = result.to_json()
    report = check_plan_document(problem, document)
    holding = [g for mb in document["micro_batches"] for g in mb["groups"] if "long" in g.get("samples", [])]
    static = result.static_baseline
    return {
        "scheme": result.scheme,
        "step_s": result.predicted_step_time_s,
        "valid": report.ok,
        "violations": report.violations[:3],
        "static_s": static.predicted_step_time_s if static else None,
        "static_layout": f"CP {static.degree} x {static.micro_batches} micro-batches"
        if static
        else result.static_baseline_reason,
        "long_group_size": len(holding[0]["ranks"]) if holding else None,
        "long_group_ulysses": holding[0].get("ulysses_size") if holding else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.refused_batches", description=__doc__.splitlines()[0])
    ap.add_argument("--budget-ms", type=float, default=1000.0)
    ap.add_argument("--out", help="write every case as JSON here")
    args = ap.parse_args(argv)
    rows = []
    failed = 0
    for name, doc in cases(args.budget_ms):
        out = {"case": name, **run_case(doc)}
        rows.append(out)
        if "refused" in out:
            print(f"{name}: refused: {out['refused']}")
            continue
        failed += not out["valid"]
        speedup = f"{out['static_s'] / out['step_s']:.3f}x" if out["static_s"] else "n/a"
        static = f"{out['static_s']:.3f} s ({out['static_layout']})" if out["static_s"] else out["static_layout"]
        print(
            f"{name}: {out['scheme']}, step {out['step_s']:.3f} s, {'valid' if out['valid'] else out['violations']}; "
            f"static {static}; speedup {speedup}; long sample's group {out['long_group_size']} ranks, "
            f"Ulysses width {out['long_group_ulysses']}"
        )
    if args.out:
        write_json(args.out, rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
