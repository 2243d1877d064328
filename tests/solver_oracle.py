"""A brute-force planner for tiny problems: the oracle the exact backends are checked against.

It shares no code with the formulations: times come from the scalar formula
:func:`optimizer.costs.sample_time`, and every plan of the problem is enumerated: micro-batches
are subsets of samples (dynamic programme over subsets), a micro-batch is any set partition of its
samples into groups, each group any allowed size, inside one node or across nodes (inter-node
bandwidth), as long as the groups inside nodes pack into the nodes and all groups fit the domain.
"""

from __future__ import annotations

import itertools
import math
from functools import cache

from optimizer.costs import sample_time, vision_work
from optimizer.problem import Problem


def _partitions(items: list[int]):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _partitions(rest):
        for k in range(len(part)):
            yield part[:k] + [[first, *part[k]]] + part[k + 1:]
        yield [[first], *part]


def _packs(sizes: list[int], nodes: list[int]) -> bool:
    if not sizes:
        return True
    d, rest = sizes[0], sizes[1:]
    for k in range(len(nodes)):
        if nodes[k] >= d:
            nodes[k] -= d
            ok = _packs(rest, nodes)
            nodes[k] += d
            if ok:
                return True
    return False


def brute_force_step_time(problem: Problem, degrees: list[int]) -> float:
    """The least step time over every plan (seconds); homogeneous clusters only."""
    profile = problem.cost_profile
    cluster = problem.cluster
    samples = problem.batch.samples
    n = len(samples)
    node_sizes = [len(node_ranks) for node_ranks in _node_ranks(problem)]
    n_ranks = sum(node_sizes)
    gpu = cluster.nodes[0].gpu.name
    capacity = profile.capacity_for(gpu)
    speed = profile.speed_for(gpu)
    b = profile.group_constant
    lengths = [s.length for s in samples]
    vision = [vision_work(profile, s) for s in samples]

    def group_options(block: tuple[int, ...]) -> list[tuple[float, int, bool]]:
        tokens = sum(lengths[i] for i in block)
        out = []
        for d in degrees:
            if tokens > capacity * d * (1 + 1e-9):
                continue
            for intra in (True, False):
                if intra and d > max(node_sizes):
                    continue
                if not intra and (len(node_sizes) < 2 or d < 2):
                    continue
                t = b + sum(sample_time(profile, lengths[i], vision[i], d, intra, speed) for i in block)
                out.append((t, d, intra))
        return out

    @cache
    def one_micro_batch(mask: int) -> float:
        members = [i for i in range(n) if mask >> i & 1]
        best = math.inf
        for part in _partitions(members):
            options = [group_options(tuple(block)) for block in part]
            if any(not o for o in options):
                continue
            for choice in itertools.product(*options):
                slowest = max(c[0] for c in choice)
                if slowest >= best:
                    continue
                if sum(c[1] for c in choice) > n_ranks:
                    continue
                if not _packs(sorted((c[1] for c in choice if c[2]), reverse=True), list(node_sizes)):
                    continue
                best = slowest
        return best

    @cache
    def step(mask: int, left: int) -> float:
        if mask == 0:
            return 0.0
        if left == 0:
            return math.inf
        low = mask & -mask
        rest = mask ^ low
        best = math.inf
        sub = rest
        while True:
            chosen = sub | low
            best = min(best, one_micro_batch(chosen) + step(mask ^ chosen, left - 1))
            if sub == 0:
                break
            sub = (sub - 1) & rest
        return best

    return step((1 << n) - 1, problem.options.max_micro_batches)


def _node_ranks(problem: Problem) -> list[list[int]]:
    out: dict[int, list[int]] = {}
    for r, node in enumerate(problem.cluster.rank_node):
        out.setdefault(node, []).append(r)
    return list(out.values())
