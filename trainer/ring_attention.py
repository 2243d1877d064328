"""Context-parallel causal attention over a group of any size: ring (point-to-point) and Ulysses.

Layout. A group of d ranks holds the samples of one micro-batch. Each sample is padded (at its end)
and split as :mod:`optimizer.plan.sharding` says: zig-zag for ring (2d chunks, position i holds chunks i
and 2d-1-i), contiguous for Ulysses. Every rank concatenates its pieces of all the group's samples;
a token is described by its position in its sample and its sample's index in the micro-batch
(``segment``). A query may attend to a key of the same segment at the same or an earlier position,
so padding (always after the real tokens) is never seen by a real token.

Ring. Keys and values travel around the ring (rank at position i sends to i+1 and receives from
i-1) with ``batch_isend_irecv``; after d steps every query has met every key block, merged with
the log-sum-exp rule. Each block is computed in tiles of query rows, each over only the keys it
can see, so causal attention costs about half of the full square; in the zig-zag layout every rank
does the same work. A group of one rank runs the same code with no peers. The backward pass
recomputes each block's probabilities from the saved log-sum-exp, and the key/value gradients
travel around the ring with the blocks they belong to, arriving at their owner after d steps.

Ulysses. An all-to-all turns (local tokens, all heads) into (all tokens, heads / d); each rank runs
ordinary attention on its heads; a second all-to-all turns the result back. It needs d to divide
the number of heads.

Tensors are ``[tokens, heads, head_dim]``; ``positions`` and ``segments`` are int64 ``[tokens]``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from optimizer.plan.sharding import padded_length, token_ranges

_NEG = -1e30


# -- layout ---------------------------------------------------------------------------------

def shard_layout(lengths: Sequence[int], d: int, scheme: str = "ring") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """For each position 0..d-1 of a group, the (positions, segments) of the tokens it holds, padding included."""
    out = []
    for p in range(d):
        pos_parts, seg_parts = [], []
        for s, length in enumerate(lengths):
            padded = padded_length(length, d, scheme) if d > 1 else length
            for a, b in token_ranges(padded, d, scheme)[p]:
                pos_parts.append(torch.arange(a, b, dtype=torch.int64))
                seg_parts.append(torch.full((b - a,), s, dtype=torch.int64))
        pos = torch.cat(pos_parts) if pos_parts else torch.zeros(0, dtype=torch.int64)
        seg = torch.cat(seg_parts) if seg_parts else torch.zeros(0, dtype=torch.int64)
        out.append((pos, seg))
    return out


def visible(q_pos: torch.Tensor, q_seg: torch.Tensor, k_pos: torch.Tensor, k_seg: torch.Tensor) -> torch.Tensor:
    """[Tq, Tk] True where the query may attend to the key (same sample, not later)."""
    return (q_seg[:, None] == k_seg[None, :]) & (q_pos[:, None] >= k_pos[None, :])


# -- one block --------------------------------------------------------------------------------

def _block_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q [H,Tq,D] over one key block: (out [H,Tq,D], lse [H,Tq]); masked rows get lse ~ -1e30."""
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    s = s.masked_fill(~mask, _NEG)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1))
    return torch.matmul(p, v), lse


def _merge(out: torch.Tensor, lse: torch.Tensor, b_out: torch.Tensor, b_lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    new = torch.logaddexp(lse, b_lse)
    out = out * torch.exp(lse - new).unsqueeze(-1) + b_out * torch.exp(b_lse - new).unsqueeze(-1)
    return out, new


TILE = 128
"""Query rows per tile: each tile computes only the key columns it can see, so causal work is about halved."""


Tiles = list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def _tiles(q_pos: torch.Tensor, q_seg: torch.Tensor, k_pos: torch.Tensor, k_seg: torch.Tensor) -> Tiles:
    """(query rows, key columns, their mask) of each row tile of a block that sees at least one key.

    Built sample by sample (a query sees only keys of its own sample), so the cost grows with the
    sum of squared sample lengths, not the square of the total. Tiles never span two samples or two
    chunks of one, whose rows see very different keys.
    """
    out: Tiles = []
    for s in torch.unique(q_seg).tolist():
        qi = (q_seg == s).nonzero().flatten()
        ki = (k_seg == s).nonzero().flatten()
        if ki.numel() == 0:
            continue
        mask = q_pos[qi][:, None] >= k_pos[ki][None, :]
        live = mask.any(dim=1).nonzero().flatten()
        if live.numel() == 0:
            continue
        pos = q_pos[qi][live]
        breaks = (pos[1:] != pos[:-1] + 1).nonzero().flatten() + 1
        bounds = [0, *breaks.tolist(), int(live.numel())]
        for a, b in zip(bounds[:-1], bounds[1:], strict=False):
            for x in range(a, b, TILE):
                local = live[x:min(x + TILE, b)]
                sub = mask[local]
                c = sub.any(dim=0).nonzero().flatten()
                out.append((qi[local], ki[c], sub[:, c]))
    return out


def _block_into(out: torch.Tensor, lse: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tiles: Tiles, scale: float) -> None:
    """Merge one key block into (out, lse) in place, tile by tile over the visible rows and columns."""
    for r, c, m in tiles:
        b_out, b_lse = _block_forward(q[:, r], k[:, c], v[:, c], m, scale)
        o, s = _merge(out[:, r], lse[:, r], b_out, b_lse)
        out[:, r] = o
        lse[:, r] = s


def _block_backward(q, k, v, dout, lse, delta, tiles: Tiles, scale, dq, dk, dv) -> None:
    """Add one block's gradients into dq, dk, dv (in place), recomputing its probabilities tile by tile."""
    for rows, cols, m in tiles:
        qr, kc, vc, dr = q[:, rows], k[:, cols], v[:, cols], dout[:, rows]
        s = torch.matmul(qr, kc.transpose(-1, -2)) * scale
        p = torch.exp(s - lse[:, rows].unsqueeze(-1)).masked_fill(~m, 0.0)
        dv[:, cols] += torch.matmul(p.transpose(-1, -2), dr)
        dp = torch.matmul(dr, vc.transpose(-1, -2))
        ds = p * (dp - delta[:, rows].unsqueeze(-1))
        dq[:, rows] += torch.matmul(ds, kc) * scale
        dk[:, cols] += torch.matmul(ds.transpose(-1, -2), qr) * scale


# -- the ring ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class RingSpec:
    """Where a rank sits in its ring and the token layout of every position."""

    group: Any
    ranks: tuple[int, ...]
    position: int
    layout: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    _tiles: dict[int, Tiles] = field(default_factory=dict, compare=False, repr=False)
    """Tiles of each source's block, computed once per micro-batch and shared by all layers."""

    @property
    def d(self) -> int:
        return len(self.ranks)

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
        hit = self._tiles.get(source)
        if hit is None:
            qp, qs = self.layout[self.position]
            kp, ks = self.layout[source]
            hit = self._tiles[source] = _tiles(qp, qs, kp, ks)
        return hit


LOOPBACK = "loopback"
"""A ``RingSpec.group`` that runs one position's computation with no peers (every block comes back
unchanged): the profiler times a rank's work this way without the communication."""


def _start_exchange(t: torch.Tensor, spec: RingSpec, tag: int = 0) -> tuple[list[Any], torch.Tensor]:
    if spec.group is LOOPBACK or spec.d == 1:
        return [], t
    buf = torch.empty_like(t)
    ops = [dist.P2POp(dist.isend, t, spec.send_to, spec.group, tag), dist.P2POp(dist.irecv, buf, spec.recv_from, spec.group, tag)]
    return dist.batch_isend_irecv(ops), buf


def _finish(reqs: list[Any]) -> None:
    for r in reqs:
        r.wait()


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: RingSpec, scale: float) -> torch.Tensor:  # type: ignore[override]
        qh, kh, vh = (x.transpose(0, 1).contiguous() for x in (q, k, v))  # [H, T, D]
        H, T, D = qh.shape
        out = torch.zeros_like(qh)
        lse = torch.full((H, T), -math.inf, dtype=qh.dtype, device=qh.device)
        kv = torch.stack([kh, vh])
        d = spec.d
        for step in range(d):
            source = (spec.position - step) % d
            pending = _start_exchange(kv, spec) if step < d - 1 else None
            _block_into(out, lse, qh, kv[0], kv[1], spec.tiles(source), scale)
            if pending is not None:
                _finish(pending[0])
                kv = pending[1]
        ctx.save_for_backward(qh, kh, vh, out, lse)
        ctx.spec, ctx.scale = spec, scale
        return out.transpose(0, 1)

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        qh, kh, vh, out, lse = ctx.saved_tensors
        spec, scale = ctx.spec, ctx.scale
        d = spec.d
        doh = dout.transpose(0, 1).contiguous()
        delta = (doh * out).sum(-1)
        dq = torch.zeros_like(qh)
        kv = torch.stack([kh, vh])
        dkv = torch.zeros_like(kv)
        for step in range(d):
            source = (spec.position - step) % d
            pending = _start_exchange(kv, spec) if step < d - 1 else None
            _block_backward(qh, kv[0], kv[1], doh, lse, delta, spec.tiles(source), scale, dq, dkv[0], dkv[1])
            if pending is not None:
                _finish(pending[0])
                kv = pending[1]
            # The gradient of this block travels on with it; after d moves it is back at its owner.
            reqs, dkv_next = _start_exchange(dkv, spec, tag=1)
            _finish(reqs)
            dkv = dkv_next
        return dq.transpose(0, 1), dkv[0].transpose(0, 1), dkv[1].transpose(0, 1), None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: RingSpec, scale: float | None = None) -> torch.Tensor:
    """Causal attention of this rank's tokens over the whole group's sequence (ring, zig-zag layout)."""
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    return _RingAttention.apply(q, k, v, spec, scale)


# -- plain attention (one rank, and the reference) ---------------------------------------------

def full_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, segments: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Causal attention within each segment on one rank, with autograd (the reference)."""
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    qh, kh, vh = (x.transpose(0, 1) for x in (q, k, v))
    s = torch.matmul(qh, kh.transpose(-1, -2)) * scale
    s = s.masked_fill(~visible(positions, segments, positions, segments), _NEG)
    return torch.matmul(torch.softmax(s, dim=-1), vh).transpose(0, 1)


# -- Ulysses ----------------------------------------------------------------------------------

def _a2a(x: torch.Tensor, group: Any) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=group)
    return out


def _heads_to_tokens(x: torch.Tensor, d: int, group: Any) -> torch.Tensor:
    """[T_local, H, D] -> [d * T_local, H / d, D] (tokens of position j come j-th)."""
    t, h, dim = x.shape
    chunks = x.reshape(t, d, h // d, dim).permute(1, 0, 2, 3)
    return _a2a(chunks, group).reshape(d * t, h // d, dim)


def _tokens_to_heads(y: torch.Tensor, d: int, group: Any) -> torch.Tensor:
    """The inverse of :func:`_heads_to_tokens`."""
    td, hd, dim = y.shape
    t = td // d
    back = _a2a(y.reshape(d, t, hd, dim), group)
    return back.permute(1, 0, 2, 3).reshape(t, d * hd, dim)


class _AllToAll(torch.autograd.Function):
    """Ulysses' exchange as an autograd function: heads to tokens (``to_tokens``) or back; the
    backward runs the opposite exchange."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, d: int, group: Any, to_tokens: bool) -> torch.Tensor:  # type: ignore[override]
        ctx.d, ctx.group, ctx.to_tokens = d, group, to_tokens
        return (_heads_to_tokens if to_tokens else _tokens_to_heads)(x, d, group)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        return (_tokens_to_heads if ctx.to_tokens else _heads_to_tokens)(g, ctx.d, ctx.group), None, None, None


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: RingSpec, scale: float | None = None) -> torch.Tensor:
    """Causal attention by all-to-all over heads (layout from ``shard_layout(..., 'ulysses')``)."""
    d = spec.d
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    if d == 1:
        pos, seg = spec.layout[0]
        return full_attention(q, k, v, pos, seg, scale)
    if q.shape[1] % d:
        raise ValueError(f"Ulysses needs the group size {d} to divide the {q.shape[1]} heads")
    counts = {int(p.numel()) for p, _ in spec.layout}
    if len(counts) != 1:
        raise ValueError("Ulysses needs every position to hold the same number of tokens (pad to a multiple of d)")
    pos = torch.cat([p for p, _ in spec.layout])
    seg = torch.cat([s for _, s in spec.layout])
    qa, ka, va = (_AllToAll.apply(x, d, spec.group, True) for x in (q, k, v))
    o = full_attention(qa, ka, va, pos, seg, scale)
    return _AllToAll.apply(o, d, spec.group, False)
