"""Workers for the multi-process tests (module-level so spawned processes can import them)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from trainer.group_pool import GroupPool
from trainer.ring_attention import RingSpec, full_attention, ring_attention, shard_layout, ulysses_attention


def attention_worker(rank: int, world_size: int, lengths: list[int], scheme: str, tile: int = 128, heads: int = 6, dim: int = 4) -> list[float]:
    """Largest differences (output, dq, dk, dv) of ring/Ulysses attention against full attention."""
    from trainer import ring_attention as module

    module.TILE = tile
    layout = shard_layout(lengths, world_size, scheme)
    sizes = [int(p.numel()) for p, _ in layout]
    total = sum(sizes)
    g = torch.Generator().manual_seed(1)
    q, k, v, go = (torch.randn(total, heads, dim, generator=g, dtype=torch.float64) for _ in range(4))
    a = sum(sizes[:rank])
    b = a + sizes[rank]
    spec = RingSpec(dist.group.WORLD, tuple(range(world_size)), rank, tuple(layout))
    ql, kl, vl = (x[a:b].clone().requires_grad_(True) for x in (q, k, v))
    fn = ring_attention if scheme == "ring" else ulysses_attention
    out = fn(ql, kl, vl, spec)
    (out * go[a:b]).sum().backward()
    qf, kf, vf = (x.clone().requires_grad_(True) for x in (q, k, v))
    pos = torch.cat([p for p, _ in layout])
    seg = torch.cat([s for _, s in layout])
    ref = full_attention(qf, kf, vf, pos, seg)
    (ref * go).sum().backward()
    assert ql.grad is not None and kl.grad is not None and vl.grad is not None
    assert qf.grad is not None and kf.grad is not None and vf.grad is not None
    return [float((out - ref[a:b]).abs().max()), float((ql.grad - qf.grad[a:b]).abs().max()),
            float((kl.grad - kf.grad[a:b]).abs().max()), float((vl.grad - vf.grad[a:b]).abs().max())]


def pool_worker(rank: int, world_size: int) -> dict[str, Any]:
    """Exercise the pool: pre-create blocks, reuse, create on demand, and reduce inside a pooled group."""
    pool = GroupPool()
    first = pool.precreate_blocks([2, 3])
    again = pool.precreate_blocks([2, 3])
    on_demand = pool.ensure([(3, 0), (0, 3)])  # the same group twice, written unsorted
    g = pool.get((0, 3))
    hits_after_get = pool.stats.hits
    x = torch.tensor([float(rank + 1)])
    if rank in (0, 3):
        dist.all_reduce(x, group=g)
    try:
        pool.lookup((1, 2))
        unknown = "found"
    except KeyError:
        unknown = "missing"
    return {"first": first, "again": again, "on_demand": on_demand, "hits": hits_after_get, "sum": float(x), "unknown": unknown,
            "known": [list(k) for k in pool.known()], "single": pool.get((rank,)) is None}
