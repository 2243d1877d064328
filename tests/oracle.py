"""Brute-force optimum for tiny problems (<= 8 samples, <= 6 ranks), the oracle of the tests.

It shares nothing with the planners but the scalar cost formula: every way to cut the ranks into
groups (set partitions, idle ranks allowed; under ``degree_policy`` ``aligned`` only aligned
blocks) is enumerated, every split of the samples over those groups is searched by dynamic
programming over sample subsets (memory per micro-batch, or per sample under ``memory`` ``sample``),
and micro-batches are combined by a subset DP. Exponential; only for tests.
"""

from __future__ import annotations

import math
from functools import cache

from optimizer.costs.cp_schemes import ulysses_width
from optimizer.costs.tables import sample_time, vision_work
from optimizer.problem.problem import Problem


def _set_partitions(items: list[int]):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _set_partitions(rest):
        for k in range(len(part)):
            yield part[:k] + [[first] + part[k]] + part[k + 1 :]
        yield [[first]] + part


def _degree_ok(problem: Problem, d: int) -> bool:
    o = problem.options
    if o.max_degree is not None and d > o.max_degree:
        return False
    if o.degree_policy == "pow2" and d & (d - 1):
        return False
    n = problem.cluster.domain_size
    if o.degree_policy == "aligned" and d not in (1, n) and (d & (d - 1) or 2 * d > 1 << (n.bit_length() - 1)):
        return False  # a power of two below the domain's largest power of two, one rank, or the domain
    if problem.scheme == "ulysses" and (problem.model.llm.heads // problem.cluster.tensor_parallel) % d:
        return False
    return True


def _block_ok(problem: Problem, block: list[int]) -> bool:
    """Under the aligned policy a group below the domain is ranks k d .. k d + d - 1."""
    d = len(block)
    if problem.options.degree_policy != "aligned" or d in (1, problem.cluster.domain_size):
        return True
    return min(block) % d == 0 and max(block) - min(block) == d - 1


def brute_force_optimum(problem: Problem) -> float:
    """The least step time over all plans of ``problem``."""
    profile = problem.cost_profile
    cluster = problem.cluster
    samples = problem.batch.samples
    n = len(samples)
    n_ranks = cluster.domain_size
    assert n <= 8 and n_ranks <= 6, "the oracle is for tiny problems only"
    lengths = [s.length for s in samples]
    vision = [vision_work(profile, s) for s in samples]
    node = cluster.rank_node
    speed_of = [profile.speed_for(cluster.rank_gpu(r).name) for r in range(n_ranks)]
    cap_of = [profile.capacity_for(cluster.rank_gpu(r).name) for r in range(n_ranks)]
    full = (1 << n) - 1

    # Group classes (size, intra, speed, capacity) and the time of every sample subset on each.
    classes: dict[tuple, list[float]] = {}

    def class_times(key: tuple) -> list[float]:
        if key not in classes:
            d, intra, speed, cap = key
            u = ulysses_width(problem, d)
            t = [sample_time(profile, lengths[i], vision[i], d, intra, speed, u) for i in range(n)]
            times = [0.0] * (1 << n)
            for mask in range(1, 1 << n):
                low = mask & -mask
                i = low.bit_length() - 1
                prev = mask ^ low
                times[mask] = (
                    times[prev] if prev else profile.group_constant + profile.group_exchange_time(d, intra)
                ) + t[i]
            tokens = [0] * (1 << n)
            per_sample = problem.options.memory == "sample"  # samples run one at a time: the longest binds
            for mask in range(1, 1 << n):
                low = mask & -mask
                one = lengths[low.bit_length() - 1]
                tokens[mask] = max(tokens[mask ^ low], one) if per_sample else tokens[mask ^ low] + one
            classes[key] = [times[m] if tokens[m] / d <= cap * (1 + 1e-9) else math.inf for m in range(1 << n)]
        return classes[key]

    layouts: set[tuple] = set()
    for part in _set_partitions(list(range(n_ranks))):
        # Each block is a group, or idle: enumerate which blocks are groups by taking all, since an
        # idle block is equivalent to a group that receives no samples (time 0).
        keys = []
        ok = True
        for block in part:
            d = len(block)
            if not _degree_ok(problem, d) or not _block_ok(problem, block):
                ok = False
                break
            intra = len({node[r] for r in block}) == 1
            keys.append((d, intra, min(speed_of[r] for r in block), min(cap_of[r] for r in block)))
        if ok:
            layouts.add(tuple(sorted(keys)))
        # Blocks with a forbidden size may still be left idle: drop them and keep the rest.
        if not ok:
            keys = []
            for block in part:
                d = len(block)
                if _degree_ok(problem, d) and _block_ok(problem, block):
                    intra = len({node[r] for r in block}) == 1
                    keys.append((d, intra, min(speed_of[r] for r in block), min(cap_of[r] for r in block)))
            if keys:
                layouts.add(tuple(sorted(keys)))

    best_single = [math.inf] * (1 << n)
    best_single[0] = 0.0
    for layout in layouts:
        # H[S] = least max-time of placing sample set S on the groups processed so far.
        h = class_times(layout[0])[:]
        for key in layout[1:]:
            g = class_times(key)
            nh = h[:]
            for mask in range(1, 1 << n):
                sub = mask
                best = nh[mask]
                while sub:
                    v = g[sub]
                    if v < best:
                        rest = h[mask ^ sub]
                        cand = v if v > rest else rest
                        if cand < best:
                            best = cand
                    sub = (sub - 1) & mask
                nh[mask] = best
            h = nh
        for mask in range(1 << n):
            if h[mask] < best_single[mask]:
                best_single[mask] = h[mask]

    max_mb = min(problem.options.micro_batch_limit, n)  # more micro-batches than samples never help

    @cache
    def step(mask: int, k: int) -> float:
        if mask == 0:
            return 0.0
        if k == 0:
            return math.inf
        low = mask & -mask
        rest_bits = mask ^ low
        best = math.inf
        sub = rest_bits
        while True:
            block = sub | low
            v = best_single[block]
            if v < best:
                total = v + step(mask ^ block, k - 1)
                if total < best:
                    best = total
            if sub == 0:
                break
            sub = (sub - 1) & rest_bits
        return best

    return step(full, max_mb) + profile.step_constant
