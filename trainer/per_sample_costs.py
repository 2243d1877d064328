"""The cost profile of per-sample execution, derived from a profile fitted for packed execution.

``dhp profile`` fits the trainer's packed execution (:mod:`trainer.step`): a group of size d in one
micro-batch runs one forward and backward over all its samples and costs
``b + (g1 (d-1) + g0) lat + sum_i t(L_i, d)``, with ``t(L, d) = (a2 L^2 + a1 L) / d + a0 + c (d-1)
+ ring bytes`` (:mod:`optimizer.costs.profile`). Per-sample execution (Megatron-Core's way) runs each
sample as its own forward and backward with its own ring, and puts a barrier over the domain
between micro-batches (barrier groups). :func:`per_sample_profile` says what that costs in the same
form, number by number:

- ``time.sample_constant`` := a0 + b. Each sample pays the fixed cost of its own forward and
  backward, which packed execution pays once per group and micro-batch: a sample alone costs
  ``b + t(L, d)`` in the packed fit, and that is what it costs run alone.
- ``time.group_constant`` := the barrier's seconds (:func:`time_barrier`, measured over the domain's
  processes): what a barrier group costs beyond its samples.
- ``comm.group_messages`` (g1 (d-1) + g0 per group and micro-batch) is dropped, and each sample's
  own ring exchanges those messages instead: ``comm.messages_per_step`` := m + g1 and
  ``comm.messages_fixed`` := g0 (a sample on a group of d >= 2 ranks then adds
  ``((m + g1) (d-1) + g0) latency``).
- ``time.step_constant`` := s - the barrier when s is at least that: Megatron's loop has no barrier
  after the last barrier group (the gradient reduction follows), so a step pays one barrier fewer
  than it has barrier groups. (Below that, s is kept and the prediction counts one barrier too many.)
- everything else is kept: a2, a1, c (``time.sample_step``: each sample's tiles in the d ring
  blocks), the ring's bytes (padded per sample either way), bandwidth, latency and the capacity
  (held per sample under Megatron's rules, ``memory: "sample"``).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Mapping
from typing import Any


def per_sample_profile(packed: Mapping[str, Any], barrier_s: float) -> dict[str, Any]:
    """The per-sample profile of a packed one and the measured barrier (see the module docstring)."""
    if not barrier_s >= 0:
        raise ValueError(f"the barrier's seconds must be >= 0, got {barrier_s!r}")
    doc: dict[str, Any] = json.loads(json.dumps(packed))
    t, comm = doc["time"], doc["comm"]
    b = float(t.get("group_constant", 0.0))
    t["sample_constant"] = float(t.get("sample_constant", 0.0)) + b
    t["group_constant"] = float(barrier_s)
    messages = comm.pop("group_messages", None) or {}
    g1, g0 = float(messages.get("per_step", 0.0)), float(messages.get("fixed", 0.0))
    comm["messages_per_step"] = float(comm.get("messages_per_step", 0.0)) + g1
    comm["messages_fixed"] = float(comm.get("messages_fixed", 0.0)) + g0
    step = float(t.get("step_constant", 0.0))
    if step >= barrier_s:
        t["step_constant"] = step - barrier_s
    doc["source"] = (
        f"per-sample execution of [{packed.get('source', 'a packed profile')}]: sample_constant a0 + b = "
        f"{t['sample_constant']:.6g} s, group_constant = barrier {barrier_s:.3g} s, messages per sample "
        f"{comm['messages_per_step']:g} per ring step + {comm['messages_fixed']:g} (trainer.per_sample_costs)"
    )
    return doc


def time_barrier(group: Any = None, repeats: int = 30, warmup: int = 3) -> float:
    """Median seconds of a barrier over ``group`` (default: the whole job) on this rank; every rank of
    the group must call it together."""
    import torch.distributed as dist

    times = []
    for i in range(warmup + repeats):
        t0 = time.perf_counter()
        dist.barrier(group=group)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def barrier_worker(rank: int, world_size: int, repeats: int = 30) -> float:
    """One process of :func:`measure_barrier` (run by :func:`trainer.launch.spawn`)."""
    return time_barrier(None, repeats)


def measure_barrier(procs: int, repeats: int = 30) -> float:
    """Seconds of a barrier over ``procs`` gloo processes on this machine (the slowest rank's median)."""
    if procs < 2:
        return 0.0
    from trainer.launch import spawn

    return max(spawn(barrier_worker, procs, repeats))
