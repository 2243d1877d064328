"""Figures: creating a process group against looking it up in a :class:`~trainer.group_pool.GroupPool`.

    python -m trainer.pool_timing [--procs 4] [--lookups 10000]

Every process creates all aligned blocks of sizes 2..procs through the pool (timing each creation,
a collective call), then looks each group up many times (timing the look-ups), and prints the
figures of rank 0. Gloo on CPU; NCCL with --backend nccl on GPUs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any


def _worker(rank: int, world_size: int, lookups: int) -> dict[str, Any]:
    import torch.distributed as dist

    from trainer.group_pool import GroupPool, aligned_blocks

    pool = GroupPool()
    blocks = aligned_blocks(world_size, range(2, world_size + 1))
    create = []
    for g in blocks:
        dist.barrier()
        t0 = time.perf_counter()
        pool.get(g)
        if rank in g:  # a rank outside the group only registers it
            create.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    for i in range(lookups):
        pool.get(blocks[i % len(blocks)])
    lookup = (time.perf_counter() - t0) / lookups
    return {"groups": len(blocks), "create_s": create, "lookup_s": lookup}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--lookups", type=int, default=10000)
    ap.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    args = ap.parse_args(argv)
    from trainer.launch import spawn

    res = spawn(_worker, args.procs, args.lookups, backend=args.backend)[0]
    create = res["create_s"]
    print(
        f"{args.backend}, {args.procs} processes: {res['groups']} groups created through the pool, "
        f"{len(create)} with rank 0"
    )
    print(
        f"create a group: median {statistics.median(create) * 1e3:.2f} ms (min {min(create) * 1e3:.2f}, "
        f"max {max(create) * 1e3:.2f})"
    )
    print(f"pooled look-up: {res['lookup_s'] * 1e6:.3f} us (mean of {args.lookups})")
    print(f"ratio: {statistics.median(create) / res['lookup_s']:.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
