"""One training step of a plan on one rank, and the single-process reference it must equal.

A step runs the rank's micro-batches in order (:func:`trainer.apply.apply_plan`): it gathers its
tokens of each sample (padding with token 0 where a zig-zag chunk runs past the end), runs the model
with the plan's attention over its group (ring, Ulysses, or hybrid: Ulysses inside the rank's
Ulysses sub-group and ring across the sub-groups, :func:`trainer.ring_attention.hybrid_attention`),
and back-propagates its share of the loss. The loss is
the mean next-token cross-entropy over every label token of the batch, so each rank divides its sum
by the batch's label count; the data-parallel reduction is then one all-reduce (sum) of all
gradients over the job, which makes every rank's gradients equal those of one process running the
whole batch.

Two executions of a micro-batch: ``packed`` (the default) runs all the samples of the rank's group
in one forward and backward; ``per-sample`` runs them as Megatron-Core's hybrid context parallelism
does, each sample of the group as its own forward and backward (ring or Ulysses attention over the
group on that sample's shards alone), one after another in the group's order, and puts a barrier
over the domain (the data x context-parallel ranks) between micro-batches (Megatron's barrier
groups). Gradients accumulate either way and the loss keeps the batch's label count as its
denominator, so both give the reference's loss and gradients; they differ in time and memory (one
sample's activations at a time).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist

from trainer.apply import MicroBatchWork, RankWork
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

IGNORE = -100
EXECUTIONS = ("packed", "per-sample")
"""How a micro-batch runs (see the module docstring)."""


def label_count(samples: Mapping[str, torch.Tensor]) -> int:
    """Label tokens of a batch: every token but each sample's last has a next token to predict."""
    return sum(max(0, int(t.numel()) - 1) for t in samples.values())


def local_tokens(
    mb: MicroBatchWork, samples: Mapping[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token ids, in-sample positions, next-token labels) of this rank's shards, padding included."""
    toks, poss, labs = [], [], []
    for sh in mb.shards:
        ids = samples[sh.sample]
        if int(ids.numel()) != sh.length:
            raise ValueError(f"sample {sh.sample!r} has {int(ids.numel())} tokens but the plan says {sh.length}")
        padded = torch.zeros(sh.padded_length + 1, dtype=torch.int64)
        padded[: sh.length] = ids
        nxt = torch.full((sh.padded_length + 1,), IGNORE, dtype=torch.int64)
        nxt[: sh.length - 1] = ids[1:]
        for a, b in sh.padded_ranges:
            toks.append(padded[a:b])
            poss.append(torch.arange(a, b, dtype=torch.int64))
            labs.append(nxt[a:b])
    return torch.cat(toks), torch.cat(poss), torch.cat(labs)


@dataclass
class StepResult:
    loss: float
    """The batch's mean token loss (the same on every rank after the reduction)."""
    seconds: float
    """Wall time of the step on this rank, reduction included."""
    micro_batch_seconds: list[float] = field(default_factory=list)
    """Seconds of each micro-batch's own work on this rank (its barrier excluded)."""
    barrier_seconds: float = 0.0
    """Seconds spent in the barriers between micro-batches (per-sample execution; 0 when packed)."""


def train_step(
    model: torch.nn.Module,
    work: RankWork,
    pool: GroupPool,
    samples: Mapping[str, torch.Tensor],
    optimizer: torch.optim.Optimizer | None = None,
    reduce: bool = True,
    execution: str = "packed",
) -> StepResult:
    """Run this rank's part of one step, then reduce gradients (and apply ``optimizer`` if given).

    Every rank must call it with the same plan; the pool must already hold the plan's groups
    (``pool.ensure(work.communicators)`` and, for a hybrid plan, ``pool.ensure(work.sub_groups)``,
    collective) or they are created here in the same order.
    ``samples`` needs only the samples of this rank's groups (:mod:`trainer.routing`); the loss is
    normalised by the label count of the whole batch, which the plan's lengths give.
    ``model`` is any module called as ``model(tokens, positions, attend) -> logits``: the tiny
    model, or a Hugging Face model wrapped by :class:`trainer.hf_adapter.HFCausalLM`.
    ``execution`` is ``packed`` or ``per-sample`` (see the module docstring); every rank of the
    domain must use the same one, as per-sample execution meets them in its barriers.
    """
    if execution not in EXECUTIONS:
        raise ValueError(f"execution must be one of {EXECUTIONS}, got {execution!r}")
    pool.ensure(work.communicators)
    pool.ensure(work.sub_groups)
    pool.ensure(work.reduce_groups)
    total = work.total_labels if work.total_labels is not None else label_count(samples)
    device = next(model.parameters()).device
    domain = pool.get(work.reduce_ranks) if work.reduce_ranks is not None else None
    run = run_micro_batch if execution == "packed" else run_per_sample
    start = time.perf_counter()
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    mb_seconds = []
    waited = 0.0
    for m, mb in enumerate(work.micro_batches):
        t0 = time.perf_counter()
        if mb.group is not None:
            subs = (pool.get(mb.ulysses_ranks), pool.get(mb.ring_ranks)) if work.scheme == "hybrid" else None
            loss_sum += run(model, mb, pool.get(mb.group), work.scheme, samples, total, subs)
        t1 = time.perf_counter()
        mb_seconds.append(t1 - t0)
        if execution == "per-sample" and m + 1 < len(work.micro_batches):
            # Megatron's barrier between barrier groups: no rank starts the next one's samples early.
            dist.barrier(group=domain)
            waited += time.perf_counter() - t1
    if reduce:
        reduce_gradients(model, domain)
        dist.all_reduce(loss_sum, group=domain)
    if optimizer is not None:
        optimizer.step()
    return StepResult(float(loss_sum), time.perf_counter() - start, mb_seconds, waited)


def run_micro_batch(
    model: torch.nn.Module,
    mb: MicroBatchWork,
    group: Any,
    scheme: str,
    samples: Mapping[str, torch.Tensor],
    total_labels: int,
    sub_groups: tuple[Any, Any] | None = None,
) -> torch.Tensor:
    """Forward and backward of this rank's shards of one micro-batch; returns its loss contribution.

    ``group`` is the process group of the micro-batch's group; a hybrid micro-batch also needs
    ``sub_groups``, the process groups of the rank's Ulysses sub-group and ring (``mb.ulysses_ranks``,
    ``mb.ring_ranks``), except where one of them is the whole group (u = 1 or u = d).
    """
    device = next(model.parameters()).device
    assert mb.group is not None
    d = len(mb.group)
    layout = shard_layout([sh.length for sh in mb.shards], d, scheme, mb.ulysses_size)
    moved = tuple((p.to(device), s.to(device)) for p, s in layout)
    spec: RingSpec | HybridSpec
    if scheme == "hybrid":
        spec = HybridSpec(mb.group, mb.position, mb.ulysses_size, moved, *_hybrid_groups(mb, group, sub_groups))
    else:
        spec = RingSpec(group, mb.group, mb.position, moved)
    tokens, positions, labels = (x.to(device) for x in local_tokens(mb, samples))

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
        if isinstance(spec, HybridSpec):
            return hybrid_attention(q, k, v, spec, scale)
        if scheme == "ring":
            return ring_attention(q, k, v, spec, scale)
        return ulysses_attention(q, k, v, spec, scale)

    logits = model(tokens, positions, attend)
    loss = torch.nn.functional.cross_entropy(logits.double(), labels, ignore_index=IGNORE, reduction="sum") / max(
        total_labels, 1
    )
    loss.backward()
    return loss.detach()


def _hybrid_groups(mb: MicroBatchWork, group: Any, sub_groups: tuple[Any, Any] | None) -> tuple[Any, Any]:
    """(Ulysses sub-group, ring) process groups of a hybrid micro-batch; the whole group stands in for a
    sub-group that is the whole group, and a sub-group of one rank needs none."""
    if sub_groups is not None:
        return sub_groups
    d, u = mb.degree, mb.ulysses_size
    if d == 1 or u in (1, d):
        return (group if u == d and d > 1 else None), (group if u == 1 and d > 1 else None)
    raise ValueError(
        f"a hybrid micro-batch of {d} ranks with Ulysses width {u} needs the process groups of its Ulysses "
        f"sub-group {list(mb.ulysses_ranks)} and ring {list(mb.ring_ranks)} (sub_groups)"
    )


def run_per_sample(
    model: torch.nn.Module,
    mb: MicroBatchWork,
    group: Any,
    scheme: str,
    samples: Mapping[str, torch.Tensor],
    total_labels: int,
    sub_groups: tuple[Any, Any] | None = None,
) -> torch.Tensor:
    """Each sample of this rank's group in one micro-batch as its own forward and backward, in the
    group's order (Megatron-Core's sub-samples); returns the micro-batch's loss contribution."""
    loss = torch.zeros((), dtype=torch.float64, device=next(model.parameters()).device)
    for shard in mb.shards:
        one = replace(mb, shards=(shard,))
        loss += run_micro_batch(model, one, group, scheme, samples, total_labels, sub_groups)
    return loss


def reduce_gradients(model: torch.nn.Module, group: Any = None) -> None:
    """Sum every parameter's gradient over the job in one flat all-reduce (missing gradients count as zero)."""
    params = list(model.parameters())
    grads = []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[offset : offset + n].view_as(g))
        offset += n


def reference_step(model: torch.nn.Module, samples: Mapping[str, torch.Tensor]) -> float:
    """The same loss and gradients on one process with plain attention over the whole batch."""
    ids = list(samples)
    tokens = torch.cat([samples[s] for s in ids])
    positions = torch.cat([torch.arange(int(samples[s].numel())) for s in ids])
    segments = torch.cat([torch.full((int(samples[s].numel()),), i, dtype=torch.int64) for i, s in enumerate(ids)])
    labels = torch.cat([torch.cat([samples[s][1:], torch.tensor([IGNORE])]) for s in ids])

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return full_attention(q, k, v, positions, segments)

    logits = model(tokens, positions, attend)
    loss = torch.nn.functional.cross_entropy(logits.double(), labels, ignore_index=IGNORE, reduction="sum") / max(
        label_count(samples), 1
    )
    loss.backward()
    return float(loss.detach())
