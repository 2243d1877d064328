"""How exact context-parallel attention is: errors against float64, beside torch SDPA's at the same dtype.

    python -m trainer.attention_check                     # d = 1..6, ring and Ulysses, fp32/bf16/fp16, GQA
    python -m trainer.attention_check --degrees 1,2 --dtypes bfloat16 --json

For each group size d (d gloo processes on this machine), scheme and dtype, the inputs are float64
values rounded to the dtype; the group computes attention and its gradients in that dtype, and
every position's largest absolute error against float64 attention of the same inputs is taken
(output, dq, dk, dv; the maximum over positions). torch's ``scaled_dot_product_attention`` on the
whole sequence in one process at the same dtype gives the yardstick. Ulysses runs only where d
divides the query heads.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

HEADS, KV_HEADS, DIM = 30, 10, 16
"""Query heads divisible by 1, 2, 3, 5 and 6 (every Ulysses size checked); 10 key/value heads (GQA, 3 query heads each)."""
LENGTHS = [97, 40, 13, 5]
"""Samples of one micro-batch: a long one, shorter ones, one shorter than 2d (whole chunks of padding)."""


def _worker(rank: int, world_size: int, configs: list[tuple[str, str]], lengths: list[int], heads: int, kv_heads: int, dim: int) -> list[dict[str, Any]]:
    from trainer._testing import attention_worker

    return [attention_worker(rank, world_size, lengths, scheme, 128, heads, dim, kv_heads, dtype, sdpa=True) for scheme, dtype in configs]


def error_table(degrees: list[int], dtypes: list[str], schemes: list[str], lengths: list[int] | None = None,
                heads: int = HEADS, kv_heads: int = KV_HEADS, dim: int = DIM) -> list[dict[str, Any]]:
    """One row per (d, scheme, dtype): our largest errors and SDPA's, for output, dq, dk, dv."""
    from trainer.launch import spawn

    rows = []
    for d in degrees:
        configs = [(s, t) for s in schemes for t in dtypes if s == "ring" or heads % d == 0]
        if not configs:
            continue
        per_rank = spawn(_worker, d, configs, lengths or LENGTHS, heads, kv_heads, dim)
        for i, (scheme, dtype) in enumerate(configs):
            ours = [max(per_rank[r][i]["ours"][j] for r in range(d)) for j in range(4)]
            rows.append({"d": d, "scheme": scheme, "dtype": dtype, "ours": ours, "sdpa": per_rank[0][i]["sdpa"]})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--degrees", default="1,2,3,4,5,6")
    ap.add_argument("--dtypes", default="float32,bfloat16,float16")
    ap.add_argument("--schemes", default="ring,ulysses")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)
    rows = error_table([int(x) for x in args.degrees.split(",")], args.dtypes.split(","), args.schemes.split(","))
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"heads {HEADS}, key/value heads {KV_HEADS}, head dim {DIM}, sample lengths {LENGTHS}; largest absolute error against float64")
    print(f"{'d':>2} {'scheme':8} {'dtype':9} | {'out':>9} {'dq':>9} {'dk':>9} {'dv':>9} | SDPA {'out':>9} {'dq':>9} {'dk':>9} {'dv':>9} | worst ratio")
    for r in rows:
        ratio = max(o / s if s > 0 else (0.0 if o == 0 else float("inf")) for o, s in zip(r["ours"], r["sdpa"], strict=True))
        ours = " ".join(f"{x:9.2e}" for x in r["ours"])
        sdpa = " ".join(f"{x:9.2e}" for x in r["sdpa"])
        print(f"{r['d']:>2} {r['scheme']:8} {r['dtype']:9} | {ours} |      {sdpa} | {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
