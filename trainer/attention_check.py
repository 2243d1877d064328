"""How exact context-parallel attention is: errors against float64, beside torch SDPA's at the same dtype.

    python -m trainer.attention_check                     # d = 1..6, ring and Ulysses, fp32/bf16/fp16, GQA
    python -m trainer.attention_check --hybrid            # hybrid: d = 4, 6, 8, 12 x u = 2, 4, fp32/bf16
    python -m trainer.attention_check --degrees 1,2 --dtypes bfloat16 --json
    python -m trainer.attention_check --kernel matmul     # the plain-product tiles instead of the fused kernel
    python -m trainer.attention_check --time-kernels      # one process: a block's forward with each kernel

For each group size d (d gloo processes on this machine), scheme and dtype, the inputs are float64
values rounded to the dtype; the group computes attention and its gradients in that dtype, and
every position's largest absolute error against float64 attention of the same inputs is taken
(output, dq, dk, dv; the maximum over positions). torch's ``scaled_dot_product_attention`` on the
whole sequence in one process at the same dtype gives the yardstick. Ulysses runs only where d
divides the query heads.

Hybrid (Ulysses over u ranks inside a ring of d / u) runs for every Ulysses width u of ``--ulysses``
that divides both d and the query heads; the pairs it skips are named in the output. ``--hybrid``
measures it alone with 8 query heads and 2 key/value heads (u = 2 splits the key/value heads, u = 4
repeats them to the query heads first).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

HEADS, KV_HEADS, DIM = 30, 10, 16
"""Query heads divisible by 1, 2, 3, 5 and 6 (every Ulysses size checked); 10 key/value heads
(GQA, 3 query heads each)."""
LENGTHS = [97, 40, 13, 5]
"""Samples of one micro-batch: a long one, shorter ones, one shorter than 2d (whole chunks of padding)."""
HYBRID_HEADS, HYBRID_KV_HEADS = 8, 2
"""Heads of ``--hybrid``: divisible by u = 2 and 4; 2 key/value heads, split by u = 2, repeated for u = 4."""
HYBRID_DEGREES, HYBRID_ULYSSES = [4, 6, 8, 12], [2, 4]


def hybrid_pairs(degrees: Sequence[int], ulysses: Sequence[int], heads: int) -> tuple[list[tuple[int, int]], list[str]]:
    """The (d, u) pairs hybrid attention can run (u divides d and the heads), and why each other one is skipped."""
    pairs, skipped = [], []
    for d in degrees:
        for u in ulysses:
            if d % u:
                skipped.append(f"d {d} with u {u}: u does not divide d")
            elif heads % u:
                skipped.append(f"d {d} with u {u}: u does not divide the {heads} query heads")
            else:
                pairs.append((d, u))
    return pairs, skipped


def _worker(
    rank: int,
    world_size: int,
    configs: list[tuple[str, str, int]],
    lengths: list[int],
    heads: int,
    kv_heads: int,
    dim: int,
) -> list[dict[str, Any]]:
    from trainer._testing import attention_worker

    return [
        attention_worker(rank, world_size, lengths, scheme, 128, heads, dim, kv_heads, dtype, sdpa=True, ulysses=u)
        for scheme, dtype, u in configs
    ]


def error_table(
    degrees: list[int],
    dtypes: list[str],
    schemes: list[str],
    lengths: list[int] | None = None,
    heads: int = HEADS,
    kv_heads: int = KV_HEADS,
    dim: int = DIM,
    ulysses: Sequence[int] = HYBRID_ULYSSES,
) -> list[dict[str, Any]]:
    """One row per (d, scheme, u, dtype): our largest errors and SDPA's, for output, dq, dk, dv.

    ``u`` is the Ulysses width: 1 for ring, d for Ulysses, each of ``ulysses`` (where it divides d and
    the heads, :func:`hybrid_pairs`) for hybrid.
    """
    from trainer.launch import spawn

    hybrid = set(hybrid_pairs(degrees, ulysses, heads)[0]) if "hybrid" in schemes else set()
    rows = []
    for d in degrees:
        widths = {"ring": [1], "ulysses": [d] if heads % d == 0 else []}
        widths["hybrid"] = [u for u in ulysses if (d, u) in hybrid]
        configs = [(s, t, u) for s in schemes for u in widths.get(s, []) for t in dtypes]
        if not configs:
            continue
        per_rank = spawn(_worker, d, configs, lengths or LENGTHS, heads, kv_heads, dim)
        for i, (scheme, dtype, u) in enumerate(configs):
            ours = [max(per_rank[r][i]["ours"][j] for r in range(d)) for j in range(4)]
            rows.append(
                {"d": d, "scheme": scheme, "u": u, "dtype": dtype, "ours": ours, "sdpa": per_rank[0][i]["sdpa"]}
            )
    return rows


TIMED_BATCHES = {"one sample of 2048": [2048], "16 mixed (40-300)": [300, 200, 60, 40] * 4, "64 x 32": [32] * 64}
"""Key blocks timed by --time-kernels (query and key tokens of one rank)."""


def kernel_times(repeats: int = 5, kv_heads: int = 2, group: int = 3, dim: int = 64) -> list[dict[str, Any]]:
    """Milliseconds of one block's forward (the fastest of ``repeats``) with each kernel, float32, one thread."""
    import time

    import torch

    from trainer.attention_tiles import block_forward_into, tiles

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for name, lengths in TIMED_BATCHES.items():
        total = sum(lengths)
        seg = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
        pos = torch.cat([torch.arange(n) for n in lengths])
        block = tiles(pos, seg, pos, seg)
        q = torch.randn(kv_heads, group, total, dim, generator=gen)
        k, v = torch.randn(kv_heads, total, dim, generator=gen), torch.randn(kv_heads, total, dim, generator=gen)
        row: dict[str, Any] = {"block": name, "tokens": total}
        for kernel in ("matmul", "fused"):
            best = float("inf")
            for _ in range(repeats):
                out, lse = torch.zeros_like(q), torch.full(q.shape[:-1], -torch.inf)
                start = time.perf_counter()
                block_forward_into(out, lse, q, k, v, block, dim**-0.5, kernel=kernel)
                best = min(best, time.perf_counter() - start)
            row[f"{kernel}_ms"] = best * 1000
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--degrees", default=None, help="group sizes (default 1,2,3,4,5,6; with --hybrid 4,6,8,12)")
    ap.add_argument(
        "--dtypes", default=None, help="dtypes (default float32,bfloat16,float16; with --hybrid float32,bfloat16)"
    )
    ap.add_argument(
        "--schemes", default=None, help="ring, ulysses, hybrid (default ring,ulysses; with --hybrid hybrid)"
    )
    ap.add_argument("--ulysses", default=",".join(map(str, HYBRID_ULYSSES)), help="Ulysses widths u of hybrid")
    ap.add_argument(
        "--hybrid",
        action="store_true",
        help=f"measure hybrid alone, {HYBRID_HEADS} query / {HYBRID_KV_HEADS} key-value heads",
    )
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument(
        "--kernel", choices=("auto", "fused", "matmul"), default=None, help="tile kernel (sets DHP_ATTENTION_KERNEL)"
    )
    ap.add_argument("--time-kernels", action="store_true", help="time one block's forward with each kernel instead")
    args = ap.parse_args(argv)
    if args.kernel:
        import os

        os.environ["DHP_ATTENTION_KERNEL"] = args.kernel  # the spawned processes inherit it
    if args.time_kernels:
        timed = kernel_times()
        if args.json:
            print(json.dumps(timed))
            return 0
        print("one block's forward, float32, one thread, 2 key/value heads x 3 query heads, head dim 64 (fastest of 5)")
        for r in timed:
            print(
                f"{r['block']:20} {r['tokens']:5} tokens | matmul {r['matmul_ms']:8.1f} ms | fused "
                f"{r['fused_ms']:8.1f} ms | {r['matmul_ms'] / r['fused_ms']:.1f}x"
            )
        return 0
    degrees = [int(x) for x in (args.degrees or ("4,6,8,12" if args.hybrid else "1,2,3,4,5,6")).split(",")]
    dtypes = (args.dtypes or ("float32,bfloat16" if args.hybrid else "float32,bfloat16,float16")).split(",")
    schemes = (args.schemes or ("hybrid" if args.hybrid else "ring,ulysses")).split(",")
    ulysses = [int(x) for x in args.ulysses.split(",")]
    heads, kv_heads = (HYBRID_HEADS, HYBRID_KV_HEADS) if args.hybrid else (HEADS, KV_HEADS)
    rows = error_table(degrees, dtypes, schemes, heads=heads, kv_heads=kv_heads, ulysses=ulysses)
    skipped = hybrid_pairs(degrees, ulysses, heads)[1] if "hybrid" in schemes else []
    if args.json:
        print(json.dumps(rows))
        for line in skipped:
            print(f"skipped: {line}", file=sys.stderr)
        return 0
    import torch

    from trainer.attention_tiles import kernel_for

    print(
        f"heads {heads}, key/value heads {kv_heads}, head dim {DIM}, sample lengths {LENGTHS}, "
        f"tile kernel {kernel_for(torch.device('cpu'))}; largest absolute error against float64"
    )
    print(
        f"{'d':>2} {'scheme':8} {'u':>2} {'dtype':9} | {'out':>9} {'dq':>9} {'dk':>9} {'dv':>9} | SDPA {'out':>9} "
        f"{'dq':>9} {'dk':>9} {'dv':>9} | worst ratio"
    )
    for r in rows:
        ratio = max(
            o / s if s > 0 else (0.0 if o == 0 else float("inf")) for o, s in zip(r["ours"], r["sdpa"], strict=True)
        )
        ours = " ".join(f"{x:9.2e}" for x in r["ours"])
        sdpa = " ".join(f"{x:9.2e}" for x in r["sdpa"])
        print(f"{r['d']:>2} {r['scheme']:8} {r['u']:>2} {r['dtype']:9} | {ours} |      {sdpa} | {ratio:.2f}")
    for line in skipped:
        print(f"skipped: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
