"""Context-parallel causal attention over a group of any size: ring (point-to-point), Ulysses and hybrid.

Layout. A group of d ranks holds the samples of one micro-batch. Each sample is padded (at its end)
and split as :mod:`optimizer.plan.sharding` says: zig-zag for ring (2d chunks, position i holds chunks i
and 2d-1-i), contiguous for Ulysses, for hybrid the zig-zag chunks of a ring of d / u cut into u
pieces. Every rank concatenates its pieces of all the group's samples; a token is described by its
position in its sample and its sample's index in the micro-batch (``segment``). A query may attend
to a key of the same segment at the same or an earlier position, so padding (always after the real
tokens) is never seen by a real token.

Ring. Keys and values travel around the ring (rank at position i sends to i+1 and receives from
i-1) with ``batch_isend_irecv``; after d steps every query has met every key block, merged with
the log-sum-exp rule. Each block is computed in tiles of query rows, each over only the keys it
can see, so causal attention costs about half of the full square; in the zig-zag layout every rank
does the same work. A group of one rank runs the same code with no peers. The backward pass
recomputes each block's probabilities from the saved log-sum-exp, and the key/value gradients
travel around the ring with the blocks they belong to, arriving at their owner after d steps.

Ulysses. An all-to-all turns (local tokens, all heads) into (all tokens, heads / d); each rank runs
ordinary attention on its heads; a second all-to-all turns the result back. It needs d to divide
the number of heads. The exchange follows the group's positions, whatever rank numbering its
process group has.

Hybrid. Ulysses over u ranks inside a ring over r = d / u (:class:`HybridSpec`). The rank at
position ``p = i u + j`` holds piece j of ring position i's two zig-zag chunks; an all-to-all over
its Ulysses sub-group (positions ``i u .. i u + u - 1``) gives it both chunks whole, the
sub-group's tokens in position order, for head slice j (H / u query heads); ring attention over
the r ranks with the same j (positions ``j, u + j, ...``, one head slice) then meets every key, each
ring position's block being the concatenation of its sub-group's layouts; the inverse all-to-all
returns the output to the tokens' owners. Each rank needs two process groups, its Ulysses
sub-group and its ring (the plan's ``ulysses_size`` gives u; :mod:`trainer.apply` lists them). It
needs u to divide the query heads; keys and values are repeated to the query heads when u does not
divide theirs, as for Ulysses. u = 1 is ring attention and u = d is Ulysses.

Precision and grouped-query attention: :mod:`trainer.attention_tiles` (float32 accumulators, keys
and values with fewer heads than queries). Keys and values travel in the input dtype; their
gradients travel in the accumulator dtype, so rounding happens once, at the owner.

Failures. Every wait on a ring message has a time limit (``RingSpec.timeout_s``). A rank whose
computation fails inside the ring first completes the exchange it has posted (so no peer is left
with a half-finished transfer), then raises :class:`RingError`; its peers get a :class:`RingError`
naming the rank they waited for when the limit passes (or at once when that rank's process exits).

Tensors are ``[tokens, heads, head_dim]`` (keys and values may have fewer heads, see above);
``positions`` and ``segments`` are int64 ``[tokens]``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from optimizer.plan.sharding import padded_length, token_ranges
from trainer import attention_tiles
from trainer.attention_tiles import (
    Tiles,
    accumulator_dtype,
    block_backward_into,
    block_forward_into,
    grouped,
    mask_value,
)

DEFAULT_TIMEOUT_S = float(os.environ.get("DHP_RING_TIMEOUT_S", "300"))
"""Longest wait for one ring message before the peer is declared failed (``DHP_RING_TIMEOUT_S``)."""


class RingError(RuntimeError):
    """Context-parallel attention failed on this rank or on a peer it waited for."""


# -- layout ---------------------------------------------------------------------------------


def shard_layout(
    lengths: Sequence[int], d: int, scheme: str = "ring", ulysses: int = 1
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """For each position 0..d-1 of a group, the (positions, segments) of the tokens it holds, padding
    included (``ulysses``: the Ulysses width u of a hybrid group)."""
    out = []
    for p in range(d):
        pos_parts, seg_parts = [], []
        for s, length in enumerate(lengths):
            padded = padded_length(length, d, scheme) if d > 1 else length
            for a, b in token_ranges(padded, d, scheme, ulysses)[p]:
                pos_parts.append(torch.arange(a, b, dtype=torch.int64))
                seg_parts.append(torch.full((b - a,), s, dtype=torch.int64))
        pos = torch.cat(pos_parts) if pos_parts else torch.zeros(0, dtype=torch.int64)
        seg = torch.cat(seg_parts) if seg_parts else torch.zeros(0, dtype=torch.int64)
        out.append((pos, seg))
    return out


def visible(q_pos: torch.Tensor, q_seg: torch.Tensor, k_pos: torch.Tensor, k_seg: torch.Tensor) -> torch.Tensor:
    """[Tq, Tk] True where the query may attend to the key (same sample, not later)."""
    return (q_seg[:, None] == k_seg[None, :]) & (q_pos[:, None] >= k_pos[None, :])


# -- the ring ---------------------------------------------------------------------------------


class _GroupPlace:
    """The group size and the global rank of a spec that holds ``ranks`` and this rank's ``position``."""

    ranks: tuple[int, ...]
    position: int

    @property
    def d(self) -> int:
        return len(self.ranks)

    @property
    def rank(self) -> int:
        return self.ranks[self.position]


@dataclass(frozen=True)
class RingSpec(_GroupPlace):
    """Where a rank sits in its ring and the token layout of every position."""

    group: Any
    ranks: tuple[int, ...]
    position: int
    layout: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    timeout_s: float | None = None
    """Longest wait for one message of the ring (None: :data:`DEFAULT_TIMEOUT_S` when the wait starts)."""
    _tiles: dict[Any, Tiles] = field(default_factory=dict, compare=False, repr=False)
    """Tiles of each source's block, computed once per micro-batch and shared by all layers."""
    _gathered: list[RingSpec] = field(default_factory=list, compare=False, repr=False)

    @property
    def send_to(self) -> int:
        return self.ranks[(self.position + 1) % self.d]

    @property
    def recv_from(self) -> int:
        return self.ranks[(self.position - 1) % self.d]

    def mask(self, source: int) -> torch.Tensor:
        qp, qs = self.layout[self.position]
        kp, ks = self.layout[source]
        return visible(qp, qs, kp, ks)

    def tiles(self, source: int) -> Tiles:
        key = (source, attention_tiles.TILE)
        hit = self._tiles.get(key)
        if hit is None:
            qp, qs = self.layout[self.position]
            kp, ks = self.layout[source]
            hit = self._tiles[key] = attention_tiles.tiles(qp, qs, kp, ks)
        return hit

    def gathered(self) -> RingSpec:
        """A one-position spec over the whole group's tokens (Ulysses' local attention), built once."""
        if not self._gathered:
            pos = torch.cat([p for p, _ in self.layout])
            seg = torch.cat([s for _, s in self.layout])
            self._gathered.append(RingSpec(LOOPBACK, (self.rank,), 0, ((pos, seg),), self.timeout_s))
        return self._gathered[0]


LOOPBACK = "loopback"
"""A ``RingSpec.group`` that runs one position's computation with no peers (every block comes back
unchanged): the profiler times a rank's work this way without the communication."""


def _start_exchange(t: torch.Tensor, spec: RingSpec, tag: int = 0) -> tuple[list[Any], torch.Tensor]:
    if spec.group is LOOPBACK or spec.d == 1:
        return [], t
    buf = torch.empty_like(t)
    ops = [
        dist.P2POp(dist.isend, t, spec.send_to, spec.group, tag),
        dist.P2POp(dist.irecv, buf, spec.recv_from, spec.group, tag),
    ]
    try:
        return dist.batch_isend_irecv(ops), buf
    except Exception as exc:
        raise RingError(
            f"rank {spec.rank}: could not post the ring exchange with ranks {spec.recv_from} and {spec.send_to}: {exc}"
        ) from exc


def _finish(reqs: list[Any], spec: RingSpec) -> None:
    seconds = spec.timeout_s if spec.timeout_s is not None else DEFAULT_TIMEOUT_S
    limit = timedelta(seconds=seconds)
    for r in reqs:
        try:
            r.wait(timeout=limit)
        except Exception as exc:
            raise RingError(
                f"rank {spec.rank}: the ring exchange with ranks {spec.recv_from} (receive) and {spec.send_to} "
                f"(send) of group {list(spec.ranks)} failed or passed {seconds:g} s; a peer failed or stopped: {exc}"
            ) from exc


def _drain(pending: tuple[list[Any], torch.Tensor] | None, spec: RingSpec) -> None:
    """After a local failure, complete the posted exchange so no peer waits on a half-done transfer."""
    if pending is not None:
        try:
            _finish(pending[0], spec)
        except RingError:
            pass


def _fail(exc: BaseException, spec: RingSpec, step: int, phase: str) -> RingError:
    if isinstance(exc, RingError):
        return exc
    return RingError(
        f"rank {spec.rank} (position {spec.position} of group {list(spec.ranks)}) failed in the {phase} pass at ring "
        f"step {step}: {type(exc).__name__}: {exc}"
    )


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: RingSpec, scale: float
    ) -> torch.Tensor:  # type: ignore[override]
        acc = accumulator_dtype(q.dtype)
        qh = q.transpose(0, 1).to(acc).contiguous()  # [H, T, D]
        kh, vh = (x.transpose(0, 1).contiguous() for x in (k, v))  # [Hkv, T, D], input dtype
        hkv = kh.shape[0]
        qg = grouped(qh, hkv)
        out = torch.zeros_like(qg)
        lse = torch.full(qg.shape[:-1], -math.inf, dtype=acc, device=qh.device)
        kv = torch.stack([kh, vh])
        d = spec.d
        pending = None
        step = 0
        try:
            for step in range(d):
                source = (spec.position - step) % d
                pending = _start_exchange(kv, spec) if step < d - 1 else None
                block_forward_into(out, lse, qg, kv[0].to(acc), kv[1].to(acc), spec.tiles(source), scale)
                if pending is not None:
                    _finish(pending[0], spec)
                    kv, pending = pending[1], None
        except BaseException as exc:
            _drain(pending, spec)
            raise _fail(exc, spec, step, "forward") from exc
        ctx.save_for_backward(qh, kh, vh, out, lse)
        ctx.spec, ctx.scale, ctx.dtype = spec, scale, q.dtype
        return out.view(qh.shape).to(q.dtype).transpose(0, 1)

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        qh, kh, vh, out, lse = ctx.saved_tensors
        spec, scale, dtype = ctx.spec, ctx.scale, ctx.dtype
        acc = qh.dtype
        hkv = kh.shape[0]
        d = spec.d
        qg = grouped(qh, hkv)
        dog = grouped(dout.transpose(0, 1).to(acc).contiguous(), hkv)
        delta = (dog * out).sum(-1)
        dq = torch.zeros_like(qg)
        kv = torch.stack([kh, vh])
        dkv = torch.zeros(kv.shape, dtype=acc, device=kv.device)
        pending = None
        step = 0
        try:
            for step in range(d):
                source = (spec.position - step) % d
                pending = _start_exchange(kv, spec) if step < d - 1 else None
                block_backward_into(
                    qg, kv[0].to(acc), kv[1].to(acc), dog, lse, delta, spec.tiles(source), scale, dq, dkv[0], dkv[1]
                )
                if pending is not None:
                    _finish(pending[0], spec)
                    kv, pending = pending[1], None
                # The gradient of this block travels on with it; after d moves it is back at its owner.
                pending = _start_exchange(dkv, spec, tag=1)
                _finish(pending[0], spec)
                dkv, pending = pending[1], None
        except BaseException as exc:
            _drain(pending, spec)
            raise _fail(exc, spec, step, "backward") from exc
        dq_out = dq.view(qh.shape).to(dtype).transpose(0, 1)
        return dq_out, dkv[0].to(dtype).transpose(0, 1), dkv[1].to(dtype).transpose(0, 1), None, None


def _check_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dim() != 3 or k.dim() != 3 or v.shape != k.shape or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(
            f"attention takes q [T, H, D] and k, v [T, Hkv, D]; got {tuple(q.shape)}, {tuple(k.shape)}, "
            f"{tuple(v.shape)}"
        )
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"the {q.shape[1]} query heads must be a multiple of the {k.shape[1]} key/value heads")


def ring_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: RingSpec, scale: float | None = None
) -> torch.Tensor:
    """Causal attention of this rank's tokens over the whole group's sequence (ring, zig-zag layout)."""
    _check_heads(q, k, v)
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    return _RingAttention.apply(q, k, v, spec, scale)


# -- plain attention (the reference) -----------------------------------------------------------


def full_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    segments: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Causal attention within each segment on one rank, with autograd, in the accumulator dtype (the reference)."""
    _check_heads(q, k, v)
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    acc = accumulator_dtype(q.dtype)
    rep = q.shape[1] // k.shape[1]
    qh, kh, vh = (x.to(acc).transpose(0, 1) for x in (q, k, v))
    if rep > 1:
        kh, vh = kh.repeat_interleave(rep, dim=0), vh.repeat_interleave(rep, dim=0)
    s = torch.matmul(qh, kh.transpose(-1, -2)) * scale
    s = s.masked_fill(~visible(positions, segments, positions, segments), mask_value(acc))
    return torch.matmul(torch.softmax(s, dim=-1), vh).transpose(0, 1).to(q.dtype)


# -- Ulysses ----------------------------------------------------------------------------------


def _a2a(x: torch.Tensor, group: Any) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=group)
    return out


def _a2a_order(group: Any, members: Sequence[int]) -> tuple[int, ...] | None:
    """The group rank of each member (in position order), or None when they are the same (the all-to-all
    then needs no reordering). A process group numbers its ranks in sorted order, a plan's group need not."""
    order = tuple(dist.get_group_rank(group, r) for r in members)
    return None if order == tuple(range(len(members))) else order


def _heads_to_tokens(x: torch.Tensor, d: int, group: Any, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """[T_local, H, D] -> [d * T_local, H / d, D]: member j of the exchange gets head slice j, and the tokens
    of member j come j-th (``order``: each member's group rank, see :func:`_a2a_order`)."""
    t, h, dim = x.shape
    chunks = x.reshape(t, d, h // d, dim).permute(1, 0, 2, 3)
    if order is None:
        return _a2a(chunks, group).reshape(d * t, h // d, dim)
    by_group_rank = [0] * d
    for j, g in enumerate(order):
        by_group_rank[g] = j
    received = _a2a(chunks[list(by_group_rank)], group)
    return received[list(order)].reshape(d * t, h // d, dim)


def _tokens_to_heads(y: torch.Tensor, d: int, group: Any, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """The inverse of :func:`_heads_to_tokens`."""
    td, hd, dim = y.shape
    t = td // d
    chunks = y.reshape(d, t, hd, dim)
    if order is None:
        back = _a2a(chunks, group)
    else:
        by_group_rank = [0] * d
        for j, g in enumerate(order):
            by_group_rank[g] = j
        back = _a2a(chunks[list(by_group_rank)], group)[list(order)]
    return back.permute(1, 0, 2, 3).reshape(t, d * hd, dim)


class _AllToAll(torch.autograd.Function):
    """Ulysses' exchange as an autograd function: heads to tokens (``to_tokens``) or back; the
    backward runs the opposite exchange."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, d: int, group: Any, to_tokens: bool, order: tuple[int, ...] | None = None
    ) -> torch.Tensor:  # type: ignore[override]
        ctx.d, ctx.group, ctx.to_tokens, ctx.order = d, group, to_tokens, order
        return (_heads_to_tokens if to_tokens else _tokens_to_heads)(x, d, group, order)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        back = (_tokens_to_heads if ctx.to_tokens else _heads_to_tokens)(g, ctx.d, ctx.group, ctx.order)
        return back, None, None, None, None


def _ulysses_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, u: int, what: str) -> tuple[torch.Tensor, ...]:
    """Check that ``u`` divides the query heads; repeat keys and values to the query heads when it does
    not divide theirs (autograd sums their gradients back)."""
    if q.shape[1] % u:
        raise ValueError(f"{what} {u} to divide the {q.shape[1]} query heads")
    if k.shape[1] % u:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    return k, v


def ulysses_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: RingSpec, scale: float | None = None
) -> torch.Tensor:
    """Causal attention by all-to-all over heads (layout from ``shard_layout(..., 'ulysses')``).

    The group size must divide the query heads; when it does not divide the key/value heads, keys
    and values are repeated to the query heads first (their gradients are summed back by autograd).
    """
    _check_heads(q, k, v)
    d = spec.d
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    local = spec.gathered()
    if d == 1 or spec.group is LOOPBACK:
        return _RingAttention.apply(q, k, v, local, scale)
    k, v = _ulysses_heads(q, k, v, d, "Ulysses needs the group size")
    counts = {int(p.numel()) for p, _ in spec.layout}
    if len(counts) != 1:
        raise ValueError("Ulysses needs every position to hold the same number of tokens (pad to a multiple of d)")
    order = _a2a_order(spec.group, spec.ranks)
    qa, ka, va = (_AllToAll.apply(x, d, spec.group, True, order) for x in (q, k, v))
    o = _RingAttention.apply(qa, ka, va, local, scale)
    return _AllToAll.apply(o, d, spec.group, False, order)


# -- hybrid: Ulysses inside, ring across ----------------------------------------------------------


@dataclass(frozen=True)
class HybridSpec(_GroupPlace):
    """Where a rank sits in a hybrid group of d ranks (Ulysses over ``ulysses_size`` = u ranks inside a
    ring of r = d / u) and the token layout of every position (``shard_layout(..., 'hybrid', u)``).

    The rank at position ``p = i u + j`` belongs to ring position i's Ulysses sub-group
    (``ulysses_ranks``, positions ``i u .. i u + u - 1``, process group ``ulysses_group``) and to the ring
    of Ulysses index j (``ring_ranks``, positions ``j, u + j, 2u + j, ...``, process group ``ring_group``).
    A sub-group of one rank needs no process group (None).
    """

    ranks: tuple[int, ...]
    position: int
    ulysses_size: int
    layout: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    ulysses_group: Any
    ring_group: Any
    timeout_s: float | None = None
    """Longest wait for one message of the ring (None: :data:`DEFAULT_TIMEOUT_S`)."""
    _ring: list[RingSpec] = field(default_factory=list, compare=False, repr=False)
    _order: list[tuple[int, ...] | None] = field(default_factory=list, compare=False, repr=False)

    def __post_init__(self) -> None:
        d, u = len(self.ranks), self.ulysses_size
        if u < 1 or d % u:
            raise ValueError(f"the Ulysses width {u} must divide the group size {d}")
        if len(self.layout) != d or not 0 <= self.position < d:
            raise ValueError(f"position {self.position} and {len(self.layout)} layouts do not fit a group of {d}")

    @property
    def ring_size(self) -> int:
        return self.d // self.ulysses_size

    @property
    def ring_index(self) -> int:
        """i: this rank's position in its ring (and the index of its Ulysses sub-group)."""
        return self.position // self.ulysses_size

    @property
    def ulysses_index(self) -> int:
        """j: this rank's position in its Ulysses sub-group (and the head slice it attends for)."""
        return self.position % self.ulysses_size

    @property
    def ulysses_ranks(self) -> tuple[int, ...]:
        u, i = self.ulysses_size, self.ring_index
        return self.ranks[i * u : (i + 1) * u]

    @property
    def ring_ranks(self) -> tuple[int, ...]:
        return self.ranks[self.ulysses_index :: self.ulysses_size]

    def ring(self) -> RingSpec:
        """The ring over the ranks of this Ulysses index, built once: ring position i holds the tokens of
        positions ``i u .. i u + u - 1`` in that order (as the all-to-all delivers them)."""
        if not self._ring:
            u = self.ulysses_size
            layout = tuple(
                (
                    torch.cat([self.layout[i * u + j][0] for j in range(u)]),
                    torch.cat([self.layout[i * u + j][1] for j in range(u)]),
                )
                for i in range(self.ring_size)
            )
            self._ring.append(RingSpec(self.ring_group, self.ring_ranks, self.ring_index, layout, self.timeout_s))
        return self._ring[0]

    def order(self) -> tuple[int, ...] | None:
        """The Ulysses sub-group's group rank of each member (None: they follow the positions)."""
        if not self._order:
            self._order.append(_a2a_order(self.ulysses_group, self.ulysses_ranks))
        return self._order[0]


def hybrid_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: HybridSpec, scale: float | None = None
) -> torch.Tensor:
    """Causal attention of this rank's tokens over the whole hybrid group's sequence.

    An all-to-all inside the Ulysses sub-group gives each of its u ranks the sub-group's tokens for
    1/u of the heads (u must divide the query heads; keys and values are repeated to the query heads
    first when it does not divide theirs); ring attention over the r ranks holding the same head
    slice covers the rest of the sequence; the inverse all-to-all returns the output to the tokens'
    owners. u = 1 is ring attention, u = d Ulysses.
    """
    _check_heads(q, k, v)
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    u = spec.ulysses_size
    ring = spec.ring()
    if u == 1:
        return _RingAttention.apply(q, k, v, ring, scale)
    k, v = _ulysses_heads(q, k, v, u, "hybrid attention needs the Ulysses width")
    counts = {int(p.numel()) for p, _ in spec.layout}
    if len(counts) != 1:
        raise ValueError("hybrid attention needs every position to hold the same number of tokens (pad to 2d)")
    group, order = spec.ulysses_group, spec.order()
    qa, ka, va = (_AllToAll.apply(x, u, group, True, order) for x in (q, k, v))
    o = _RingAttention.apply(qa, ka, va, ring, scale)
    return _AllToAll.apply(o, u, group, False, order)
