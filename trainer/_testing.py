"""Workers for the multi-process tests (module-level so spawned processes can import them)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from trainer.apply import hybrid_sub_groups
from trainer.group_pool import GroupPool
from trainer.ring_attention import (
    HybridSpec,
    RingSpec,
    full_attention,
    hybrid_attention,
    ring_attention,
    shard_layout,
    ulysses_attention,
)

_POOLS: list[tuple[Any, GroupPool]] = []


def _pool() -> GroupPool:
    """One pool per process and process-group initialisation, so repeated calls reuse the groups they create."""
    world = dist.group.WORLD
    if not _POOLS or _POOLS[0][0] is not world:
        _POOLS[:] = [(world, GroupPool())]
    return _POOLS[0][1]


def attention_inputs(
    layout: list[tuple[torch.Tensor, torch.Tensor]],
    heads: int,
    kv_heads: int,
    dim: int,
    dtype: torch.dtype,
    seed: int = 1,
) -> list[torch.Tensor]:
    """q, k, v and the output gradient of the whole group's tokens: float64 values rounded to ``dtype``
    (then held in float64)."""
    total = sum(int(p.numel()) for p, _ in layout)
    g = torch.Generator().manual_seed(seed)
    shapes = [(total, heads, dim), (total, kv_heads, dim), (total, kv_heads, dim), (total, heads, dim)]
    return [torch.randn(s, generator=g, dtype=torch.float64).to(dtype).to(torch.float64) for s in shapes]


def attention_worker(
    rank: int,
    world_size: int,
    lengths: list[int],
    scheme: str,
    tile: int = 128,
    heads: int = 6,
    dim: int = 4,
    kv_heads: int | None = None,
    dtype: str = "float64",
    sdpa: bool = False,
    ulysses: int = 1,
    order: list[int] | None = None,
) -> dict[str, Any]:
    """Largest errors (output, dq, dk, dv) of ring, Ulysses or hybrid attention (``ulysses``: its Ulysses
    width u) in ``dtype`` against float64 attention on the same inputs.

    ``order`` lists the group's ranks in position order (default: rank r at position r). A hybrid
    group's sub-groups are created here, collectively, from :func:`trainer.apply.hybrid_sub_groups`.
    With ``sdpa`` rank 0 also measures torch's ``scaled_dot_product_attention`` at the same dtype on
    the whole sequence (one process), the yardstick of what a kernel at that precision achieves.
    """
    from trainer import attention_tiles

    attention_tiles.TILE = tile
    kv_heads = kv_heads or heads
    typ = getattr(torch, dtype)
    ranks = tuple(order) if order is not None else tuple(range(world_size))
    position = ranks.index(rank)
    layout = shard_layout(lengths, world_size, scheme, ulysses)
    sizes = [int(p.numel()) for p, _ in layout]
    q, k, v, go = attention_inputs(layout, heads, kv_heads, dim, typ)
    a = sum(sizes[:position])
    b = a + sizes[position]
    ql, kl, vl = (x[a:b].to(typ).requires_grad_(True) for x in (q, k, v))
    if scheme == "hybrid":
        pool = _pool()
        pool.ensure(hybrid_sub_groups(ranks, ulysses))
        u = ulysses
        mine = ranks[position // u * u : position // u * u + u], ranks[position % u :: u]
        hspec = HybridSpec(ranks, position, u, tuple(layout), pool.get(mine[0]), pool.get(mine[1]), timeout_s=60)
        out = hybrid_attention(ql, kl, vl, hspec)
    else:
        spec = RingSpec(dist.group.WORLD, ranks, position, tuple(layout), timeout_s=60)
        out = (ring_attention if scheme == "ring" else ulysses_attention)(ql, kl, vl, spec)
    assert out.dtype == typ
    out.backward(go[a:b].to(typ))
    qf, kf, vf = (x.clone().requires_grad_(True) for x in (q, k, v))
    pos = torch.cat([p for p, _ in layout])
    seg = torch.cat([s for _, s in layout])
    ref_out = full_attention(qf, kf, vf, pos, seg)
    ref_out.backward(go)
    ref = ref_out.detach()
    assert ql.grad is not None and kl.grad is not None and vl.grad is not None
    assert qf.grad is not None and kf.grad is not None and vf.grad is not None
    out = out.detach()
    result: dict[str, Any] = {
        "ours": [
            float((out.double() - ref[a:b]).abs().max()),
            float((ql.grad.double() - qf.grad[a:b]).abs().max()),
            float((kl.grad.double() - kf.grad[a:b]).abs().max()),
            float((vl.grad.double() - vf.grad[a:b]).abs().max()),
        ]
    }
    if sdpa and rank == 0:
        result["sdpa"] = sdpa_errors(q, k, v, go, pos, seg, typ, ref, [qf.grad, kf.grad, vf.grad])
    return result


def attention_worker_many(rank: int, world_size: int, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """:func:`attention_worker` once per entry of ``calls`` (its keyword arguments), in one job."""
    return [attention_worker(rank, world_size, **kw) for kw in calls]


def sdpa_errors(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    go: torch.Tensor,
    pos: torch.Tensor,
    seg: torch.Tensor,
    typ: torch.dtype,
    ref: torch.Tensor,
    ref_grads: list[torch.Tensor],
) -> list[float]:
    """Largest errors (output, dq, dk, dv) of torch's SDPA at ``typ`` against the float64 reference."""
    from trainer.ring_attention import visible

    qs, ks, vs = (x.to(typ).transpose(0, 1).unsqueeze(0).requires_grad_(True) for x in (q, k, v))
    mask = visible(pos, seg, pos, seg)
    o = torch.nn.functional.scaled_dot_product_attention(
        qs, ks, vs, attn_mask=mask, enable_gqa=ks.shape[1] != qs.shape[1]
    )
    o.backward(go.to(typ).transpose(0, 1).unsqueeze(0))
    out = o.detach()[0].transpose(0, 1).double()
    grads = [t.grad[0].transpose(0, 1).double() for t in (qs, ks, vs) if t.grad is not None]
    return [float((out - ref).abs().max())] + [
        float((g - r).abs().max()) for g, r in zip(grads, ref_grads, strict=True)
    ]


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
    return {
        "first": first,
        "again": again,
        "on_demand": on_demand,
        "hits": hits_after_get,
        "sum": float(x),
        "unknown": unknown,
        "known": [list(k) for k in pool.known()],
        "single": pool.get((rank,)) is None,
    }


def failing_ring_worker(
    rank: int, world_size: int, fail_rank: int, timeout_s: float, linger_s: float
) -> dict[str, Any]:
    """Ring attention where ``fail_rank`` raises in its second block; that rank then stays alive for ``linger_s``.

    Returns what each rank saw: the error type and message, and the seconds until it was raised.
    """
    import time

    from trainer import ring_attention as module

    layout = shard_layout([40, 17], world_size, "ring")
    n = int(layout[rank][0].numel())
    g = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(n, 4, 8, generator=g).requires_grad_(True) for _ in range(3))
    spec = RingSpec(
        dist.new_group(list(range(world_size))), tuple(range(world_size)), rank, tuple(layout), timeout_s=timeout_s
    )
    if rank == fail_rank:
        original, calls = module.block_forward_into, [0]

        def broken(*args: Any) -> None:
            calls[0] += 1
            if calls[0] == 2:
                raise FloatingPointError("injected failure")
            original(*args)

        module.block_forward_into = broken  # type: ignore[assignment]
    t0 = time.perf_counter()
    seen: dict[str, Any]
    try:
        ring_attention(q, k, v, spec).sum().backward()
        seen = {"error": None, "message": ""}
    except Exception as exc:
        seen = {"error": type(exc).__name__, "message": str(exc)}
    seen["seconds"] = time.perf_counter() - t0
    if rank == fail_rank:
        time.sleep(linger_s)
    return seen
